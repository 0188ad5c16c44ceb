"""Path length of every export: instructions per I/O of flashpath under callgrind serving a null
disk over vhost-user, NBD and NVMe/TCP (as the target, and as the host re-exporting the
namespace over vhost-user), each figure the callgrind section's long-minus-short method.
docs/benchmarks.md, "Path length of every export", describes every step.
"""

import os
import shutil

from fpbench.common import GIB, log, wait_for
from fpbench.load import fio_nbd
from fpbench.machine import fio_nbd_missing
from fpbench.modes import pathlen_config
from fpbench.sections.callgrind import ir_summary, long_minus_short
from fpbench.sections.nvme_tcp import NVME_NAME, VHOST_CTRLR, attach_params
from fpbench.sections.nvmf import free_port, serve_disk
from fpbench.servers import Flashpath

# The exports in the order each repetition measures them, and what each measures: the client,
# and which flashpath runs under callgrind. nvmf-target: flashpath A serves the null disk over
# NVMe/TCP under callgrind, flashpath B (native) attaches to it and exports the namespace over
# vhost-user to fp-load; nvmf-host: the same pair with B under callgrind and A native.
EXPORTS = ("vhost-user", "nbd", "nvmf-target", "nvmf-host")
# The vhost-user clients: fp-load polls its used ring on vhost-user (the callgrind section's
# headline point); behind NVMe/TCP it sleeps on its completion fd: there a round trip passes
# through three processes, and a polling client held the server under callgrind waiting
# (polling idle, which it counts) longer and less evenly.
CLIENT = {"vhost-user": "poll", "nbd": "fio nbd", "nvmf-target": "fd", "nvmf-host": "fd"}
# The native peer of an NVMe/TCP run sleeps as soon as a round finds nothing to do (with the
# default 200 µs window it would spin on the CPU it shares), and runs where the server under
# callgrind waited least for it, measured (that server polls idle while it waits, and callgrind
# counts those polls): B, which serves fp-load, beside fp-load on the client CPU; A, which serves
# only B, beside B on the server CPU, where a request wakes it and it preempts B for a few µs
# that callgrind does not count (on the client CPU, behind fp-load and the machine's other work,
# B polled idle three times as many rounds, and its figure spread twice as wide). Each layout
# measured the other way round read 40–55 % higher, with a wider spread. The measured server keeps
# the default window: its path is what is counted.
PEER_SERVE_ARGS = ("--idle-window-us", "0")
MEASURED = {"vhost-user": "flashpath (vhost-user-blk export)", "nbd": "flashpath (NBD export)",
            "nvmf-target": "flashpath A (NVMe/TCP target)", "nvmf-host": "flashpath B (NVMe/TCP host, vhost-user-blk)"}


def pathlen_missing():
    """What the section needs and this machine lacks: valgrind and fio's nbd engine."""
    return (["valgrind"] if shutil.which("valgrind") is None else []) + fio_nbd_missing()


class PathlenSection:
    """Bench's methods for this section (mixed into bench.Bench)."""

    def run_pathlen(self):
        """Every export at every QD of the mode, `reps` repetitions, the exports interleaved
        within each repetition (vhost-user, NBD, NVMe/TCP target, NVMe/TCP host; each a short
        then a long server life)."""
        c = dict(pathlen_config(self.args.mode))
        if self.args.only == "pathlen" and self.args.reps:
            c["reps"] = self.args.reps
        out = {"config": c, "exports": list(EXPORTS), "clients": CLIENT, "measured": MEASURED,
               "peer_serve_args": list(PEER_SERVE_ARGS), "points": [],
               "loadavg_before": os.getloadavg()}
        self.results["pathlen"] = out
        for qd in c["qds"]:
            runs = {x: [] for x in EXPORTS}
            for _ in range(c["reps"]):
                for x in EXPORTS:
                    runs[x].append(long_minus_short(lambda secs, x=x: self.pathlen_life(x, qd, secs),
                                                    c["short_s"], c["long_s"], x))
            for x in EXPORTS:
                e = dict({"export": x, "backend": "null", "pattern": "randread", "bs": 4096, "qd": qd,
                          "client": CLIENT[x], "runs": runs[x]}, **ir_summary(runs[x]))
                out["points"].append(e)
                log(f"pathlen: {x:<12} 4K randread QD{qd:<3} {e['ir_per_io']:>9.0f} instructions/IO "
                    f"(spread {100 * e['spread']:.1f} %, {len(runs[x])} repetitions)")
        out["loadavg_after"] = os.getloadavg()

    def pathlen_life(self, export, qd, secs):
        """One whole life of the server measured for `export`, `secs` of 4 KiB random reads at
        `qd`: its instructions and I/Os."""
        if export == "vhost-user":
            return self.callgrind_run("flashpath", ("randread", 4096, qd, 1, True), secs)
        if export == "nbd":
            return self.under_callgrind(export, lambda wrap, name: self.pathlen_nbd(wrap, name, qd, secs))
        return self.under_callgrind(export, lambda wrap, name: self.pathlen_nvmf(
            export == "nvmf-target", wrap, name, qd, secs))

    def pathlen_nbd(self, wrap, name, qd, secs):
        """flashpath (under `wrap`) exporting a 1 GiB null disk over NBD on a Unix socket, fio's
        nbd engine on the client CPU for `secs`."""
        fp = Flashpath(self.args.bin_dir, self.work, str(self.server_cpu), name=name, wrap=wrap)
        try:
            sock = os.path.join(fp.dir, "nbd.sock")
            fp.rpc("bdev_null_create", {"name": "Null0", "num_blocks": GIB // 512, "block_size": 512})
            fp.rpc("nbd_start_disk", {"bdev_name": "Null0", "nbd_device": sock})
            wait_for(lambda: os.path.exists(sock), 30, f"flashpath NBD socket {sock}", fp.proc)
            r = fio_nbd(f"nbd+unix:///Null0?socket={sock}", "randread", 4096, qd, self.client_cpu, secs)
        finally:
            fp.stop()
        if r["errors"]:
            raise RuntimeError(f"NBD under callgrind: fio reported error {r['errors']}")
        return {"seconds": secs, "ios": r["ios"], "iops": r["iops"]}

    def pathlen_nvmf(self, target_measured, wrap, name, qd, secs):
        """Flashpath A serving a 1 GiB null disk over NVMe/TCP on 127.0.0.1 (serve_disk: the
        calls the NVMe/TCP section makes), flashpath B attached to it (bdev_nvme_attach_controller,
        TCP) exporting the namespace over vhost-user (one queue), fp-load on B for `secs` on the
        client CPU. The side measured (A if `target_measured`, else B) runs under `wrap` on the
        server CPU, the other natively with PEER_SERVE_ARGS: B on the client CPU, A on the
        server CPU."""
        a_cpu = str(self.server_cpu)
        b_cpu = str(self.client_cpu if target_measured else self.server_cpu)
        port = free_port()
        a = Flashpath(self.args.bin_dir, self.work, a_cpu, name=f"{name}-target",
                      wrap=wrap if target_measured else (), extra=() if target_measured else PEER_SERVE_ARGS)
        b = None
        try:
            nqn = serve_disk(a, "null", GIB, port)
            b = Flashpath(self.args.bin_dir, self.work, b_cpu, name=f"{name}-host",
                          wrap=() if target_measured else wrap, extra=PEER_SERVE_ARGS if target_measured else ())
            bdevs = b.rpc("bdev_nvme_attach_controller", attach_params(port, nqn))
            sock = b.export(VHOST_CTRLR, bdevs[0] if bdevs else f"{NVME_NAME}n1", queues=1)
            poll = CLIENT["nvmf-target" if target_measured else "nvmf-host"] == "poll"
            res = self.loader.run(sock, "randread", 4096, qd, 1, poll, secs)
        finally:
            # The host first: its controller disconnects from a target that is still there.
            if b is not None:
                b.stop()
            a.stop()
        if res["errors"]:
            raise RuntimeError(f"NVMe/TCP under callgrind: {res['errors']} requests failed "
                               f"(first {res['first_error']})")
        return {"seconds": secs, "ios": res["ios"], "iops": res["iops"]}
