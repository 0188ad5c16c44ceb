"""TLS (`--only tls`): NVMe/TCP with TLS 1.3 against plain NVMe/TCP, the same target, initiator,
disk and client, interleaved run by run.

Target: flashpath alone on the server CPU (the side measured, as in the NVMe/TCP section)
serving two RAM disks over NVMe/TCP on 127.0.0.1, each in its own subsystem: one open to any
host on a plain listener, one on a `secure_channel` listener whose host is added with a PSK
(`nvmf_subsystem_add_host psk`, a keyring key in the interchange format). Initiator: flashpath
on the client CPU attaches both (`bdev_nvme_attach_controller`, the second with `psk`) and
exports each namespace over vhost-user to fp-load beside it (one queue, sleeping on its
completion fd: two pollers on one CPU would take turns by the scheduler's slices). Each point
(4 KiB randread at QD 32 and QD 1) runs plain then TLS, repetition after repetition, so the two
see the same machine. The figures: IOPS and the ratio TLS / plain, the target's reactor busy
time per I/O (its work per I/O: both sides encrypt and decrypt every PDU), the target's CPU
time per I/O (with the kernel's share of its system calls), and the initiator's reactor busy
time per I/O.

The floor: the cipher itself. Every 4 KiB read leaves the target as at least 4 KiB of AES-GCM
(TLS_AES_128_GCM_SHA256, the suite of a SHA-256 PSK), so `openssl speed -evp aes-128-gcm
-bytes 4096` on the target's CPU, once per repetition between the runs, gives what encrypting
the data alone costs per I/O; the plain target's busy time plus that is the least a TLS target
can cost, and plain / (plain + cipher) the best ratio any TLS target reaches beside this plain
one.

docs/benchmarks.md, "TLS", describes every step. Never in CI: a benchmark, not a test.
"""

import base64
import os
import zlib

from fpbench.common import MIB, keyring_files, log, median, ratio
from fpbench.load import measure
from fpbench.modes import tls_config
from fpbench.sections.nvmf import free_port
from fpbench.sections.crypto import parse_openssl_mr, run_timed
from fpbench.servers import Flashpath

VARIANTS = ("plain", "tls")
NQN = "nqn.2016-06.io.spdk:fpbench-tls-{variant}"
HOST_NQN = "nqn.2014-08.org.nvmexpress:uuid:5e1ec7ed-0000-4000-8000-0000000000fa"
KEY_NAME = "tls-psk0"
# The goal: 4 KiB randread QD32 over TLS at >= 0.8x the plain TCP figure.
GOAL_RATIO = 0.8
GOAL_POINT = ("randread", 4096, 32)
# The cipher of a SHA-256 PSK's suite, and the bytes of one read's data.
CIPHER = "aes-128-gcm"
CIPHER_BYTES = 4096


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


def cipher_floor(rows):
    """The cipher's cost of one read's data, in ns: the median of the `openssl speed` rows
    (bytes per second each)."""
    rate = median([r["bytes_per_sec"] for r in rows])
    return CIPHER_BYTES / rate * 1e9 if rate else None


def floor_bound(plain_busy_ns, cipher_ns):
    """The best TLS / plain ratio of a target whose plain path costs `plain_busy_ns` per I/O
    when TLS adds the cipher's `cipher_ns` and nothing else; None without both."""
    if plain_busy_ns is None or cipher_ns is None or plain_busy_ns + cipher_ns <= 0:
        return None
    return plain_busy_ns / (plain_busy_ns + cipher_ns)


def summarize_tls(runs, points, cipher_ns=None):
    """Per point and variant, the medians over the repetitions; per point the ratios TLS / plain
    (IOPS, initiator busy per I/O, target CPU per I/O), from the medians."""
    keys = ("iops", "p50_ns", "p99_ns", "target_busy_ns_per_io", "target_cpu_ns_per_io", "initiator_busy_ns_per_io")
    out = []
    for p in points:
        row = {"point": list(p)}
        for v in VARIANTS:
            rs = [r for r in runs if tuple(r["point"]) == tuple(p) and r["variant"] == v]
            row[v] = {k: median([r.get(k) for r in rs]) for k in keys}
            row[v]["runs"] = len(rs)
        row["ratio"] = {k: ratio(row["tls"][k], row["plain"][k])
                        for k in ("iops", "target_busy_ns_per_io", "target_cpu_ns_per_io", "initiator_busy_ns_per_io")}
        plain_busy = row["plain"]["target_busy_ns_per_io"]
        row["floor"] = {"cipher_ns_per_io": cipher_ns, "bound": floor_bound(plain_busy, cipher_ns),
                        "target_busy_ns_per_io": None if plain_busy is None or cipher_ns is None
                        else plain_busy + cipher_ns}
        # The TLS target's busy time over the floor's (1.0: nothing above the cipher).
        row["floor"]["over"] = ratio(row["tls"]["target_busy_ns_per_io"], row["floor"]["target_busy_ns_per_io"])
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
            tgt = Flashpath(self.args.bin_dir, self.work, str(self.server_cpu), name="flashpath-tls-target")
            host = Flashpath(self.args.bin_dir, self.work, str(self.client_cpu), name="flashpath-tls-host")
            keyring_files(os.path.join(self.work, "tls-keys"), {KEY_NAME: tls_psk_interchange(os.urandom(32))},
                          (tgt, host))
            tgt.rpc("nvmf_create_transport", {"trtype": "TCP"})
            socks, setup = {}, {"target_cpu": self.server_cpu, "host_cpu": self.client_cpu,
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
            out["cipher"] = []
            for rep in range(c["reps"]):
                out["cipher"].append(self.tls_cipher(tgt))
                for p in points:
                    for v in VARIANTS:
                        r = self.tls_measure(tgt, host, socks[v], p, c["secs"])
                        r.update(variant=v, point=list(p), rep=rep)
                        out["runs"].append(r)
                        log(f"tls: {v:<5} {point_name(p):<22} {r['iops']:>9,.0f} IOPS, target busy "
                            f"{(r.get('target_busy_ns_per_io') or 0) / 1000:.2f} µs/IO, CPU "
                            f"{(r.get('target_cpu_ns_per_io') or 0) / 1000:.2f} µs/IO; initiator busy "
                            f"{(r.get('initiator_busy_ns_per_io') or 0) / 1000:.2f} µs/IO")
            out["cipher"].append(self.tls_cipher(tgt))
            cipher_ns = cipher_floor(out["cipher"])
            out["summary"] = summarize_tls(out["runs"], points, cipher_ns)
            for row in out["summary"]:
                f = row["floor"]
                log(f"tls: {point_name(tuple(row['point']))}: TLS / plain IOPS {row['ratio']['iops']:.2f}x; the cipher "
                    f"{cipher_ns / 1000:.2f} µs per 4 KiB, bound {f['bound'] or 0:.2f}x, TLS target busy "
                    f"{f['over'] or 0:.2f}x the floor's")
        finally:
            out["loadavg_after"] = os.getloadavg()
            if host is not None:
                host.stop()
            if tgt is not None:
                tgt.stop()

    def tls_cipher(self, tgt):
        """`openssl speed` of the suite's cipher on 4 KiB buffers, on the target's CPU (the
        target idle meanwhile), for one second."""
        cmd = ["taskset", "-c", str(self.server_cpu), "openssl", "speed", "-mr", "-elapsed", "-seconds", "1",
               "-bytes", str(CIPHER_BYTES), "-evp", CIPHER]
        out, wall, cpu = run_timed(cmd, 60)
        r = parse_openssl_mr(out, CIPHER_BYTES)
        r.update(wall_s=wall, cpu_s=cpu)
        log(f"tls: openssl speed {CIPHER} {CIPHER_BYTES} B: {r['bytes_per_sec'] / 1e9:.2f} GB/s")
        return r

    def tls_measure(self, tgt, host, sock, p, secs):
        """One fp-load run (completion fd, one queue) with the target's reactor and CPU deltas
        and the initiator's reactor deltas."""
        pattern, bs, qd = p
        h0 = host.reactors()
        r = measure(tgt, self.loader, sock, (pattern, bs, qd, 1, False), secs, False)
        h1 = host.reactors()
        ios = r["ios"]
        r["target_busy_ns_per_io"] = r.get("reactor_busy_ns_per_io")
        r["target_cpu_ns_per_io"] = r.get("server_cpu_ns_per_io")
        busy = sum(h1[k]["busy"] - h0[k]["busy"] for k in h1)
        r["initiator_busy_ns_per_io"] = busy / ios if ios else None
        return r
