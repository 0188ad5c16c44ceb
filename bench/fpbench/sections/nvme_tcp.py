"""The NVMe/TCP initiator (issue 25, `--only nvme-tcp`, or a whole run with `--spdk DIR`):
flashpath's vhost export of a bdev_nvme namespace reached over TCP against SPDK's vhost target
with its own bdev_nvme over TCP, both attached to one SPDK nvmf_tgt serving a null bdev on
127.0.0.1, both driven by the same vhost-user client (fp-load --hugetlb, as the SPDK section),
interleaved point by point. The initiators run on the server CPU; the target and the client
share the client CPU. Never part of CI: it needs a built SPDK.
"""

import os

from fpbench.common import GIB, log, median, proc_cpu, ratio
from fpbench.load import measure, point_key, point_label, summarize
from fpbench.sections.nvmf import NvmfTgt, free_port, serve_disk
from fpbench.sections.spdk import CLIENT, HugePages
from fpbench.servers import Flashpath, Spdk, wait_for
from fpbench.syscalls import SyscallCounter
from fpbench.syscalls import method as syscall_method

INITIATORS = ("flashpath", "spdk")
# The controller's name on both initiators (its namespace's bdev is "<name>n1") and the vhost
# controller exporting that bdev.
NVME_NAME = "Nvme0"
VHOST_CTRLR = "vhost.nvme"
# (pattern, bs, qd, queues, poll) as the other sections write them: one virtqueue; the client
# polls its used ring ("poll") or sleeps on its completion fd ("fd").
POINTS = [("randread", 4096, qd, 1, poll) for qd in (1, 32) for poll in (True, False)]
CONFIG = {
    "full": {"secs": 3.0, "reps": 3, "size": GIB, "points": POINTS},
    "quick": {"secs": 2.0, "reps": 2, "size": GIB, "points": POINTS},
    "smoke": {"secs": 1.0, "reps": 1, "size": GIB, "points": POINTS},
}
# What this machine's SPDK v23.01 offers for the target's idle CPU, found by trying it: nvmf_tgt
# has no --interrupt-mode option, and the TCP transport has no interrupt support in 23.01 (only
# vfio-user does), so the target polls the client's CPU all the time, for both initiators alike.
TARGET_MODE = ("polling: SPDK v23.01's nvmf_tgt has no --interrupt-mode option and its TCP transport "
               "no interrupt support (only vfio-user has), so its reactor spins on the client CPU during "
               "every run, the same for both initiators")


def nvme_tcp_config(mode):
    return CONFIG[mode]


def nvme_tcp_missing(spdk_dir):
    """What the section needs from `spdk_dir` and lacks (nvmf_tgt and vhost)."""
    if not spdk_dir:
        return ["--spdk DIR (a built SPDK v23.01.1: build/bin/nvmf_tgt, build/bin/vhost)"]
    need = [os.path.join(spdk_dir, "build", "bin", b) for b in ("nvmf_tgt", "vhost")]
    return [p for p in need if not os.access(p, os.X_OK)]


def attach_params(port, nqn):
    """bdev_nvme_attach_controller's parameters (SPDK's names), the same for both initiators."""
    return {"name": NVME_NAME, "trtype": "TCP", "adrfam": "IPv4", "traddr": "127.0.0.1",
            "trsvcid": str(port), "subnqn": nqn}


def shared_cpu_bound(target_busy_ns_per_io, client_cpu_ns_per_io):
    """The client CPU's bound, in IOPS: the target and the client share that CPU, so no
    initiator, even one costing nothing, gets more I/Os through than one over their work per
    I/O there (the target's busy time, not its idle polling, which yields to the client)."""
    if not target_busy_ns_per_io or not client_cpu_ns_per_io:
        return None
    return 1e9 / (target_busy_ns_per_io + client_cpu_ns_per_io)


def summarize_nvme_tcp(runs):
    out = summarize(runs)
    for k in ("target_cpu_ns_per_io", "target_busy_ns_per_io", "server_wait_share", "client_cpu_ns_per_io",
              "shared_cpu_bound_iops"):
        out[k] = median([r.get(k) for r in runs])
    xs = [r["iops"] for r in runs]
    out["iops_spread"] = (max(xs) - min(xs)) / out["iops"] if out.get("iops") else None
    return out


def nvme_tcp_ratios(e):
    """flashpath / SPDK of a point's medians (IOPS: higher is better; the rest lower)."""
    f, s = e["servers"]["flashpath"]["median"], e["servers"]["spdk"]["median"]
    keys = {"iops": "iops", "p50": "p50_ns", "p99": "p99_ns", "server_cpu_per_io": "server_cpu_ns_per_io",
            "reactor_busy_per_io": "reactor_busy_ns_per_io", "target_busy_per_io": "target_busy_ns_per_io"}
    return {k: ratio(f.get(m), s.get(m)) for k, m in keys.items()}


class NvmeTcpSection:
    """Bench's methods for this section (mixed into bench.Bench)."""

    def run_nvme_tcp(self):
        c = dict(nvme_tcp_config(self.args.mode))
        # --time and --reps override the mode's, as they do for the matrix.
        c.update({k: v for k, v in (("secs", self.args.time), ("reps", self.args.reps)) if v})
        how, why = syscall_method()
        out = {"dir": self.args.spdk, "config": c, "client": "fp-load " + " ".join(CLIENT), "points": [],
               "target_mode": TARGET_MODE, "loadavg_before": os.getloadavg(), "syscall_method": how,
               "syscall_note": why}
        self.results["nvme_tcp"] = out
        with HugePages():
            self.nvme_tcp_rounds(c, out)
        out["loadavg_after"] = os.getloadavg()

    def nvme_tcp_rounds(self, c, out):
        servers, socks = {}, {}
        tgt = NvmfTgt(self.args.spdk, self.work, self.client_cpu, name="spdk-nvmf-nvme-tcp")
        try:
            out["version"] = tgt.version()
            port = free_port()
            nqn = serve_disk(tgt, "null", c["size"], port)
            out["target"] = {"cpu": self.client_cpu, "cmd": " ".join(tgt.cmd), "nqn": nqn, "port": port,
                             "bdev": f"bdev_null_create Null0 {c['size'] // 512} blocks of 512 bytes"}
            params = attach_params(port, nqn)
            out["attach"] = params
            fp = servers["flashpath"] = Flashpath(self.args.bin_dir, self.work, str(self.server_cpu),
                                                  name="flashpath-nvme-tcp")
            bdevs = fp.rpc("bdev_nvme_attach_controller", params)
            socks["flashpath"] = fp.export(VHOST_CTRLR, bdevs[0], queues=1)
            sp = servers["spdk"] = Spdk(self.args.spdk, self.work, self.server_cpu, name="spdk-vhost-nvme-tcp")
            bdevs = sp.rpc("bdev_nvme_attach_controller", params)
            sp.rpc("vhost_create_blk_controller", {"ctrlr": VHOST_CTRLR, "dev_name": bdevs[0],
                                                   "cpumask": hex(1 << self.server_cpu)})
            socks["spdk"] = os.path.join(sp.vhost_dir, VHOST_CTRLR)
            wait_for(lambda: os.path.exists(socks["spdk"]), 10, f"SPDK socket {socks['spdk']}", sp.proc)
            out["initiators"] = {"flashpath": " ".join(fp.proc.args), "spdk": " ".join(sp.cmd)}
            # SPDK's reactor polls its core even when idle: frozen outside its own runs (its
            # keep-alive to the target is sent every few seconds; a pause lasts one run).
            sp.pause()
            for point in c["points"]:
                pk = point_key("null", point)
                runs = {k: [] for k in INITIATORS}
                for _ in range(c["reps"]):
                    for kind in INITIATORS:
                        runs[kind].append(self.nvme_tcp_measure(servers[kind], tgt, socks[kind], point, c["secs"]))
                e = dict(pk, servers={k: {"runs": runs[k], "median": summarize_nvme_tcp(runs[k])}
                                      for k in INITIATORS})
                if out["syscall_method"]:
                    # One more run per initiator with the target's and the initiator's system
                    # calls counted (not in the medians: counting slows every call a little).
                    for kind in INITIATORS:
                        e["servers"][kind]["traced"] = self.nvme_tcp_measure(
                            servers[kind], tgt, socks[kind], point, c["secs"], out["syscall_method"])
                e["ratios"] = nvme_tcp_ratios(e)
                out["points"].append(e)
                md = {k: e["servers"][k]["median"] for k in INITIATORS}
                log(f"{point_label(pk):<30} flashpath {md['flashpath']['iops']:>9.0f} IOPS  spdk "
                    f"{md['spdk']['iops']:>9.0f} IOPS  fp/spdk "
                    + (f"{e['ratios']['iops']:.2f}x" if e["ratios"]["iops"] else "-"))
        finally:
            for s in servers.values():
                s.stop()
            tgt.stop()

    def nvme_tcp_measure(self, server, tgt, sock, point, secs, trace=None):
        """`measure` with the SPDK section's client (SPDK's vhost thawed for its run), plus the
        target's CPU time and reactor busy time per I/O over the run; `trace` ("perf" or
        "strace"): the target's and the initiator's system calls counted over the run too."""
        if server.kind == "spdk":
            server.resume()
        counters = {}
        try:
            if trace:
                counters = {"target": SyscallCounter(tgt.pid, trace, self.work),
                            "initiator": SyscallCounter(server.pid, trace, self.work)}
            for x in counters.values():
                x.start()
            w0, c0, b0 = proc_cpu(server.pid)["wait_ns"], proc_cpu(tgt.pid), tgt.reactors()
            r = measure(server, self.loader, sock, point, secs, False, extra=CLIENT)
            w1, c1, b1 = proc_cpu(server.pid)["wait_ns"], proc_cpu(tgt.pid), tgt.reactors()
            calls = {k: x.stop() for k, x in counters.items()}
        finally:
            if server.kind == "spdk":
                server.pause()
        ios = r["ios"]
        for k, v in calls.items():
            r[f"{k}_syscalls"] = v
            r[f"{k}_syscalls_per_io"] = v["total"] / ios if ios else None
        busy = sum(b1[k]["busy"] - b0[k]["busy"] for k in b1)
        r["target_cpu_ns_per_io"] = (c1["sched_ns"] - c0["sched_ns"]) / ios if ios else None
        r["target_busy_ns_per_io"] = busy / ios if ios else None
        r["shared_cpu_bound_iops"] = shared_cpu_bound(r["target_busy_ns_per_io"], r.get("client_cpu_ns_per_io"))
        # The share of the run the initiator was runnable while something else had its CPU:
        # more than a few % means the run measured the machine's other load too.
        r["server_wait_share"] = (w1 - w0) / 1e9 / r["elapsed_s"] if r["elapsed_s"] else None
        return r
