"""TLS (`--only tls`): NVMe/TCP with TLS 1.3 against plain NVMe/TCP, the same target, initiator,
disk and client, interleaved run by run.

Target: flashpath (client CPU) serving two RAM disks over NVMe/TCP on 127.0.0.1, each in its own
subsystem: one open to any host on a plain listener, one on a `secure_channel` listener whose
host is added with a PSK (`nvmf_subsystem_add_host psk`, a keyring key in the interchange
format). Initiator: flashpath (server CPU) attaches both (`bdev_nvme_attach_controller`, the
second with `psk`) and exports each namespace over vhost-user to fp-load (client CPU, polling,
one queue). Each point (4 KiB randread at QD 32 and QD 1) runs plain then TLS, repetition after
repetition, so the two see the same machine. The figures: IOPS and the ratio TLS / plain, the
initiator's reactor busy time per I/O and the target's CPU time per I/O (both sides encrypt).

docs/benchmarks.md, "TLS", describes every step. Never in CI: a benchmark, not a test.
"""

import base64
import os
import zlib

from fpbench.common import MIB, log, median, proc_cpu, ratio
from fpbench.load import measure
from fpbench.modes import tls_config
from fpbench.sections.nvmf import free_port
from fpbench.servers import Flashpath

VARIANTS = ("plain", "tls")
NQN = "nqn.2016-06.io.spdk:fpbench-tls-{variant}"
HOST_NQN = "nqn.2014-08.org.nvmexpress:uuid:5e1ec7ed-0000-4000-8000-0000000000fa"
KEY_NAME = "tls-psk0"
# The goal: 4 KiB randread QD32 over TLS at >= 0.8x the plain TCP figure.
GOAL_RATIO = 0.8
GOAL_POINT = ("randread", 4096, 32)


def tls_psk_interchange(key, hash_id=1):
    """A configured PSK in the NVMe TLS PSK interchange format, as `nvme gen-tls-key` writes it:
    `NVMeTLSkey-1:<hh>:<base64(key || CRC-32(key), little-endian)>:` (hh 01: SHA-256, 32 bytes;
    02: SHA-384, 48 bytes)."""
    want = {1: 32, 2: 48}[hash_id]
    if len(key) != want:
        raise ValueError(f"a PSK for hash {hash_id:02} is {want} bytes, not {len(key)}")
    crc = zlib.crc32(key).to_bytes(4, "little")
    return f"NVMeTLSkey-1:{hash_id:02}:{base64.b64encode(key + crc).decode()}:"


def point_name(p):
    pattern, bs, qd = p
    return f"{pattern} {bs // 1024} KiB QD{qd}"


def summarize_tls(runs, points):
    """Per point and variant, the medians over the repetitions; per point the ratios TLS / plain
    (IOPS, initiator busy per I/O, target CPU per I/O), from the medians."""
    keys = ("iops", "p50_ns", "p99_ns", "reactor_busy_ns_per_io", "target_cpu_ns_per_io")
    out = []
    for p in points:
        row = {"point": list(p)}
        for v in VARIANTS:
            rs = [r for r in runs if tuple(r["point"]) == tuple(p) and r["variant"] == v]
            row[v] = {k: median([r.get(k) for r in rs]) for k in keys}
            row[v]["runs"] = len(rs)
        row["ratio"] = {k: ratio(row["tls"][k], row["plain"][k])
                        for k in ("iops", "reactor_busy_ns_per_io", "target_cpu_ns_per_io")}
        out.append(row)
    return out


class TlsSection:
    """Bench's methods for this section (mixed into bench.Bench)."""

    def run_tls(self):
        c = dict(tls_config(self.args.mode))
        c.update({k: v for k, v in (("secs", self.args.time), ("reps", self.args.reps)) if v})
        points = [tuple(p) for p in c["points"]]
        out = {"config": c, "loadavg_before": os.getloadavg(), "runs": []}
        self.results["tls"] = out
        tgt = host = None
        try:
            tgt = Flashpath(self.args.bin_dir, self.work, str(self.client_cpu), name="flashpath-tls-target")
            host = Flashpath(self.args.bin_dir, self.work, str(self.server_cpu), name="flashpath-tls-host")
            keydir = os.path.join(self.work, "tls-keys")
            os.makedirs(keydir, mode=0o700, exist_ok=True)
            path = os.path.join(keydir, KEY_NAME)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(tls_psk_interchange(os.urandom(32)))
            for d in (tgt, host):
                d.rpc("keyring_file_add_key", {"name": KEY_NAME, "path": path})
            tgt.rpc("nvmf_create_transport", {"trtype": "TCP"})
            socks, setup = {}, {"target_cpu": self.client_cpu, "host_cpu": self.server_cpu,
                                "client_cpu": self.client_cpu, "disk_mib": c["size_mib"], "host_nqn": HOST_NQN}
            for i, v in enumerate(VARIANTS):
                nqn = NQN.format(variant=v)
                port = free_port()
                bdev = f"Malloc{i}"
                tgt.rpc("bdev_malloc_create", {"name": bdev, "num_blocks": c["size_mib"] * MIB // 512,
                                               "block_size": 512})
                tgt.rpc("nvmf_create_subsystem", {"nqn": nqn, "allow_any_host": v == "plain",
                                                  "serial_number": f"FPBENCHTLS{i}"})
                tgt.rpc("nvmf_subsystem_add_ns", {"nqn": nqn, "namespace": {"bdev_name": bdev}})
                listen = {"trtype": "TCP", "adrfam": "IPv4", "traddr": "127.0.0.1", "trsvcid": str(port)}
                attach = {"name": f"Nvme{i}", "trtype": "TCP", "adrfam": "IPv4", "traddr": "127.0.0.1",
                          "trsvcid": str(port), "subnqn": nqn, "hostnqn": HOST_NQN}
                if v == "tls":
                    tgt.rpc("nvmf_subsystem_add_listener", {"nqn": nqn, "listen_address": listen,
                                                            "secure_channel": True})
                    tgt.rpc("nvmf_subsystem_add_host", {"nqn": nqn, "host": HOST_NQN, "psk": KEY_NAME})
                    attach["psk"] = KEY_NAME
                else:
                    tgt.rpc("nvmf_subsystem_add_listener", {"nqn": nqn, "listen_address": listen})
                host.rpc("bdev_nvme_attach_controller", attach)
                socks[v] = host.export(f"vhost.tls.{v}", f"Nvme{i}n1", queues=1)
                setup[v] = {"nqn": nqn, "port": port, "attach": attach}
            out["setup"] = setup
            # Every block written once, so that no read meets a page never written.
            for v in VARIANTS:
                self.loader.run(socks[v], "write", 131072, 8, 1, True, c["fill_secs"])
            for rep in range(c["reps"]):
                for p in points:
                    for v in VARIANTS:
                        r = self.tls_measure(tgt, host, socks[v], p, c["secs"])
                        r.update(variant=v, point=list(p), rep=rep)
                        out["runs"].append(r)
                        log(f"tls: {v:<5} {point_name(p):<22} {r['iops']:>9,.0f} IOPS, initiator busy "
                            f"{(r.get('reactor_busy_ns_per_io') or 0) / 1000:.2f} µs/IO, target CPU "
                            f"{(r.get('target_cpu_ns_per_io') or 0) / 1000:.2f} µs/IO")
            out["summary"] = summarize_tls(out["runs"], points)
            for row in out["summary"]:
                log(f"tls: {point_name(tuple(row['point']))}: TLS / plain IOPS {row['ratio']['iops']:.2f}x")
        finally:
            out["loadavg_after"] = os.getloadavg()
            if host is not None:
                host.stop()
            if tgt is not None:
                tgt.stop()

    def tls_measure(self, tgt, host, sock, p, secs):
        """One fp-load run (polling, one queue) with the initiator's reactor deltas and the
        target's CPU time."""
        pattern, bs, qd = p
        t0 = proc_cpu(tgt.pid)
        r = measure(host, self.loader, sock, (pattern, bs, qd, 1, True), secs, False)
        t1 = proc_cpu(tgt.pid)
        r["target_cpu_ns"] = t1["sched_ns"] - t0["sched_ns"]
        r["target_cpu_ns_per_io"] = r["target_cpu_ns"] / r["ios"] if r["ios"] else None
        return r
