"""LUKS volumes (`--only luks`): what opening a volume costs against cryptsetup with the same key
slot, online re-encryption's speed against `cryptsetup reencrypt`, and a guest's 4 KiB QD32 IOPS
on an open LUKS RAM disk alone and beside a re-encryption job under a speed limit.
docs/benchmarks.md, "LUKS volumes", describes every step. Never in CI: a benchmark, not a test
(its unit tests are, fpbench/tests_luks.py).
"""

import json
import os
import shutil
import subprocess
import tempfile
import time

from fpbench.common import MIB, log, median, proc_cpu, ratio, write_random_file
from fpbench.load import measure, point_key, summarize
from fpbench.report_format import spread_of
from fpbench.sections.crypto import run_timed
from fpbench.servers import Flashpath, jsonrpc

# The KDFs opening is timed with: LUKS2's default and LUKS1's only one (judged), and PBKDF2 with
# 1000 iterations (reported: what opening costs beside the KDF, each tool's fixed cost).
KDFS = ("argon2id", "pbkdf2")
FLOOR = "pbkdf2-1000"
# Reported too: argon2id formatted and opened by cryptsetup on every CPU, as on a user's host
# (its --iter-time measured with the lanes in parallel); flashpath's daemon as before.
ALL_CPUS = "argon2id-all-cpus"
# The guest's points: (pattern, bs, qd, queues, poll), as the other sections write them.
POINTS = [(pattern, 4096, 32, 1, True) for pattern in ("randread", "randwrite")]
CONFIG = {
    # opens: each volume opened this many times by each tool; iter_ms: cryptsetup's --iter-time.
    # reenc_size: the re-encrypted RAM disk and file; reenc_reps: runs per tool.
    # iops_size: the LUKS RAM disk the guest load runs on (the job at `speed_limit` MiB/s must
    # outlast every run beside it: reps x points x secs x speed_limit < iops_size).
    "full": {"opens": 10, "iter_ms": 1000, "reenc_size": 1024 * MIB, "reenc_reps": 3, "secs": 3.0, "reps": 3,
             "iops_size": 2048 * MIB, "speed_limit": 64},
    "quick": {"opens": 5, "iter_ms": 1000, "reenc_size": 256 * MIB, "reenc_reps": 2, "secs": 2.0, "reps": 2,
              "iops_size": 1024 * MIB, "speed_limit": 64},
    "smoke": {"opens": 1, "iter_ms": 50, "reenc_size": 32 * MIB, "reenc_reps": 2, "secs": 1.0, "reps": 1,
              "iops_size": 128 * MIB, "speed_limit": 16},
}
# The issue's bars: opening at most this many times cryptsetup's time; re-encryption at least
# this share of cryptsetup's speed; a guest's IOPS beside a limited job at least this share of
# its IOPS alone.
OPEN_GOAL = 1.1
REENC_GOAL = 0.8
IOPS_GOAL = 0.7
# The bench's own throwaway passphrase and the cheap KDF of the volumes whose opening is not
# measured (re-encryption and the guest load): PBKDF2 with 1000 iterations.
PASSPHRASE = "fpbench-luks-passphrase"
CHEAP_KDF = {"pbkdf": "pbkdf2", "pbkdf_force_iterations": 1000}
CHEAP_KDF_ARGS = ["--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000"]
# A re-encryption poll's interval, and the longest any one job may take.
POLL_S = 0.02
REENC_TIMEOUT_S = 600


def luks_config(mode):
    return CONFIG[mode]


def luks_missing(bin_dir):
    """What the section needs and this machine lacks."""
    missing = [t for t in ("cryptsetup", "taskset") if shutil.which(t) is None]
    if not os.access(os.path.join(bin_dir, "flashpath"), os.X_OK):
        missing.append(os.path.join(bin_dir, "flashpath"))
    return missing


def stats(xs):
    """The median, min, max and spread of a list of runs' figures."""
    xs = [x for x in xs if x is not None]
    return {"n": len(xs), "median": median(xs), "min": min(xs) if xs else None, "max": max(xs) if xs else None,
            "spread": spread_of(xs)}


def slot_kdf(dump, slot):
    """Key slot `slot`'s KDF from `cryptsetup luksDump --dump-json-metadata`: its type and cost
    (PBKDF2 iterations and hash; Argon2 time, memory KiB and lanes), never the salt."""
    kdf = dict(dump["keyslots"][str(slot)]["kdf"])
    kdf.pop("salt", None)
    return kdf


def open_summary(fp_s, cs_s, fp_cpu_s=None, cs_cpu_s=None):
    """One KDF's opening figures: both tools' wall seconds per open (median, spread), and the
    ratio of the medians (flashpath / cryptsetup: at most OPEN_GOAL is the target), and the same
    for the CPU seconds each open used."""
    f, c = stats(fp_s), stats(cs_s)
    out = {"flashpath_s": f, "cryptsetup_s": c, "ratio": ratio(f["median"], c["median"])}
    if fp_cpu_s is not None and cs_cpu_s is not None:
        fc, cc = stats(fp_cpu_s), stats(cs_cpu_s)
        out.update(flashpath_cpu_s=fc, cryptsetup_cpu_s=cc, cpu_ratio=ratio(fc["median"], cc["median"]))
    return out


def reenc_summary(fp_bytes, fp_s, cs_bytes, cs_s):
    """Re-encryption: each tool's MiB/s per run (the data it rewrote over its seconds), medians
    and spreads, and flashpath's median over cryptsetup's (at least REENC_GOAL is the target)."""
    f = stats([fp_bytes / MIB / s for s in fp_s if s])
    c = stats([cs_bytes / MIB / s for s in cs_s if s])
    return {"flashpath_mib_s": f, "cryptsetup_mib_s": c, "ratio": ratio(f["median"], c["median"])}


def iops_summary(alone, beside):
    """One point's IOPS alone and beside the job (lists of runs' IOPS), with the ratio of the
    medians (at least IOPS_GOAL is the target) and of each repetition's pair."""
    a, b = stats(alone), stats(beside)
    pairs = [ratio(y, x) for x, y in zip(alone, beside)]
    return {"alone": a, "beside_job": b, "ratio": ratio(b["median"], a["median"]),
            "rep_ratios": [p for p in pairs if p is not None]}


class LuksSection:
    """Bench's methods for this section (mixed into bench.Bench)."""

    def run_luks(self):
        c = dict(luks_config(self.args.mode))
        c.update({k: v for k, v in (("secs", self.args.time), ("reps", self.args.reps)) if v})
        out = {"config": c, "cpu": self.server_cpu, "client_cpu": self.client_cpu, "loadavg": [],
               "cryptsetup_version": subprocess.run(["cryptsetup", "--version"], capture_output=True,
                                                    text=True).stdout.strip()}
        self.results["luks"] = out
        keydir = os.path.join(self.work, "luks-keys")
        os.makedirs(keydir, mode=0o700, exist_ok=True)
        self.luks_pass = os.path.join(keydir, "pass")
        with open(os.open(self.luks_pass, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
            f.write(PASSPHRASE)
        self.luks_load(out, "start")
        self.luks_open(c, out)
        self.luks_load(out, "after opening")
        self.luks_reencrypt(c, out)
        self.luks_load(out, "after re-encryption")
        self.luks_iops(c, out)
        self.luks_load(out, "end")

    def luks_load(self, out, when):
        out["loadavg"].append({"when": when, "loadavg": os.getloadavg()})

    def luks_server(self, name):
        fp = Flashpath(self.args.bin_dir, self.work, str(self.server_cpu), name=name)
        fp.rpc("keyring_file_add_key", {"name": "pass", "path": self.luks_pass})
        return fp

    def luks_ram_disk(self, fp, name, size):
        """A malloc bdev of `size` bytes (4096-byte blocks) formatted LUKS2 by `bdev_luks_format`
        (the cheap KDF, 4096-byte sectors), opened as `name`, exported over vhost-user and written
        in full through the export (so no read meets an untouched page); (its socket, the
        volume's data bytes)."""
        base = f"{name}Base"
        fp.rpc("bdev_malloc_create", {"name": base, "num_blocks": size // 4096, "block_size": 4096})
        fp.rpc("bdev_luks_format", dict(CHEAP_KDF, base_bdev_name=base, key_name="pass", type="luks2",
                                        sector_size=4096))
        fp.rpc("bdev_crypto_create", {"base_bdev_name": base, "name": name, "luks_key_name": "pass"})
        sock = fp.export(f"vhost.{name}", name)
        vol = next(b for b in fp.rpc("bdev_get_bdevs") if b["name"] == name)
        data = vol["num_blocks"] * vol["block_size"]
        log(f"luks: filling {name} ({data // MIB} MiB of data)")
        self.fill_ram(sock, data)
        return sock, data

    def cryptsetup(self, args, timeout=300, pinned=True):
        """`cryptsetup` on the server CPU (`pinned`, else on every CPU) with the bench's passphrase
        file; (output, wall s, CPU s)."""
        pin = ["taskset", "-c", str(self.server_cpu)] if pinned else []
        return run_timed([*pin, "cryptsetup", "--batch-mode", "--key-file", self.luks_pass, *args], timeout)

    # -- 1. opening -----------------------------------------------------------------------------

    def luks_open(self, c, out):
        """For each KDF a 32 MiB file formatted by `cryptsetup luksFormat` (LUKS2, --iter-time), then
        `opens` rounds: flashpath's `bdev_crypto_create luks_key_name` with the one slot (timed over
        its RPC socket, then `bdev_crypto_delete`) and `cryptsetup open --test-passphrase` with the
        same slot (timed per process), the two alternating and the first of a round rotating. Both
        on the server CPU: cryptsetup's Argon2 runs a thread per lane, so one core gives both the
        same CPU."""
        fp = self.luks_server("flashpath-luks-open")
        rows = {}
        try:
            for kdf in (*KDFS, FLOOR, ALL_CPUS):
                img = os.path.join(self.work, f"open-{kdf}.img")
                with open(img, "wb") as f:
                    f.truncate(32 * MIB)
                pinned = kdf != ALL_CPUS
                cost = {FLOOR: CHEAP_KDF_ARGS, ALL_CPUS: ["--pbkdf", "argon2id", "--iter-time", str(c["iter_ms"])]}.get(
                    kdf, ["--pbkdf", kdf, "--iter-time", str(c["iter_ms"])])
                _, fmt_s, _ = self.cryptsetup(["luksFormat", "--type", "luks2", *cost, img], pinned=pinned)
                dump = json.loads(subprocess.run(["cryptsetup", "luksDump", "--dump-json-metadata", img],
                                                 check=True, capture_output=True, text=True, timeout=60).stdout)
                slot = min(int(s) for s in dump["keyslots"])
                base = f"Open{kdf.replace('-', '')}"
                fp.rpc("bdev_uring_create", {"name": base, "filename": img, "block_size": 512})
                fp_s, fp_cpu, cs_s, cs_cpu = [], [], [], []
                for i in range(c["opens"]):
                    order = ("flashpath", "cryptsetup") if i % 2 == 0 else ("cryptsetup", "flashpath")
                    for tool in order:
                        if tool == "flashpath":
                            # stat_ns: utime + stime of every thread, exited ones too (the
                            # KDF may run on a thread that ends with the call).
                            c0 = proc_cpu(fp.pid)["stat_ns"]
                            t0 = time.monotonic()
                            jsonrpc(fp.rpc_sock, "bdev_crypto_create", {"base_bdev_name": base, "name": f"{base}Vol",
                                                                        "luks_key_name": "pass", "luks_key_slot": slot})
                            fp_s.append(time.monotonic() - t0)
                            fp_cpu.append((proc_cpu(fp.pid)["stat_ns"] - c0) / 1e9)
                            jsonrpc(fp.rpc_sock, "bdev_crypto_delete", {"name": f"{base}Vol"})
                        else:
                            _, wall, cpu = self.cryptsetup(["open", "--test-passphrase", "--key-slot", str(slot), img],
                                                           pinned=pinned)
                            cs_s.append(wall)
                            cs_cpu.append(cpu)
                row = open_summary(fp_s, cs_s, fp_cpu, cs_cpu)
                row.update(kdf=kdf, slot=slot, slot_kdf=slot_kdf(dump, slot), format_s=fmt_s,
                           runs={"flashpath_s": fp_s, "flashpath_cpu_s": fp_cpu, "cryptsetup_s": cs_s,
                                 "cryptsetup_cpu_s": cs_cpu})
                rows[kdf] = row
                log(f"luks open {kdf} ({row['slot_kdf']}): flashpath {row['flashpath_s']['median']:.3f} s, "
                    f"cryptsetup {row['cryptsetup_s']['median']:.3f} s = {row['ratio']:.2f}x "
                    f"(CPU {row['cpu_ratio']:.2f}x)")
                fp.rpc("bdev_uring_delete", {"name": base})
                os.unlink(img)
        finally:
            fp.stop()
        out["open"] = rows

    # -- 2. re-encryption -----------------------------------------------------------------------

    def luks_reencrypt(self, c, out):
        """flashpath: a malloc bdev of `reenc_size` (4096-byte blocks) formatted LUKS2 by
        `bdev_luks_format` (PBKDF2, 1000 iterations; 4096-byte sectors), opened, written in full
        through a vhost-user export, then `bdev_luks_reencrypt_start` with no speed limit timed to
        `done` (polling `bdev_luks_reencrypt_get`); the next run re-encrypts the result again.
        cryptsetup: a file of the same size on /dev/shm, random data, `luksFormat` (LUKS2,
        4096-byte sectors, the same KDF), `reencrypt --force-offline-reencrypt --resilience
        checksum` timed per process. The tools alternate; both on the server CPU."""
        size = c["reenc_size"]
        shm = tempfile.mkdtemp(prefix="fp-bench-luks.", dir="/dev/shm")
        fp = self.luks_server("flashpath-luks-reenc")
        fp_s, cs_s, fp_runs = [], [], []
        try:
            _, data = self.luks_ram_disk(fp, "Vol0", size)
            # Not exported while re-encrypted: the disk is closed and opened again between runs.
            fp.rpc("vhost_delete_controller", {"ctrlr": "vhost.Vol0"})
            img = os.path.join(shm, "reenc.img")
            log(f"luks: writing {size // MIB} MiB of random data for cryptsetup: {img}")
            write_random_file(img, size)
            self.cryptsetup(["luksFormat", "--type", "luks2", "--sector-size", "4096", *CHEAP_KDF_ARGS, img])
            for i in range(c["reenc_reps"]):
                order = ("flashpath", "cryptsetup") if i % 2 == 0 else ("cryptsetup", "flashpath")
                for tool in order:
                    if tool == "flashpath":
                        if fp_runs:
                            # A second job on a disk whose first one is done is refused while the
                            # disk stays open (the finished job's new key keeps its name), so
                            # each run after the first opens the disk afresh.
                            fp.rpc("bdev_crypto_delete", {"name": "Vol0"})
                            fp.rpc("bdev_crypto_create", {"base_bdev_name": "Vol0Base", "name": "Vol0",
                                                          "luks_key_name": "pass"})
                        r = self.luks_reencrypt_fp(fp, "Vol0")
                        fp_runs.append(r)
                        fp_s.append(r["seconds"])
                    else:
                        _, wall, cpu = self.cryptsetup(["reencrypt", "--force-offline-reencrypt", "--resilience",
                                                        "checksum", *CHEAP_KDF_ARGS, img], REENC_TIMEOUT_S)
                        cs_s.append(wall)
            dump = json.loads(subprocess.run(["cryptsetup", "luksDump", "--dump-json-metadata", img],
                                             check=True, capture_output=True, text=True, timeout=60).stdout)
            cs_data = int(dump["segments"]["0"]["size"]) if dump["segments"]["0"]["size"] != "dynamic" else \
                size - int(dump["segments"]["0"]["offset"])
        finally:
            fp.stop()
            shutil.rmtree(shm, ignore_errors=True)
        # Each tool's speed over the data it rewrote (the disk less its header area).
        row = {"size": size, "flashpath_data_bytes": data, "cryptsetup_data_bytes": cs_data,
               "runs": {"flashpath_s": fp_s, "cryptsetup_s": cs_s, "flashpath": fp_runs}}
        row.update(reenc_summary(data, fp_s, cs_data, cs_s))
        out["reencrypt"] = row
        log(f"luks re-encryption of {size // MIB} MiB: flashpath {row['flashpath_mib_s']['median']:,.0f} MiB/s, "
            f"cryptsetup {row['cryptsetup_mib_s']['median']:,.0f} MiB/s = {row['ratio']:.2f}x")

    def luks_reencrypt_fp(self, fp, name, speed_limit=0):
        """One flashpath job on `name` to its end: (seconds from the start request to the poll
        that saw `done`, the job's bytes)."""
        t0 = time.monotonic()
        jsonrpc(fp.rpc_sock, "bdev_luks_reencrypt_start", dict(CHEAP_KDF, name=name, key_name="pass",
                                                                 speed_limit=speed_limit))
        deadline = t0 + REENC_TIMEOUT_S
        while True:
            job = jsonrpc(fp.rpc_sock, "bdev_luks_reencrypt_get", {"name": name})[0]
            if job["state"] == "done":
                return {"seconds": time.monotonic() - t0, "bytes": job["total_bytes"]}
            if job["state"] not in ("running", "paused"):
                raise RuntimeError(f"luks re-encryption of {name}: {job['state']}: {job.get('error')}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"luks re-encryption of {name}: not done after {REENC_TIMEOUT_S} s")
            time.sleep(POLL_S)

    # -- 3. a guest's IOPS beside a job ---------------------------------------------------------

    def luks_iops(self, c, out):
        """A malloc bdev of `iops_size` formatted LUKS2 (PBKDF2, 4096-byte sectors), opened,
        exported over vhost-user and written in full; then a re-encryption job at `speed_limit`
        MiB/s is started and paused at once. Each point `reps` rounds of a run alone and a run
        with the job resumed (paused again after it), fp-load (one polled queue) on the client
        CPU, flashpath (reactor and the job's thread) on the server CPU. The job's bytes before
        and after each run give its speed during the run, and its state shows it ran throughout."""
        size = c["iops_size"]
        fp = self.luks_server("flashpath-luks-iops")
        points = []
        try:
            sock, _ = self.luks_ram_disk(fp, "Vol1", size)
            jsonrpc(fp.rpc_sock, "bdev_luks_reencrypt_start", dict(CHEAP_KDF, name="Vol1", key_name="pass",
                                                                     speed_limit=c["speed_limit"]))
            jsonrpc(fp.rpc_sock, "bdev_luks_reencrypt_pause", {"name": "Vol1"})
            for point in POINTS:
                alone, beside, job_runs = [], [], []
                for _ in range(c["reps"]):
                    alone.append(measure(fp, self.loader, sock, point, c["secs"], False))
                    self.luks_resume_at(fp, "Vol1", c["speed_limit"])
                    j0 = self.luks_job(fp, "Vol1")
                    r = measure(fp, self.loader, sock, point, c["secs"], False)
                    j1 = self.luks_job(fp, "Vol1")
                    jsonrpc(fp.rpc_sock, "bdev_luks_reencrypt_pause", {"name": "Vol1"})
                    if j1["state"] != "running":
                        raise RuntimeError(f"luks: the job was {j1['state']} at the end of a run beside it "
                                           f"(iops_size too small for the runs at {c['speed_limit']} MiB/s?)")
                    r["job_mib_s"] = (j1["done_bytes"] - j0["done_bytes"]) / MIB / r["elapsed_s"]
                    beside.append(r)
                    job_runs.append({"before": j0["done_bytes"], "after": j1["done_bytes"],
                                     "mib_s": r["job_mib_s"]})
                p = dict(point_key("ram", point), runs={"alone": alone, "beside_job": beside}, job=job_runs,
                         median={"alone": summarize(alone), "beside_job": summarize(beside)})
                p.update(iops_summary([r["iops"] for r in alone], [r["iops"] for r in beside]))
                p["job_mib_s"] = stats([j["mib_s"] for j in job_runs])
                points.append(p)
                log(f"luks {point[0]} 4K QD32: alone {p['alone']['median']:,.0f} IOPS, beside the job at "
                    f"{c['speed_limit']} MiB/s (measured {p['job_mib_s']['median']:.0f}) "
                    f"{p['beside_job']['median']:,.0f} IOPS = {p['ratio']:.2f}x")
            out["job_total_bytes"] = self.luks_job(fp, "Vol1")["total_bytes"]
            jsonrpc(fp.rpc_sock, "bdev_luks_reencrypt_cancel", {"name": "Vol1"})
        finally:
            fp.stop()
        out["points"] = points

    def luks_resume_at(self, fp, name, limit):
        """Resumes the paused job on `name` at `limit` MiB/s counted from now. The job's limiter
        counts from when it last saw its limit change, paused time included, so a plain resume
        would run unlimited until the average since the start fell back to the limit: the job
        is resumed at 1 MiB/s and given `limit` once it has seen that (its limiter looks again
        every 10 ms while it waits)."""
        jsonrpc(fp.rpc_sock, "bdev_luks_reencrypt_set_speed", {"name": name, "speed_limit": 1})
        jsonrpc(fp.rpc_sock, "bdev_luks_reencrypt_resume", {"name": name})
        time.sleep(0.05)
        jsonrpc(fp.rpc_sock, "bdev_luks_reencrypt_set_speed", {"name": name, "speed_limit": limit})

    def luks_job(self, fp, name):
        return jsonrpc(fp.rpc_sock, "bdev_luks_reencrypt_get", {"name": name})[0]
