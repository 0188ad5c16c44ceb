"""Backups (`--only backup`): what dirty bitmaps cost the I/O path, what incremental and repeated
full backups upload, a full backup's throughput against `rclone copy` of the same image and the
guest's IOPS beside it, and a live restore's first read and throughput.

(A) The bitmap's cost. flashpath alone on the server CPU, one null (or RAM) disk exported over
vhost-user to fp-load on the client CPU (one queue, polling). Each point (4 KiB randwrite QD32:
writes are what marks; randread QD32 for reference) runs without a bitmap and with one
(`bdev_dirty_bitmap_add`, removed after the run), alternating which goes first repetition by
repetition; the bitmap's `count` after its run shows it marked.

(B) What incrementals upload. A disk of random data (a file through io_uring, so every chunk is
incompressible and unique), a full backup (`bdev_backup_start sync: full` with a bitmap added
first), then two kinds of "1 % changed" written with random bytes through an NBD export of the
same disk (so the bitmap marks them): 1 % of the disk's chunks rewritten whole at random chunk
offsets, and 1 % of the disk's bytes as 4 KiB writes at random 4 KiB offsets (which touch far
more chunks). Each is followed by an incremental (`sync: incremental`, `bitmap`), and a second
full backup of the unchanged disk comes last. Bytes uploaded come from `bdev_backup_get_jobs`'
progress, changed bytes from what the bench wrote; to each store of the mode (file:// under the
scratch directory, the local RADOS Gateway).

(C) A full backup's throughput to the gateway against `rclone copy` of the same raw image to
the same gateway, and fp-load's IOPS on the disk's vhost-user export while a speed-limited
backup runs against the same without one.

(D) A live restore (`bdev_backup_restore_create` over an empty RAM disk): the first 4 KiB reads
of absent chunks (QD1, random offsets, no read-ahead, the background copy held at a low speed)
against one GET of a chunk object from the gateway (curl --aws-sigv4), and the throughput of
the whole restore. Then boots: a root file system (the guest tests' initramfs unpacked into
ext4) backed up to the gateway, and one guest (TCG, the image's kernel, a stage-one initramfs
that mounts /dev/vda and switch_roots into it) booted from the local disk and from live
restores of it (the background copy unlimited, and held so that every block the boot reads is
fetched on demand), the three in turn each repetition; the wall time from QEMU's start to the
root's "booted" line (after running its programs and reading every file once).

(B)-(D) need the backup RPCs (`backup_store_add`, `bdev_backup_start`, `bdev_backup_get_jobs`,
`bdev_backup_restore_create`); a build without them records that and measures (A) alone.
docs/benchmarks.md, "Backups", describes every step. Never in CI: a benchmark, not a test.
"""

import math
import os
import random
import socket
import struct
import subprocess
import time

from fpbench.common import MIB, log, median, ratio, run
from fpbench.guest import Guest, boot_image, boot_initramfs, boot_root_image
from fpbench.load import measure
from fpbench.modes import backup_config
from fpbench.sections.callgrind import ir_summary
from fpbench.s3 import rclone_copy_cmd, rclone_env, write_rclone_config
from fpbench.servers import CephCluster, Flashpath

VARIANTS = ("off", "on")
BITMAP = "fpbench"
# The issue's goals (benchmarks, not CI assertions).
GOAL_BITMAP_COST = 0.03       # (A) IOPS lost with one bitmap, randwrite 4 KiB QD32
GOAL_BITMAP_POINT = ("randwrite", 4096, 32)
GOAL_INCREMENTAL = 1.2        # (B) uploaded / changed bytes
GOAL_REPEAT_FULL = 0.01       # (B) a second full of an unchanged disk: uploaded / disk size
GOAL_THROUGHPUT = 0.8         # (C) backup MB/s / rclone's
GOAL_GUEST_IOPS = 0.8         # (C) IOPS during a limited backup / without
GOAL_FIRST_READ = 2.0         # (D) first read of an absent chunk / one GET
GOAL_BOOT = 1.5               # (D) a guest's boot from a live-restored disk / from a local one
# (D)'s boots: from the local disk, from a live restore whose background copy runs unlimited, and
# from one whose copy is held (every block the boot reads is fetched on demand: the worst case).
BOOT_VARIANTS = ("local", "restore", "restore-held")
EMPTY_SHA256 = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
# The backup RPCs each part needs (docs/backup.md): (B) and (C) the stores and the jobs, (D) the
# catalogue and the live restore too.
JOB_RPCS = ("backup_store_add", "bdev_backup_start", "bdev_backup_get_jobs", "bdev_backup_cancel")
RESTORE_RPCS = ("backup_list", "bdev_backup_restore_create")
BACKUP_RPCS = JOB_RPCS + RESTORE_RPCS
# The two definitions of "1 % changed" (B).
CHANGE_KINDS = ("chunks", "scattered")
SCATTER_BS = 4096


def point_name(p):
    pattern, bs, qd = p
    return f"{pattern} {bs // 1024} KiB QD{qd}"


# -- (A) pure parts --------------------------------------------------------------------------


def variant_order(rep):
    """Which variant runs first in repetition `rep`: alternating, so neither always follows the
    other (a warm cache, a neighbour's compile starting)."""
    return VARIANTS if rep % 2 == 0 else VARIANTS[::-1]


def summarize_bitmap(runs, backends, points):
    """Per backend and point, the medians of each variant, each repetition's ratio with / without
    (the pair ran back to back) and the cost: 1 - the median of those ratios (the share of IOPS
    the bitmap takes; negative when the runs with it were faster)."""
    keys = ("iops", "p50_ns", "p99_ns", "server_cpu_ns_per_io", "reactor_busy_ns_per_io", "server_busy_share")
    out = []
    for b in backends:
        for p in points:
            row = {"backend": b, "point": list(p)}
            for v in VARIANTS:
                rs = [r for r in runs if r["backend"] == b and tuple(r["point"]) == tuple(p) and r["variant"] == v]
                row[v] = {k: median([r.get(k) for r in rs]) for k in keys}
                row[v]["runs"] = len(rs)
                row[v]["iops_all"] = [r["iops"] for r in rs]
            # Each repetition's pair ran back to back: its ratio sees the same machine, while the
            # medians of each side may come from different minutes of a drifting load. The cost
            # judged is the median of the pairs' ratios.
            pairs = {}
            for x in runs:
                if x["backend"] == b and tuple(x["point"]) == tuple(p):
                    pairs.setdefault(x["rep"], {})[x["variant"]] = x["iops"]
            paired = [ratio(v.get("on"), v.get("off")) for _, v in sorted(pairs.items())]
            paired = [x for x in paired if x is not None]
            row["paired_ratios"] = paired
            row["ratio_of_medians"] = ratio(row["on"]["iops"], row["off"]["iops"])
            r = median(paired)
            row["ratio"] = r
            row["cost"] = None if r is None else 1.0 - r
            row["busy_ratio"] = ratio(row["on"]["reactor_busy_ns_per_io"], row["off"]["reactor_busy_ns_per_io"])
            counts = [r.get("bitmap_count") for r in runs if r["backend"] == b and tuple(r["point"]) == tuple(p)
                      and r["variant"] == "on"]
            row["bitmap_counts"] = counts
            out.append(row)
    return out


# -- (B) pure parts --------------------------------------------------------------------------


def chunk_rewrites(disk_size, chunk_size, frac, rng):
    """'frac of the disk changed' as whole chunks: round(frac x chunks) distinct chunks at random,
    each rewritten whole; [(offset, length)] sorted."""
    n_chunks = disk_size // chunk_size
    k = max(1, round(frac * n_chunks))
    return sorted((i * chunk_size, chunk_size) for i in rng.sample(range(n_chunks), k))


def scattered_writes(disk_size, frac, rng, bs=SCATTER_BS):
    """'frac of the disk's bytes changed' as `bs` writes at distinct random `bs`-aligned
    offsets; [(offset, length)] sorted."""
    n_blocks = disk_size // bs
    k = max(1, round(frac * n_blocks))
    return sorted((i * bs, bs) for i in rng.sample(range(n_blocks), k))


def chunks_touched(writes, chunk_size):
    """The distinct chunks a list of (offset, length) writes touches."""
    out = set()
    for off, length in writes:
        out.update(range(off // chunk_size, (off + length - 1) // chunk_size + 1))
    return out


def expected_touched(disk_size, chunk_size, n_writes):
    """Chunks that n_writes uniform random small writes touch on average: C (1 - (1 - 1/C)^n)."""
    c = disk_size // chunk_size
    return c * (1.0 - (1.0 - 1.0 / c) ** n_writes)


def chunk_size_for(disk_size, n_writes, bs, goal, lo=64 * 1024, hi=16 * MIB):
    """The largest power-of-two chunk size from `lo` to `hi` (fp_backup's range) at which
    n_writes random `bs` writes upload at most `goal` x their bytes (touched chunks x chunk size,
    the expectation, data incompressible); None when even `lo` does not (then what would:
    the largest power of two below `lo` that does, as ("below", size))."""
    changed = n_writes * bs
    size, best = hi, None
    while size >= bs:
        if expected_touched(disk_size, size, n_writes) * size <= goal * changed:
            best = size
            break
        size //= 2
    if best is None or best >= lo:
        return best
    return ("below", best)


def upload_verdict(uploaded, changed, goal=GOAL_INCREMENTAL):
    """(uploaded / changed, whether within `goal`)."""
    r = ratio(uploaded, changed)
    return r, None if r is None else r <= goal


def job_progress(jobs, job_id):
    """The job's entry from `bdev_backup_get_jobs` (a list, or {"jobs": [...]}), or None."""
    if isinstance(jobs, dict):
        jobs = jobs.get("jobs", [])
    for j in jobs or []:
        if j.get("job_id") == job_id or j.get("id") == job_id:
            return j
    return None


def progress_bytes(job, field):
    """A progress counter of a job entry (under "progress", or at the top), or None."""
    if job is None:
        return None
    p = job.get("progress") if isinstance(job.get("progress"), dict) else job
    v = p.get(field)
    return v if isinstance(v, (int, float)) else None


def job_finished(job):
    """(finished, error) of a job entry: a state of done/completed/finished/concluded, or one of
    failed/error/cancelled with its error."""
    if job is None:
        return False, None
    state = str(job.get("state", job.get("status", ""))).lower()
    if state in ("done", "completed", "complete", "finished", "concluded", "success", "succeeded"):
        return True, None
    if state in ("failed", "error", "cancelled", "canceled", "aborted"):
        return True, job.get("error") or state
    if job.get("error"):
        return True, job["error"]
    return False, None


def job_id_of(result):
    """`bdev_backup_start`'s result: the job id (a string, or {"job_id": ...})."""
    if isinstance(result, dict):
        return result.get("job_id") or result.get("id")
    return result


# -- (D) pure parts --------------------------------------------------------------------------


def parse_curl_time(out):
    """curl -w '%{http_code} %{size_download} %{time_total}' output: (status, bytes, seconds)."""
    code, size, secs = out.strip().split()[-3:]
    return int(code), int(float(size)), float(secs)


def restore_state(bdev_info):
    """(chunks done, chunks total) of a restore bdev from bdev_get_bdevs' driver_specific
    .backup_restore, or (None, None)."""
    ds = ((bdev_info or {}).get("driver_specific") or {}).get("backup_restore") or {}
    total = ds.get("chunks_total", ds.get("chunks"))
    for k in ("restored", "chunks_present", "chunks_restored", "chunks_done", "chunks_fetched"):
        if isinstance(ds.get(k), int):
            return ds[k], total
    if ds.get("state") in ("done", "complete", "completed") and isinstance(total, int):
        return total, total
    return None, total


# -- a minimal NBD writer (B: writes of chosen bytes the bitmap marks) --------------------------

NBD_MAGIC, NBD_OPTS_MAGIC = b"NBDMAGIC", b"IHAVEOPT"
NBD_OPT_EXPORT_NAME = 1
NBD_FLAG_C_FIXED_NEWSTYLE, NBD_FLAG_C_NO_ZEROES = 1, 2
NBD_REQUEST_MAGIC, NBD_REPLY_MAGIC = 0x25609513, 0x67446698
NBD_CMD_WRITE, NBD_CMD_FLUSH, NBD_CMD_DISC = 1, 3, 2


def nbd_request(cmd, handle, offset, length):
    """An NBD request header (simple, no flags)."""
    return struct.pack(">IHHQQI", NBD_REQUEST_MAGIC, 0, cmd, handle, offset, length)


def nbd_parse_reply(buf):
    """A simple reply: (error, handle); raises on a wrong magic."""
    magic, err, handle = struct.unpack(">IIQ", buf)
    if magic != NBD_REPLY_MAGIC:
        raise ValueError(f"NBD reply magic {magic:#x}")
    return err, handle


def _recv(s, n):
    b = bytearray()
    while len(b) < n:
        x = s.recv(n - len(b))
        if not x:
            raise ConnectionError("NBD server closed the connection")
        b += x
    return bytes(b)


def nbd_write_all(path, export, writes, data_of, depth=16, timeout=60):
    """Writes every (offset, length) of `writes` with bytes `data_of(offset, length)` to the NBD
    export `export` on Unix socket `path` (fixed newstyle, NBD_OPT_EXPORT_NAME, simple replies,
    `depth` requests in flight), then a flush; raises on any error reply."""
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(timeout)
        s.connect(path)
        hello = _recv(s, 18)
        if hello[:16] != NBD_MAGIC + NBD_OPTS_MAGIC:
            raise ValueError(f"not a newstyle NBD server: {hello!r}")
        s.sendall(struct.pack(">I", NBD_FLAG_C_FIXED_NEWSTYLE | NBD_FLAG_C_NO_ZEROES))
        name = export.encode()
        s.sendall(NBD_OPTS_MAGIC + struct.pack(">II", NBD_OPT_EXPORT_NAME, len(name)) + name)
        _recv(s, 10)  # size (u64), transmission flags (u16); no zeroes (NO_ZEROES)
        pending, handle, i = 0, 0, 0
        while i < len(writes) or pending:
            while i < len(writes) and pending < depth:
                off, length = writes[i]
                s.sendall(nbd_request(NBD_CMD_WRITE, i, off, length) + data_of(off, length))
                i += 1
                pending += 1
            err, handle = nbd_parse_reply(_recv(s, 16))
            if err:
                raise OSError(err, f"NBD write {writes[handle]} failed")
            pending -= 1
        s.sendall(nbd_request(NBD_CMD_FLUSH, len(writes), 0, 0))
        err, _ = nbd_parse_reply(_recv(s, 16))
        if err:
            raise OSError(err, "NBD flush failed")
        s.sendall(nbd_request(NBD_CMD_DISC, 0, 0, 0))


def write_random_image(path, size):
    """A file of `size` random bytes (every chunk unique and incompressible)."""
    with open(path, "wb") as f:
        left = size
        while left:
            n = min(left, 8 * MIB)
            f.write(os.urandom(n))
            left -= n


class BackupSection:
    """Bench's methods for this section (mixed into bench.Bench)."""

    def run_backup(self):
        c = dict(backup_config(self.args.mode))
        if self.args.time:
            c["bitmap"] = dict(c["bitmap"], secs=self.args.time)
        if self.args.reps:
            c["bitmap"] = dict(c["bitmap"], reps=self.args.reps)
        out = {"config": c, "loadavg_before": os.getloadavg(), "notes": []}
        self.results["backup"] = out
        try:
            self.backup_bitmap_cost(c["bitmap"], out)
            missing = self.backup_rpcs_missing()
            out["rpcs_missing"] = missing
            if any(m in JOB_RPCS for m in missing):
                note_ = (f"(B)-(D) not measured: this flashpath has no {', '.join(missing)} (the backup jobs are "
                         "not in this build)")
                out["notes"].append(note_)
                log(f"backup: {note_}")
            else:
                if missing:
                    note_ = (f"(D) not measured: this flashpath has no {', '.join(missing)} (the live restore is "
                             "not in this build)")
                    out["notes"].append(note_)
                    log(f"backup: {note_}")
                self.backup_jobs(c, out, with_restore=not missing)
        finally:
            out["loadavg_after"] = os.getloadavg()

    def backup_rpcs_missing(self):
        srv = Flashpath(self.args.bin_dir, self.work, str(self.server_cpu), name="flashpath-backup-probe")
        try:
            methods = set(srv.rpc("rpc_get_methods") or [])
        finally:
            srv.stop()
        return [m for m in BACKUP_RPCS if m not in methods]

    # -- (A) -------------------------------------------------------------------------------

    def backup_bitmap_cost(self, c, out):
        points = [tuple(p) for p in c["points"]]
        out["bitmap"] = {"runs": []}
        runs = out["bitmap"]["runs"]
        for backend in c["backends"]:
            srv = Flashpath(self.args.bin_dir, self.work, str(self.server_cpu), name=f"flashpath-bitmap-{backend}")
            try:
                size = c["size_mib"] * MIB
                sock = srv.add_disk(backend, size, queues=1)
                bdev = {"null": "Null0", "ram": "Malloc0"}[backend]
                if backend == "ram":
                    self.loader.run(sock, "write", 131072, 8, 1, True, c["fill_secs"])
                for rep in range(c["reps"]):
                    for p in points:
                        for v in variant_order(rep):
                            r = self.backup_bitmap_run(srv, sock, bdev, p, v, c)
                            r.update(backend=backend, point=list(p), variant=v, rep=rep)
                            runs.append(r)
                            log(f"backup: bitmap {v:<3} {backend} {point_name(p):<22} {r['iops']:>9,.0f} IOPS, busy "
                                f"{(r.get('reactor_busy_ns_per_io') or 0):.0f} ns/IO"
                                + (f", bitmap count {r['bitmap_count']:,}" if v == "on" else ""))
            finally:
                srv.stop()
        out["bitmap"]["summary"] = summarize_bitmap(runs, c["backends"], points)
        self.backup_bitmap_pathlen(c, out)
        for row in out["bitmap"]["summary"]:
            log(f"backup: bitmap {row['backend']} {point_name(tuple(row['point']))}: with / without "
                f"{row['ratio'] or 0:.3f}x (cost {100 * (row['cost'] or 0):+.1f} %)")

    def backup_bitmap_pathlen(self, c, out):
        """Instructions per write of the server without and with a bitmap under callgrind
        (the path-length section's long-minus-short method, null disk): a figure the machine's
        load does not move, beside the IOPS that it does."""
        cg = c.get("callgrind")
        if not cg:
            return
        pattern, bs, qd = GOAL_BITMAP_POINT
        point = (pattern, bs, qd, 1, True)
        res = {"config": cg, "point": list(GOAL_BITMAP_POINT), "runs": {v: [] for v in VARIANTS}}
        out["bitmap"]["pathlen"] = res

        def disk(variant):
            def make(server):
                sock = server.add_disk("null", c["size_mib"] * MIB, queues=1)
                if variant == "on":
                    server.rpc("bdev_dirty_bitmap_add", {"bdev": "Null0", "name": BITMAP,
                                                         "granularity": c["granularity"]})
                return sock
            return make

        for rep in range(cg["reps"]):
            for v in variant_order(rep):
                res["runs"][v].append(self.callgrind_ir_per_io("flashpath", point, cg, disk=disk(v)))
        for v in VARIANTS:
            res[v] = ir_summary(res["runs"][v])
        res["ratio"] = ratio(res["on"]["ir_per_io"], res["off"]["ir_per_io"])
        log(f"backup: callgrind {point_name(GOAL_BITMAP_POINT)}: {res['off']['ir_per_io']:.0f} instructions per write "
            f"without a bitmap, {res['on']['ir_per_io']:.0f} with = {res['ratio']:.3f}x")

    def backup_bitmap_run(self, srv, sock, bdev, p, variant, c):
        pattern, bs, qd = p
        if variant == "on":
            srv.rpc("bdev_dirty_bitmap_add", {"bdev": bdev, "name": BITMAP, "granularity": c["granularity"]})
        try:
            r = measure(srv, self.loader, sock, (pattern, bs, qd, 1, True), c["secs"], False)
            # The reactor's busy share of the run: well below 1, the client bounds the IOPS and
            # they cannot show the server's cost (its busy time and path length do).
            r["server_busy_share"] = sum(v for v in (r.get("reactor_busy_frac") or {}).values() if v is not None)
            if variant == "on":
                bm = [b for b in srv.rpc("bdev_dirty_bitmap_list", {"bdev": bdev}) if b["name"] == BITMAP]
                r["bitmap_count"] = bm[0]["count"] if bm else None
        finally:
            if variant == "on":
                srv.rpc("bdev_dirty_bitmap_remove", {"bdev": bdev, "name": BITMAP})
        return r

    # -- (B)-(D) ---------------------------------------------------------------------------

    def backup_jobs(self, c, out, with_restore=True):
        disk = c["disk_mib"] * MIB
        image = os.path.join(self.work, "backup-disk.img")
        log(f"backup: writing a {c['disk_mib']} MiB image of random data: {image}")
        write_random_image(image, disk)
        cluster = endpoint = None
        self.ceph_dir = os.path.join(self.work, "ceph")
        srv = None
        try:
            stores = {}
            if "file" in c["stores"]:
                d = os.path.join(self.work, "store")
                os.makedirs(d)
                stores["file"] = {"name": "bench-file", "url": f"file://{d}"}
            if "rgw" in c["stores"]:
                os.makedirs(self.ceph_dir)
                cluster = CephCluster(self.ceph_dir, self.client_cpu)
                endpoint = cluster.start_rgw()
                rconf = write_rclone_config(os.path.join(self.work, "rclone.conf"), endpoint)
                out["rgw"] = {"url": endpoint.url}
                # One bucket per use, so that no job finds chunks another stored (fp_backup skips
                # content the store has): (B)'s incrementals, (C)'s timed full backup and
                # (D)'s restores of it, (C)'s backup beside the guest, and rclone's copy.
                for bucket in ("fp-backup", "fp-throughput", "rclone-peer", "fp-boot"):
                    run(["rclone", "--config", rconf, "mkdir", f"rgw:{bucket}"], 60, env=rclone_env(os.environ))
                s3 = {"endpoint": endpoint.url, "region": endpoint.region, "access_key_id": endpoint.access_key,
                      "secret_access_key": endpoint.secret_key, "allow_http": True, "path_style": True}
                stores["rgw"] = dict(s3, name="bench-rgw", url="s3://fp-backup")
                extra_stores = [dict(s3, name="bench-throughput", url="s3://fp-throughput"),
                                dict(s3, name="bench-boot", url="s3://fp-boot")]
            # (C)'s guest beside a limited backup: a file store of its own per repetition (the
            # test cluster's 4 GiB memstore holds (B) and (C)'s throughput run, no more: a full
            # one hangs every PUT).
            guest_stores = []
            for rep in range(c["guest_reps"]):
                d = os.path.join(self.work, f"store-guest-{rep}")
                os.makedirs(d)
                guest_stores.append({"name": f"bench-guest-{rep}", "url": f"file://{d}"})
            # Backup jobs need a state directory (the fleece's scratch file, job and parent records).
            state = os.path.join(self.work, "state")
            os.makedirs(state)
            srv = Flashpath(self.args.bin_dir, self.work, str(self.server_cpu), name="flashpath-backup",
                            extra=["--state-dir", state])
            for s in [*stores.values(), *(extra_stores if "rgw" in stores else []), *guest_stores]:
                srv.rpc("backup_store_add", s)
            out["incremental"] = []
            for kind, s in stores.items():
                bdev = f"Disk{kind.capitalize()}"
                srv.rpc("bdev_uring_create", {"name": bdev, "filename": image, "block_size": 512, "direct": True})
                out["incremental"].append(self.backup_incrementals(srv, bdev, s["name"], kind, disk, c))
                srv.rpc("bdev_uring_delete", {"name": bdev})
                if kind == "rgw":
                    # The cluster's OSD is a 4 GiB memstore: (B)'s ~2 GiB would leave (C) a full
                    # cluster, whose PUTs hang (seen: a minute per PUT, then retries).
                    run(["rclone", "--config", rconf, "purge", "rgw:fp-backup"], 300, env=rclone_env(os.environ))
            if "rgw" in stores:
                out["throughput"] = self.backup_throughput(srv, image, disk, rconf, c)
                if with_restore:
                    out["restore"] = self.backup_restore(srv, "bench-throughput", extra_stores[0], endpoint, rconf,
                                                         disk, c)
                    out["restore"]["boot"] = self.backup_boot(srv, "bench-boot", c)
        except Exception as e:  # noqa: BLE001 - recorded: (A) stands without (B)-(D)
            out["notes"].append(f"(B)-(D) stopped: {e}")
            log(f"backup: (B)-(D) stopped: {e}")
        finally:
            if srv is not None:
                srv.stop()
            if cluster is not None:
                cluster.stop()

    def backup_wait(self, srv, job_id, timeout):
        """Polls `bdev_backup_get_jobs` until the job ends (bounded); its last entry and the
        seconds it took from the call."""
        t0 = time.monotonic()
        while True:
            job = job_progress(srv.rpc("bdev_backup_get_jobs", {"job_id": job_id}), job_id)
            done, err = job_finished(job)
            if done:
                if err:
                    raise RuntimeError(f"backup job {job_id}: {err}")
                return job, time.monotonic() - t0
            if time.monotonic() - t0 > timeout:
                raise TimeoutError(f"backup job {job_id} not done after {timeout} s")
            time.sleep(0.05)

    def backup_wait_ended(self, srv, job_id, timeout):
        """Polls until the job ended in any state (a cancelled one included), bounded."""
        t0 = time.monotonic()
        while not job_finished(job_progress(srv.rpc("bdev_backup_get_jobs", {"job_id": job_id}), job_id))[0]:
            if time.monotonic() - t0 > timeout:
                raise TimeoutError(f"backup job {job_id} still running {timeout} s after its cancel")
            time.sleep(0.05)

    def backup_one(self, srv, params, timeout):
        t0 = time.monotonic()
        job_id = job_id_of(srv.rpc("bdev_backup_start", params))
        job, _ = self.backup_wait(srv, job_id, timeout)
        secs = time.monotonic() - t0
        return {"job_id": job_id, "params": {k: v for k, v in params.items() if k != "key"}, "secs": secs,
                "bytes_uploaded": progress_bytes(job, "bytes_uploaded"), "bytes_read": progress_bytes(job, "bytes_read"),
                "chunks_uploaded": progress_bytes(job, "chunks_uploaded"), "job": job}

    def backup_incrementals(self, srv, bdev, store, kind, disk, c):
        chunk = c["chunk_size"]
        rng = random.Random(c["seed"])
        res = {"store": kind, "disk": disk, "chunk_size": chunk, "changes": []}
        nbd_sock = os.path.join(self.work, f"{bdev}.nbd")
        srv.rpc("nbd_start_disk", {"bdev_name": bdev, "nbd_device": nbd_sock})
        base = {"bdev": bdev, "store": store}
        # The full backup adds the bitmap (and takes it), so that it tracks the changes after it;
        # an incremental takes its parent's chunk size.
        res["full"] = self.backup_one(srv, dict(base, sync="full", bitmap=BITMAP, granularity=c["granularity"],
                                                chunk_size=chunk), c["timeout_s"])
        log(f"backup: {kind}: full backup of {disk // MIB} MiB in {res['full']['secs']:.1f} s, "
            f"{(res['full']['bytes_uploaded'] or 0) / MIB:.0f} MiB uploaded")
        for change in CHANGE_KINDS:
            if change == "chunks":
                writes = chunk_rewrites(disk, chunk, c["changed_frac"], rng)
            else:
                writes = scattered_writes(disk, c["changed_frac"], rng)
            nbd_write_all(nbd_sock, bdev, writes, lambda off, n: os.urandom(n))
            changed = sum(n for _, n in writes)
            touched = len(chunks_touched(writes, chunk))
            r = self.backup_one(srv, dict(base, sync="incremental", bitmap=BITMAP), c["timeout_s"])
            ratio_, ok = upload_verdict(r["bytes_uploaded"], changed)
            r.update(change=change, writes=len(writes), changed_bytes=changed, chunks_touched=touched,
                     ratio=ratio_, ok=ok)
            if change == "scattered":
                r["chunk_size_needed"] = chunk_size_for(disk, len(writes), SCATTER_BS, GOAL_INCREMENTAL)
            res["changes"].append(r)
            log(f"backup: {kind}: incremental after {change} ({len(writes)} writes, {changed / MIB:.1f} MiB, "
                f"{touched} chunks): {(r['bytes_uploaded'] or 0) / MIB:.1f} MiB uploaded = {ratio_ or 0:.2f}x")
        r = self.backup_one(srv, dict(base, sync="full", chunk_size=chunk), c["timeout_s"])
        r["ratio"] = ratio(r["bytes_uploaded"], disk)
        r["ok"] = None if r["ratio"] is None else r["ratio"] < GOAL_REPEAT_FULL
        res["repeat_full"] = r
        srv.rpc("nbd_stop_disk", {"nbd_device": nbd_sock})
        srv.rpc("bdev_dirty_bitmap_remove", {"bdev": bdev, "name": BITMAP})
        return res

    def backup_throughput(self, srv, image, disk, rconf, c):
        res = {"disk": disk}
        self.results["backup"]["throughput"] = res  # what was measured stays if a later step fails
        # The peer: rclone copy of the raw image into another bucket of the same gateway.
        cmd = rclone_copy_cmd(rconf, image, "rclone-peer", extra=c["rclone_flags"])
        t0 = time.monotonic()
        subprocess.run(["taskset", "-c", str(self.server_cpu), *cmd], check=True, timeout=c["timeout_s"],
                       capture_output=True, env=rclone_env(os.environ))
        res["rclone_secs"] = time.monotonic() - t0
        bdev = "DiskThroughput"
        srv.rpc("bdev_uring_create", {"name": bdev, "filename": image, "block_size": 512, "direct": True})
        # A bucket of its own: every chunk goes up.
        r = self.backup_one(srv, {"bdev": bdev, "store": "bench-throughput", "sync": "full",
                                  "chunk_size": c["throughput_chunk"]}, c["timeout_s"])
        res["backup"] = r
        res["backup_mbps"] = disk / r["secs"] / 1e6
        res["rclone_mbps"] = disk / res["rclone_secs"] / 1e6
        res["ratio"] = ratio(res["backup_mbps"], res["rclone_mbps"])
        log(f"backup: full backup to the gateway {res['backup_mbps']:.0f} MB/s, rclone copy "
            f"{res['rclone_mbps']:.0f} MB/s: {res['ratio'] or 0:.2f}x")
        # The guest's side: IOPS on the disk's export without and with a speed-limited backup.
        sock = srv.export("vhost.backup", bdev, queues=1)
        point = tuple(c["guest_point"])
        res["guest"] = []
        for rep in range(c["guest_reps"]):
            for v in variant_order(rep):
                job_id = None
                if v == "on":
                    # A store of its own each repetition: every chunk it reads goes up.
                    job_id = job_id_of(srv.rpc("bdev_backup_start", {"bdev": bdev, "store": f"bench-guest-{rep}",
                                                                      "sync": "full", "speed": c["speed"]}))
                try:
                    m = measure(srv, self.loader, sock, (*point, 1, False), c["guest_secs"], False)
                finally:
                    if job_id is not None:
                        job = job_progress(srv.rpc("bdev_backup_get_jobs", {"job_id": job_id}), job_id)
                        m["backup_bytes_read"] = progress_bytes(job, "bytes_read")
                        # Lifted and let finish rather than cancelled: a first run saw
                        # bdev_backup_cancel of a limited job not answer within 30 s.
                        if not job_finished(job)[0]:
                            srv.rpc("bdev_backup_set_speed", {"job_id": job_id, "speed": 0})
                        self.backup_wait_ended(srv, job_id, c["timeout_s"])
                m.update(variant=v, rep=rep)
                res["guest"].append(m)
        iops = {v: median([m["iops"] for m in res["guest"] if m["variant"] == v]) for v in VARIANTS}
        res["guest_iops"] = iops
        res["guest_ratio"] = ratio(iops["on"], iops["off"])
        log(f"backup: guest {point_name(point)} with a backup at {c['speed'] / MIB:.0f} MiB/s: {iops['on'] or 0:,.0f} "
            f"vs {iops['off'] or 0:,.0f} IOPS = {res['guest_ratio'] or 0:.2f}x")
        return res

    def backup_first_reads(self, srv, store, backup_id, disk, c, tag):
        """fp-load's 4 KiB randread QD1 on a fresh restore (no read-ahead, its copy held) of
        `backup_id` over an empty RAM disk on `srv`: almost every read meets a chunk not fetched
        yet. The run's figures; the restore and its base are deleted after."""
        name, base = f"Restore{tag.capitalize()}", f"RestoreBase{tag.capitalize()}"
        srv.rpc("bdev_malloc_create", {"name": base, "num_blocks": disk // 512, "block_size": 512})
        srv.rpc("bdev_backup_restore_create", {"name": name, "base_bdev": base, "store": store,
                                               "bdev": "DiskThroughput", "backup_id": backup_id,
                                               "read_ahead": 0, "speed": c["restore_hold_speed"]})
        ctrlr = f"vhost.restore-{tag}"
        sock = srv.export(ctrlr, name, queues=1)
        try:
            first = measure(srv, self.loader, sock, ("randread", 4096, 1, 1, False), c["first_read_secs"], False)
        finally:
            srv.rpc("vhost_delete_controller", {"ctrlr": ctrlr})
        srv.rpc("bdev_backup_restore_delete", {"name": name})
        srv.rpc("bdev_malloc_delete", {"name": base})
        return {k: first.get(k) for k in ("iops", "ios", "p50_ns", "p99_ns", "lat_mean_ns")}

    def backup_restore(self, srv, store, store_params, endpoint, rconf, disk, c):
        res = {}
        self.results["backup"]["restore"] = res
        listing = run(["rclone", "--config", rconf, "lsf", "-R", "--files-only", "--format", "ps", "rgw:fp-throughput"],
                      120, env=rclone_env(os.environ)).stdout.splitlines()
        # Chunk objects are `chunks/<2 hex>/<64 hex>` (fp_backup); manifests lie elsewhere.
        objs = [line.split(";") for line in listing if line.startswith("chunks/")]
        big = [(p, int(s)) for p, s in objs if s.isdigit() and int(s) >= c["throughput_chunk"] // 2]
        if not big:
            raise RuntimeError("no chunk object in the gateway's bucket to time a GET of")
        # One curl for all the GETs, so that every one after the first reuses the connection, as
        # fp_backup's client does: the first is left out of the median (it also connects).
        # RGW wants x-amz-content-sha256, which Debian 12's curl does not add by itself: the
        # SHA-256 of a GET's empty body (curl signs the x-amz-* headers it is given).
        picked = big[:c["gets"] + 1]
        cmd = ["curl", "-s", "-w", "%{http_code} %{size_download} %{time_total}\\n", "--aws-sigv4",
               f"aws:amz:{endpoint.region}:s3", "--user", f"{endpoint.access_key}:{endpoint.secret_key}", "-H",
               f"x-amz-content-sha256: {EMPTY_SHA256}"]
        for p, _ in picked:
            cmd += ["-o", "/dev/null", f"{endpoint.url}/fp-throughput/{p}"]
        lines = run(cmd, 120).stdout.strip().splitlines()
        if len(lines) != len(picked):
            raise RuntimeError(f"curl timed {len(lines)} GETs of {len(picked)}")
        gets = []
        for (p, _), line in zip(picked, lines):
            code, n, secs = parse_curl_time(line)
            if code != 200:
                raise RuntimeError(f"GET {p}: HTTP {code}")
            gets.append({"object": p, "bytes": n, "secs": secs})
        gets = gets[1:] if len(gets) > 1 else gets
        res["get"] = gets
        res["get_s"] = median([g["secs"] for g in gets])
        backups = srv.rpc("backup_list", {"store": store, "bdev": "DiskThroughput"})
        backup_id = max(backups, key=lambda b: str(b.get("created", "")))["backup_id"]
        n_chunks = math.ceil(disk / c["throughput_chunk"])
        # The first reads twice: on this daemon, every thread of it on the server CPU with the
        # reactor busy-polling there (each hop of a fetch, from the store's runtime to the
        # restore's worker to the reactor, waits for the scheduler to preempt the reactor); and
        # on a daemon laid out as a deployment is, the reactor alone on its CPU and the other
        # threads free to run on the other one (the judged figure).
        first = self.backup_first_reads(srv, store, backup_id, disk, c, "pinned")
        res["first_read_pinned"] = dict(first, chunks=n_chunks)
        res["first_read_pinned_ratio"] = ratio((first["p50_ns"] or 0) / 1e9, res["get_s"])
        state = os.path.join(self.work, "state-restore-free")
        os.makedirs(state)
        free = Flashpath(self.args.bin_dir, self.work, str(self.server_cpu), name="flashpath-restore-free",
                         extra=["--state-dir", state], control_cpus=f"{self.server_cpu},{self.client_cpu}")
        try:
            free.rpc("backup_store_add", store_params)
            first = self.backup_first_reads(free, store, backup_id, disk, c, "free")
        finally:
            free.stop()
        res["first_read"] = dict(first, chunks=n_chunks)
        res["first_read_ratio"] = ratio((first["p50_ns"] or 0) / 1e9, res["get_s"])
        log(f"backup: restore: first reads p50 {first['p50_ns'] / 1000:.0f} µs (threads free), "
            f"{res['first_read_pinned']['p50_ns'] / 1000:.0f} µs (all on the server CPU) vs one GET "
            f"{res['get_s'] * 1e6:.0f} µs = {res['first_read_ratio'] or 0:.2f}x, "
            f"{res['first_read_pinned_ratio'] or 0:.2f}x")
        # Throughput: a second restore of the same backup without a speed limit, timed to its end.
        srv.rpc("bdev_malloc_create", {"name": "RestoreBase1", "num_blocks": disk // 512, "block_size": 512})
        t0 = time.monotonic()
        srv.rpc("bdev_backup_restore_create", {"name": "Restore1", "base_bdev": "RestoreBase1", "store": store,
                                               "bdev": "DiskThroughput", "backup_id": backup_id})
        while True:
            done, total = restore_state(srv.rpc("bdev_get_bdevs", {"name": "Restore1"})[0])
            if done is not None and total and done >= total:
                break
            if time.monotonic() - t0 > c["timeout_s"]:
                raise TimeoutError(f"the restore did not finish in {c['timeout_s']} s")
            time.sleep(0.05)
        res["restore_secs"] = time.monotonic() - t0
        res["restore_mbps"] = disk / res["restore_secs"] / 1e6
        log(f"backup: restore of {disk // MIB} MiB in {res['restore_secs']:.1f} s = {res['restore_mbps']:.0f} MB/s")
        return res

    def backup_boot(self, srv, store, c):
        """(D)'s boots: a root file system image backed up to `store`, then the same guest booted
        from the local disk and from live restores of the backup, repetition by repetition in
        turn; each boot's wall time (QEMU's start to FPBENCH-BOOTED) and guest uptime."""
        b = c["boot"]
        res = {"root_mib": b["root_mib"], "runs": []}
        self.results["backup"]["restore"]["boot"] = res
        kernel, base = boot_image()
        initrd = boot_initramfs(base, self.work)
        image, files = boot_root_image(base, self.work, b["root_mib"] * MIB)
        res["files_bytes"] = files
        srv.rpc("bdev_uring_create", {"name": "BootLocal", "filename": image, "block_size": 512, "direct": True})
        r = self.backup_one(srv, {"bdev": "BootLocal", "store": store, "sync": "full", "chunk_size": c["chunk_size"]},
                            c["timeout_s"])
        res["backup_uploaded"] = r["bytes_uploaded"]
        backups = srv.rpc("backup_list", {"store": store, "bdev": "BootLocal"})
        backup_id = max(backups, key=lambda x: str(x.get("created", "")))["backup_id"]
        size = b["root_mib"] * MIB
        for rep in range(b["reps"]):
            # The order turns each repetition: no variant always boots first after the backup.
            order = BOOT_VARIANTS[rep % 3:] + BOOT_VARIANTS[:rep % 3]
            for v in order:
                bdev = "BootLocal"
                if v != "local":
                    tag = f"{'Held' if v == 'restore-held' else 'Copy'}{rep}"
                    bdev, base_bdev = f"BootRestore{tag}", f"BootBase{tag}"
                    srv.rpc("bdev_malloc_create", {"name": base_bdev, "num_blocks": size // 512, "block_size": 512})
                    params = {"name": bdev, "base_bdev": base_bdev, "store": store, "bdev": "BootLocal",
                              "backup_id": backup_id}
                    if v == "restore-held":
                        params["speed"] = b["held_speed"]
                    srv.rpc("bdev_backup_restore_create", params)
                run_ = self.backup_boot_one(srv, bdev, kernel, initrd, f"boot-{rep}-{v}", b)
                run_.update(variant=v, rep=rep)
                if v != "local":
                    done, total = restore_state(srv.rpc("bdev_get_bdevs", {"name": bdev})[0])
                    run_["chunks_restored_after"], run_["chunks"] = done, total
                    srv.rpc("bdev_backup_restore_delete", {"name": bdev})
                    srv.rpc("bdev_malloc_delete", {"name": base_bdev})
                res["runs"].append(run_)
                log(f"backup: boot {v:<12} rep {rep}: {run_['wall_s']:.1f} s (guest uptime {run_['uptime_s']:.1f} s, "
                    f"{run_['read_kib'] // 1024} MiB read)")
        res.update(summarize_boots(res["runs"]))
        srv.rpc("bdev_uring_delete", {"name": "BootLocal"})
        return res

    def backup_boot_one(self, srv, bdev, kernel, initrd, name, b):
        sock = srv.export(f"vhost.{name}", bdev, queues=1)
        t0 = time.monotonic()
        guest = Guest(name, self.work, self.client_cpu, sock, kernel, initrd, "boot", b["mem_mib"])
        try:
            line = guest.wait_line(r"FPBENCH-BOOTED ", b["timeout_s"])
            wall = time.monotonic() - t0
            root = guest.wait_line(r"FPBENCH-ROOT ", 5)
        finally:
            guest.stop()
            srv.rpc("vhost_delete_controller", {"ctrlr": f"vhost.{name}"})
        fields = line.split("FPBENCH-BOOTED ", 1)[1].split()
        return {"wall_s": wall, "uptime_s": float(fields[0]), "read_kib": int(fields[1]),
                "root_at_s": float(root.split("FPBENCH-ROOT ", 1)[1].split()[0])}


def summarize_boots(runs):
    """Each variant's median wall time and guest uptime at the end of its boots, and each restore
    variant's median against the local disk's."""
    out = {}
    for key in ("wall_s", "uptime_s"):
        med = {v: median([r[key] for r in runs if r["variant"] == v]) for v in BOOT_VARIANTS}
        out[f"median_{key}"] = med
    loc = out["median_wall_s"].get("local")
    out["ratio"] = {v: ratio(out["median_wall_s"].get(v), loc) for v in BOOT_VARIANTS if v != "local"}
    return out

