"""AES-XTS (issue 27, `--only crypto`): the crypto bdev's cipher on one core against `openssl speed`,
and 4 KiB QD32 randread and randwrite on an encrypted RAM disk against a plain one, with
qemu-storage-daemon's LUKS driver beside it as the peer. docs/benchmarks.md, "AES-XTS (issue 27)",
describes every step. Never in CI: a benchmark, not a test.
"""

import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time

from fpbench.common import MIB, log, median, proc_cpu, ratio, wait_for, write_random_file
from fpbench.load import measure, point_key, summarize
from fpbench.servers import CHILDREN, Flashpath, spawn, stop

# Buffer sizes of the cipher part: a 512-byte sector, a 4 KiB block (the data path's I/O), and
# 16 KiB (four 4 KiB units: what a larger request costs per byte).
SIZES = (512, 4096, 16384)
# XTS key sizes: 512 bits is AES-256-XTS (two 256-bit halves; the target, LUKS's default),
# 256 bits AES-128-XTS.
KEY_BITS = (512, 256)
OPS = ("encrypt", "decrypt")
# xts_speed's runs: "flashpath", the engine the crypto bdev's channels use on this host (OpenSSL's
# libcrypto where it loads; judged), and "fallback", the XTS over the `aes` crate that they use where
# it does not (`--engine rust`; reported).
ENGINES = {"flashpath": [], "fallback": ["--engine", "rust"]}
# The data path's points: (pattern, bs, qd, queues, poll) as the other sections write them.
POINTS = [(pattern, 4096, 32, 1, True) for pattern in ("randread", "randwrite")]
# The cipher operation each pattern's I/O needs: a read is decrypted, a write encrypted.
PATTERN_OP = {"randread": "decrypt", "randwrite": "encrypt"}
# The disks: flashpath's plain RAM disk and two crypto bdevs over RAM disks on one daemon, qsd's raw
# file on tmpfs and a LUKS image on tmpfs on one qsd.
#   fp-plain:      malloc bdev, 4096-byte blocks
#   fp-crypto:     crypto bdev over a malloc bdev with 4096-byte blocks: one 4 KiB XTS unit per
#                  I/O, as openssl's 4096-byte figure (the target's bound)
#   fp-crypto-512: the same over 512-byte blocks: eight 512-byte units per I/O, as LUKS does
#   qsd-raw:       driver=file on /dev/shm (io_uring, page cache), as the other sections' RAM disk
#   qsd-luks:      driver=luks over the same kind of file (aes-256-xts-plain64, 512-byte sectors)
FP_VARIANTS = ("fp-plain", "fp-crypto", "fp-crypto-512")
QSD_VARIANTS = ("qsd-raw", "qsd-luks")
VARIANTS = FP_VARIANTS + QSD_VARIANTS
CONFIG = {
    "full": {"cipher_secs": 3, "cipher_reps": 3, "secs": 3.0, "reps": 3, "size": 256 * MIB},
    "quick": {"cipher_secs": 1, "cipher_reps": 2, "secs": 2.0, "reps": 2, "size": 256 * MIB},
    "smoke": {"cipher_secs": 1, "cipher_reps": 1, "secs": 1.0, "reps": 1, "size": 32 * MIB},
}
# Issue 27's bar for both targets: flashpath at least this share of openssl's figure.
TARGET = 0.8
# A cipher run whose process got less than this share of a CPU over its wall time shared the core
# with something else; the report marks such runs.
CLEAN_CPU_SHARE = 0.95


def crypto_config(mode):
    return CONFIG[mode]


def openssl_cipher(bits):
    """openssl's name for XTS with a key of `bits` bits (both halves)."""
    return f"aes-{bits // 2}-xts"


def crypto_missing(bin_dir):
    """What the section needs and this machine lacks."""
    missing = [t for t in ("openssl", "qemu-img", "qemu-storage-daemon", "taskset") if shutil.which(t) is None]
    if not os.access(xts_speed_path(bin_dir), os.X_OK):
        missing.append(f"{xts_speed_path(bin_dir)} (cargo build --release -p fp-crypto --example xts_speed)")
    return missing


def cipher_cpu_flags():
    """The CPU features AES-XTS speed depends on (AES-NI; VAES and VPCLMULQDQ let a cipher do
    several blocks per instruction; AVX-512), as /proc/cpuinfo lists them."""
    with open("/proc/cpuinfo") as f:
        flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    return [x for x in ("aes", "pclmulqdq", "avx2", "vaes", "vpclmulqdq", "avx512f") if x in flags]


def xts_speed_path(bin_dir):
    return os.path.join(bin_dir, "examples", "xts_speed")


def run_timed(cmd, timeout):
    """Runs `cmd` to its end; (its stdout and stderr together, wall seconds, the CPU seconds it used).
    The CPU time comes from wait4's rusage: a run that got less than a whole core over its wall time
    shared the core with something else."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    CHILDREN.append(p)
    timer = threading.Timer(timeout, p.kill)
    t0 = time.monotonic()
    timer.start()
    try:
        out = p.stdout.read()
    finally:
        timer.cancel()
    _, status, usage = os.wait4(p.pid, 0)
    wall = time.monotonic() - t0
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: exit {p.returncode}: {out.strip()[-2000:]}")
    return out, wall, usage.ru_utime + usage.ru_stime


def parse_openssl_mr(out, size):
    """Bytes per second from `openssl speed -mr` for one `-bytes size`: its `+R:count:name:seconds`
    line (count buffers of `size` bytes in that time); the `+F` line's own figure is kept beside
    it as a check."""
    m = re.search(r"^\+R:(\d+):([^:]+):([0-9.]+)\s*$", out, re.M)
    if not m:
        raise RuntimeError(f"openssl speed: no +R line in its output: {out.strip()[-500:]}")
    count, secs = int(m.group(1)), float(m.group(3))
    if secs <= 0 or count <= 0:
        raise RuntimeError(f"openssl speed: {count} buffers in {secs} s")
    f = re.search(r"^\+F:\d+:[^:]+:([0-9.]+)", out, re.M)
    return {"buffers": count, "seconds": secs, "bytes_per_sec": count * size / secs,
            "reported_bytes_per_sec": float(f.group(1)) if f else None}


def parse_xts_speed(out, sizes):
    """xts_speed's JSON lines (one per operation and size) for a run over `sizes` sizes."""
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    if len(rows) != sizes * len(OPS):
        raise RuntimeError(f"xts_speed: {len(rows)} result lines, want {sizes * len(OPS)}: {out.strip()[-500:]}")
    return rows


def xts_run(row, tool, bits, size, rep, cpu_share):
    """One of xts_speed's lines as a cipher figure. Per CPU second: its own figure where it gives
    one (`bytes_per_cpu_sec`: the operation's own CPU time, clock_gettime of the process's CPU clock),
    else the wall figure over the process's CPU share (both operations together)."""
    r = cipher_run({k: row[k] for k in ("unit", "bytes_per_sec", "ns_per_buffer")}, tool, bits, size, row["op"], rep,
                   cpu_share)
    r["engine"] = row.get("engine", "xts-mode")
    if row.get("bytes_per_cpu_sec"):
        r["bytes_per_cpu_sec"] = row["bytes_per_cpu_sec"]
        r["cpu_figure"] = "xts_speed"
    else:
        r["cpu_figure"] = "process share"
    return r


def cipher_run(r, tool, bits, size, op, rep, cpu_share):
    """One cipher figure: `r` (with `bytes_per_sec` by the wall clock) and where it came from, plus
    the same per second of CPU the process got (cpu_share: its CPU time over its wall time; the
    whole process's, both operations for xts_speed)."""
    return dict(r, tool=tool, bits=bits, bytes=size, op=op, rep=rep, cpu_share=cpu_share,
                bytes_per_cpu_sec=r["bytes_per_sec"] / cpu_share if cpu_share > 0 else None)


class QsdCrypto:
    """One qemu-storage-daemon on `cpu` with two exports on one iothread: `raw` (a file on tmpfs,
    through the page cache with io_uring, as the other sections' RAM disk) and `luks` (the LUKS
    driver over another such file, its passphrase from a secret object read from a file)."""
    kind = "qsd"

    def __init__(self, work, cpu, raw_path, luks_path, secret_path):
        self.name = "qsd-crypto"
        self.dir = os.path.join(work, self.name)
        os.makedirs(self.dir, exist_ok=True)
        self.socks = {"qsd-raw": os.path.join(self.dir, "vhost.raw"), "qsd-luks": os.path.join(self.dir, "vhost.luks")}
        file_opts = "driver=file,aio=io_uring,cache.direct=off"
        self.cmd = ["taskset", "-c", str(cpu), "qemu-storage-daemon",
                    "--object", "iothread,id=iot0",
                    "--object", f"secret,id=sec0,file={secret_path}",
                    "--blockdev", f"{file_opts},node-name=raw0,filename={raw_path}",
                    "--blockdev", f"{file_opts},node-name=lukfile0,filename={luks_path}",
                    "--blockdev", "driver=luks,node-name=luks0,file=lukfile0,key-secret=sec0"]
        for i, (node, sock) in enumerate((("raw0", self.socks["qsd-raw"]), ("luks0", self.socks["qsd-luks"]))):
            self.cmd += ["--export", f"type=vhost-user-blk,id=e{i},node-name={node},addr.type=unix,"
                                     f"addr.path={sock},writable=on,iothread=iot0,num-queues=2"]
        self.proc = spawn(self.cmd, os.path.join(self.dir, "qsd.log"))
        self.pid = self.proc.pid
        wait_for(lambda: all(os.path.exists(s) for s in self.socks.values()), 60,
                 "qemu-storage-daemon sockets", self.proc)

    def stop(self):
        stop(self.proc, 20)


class CryptoSection:
    """Bench's methods for this section (mixed into bench.Bench)."""

    def run_crypto(self):
        c = dict(crypto_config(self.args.mode))
        c.update({k: v for k, v in (("secs", self.args.time), ("reps", self.args.reps)) if v})
        out = {"config": dict(c, sizes=list(SIZES), key_bits=list(KEY_BITS), variants=list(VARIANTS)),
               "loadavg_before": os.getloadavg(), "cpu": self.server_cpu,
               "openssl_version": subprocess.run(["openssl", "version"], capture_output=True,
                                                 text=True).stdout.strip()}
        out["cpu_flags"] = cipher_cpu_flags()
        self.results["crypto"] = out
        self.crypto_cipher(c, out)
        self.crypto_datapath(c, out)
        out["loadavg_after"] = os.getloadavg()

    # -- 1. the cipher alone -------------------------------------------------------------------

    def crypto_cipher(self, c, out):
        """`openssl speed -elapsed -evp aes-{256,128}-xts` (encrypt, and `-decrypt`) for each size, and
        flashpath's `xts_speed` for each size (both operations in one process), both under `taskset -c
        <server CPU>`, `cipher_reps` rounds with the two tools alternating (the first of a round
        rotating). Each run's figure two ways: by the wall clock (`-elapsed`: openssl as xts_speed
        does), and per second of CPU the process got (the wall figure over the run's CPU share, from
        wait4's rusage): on a machine whose other work takes the core from a run, the second is
        the one core's worth the target speaks of, and the one judged."""
        secs = c["cipher_secs"]
        cpu = str(self.server_cpu)
        runs = []
        order = ["openssl", *ENGINES]
        for rep in range(c["cipher_reps"]):
            for bits in KEY_BITS:
                for tool in order:
                    for size in SIZES:
                        if tool == "openssl":
                            for op in OPS:
                                cmd = ["taskset", "-c", cpu, "openssl", "speed", "-elapsed", "-mr", "-seconds",
                                       str(secs), "-bytes", str(size), *(["-decrypt"] if op == "decrypt" else []),
                                       "-evp", openssl_cipher(bits)]
                                text, wall, cpu_s = run_timed(cmd, secs + 60)
                                runs.append(cipher_run(parse_openssl_mr(text, size), "openssl", bits, size, op, rep,
                                                       cpu_s / wall))
                        else:
                            cmd = ["taskset", "-c", cpu, xts_speed_path(self.args.bin_dir), "--bytes", str(size),
                                   "--seconds", str(secs), "--key-bits", str(bits), *ENGINES[tool]]
                            text, wall, cpu_s = run_timed(cmd, len(OPS) * secs + 60)
                            for row in parse_xts_speed(text, 1):
                                runs.append(xts_run(row, tool, bits, size, rep, cpu_s / wall))
            order = order[1:] + order[:1]
        rows = []
        for bits in KEY_BITS:
            for size in SIZES:
                for op in OPS:
                    def pick(tool):
                        return [r for r in runs if r["tool"] == tool and r["bits"] == bits and r["bytes"] == size
                                and r["op"] == op]
                    o, f = pick("openssl"), pick("flashpath")
                    row = {"bits": bits, "cipher": openssl_cipher(bits), "bytes": size, "op": op,
                           "min_cpu_share": min(r["cpu_share"] for r in o + f),
                           "flashpath_engine": f[0].get("engine") if f else None}
                    for tool in ("openssl", *ENGINES):
                        rs = pick(tool)
                        row[f"{tool}_runs"] = len(rs)
                        row[f"{tool}_bytes_per_sec"] = median([r["bytes_per_sec"] for r in rs])
                        row[f"{tool}_bytes_per_cpu_sec"] = median([r["bytes_per_cpu_sec"] for r in rs])
                    row["ratio"] = ratio(row["flashpath_bytes_per_cpu_sec"], row["openssl_bytes_per_cpu_sec"])
                    row["ratio_wall"] = ratio(row["flashpath_bytes_per_sec"], row["openssl_bytes_per_sec"])
                    row["fallback_ratio"] = ratio(row["fallback_bytes_per_cpu_sec"], row["openssl_bytes_per_cpu_sec"])
                    row["flashpath_ns_per_buffer"] = median([r["ns_per_buffer"] for r in f])
                    rows.append(row)
                    log(f"crypto cipher {openssl_cipher(bits)} {size:>5} B {op}: per CPU second openssl "
                        f"{row['openssl_bytes_per_cpu_sec'] / 1e6:,.0f} MB/s, flashpath "
                        f"{row['flashpath_bytes_per_cpu_sec'] / 1e6:,.0f} MB/s = {row['ratio']:.2f}x "
                        f"(wall clock {row['ratio_wall']:.2f}x, CPU share >= {row['min_cpu_share']:.0%})")
        out["cipher"] = {"runs": runs, "rows": rows}

    def openssl_bound(self, op, bits=512, size=4096):
        """openssl's `size`-byte buffers per second of one core for `op` (the median of this run's runs,
        per CPU second)."""
        for row in self.results["crypto"]["cipher"]["rows"]:
            if row["bits"] == bits and row["bytes"] == size and row["op"] == op:
                return row["openssl_bytes_per_cpu_sec"] / size
        return None

    # -- 2. the data path ----------------------------------------------------------------------

    def crypto_datapath(self, c, out):
        """One flashpath on the server CPU with fp-plain, fp-crypto and fp-crypto-512 exported, one
        qsd on the same CPU with qsd-raw and qsd-luks; every disk `size` bytes, written in full
        before measuring. Each point `reps` rounds over the five disks, the order rotating; fp-load
        (one polled queue) on the client CPU. Both daemons run throughout; the one not measured
        sleeps."""
        size = c["size"]
        shm = tempfile.mkdtemp(prefix="fp-bench-crypto.", dir="/dev/shm")
        fp = qsd = None
        try:
            fp = Flashpath(self.args.bin_dir, self.work, str(self.server_cpu), name="flashpath-crypto")
            fp.rpc("bdev_malloc_create", {"name": "Plain0", "num_blocks": size // 4096, "block_size": 4096})
            fp.rpc("bdev_malloc_create", {"name": "Base4k", "num_blocks": size // 4096, "block_size": 4096})
            fp.rpc("bdev_malloc_create", {"name": "Base512", "num_blocks": size // 512, "block_size": 512})
            # A throwaway random key for a RAM disk that ends with the run (it passes through the
            # CLI's command line, which only a benchmark may do).
            key, key2 = os.urandom(32).hex(), os.urandom(32).hex()
            fp.rpc("accel_crypto_key_create", {"cipher": "AES_XTS", "key": key, "key2": key2, "name": "bench0"})
            for name, base in (("Crypto4k", "Base4k"), ("Crypto512", "Base512")):
                fp.rpc("bdev_crypto_create", {"base_bdev_name": base, "name": name, "key_name": "bench0"})
            socks = {"fp-plain": fp.export("vhost.plain", "Plain0"),
                     "fp-crypto": fp.export("vhost.crypto", "Crypto4k"),
                     "fp-crypto-512": fp.export("vhost.crypto512", "Crypto512")}
            out["flashpath_bdevs"] = {b["name"]: {"block_size": b["block_size"], "num_blocks": b["num_blocks"],
                                                  "product_name": b.get("product_name")}
                                      for b in fp.rpc("bdev_get_bdevs")}
            for v in FP_VARIANTS:
                log(f"crypto: filling {v} ({size // MIB} MiB)")
                self.fill_ram(socks[v], size)
            raw = os.path.join(shm, "raw.img")
            log(f"crypto: writing {size // MIB} MiB of random data for qsd-raw: {raw}")
            write_random_file(raw, size)
            luks = os.path.join(shm, "disk.luks")
            secret = os.path.join(self.work, "luks.pass")
            with open(os.open(secret, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
                f.write(os.urandom(16).hex())
            # qemu's LUKS defaults: LUKS1, aes-256 xts plain64 (a 512-bit XTS key), sha256. A short
            # PBKDF time only shortens opening the image; preallocation=full writes every payload
            # page once, so no read meets a hole.
            t = time.monotonic()
            subprocess.run(["qemu-img", "create", "-q", "-f", "luks", "--object", f"secret,id=sec0,file={secret}",
                            "-o", "key-secret=sec0,iter-time=10,preallocation=full", luks, str(size)],
                           check=True, capture_output=True, text=True, timeout=300)
            out["luks_create_s"] = time.monotonic() - t
            info = subprocess.run(["qemu-img", "info", "--output=json", "--object", f"secret,id=sec0,file={secret}",
                                   "--image-opts", f"driver=luks,file.filename={luks},key-secret=sec0"],
                                  check=True, capture_output=True, text=True, timeout=120).stdout
            out["luks_info"] = info
            qsd = QsdCrypto(self.work, self.server_cpu, raw, luks, secret)
            socks.update(qsd.socks)
            servers = {v: fp for v in FP_VARIANTS}
            servers.update({v: qsd for v in QSD_VARIANTS})
            out["points"] = []
            for point in POINTS:
                runs = {v: [] for v in VARIANTS}
                order = list(VARIANTS)
                for _ in range(c["reps"]):
                    for v in order:
                        runs[v].append(self.crypto_measure(servers[v], socks[v], point, c["secs"]))
                    order = order[1:] + order[:1]
                out["points"].append(self.crypto_point(point, runs))
        finally:
            for s in (qsd, fp):
                if s:
                    s.stop()
            shutil.rmtree(shm, ignore_errors=True)

    def crypto_measure(self, server, sock, point, secs):
        """`measure`, plus the share of the run the daemon was runnable while something else had
        its CPU (schedstat): more than a few % means the run measured the machine's other load too."""
        w0 = proc_cpu(server.pid)["wait_ns"]
        r = measure(server, self.loader, sock, point, secs, False)
        w1 = proc_cpu(server.pid)["wait_ns"]
        r["server_wait_share"] = (w1 - w0) / 1e9 / r["elapsed_s"] if r["elapsed_s"] else None
        return r

    def crypto_point(self, point, runs):
        """One point's medians, each variant against openssl's 4096-byte bound for the operation the
        pattern needs, and what encryption adds per I/O on each server."""
        pattern = point[0]
        op = PATTERN_OP[pattern]
        bound = self.openssl_bound(op)
        p = dict(point_key("ram", point), op=op, runs=runs, median={},
                 openssl_bound_iops=bound, openssl_bound_mb_per_s=bound * 4096 / 1e6 if bound else None)
        for v, rs in runs.items():
            md = summarize(rs)
            md["server_wait_share"] = median([r["server_wait_share"] for r in rs])
            md["other_cpu_cores"] = median([r.get("other_cpu_cores") for r in rs])
            xs = [r["iops"] for r in rs]
            md["iops_spread"] = (max(xs) - min(xs)) / md["iops"] if md.get("iops") else None
            md["vs_openssl_bound"] = ratio(md.get("iops"), bound)
            # The server's I/Os per second of CPU it got (all threads, schedstat): one core's worth, as
            # the bound is, whatever the machine's other work took from it. A polling reactor counts
            # its empty polls here too, so this never flatters flashpath.
            cpu_ns = md.get("server_cpu_ns_per_io")
            md["iops_per_cpu_sec"] = 1e9 / cpu_ns if cpu_ns else None
            md["vs_openssl_bound_cpu"] = ratio(md["iops_per_cpu_sec"], bound)
            p["median"][v] = md
        m = p["median"]

        def extra(a, b, key):
            x, y = m[a].get(key), m[b].get(key)
            return None if x is None or y is None else x - y

        xts = [row for row in self.results["crypto"]["cipher"]["rows"]
               if row["bits"] == 512 and row["bytes"] == 4096 and row["op"] == op]
        p["cost"] = {
            # What encryption adds per I/O: flashpath's reactor busy time and both servers' CPU time.
            "fp_crypto_busy_ns_per_io": extra("fp-crypto", "fp-plain", "reactor_busy_ns_per_io"),
            "fp_crypto_512_busy_ns_per_io": extra("fp-crypto-512", "fp-plain", "reactor_busy_ns_per_io"),
            "fp_crypto_cpu_ns_per_io": extra("fp-crypto", "fp-plain", "server_cpu_ns_per_io"),
            "fp_crypto_512_cpu_ns_per_io": extra("fp-crypto-512", "fp-plain", "server_cpu_ns_per_io"),
            "qsd_luks_cpu_ns_per_io": extra("qsd-luks", "qsd-raw", "server_cpu_ns_per_io"),
            # The same cipher alone: xts_speed's time for one 4 KiB buffer, by the wall clock and per
            # CPU second (what the CPU/IO differences compare with).
            "xts_speed_ns_per_4k": xts[0]["flashpath_ns_per_buffer"] if xts else None,
            "xts_speed_cpu_ns_per_4k": 4096e9 / xts[0]["flashpath_bytes_per_cpu_sec"] if xts else None,
        }
        # What the data-path target leaves for the cipher: the CPU per I/O at which one core does
        # TARGET x openssl's blocks per second, less what the plain disk's I/O already costs; beside
        # openssl's own CPU time per 4 KiB buffer.
        allowed = 1e9 / (TARGET * bound) if bound else None
        plain = m["fp-plain"].get("server_cpu_ns_per_io")
        p["budget"] = {"target_cpu_ns_per_io": allowed,
                       "left_for_cipher_ns": allowed - plain if allowed and plain else None,
                       "openssl_cpu_ns_per_4k": 1e9 / bound if bound else None}
        p["ratios"] = {"fp_crypto_vs_plain_iops": ratio(m["fp-crypto"].get("iops"), m["fp-plain"].get("iops")),
                       "fp_crypto_512_vs_plain_iops": ratio(m["fp-crypto-512"].get("iops"), m["fp-plain"].get("iops")),
                       "qsd_luks_vs_raw_iops": ratio(m["qsd-luks"].get("iops"), m["qsd-raw"].get("iops")),
                       "fp_crypto_vs_qsd_luks_iops": ratio(m["fp-crypto"].get("iops"), m["qsd-luks"].get("iops")),
                       "fp_crypto_512_vs_qsd_luks_iops": ratio(m["fp-crypto-512"].get("iops"),
                                                               m["qsd-luks"].get("iops"))}
        log(f"crypto {pattern} 4K QD32: " + "  ".join(f"{v} {m[v]['iops']:,.0f}" for v in VARIANTS) +
            f" IOPS; openssl {op} bound {bound or 0:,.0f} blocks/s")
        return p
