"""raid1 (issue 26, `--only raid`): the cost of a mirrored write and read against a single RAM
disk, a partial rebuild's copy against what was written while a replica was out, and a full
rebuild's speed against a plain copy of the same disk with guest reads running beside it.
docs/benchmarks.md, "raid1", describes every step. Never in CI: a benchmark, not a test.
"""

import os
import shutil
import tempfile
import time

from fpbench.common import GIB, MIB, log, median, proc_cpu, ratio, thread_cpu, write_random_file
from fpbench.load import measure, point_key, point_label, summarize
from fpbench.servers import Flashpath, jsonrpc

# The variants of the cost part: a malloc bdev exported raw, and raid1 over two of them with
# and without a superblock (with one, every write goes through the on-disk write-intent bitmap).
VARIANTS = ("single", "raid1", "raid1-nosb")
# (pattern, bs, qd, queues, poll) as the other sections write them.
POINTS = [(pattern, 4096, qd, 1, True) for pattern in ("randwrite", "randread") for qd in (1, 32)]
# The guest load beside a full rebuild: fd client (it sleeps on its completion fd, as a VM's
# virtio driver waits for an interrupt), so the server core is not shared with a poller.
GUEST = ("randread", 4096, 32, 1, False)
# Room for the superblock copies and the bitmap pages ahead of the data (design: data_offset =
# the metadata pages rounded up to 1 MiB): the raid's data region is then at least `size`.
META = 8 * MIB
CONFIG = {
    "full": {"secs": 3.0, "reps": 3, "cost_size": 256 * MIB, "points": POINTS, "variants": VARIANTS,
             "partial_size": GIB, "write_secs": 10.0, "region": 64 * MIB, "full_size": GIB, "copy_reps": 3,
             "lead_s": 2.0},
    "quick": {"secs": 2.0, "reps": 2, "cost_size": 256 * MIB, "points": POINTS, "variants": VARIANTS,
              "partial_size": GIB, "write_secs": 10.0, "region": 64 * MIB, "full_size": GIB, "copy_reps": 2,
              "lead_s": 1.5},
    "smoke": {"secs": 1.0, "reps": 1, "cost_size": 32 * MIB, "points": POINTS, "variants": VARIANTS,
              "partial_size": 64 * MIB, "write_secs": 1.0, "region": 8 * MIB, "full_size": 64 * MIB, "copy_reps": 1,
              "lead_s": 0.5},
}
# How often the bench asks the daemon for a process's progress (direct JSON-RPC on its socket:
# no CLI process per poll on the machine being measured).
POLL_S = 0.02
# Timeline buckets of the guest load beside a copy; a bucket counts as "during" the copy only
# when it lies wholly inside it, with one bucket of margin at each end for the alignment.
BUCKET_S = 0.1
# How much slower than alone a copy beside the guest's load may run and still have the load
# outlast it: at the default share a rebuild beside a QD32 guest ran 5x slower than alone, and
# with 3 here the load ended first, so 40 % of its bytes went unshared and its rate read high.
COPY_SLOWDOWN = 12
# The copy-share target's rebuild speed, as a fraction of the rebuild's alone: the bench holds a
# rebuild there with the speed limit (share off) to see what the guest keeps at it.
AT_TARGET = 0.5
BLOCK = 4096
# fp-load's seed for the partial rebuild's writes (replayed to know which blocks they hit).
SEED = 26
# Where the full-rebuild part keeps each kind's timed runs.
LISTS = {"copy": "copies", "rebuild": "rebuilds"}


def reactor_sample(fp):
    """The daemon's reactors summed: (busy ns, rounds), from `framework_get_reactors`; with the
    wall time between two samples, the busy share of the server's core over a copy."""
    r = jsonrpc(fp.rpc_sock, "framework_get_reactors", {})
    return (sum(x["busy"] for x in r["reactors"]), sum(x.get("rounds", 0) for x in r["reactors"]))


def raid_config(mode):
    return CONFIG[mode]


def find_key(obj, name):
    """The first value of key `name` anywhere in `obj` (dicts and lists, depth first), or None:
    flashpath's own raid fields sit in an object of their own in `bdev_raid_get_bdevs`, whose
    exact place the bench need not know."""
    if isinstance(obj, dict):
        if name in obj:
            return obj[name]
        children = obj.values()
    elif isinstance(obj, list):
        children = obj
    else:
        return None
    for v in children:
        got = find_key(v, name)
        if got is not None:
            return got
    return None


def differing_blocks(path_a, path_b, offset, length, block=BLOCK, chunk=None):
    """Blocks of `block` bytes that differ between the two files in [offset, offset + length),
    and, with `chunk`, the chunks of that size holding at least one: (blocks, chunks)."""
    blocks, chunks = 0, set()
    step = 4 * MIB
    with open(path_a, "rb") as fa, open(path_b, "rb") as fb:
        fa.seek(offset)
        fb.seek(offset)
        done = 0
        while done < length:
            n = min(step, length - done)
            a, b = fa.read(n), fb.read(n)
            if a != b:
                for i in range(0, n, block):
                    if a[i:i + block] != b[i:i + block]:
                        blocks += 1
                        if chunk:
                            chunks.add((done + i) // chunk)
            done += n
    return blocks, len(chunks)


def splitmix64(seed):
    """SplitMix64's numbers from `seed`, as crates/loadgen/src/rng.rs makes them."""
    mask = (1 << 64) - 1
    state = seed
    while True:
        state = (state + 0x9E3779B97F4A7C15) & mask
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
        yield z ^ (z >> 31)


def written_blocks(seed, blocks, ios, qd, chunk=None):
    """The blocks fp-load's randwrite (one queue, `--seed seed`) wrote over a region of `blocks`
    4 KiB blocks when it reported `ios` completions: its offsets replayed (rng.rs's `below`, a
    multiply-high). (distinct blocks among the first `ios` offsets, among the first `ios + qd`
    (the drained ones included), chunks of `chunk` bytes the latter touch)."""
    rng = splitmix64(seed)
    seen = {(next(rng) * blocks) >> 64 for _ in range(ios)}
    lo = len(seen)
    seen.update((next(rng) * blocks) >> 64 for _ in range(qd))
    chunks = len({b * BLOCK // chunk for b in seen}) if chunk else 0
    return lo, len(seen), chunks


def window_rate(timeline, run_start, lo, hi):
    """The mean I/O rate of `timeline`'s buckets lying wholly inside [lo, hi] (seconds on the
    bench's clock; bucket i starts at run_start + i * interval), and how many there were."""
    step = timeline["interval_s"]
    ios = [n for i, n in enumerate(timeline["ios"])
           if run_start + i * step >= lo and run_start + (i + 1) * step <= hi]
    return (sum(ios) / (len(ios) * step) if ios else None), len(ios)


class RaidSection:
    """Bench's methods for this section (mixed into bench.Bench)."""

    def run_raid(self):
        c = dict(raid_config(self.args.mode))
        c.update({k: v for k, v in (("secs", self.args.time), ("reps", self.args.reps)) if v})
        out = {"config": {k: v for k, v in c.items() if k != "points"}, "points": [],
               "loadavg_before": os.getloadavg()}
        self.results["raid"] = out
        self.raid_cost(c, out)
        self.raid_partial(c, out, "file")
        self.raid_partial(c, out, "ram")
        self.raid_partial(c, out, "ram", c["region"])
        self.raid_full(c, out)
        out["loadavg_after"] = os.getloadavg()

    # -- helpers -------------------------------------------------------------------------------

    def raid_daemon(self, name):
        return Flashpath(self.args.bin_dir, self.work, str(self.server_cpu), name=name)

    @staticmethod
    def raid_info(fp, name="Raid0"):
        """The raid's `bdev_raid_get_bdevs` entry (direct JSON-RPC)."""
        for e in jsonrpc(fp.rpc_sock, "bdev_raid_get_bdevs", {"category": "all"}):
            if e.get("name") == name:
                return e
        raise RuntimeError(f"{fp.name}: bdev_raid_get_bdevs does not list {name}")

    @staticmethod
    def bdev_geometry(fp, name="Raid0"):
        """(block size, bytes) of bdev `name` (`bdev_get_bdevs`: SPDK's raid entry has neither)."""
        b = jsonrpc(fp.rpc_sock, "bdev_get_bdevs", {"name": name})[0]
        return b["block_size"], b["block_size"] * b["num_blocks"]

    @staticmethod
    def raid_create(fp, bases, superblock, name="Raid0"):
        fp.rpc("bdev_raid_create", {"name": name, "raid_level": "raid1", "base_bdevs": bases,
                                    "superblock": superblock})
        return name

    def raid_wait(self, fp, pred, what, timeout=120):
        """Polls the raid's entry until `pred(entry)`; (the entry, seconds waited, every process
        type seen on the way)."""
        t0 = time.monotonic()
        seen = set()
        while True:
            e = self.raid_info(fp)
            proc = e.get("process")
            if proc:
                if not seen:
                    self.raid_first_process = e  # what the raid said while its process ran
                seen.add(f"{proc.get('type')} ({find_key(e, 'rebuild_kind')})")
            if pred(e):
                return e, time.monotonic() - t0, sorted(seen)
            if time.monotonic() - t0 > timeout:
                raise RuntimeError(f"{fp.name}: {what} not done after {timeout} s: {e}")
            time.sleep(POLL_S)

    @staticmethod
    def raid_rebuilt(before):
        """A predicate: the rebuild that started after `before` (the counters then) is over."""
        done0 = find_key(before, "rebuilds_completed") or 0

        def pred(e):
            done = find_key(e, "rebuilds_completed")
            slots = find_key(e, "slots")
            if done is not None:
                return done > done0 and not e.get("process") and (slots is None or all(x == "active" for x in slots))
            bases = e.get("base_bdevs_list") or []
            return not e.get("process") and bases and all(b.get("is_configured") for b in bases) and \
                e.get("num_base_bdevs_operational") == e.get("num_base_bdevs")
        return pred

    @staticmethod
    def raid_degraded(e):
        return e.get("num_base_bdevs_operational", 0) < e.get("num_base_bdevs", 0) or \
            not all(b.get("is_configured") for b in e.get("base_bdevs_list") or [])

    @staticmethod
    def counters(e):
        keys = ("rebuild_bytes_copied", "rebuild_bytes_unshared", "degraded_bytes_written", "rebuilds_completed", "bitmap_writes",
                "superblock_writes", "base_failures", "bitmap_chunk_bytes", "slots")
        return {k: find_key(e, k) for k in keys}

    # -- 1. the cost of a mirrored write ---------------------------------------------------------

    def raid_cost(self, c, out):
        """One daemon per variant on the server CPU (the others sleep while one is measured):
        `single` exports a malloc bdev, `raid1` raid1 with a superblock over two, `raid1-nosb`
        the same without one. Every disk written in full first; each point runs `reps` times per
        variant, the order rotating."""
        size = c["cost_size"]
        servers, socks = {}, {}
        try:
            for v in c["variants"]:
                fp = servers[v] = self.raid_daemon(f"flashpath-raid-{v}")
                if v == "single":
                    socks[v] = fp.add_disk("ram", size)
                    continue
                for b in ("Malloc0", "Malloc1"):
                    fp.rpc("bdev_malloc_create", {"name": b, "num_blocks": (size + META) // 512, "block_size": 512})
                self.raid_create(fp, ["Malloc0", "Malloc1"], v == "raid1")
                socks[v] = fp.export("vhost.raid", "Raid0")
                out.setdefault("cost_raid", {})[v] = self.raid_info(fp)
            for v in c["variants"]:
                log(f"raid: filling {v}")
                # The raid's data region is a little larger than the single disk: all of it.
                self.fill_ram(socks[v], size if v == "single" else self.bdev_geometry(servers[v])[1])
            for point in c["points"]:
                runs = {v: [] for v in c["variants"]}
                order = list(c["variants"])
                for _ in range(c["reps"]):
                    for v in order:
                        runs[v].append(self.raid_measure(servers[v], socks[v], point, c["secs"]))
                    order = order[1:] + order[:1]
                p = dict(point_key("ram", point), runs=runs, median={})
                for v, rs in runs.items():
                    md = summarize(rs)
                    md["work_ns_per_io"] = median([r["work_ns_per_io"] for r in rs])
                    md["other_threads_ns_per_io"] = median([r["other_threads_ns_per_io"] for r in rs])
                    md["server_wait_share"] = median([r["server_wait_share"] for r in rs])
                    xs = [r["iops"] for r in rs]
                    md["iops_spread"] = (max(xs) - min(xs)) / md["iops"] if md.get("iops") else None
                    p["median"][v] = md
                p["ratios"] = {v: {m: ratio(p["median"][v].get(m), p["median"]["single"].get(m))
                                   for m in ("iops", "reactor_busy_ns_per_io", "work_ns_per_io",
                                             "server_cpu_ns_per_io", "p50_ns")}
                               for v in c["variants"] if v != "single"}
                out["points"].append(p)
                md = p["median"]
                log(f"raid {point_label(p):<30} " + "  ".join(
                    f"{v} {md[v]['iops']:>9.0f} IOPS {md[v]['work_ns_per_io']:>6.0f} ns/IO" for v in c["variants"]))
        finally:
            for s in servers.values():
                s.stop()

    def raid_measure(self, server, sock, point, secs):
        """`measure`, plus the CPU of the daemon's threads other than its reactors per I/O (the raid
        owner's bitmap writes run there) and the work per I/O: reactor busy time plus that."""
        t0, w0 = thread_cpu(server.pid), proc_cpu(server.pid)["wait_ns"]
        r = measure(server, self.loader, sock, point, secs, False)
        t1, w1 = thread_cpu(server.pid), proc_cpu(server.pid)["wait_ns"]
        # The share of the run the daemon was runnable while something else had its CPU: more
        # than a few % means the run measured the machine's other load too.
        r["server_wait_share"] = (w1 - w0) / 1e9 / r["elapsed_s"] if r["elapsed_s"] else None
        other = sum(t1[k] - t0.get(k, 0) for k in t1 if not k.startswith("reactor"))
        r["threads_ns"] = {k: t1[k] - t0.get(k, 0) for k in t1}
        r["other_threads_ns_per_io"] = other / r["ios"] if r["ios"] else None
        r["work_ns_per_io"] = (r["reactor_busy_ns_per_io"] or 0) + (r["other_threads_ns_per_io"] or 0)
        return r

    # -- 2. partial rebuild ----------------------------------------------------------------------

    def raid_partial(self, c, out, kind, region=None):
        """raid1 with a superblock over two bases, identical to start with; one replica removed;
        `write_secs` of QD32 4 KiB randwrite (a known seed); the replica added back, the rebuild
        waited for, its bytes copied read from the raid's counters. The unique bytes written
        meanwhile: fp-load's offsets replayed (`written_blocks`); with `kind` "file" (two files on
        tmpfs through bdev_uring, readable by the bench) also the files compared block by block,
        before (the replay's check) and after the rebuild (they must be identical). With "ram"
        (malloc bases) the writes run at the RAM disks' rate. `region`: the writes confined to the
        raid's first `region` bytes (an outage during which the guest wrote one part of its disk:
        what a partial rebuild saves), reported beside the issue's target."""
        size = c["partial_size"]
        base = size + META
        shm = tempfile.mkdtemp(prefix="fp-bench-raid.", dir="/dev/shm")
        e = {"kind": kind, "size": size, "base_size": base, "write_secs": c["write_secs"], "seed": SEED,
             "dir": "tmpfs (/dev/shm), bdev_uring O_DIRECT" if kind == "file" else "malloc", "region": region}
        out["partial" if kind == "file" else "partial_region" if region else "partial_ram"] = e
        fp = None
        try:
            fp = self.raid_daemon(f"flashpath-raid-partial-{kind}{'-region' if region else ''}")
            paths = [os.path.join(shm, n) for n in ("a.img", "b.img")]
            if kind == "file":
                log(f"raid partial: two {base // MIB} MiB base files of random data on tmpfs")
                write_random_file(paths[0], base)
                shutil.copyfile(paths[0], paths[1])
            for name, path in zip(("BaseA", "BaseB"), paths):
                if kind == "file":
                    fp.rpc("bdev_uring_create", {"name": name, "filename": path, "block_size": 512, "direct": True})
                else:
                    fp.rpc("bdev_malloc_create", {"name": name, "num_blocks": base // 512, "block_size": 512})
            self.raid_create(fp, ["BaseA", "BaseB"], True)
            sock = fp.export("vhost.raid", "Raid0")
            info = self.raid_info(fp)
            e["raid_created"] = info
            bs, raid_bytes = self.bdev_geometry(fp)
            # SPDK gives a base's data_offset and data_size in blocks of the raid.
            b0 = (info.get("base_bdevs_list") or [{}])[0]
            off = (b0.get("data_offset") or 0) * bs
            length = (b0.get("data_size") or (raid_bytes // bs)) * bs
            e["data_offset"], e["data_bytes"] = off, length
            if off + length > base or length < raid_bytes:
                raise RuntimeError(f"raid partial: data region {off} + {length} bytes does not fit the {base}-byte "
                                   f"bases or the {raid_bytes}-byte raid (data_offset/data_size not in blocks?)")
            if kind == "ram":
                log(f"raid partial (RAM): filling the raid ({raid_bytes // MIB} MiB)")
                self.fill_ram(sock, raid_bytes)
                # The fill's bits would make the rebuild copy the whole disk: wait for the
                # owner's lazy clearing (two idle passes, 5 s apart) to write them back clean.
                e["settle_s"], e["settled"] = self.raid_settle(fp)
            fp.rpc("bdev_raid_remove_base_bdev", {"name": "BaseB"})
            removed, _, _ = self.raid_wait(fp, self.raid_degraded, "removing BaseB", 30)
            e["after_remove"] = removed
            c0 = self.counters(removed)
            log(f"raid partial ({kind}): BaseB removed; {c['write_secs']:g} s of QD32 4 KiB randwrite")
            extra = ["--seed", str(SEED)] + (["--size", str(region)] if region else [])
            res = self.loader.run(sock, "randwrite", BLOCK, 32, 1, True, c["write_secs"], extra=extra)
            if res["errors"]:
                raise RuntimeError(f"raid partial: {res['errors']} writes failed ({res['first_error']})")
            e["writes"] = {k: res[k] for k in ("ios", "bytes", "iops", "elapsed_s", "p50_ns", "p99_ns")}
            degraded = self.raid_info(fp)
            c1 = self.counters(degraded)
            chunk = c1.get("bitmap_chunk_bytes")
            e["bitmap_chunk"] = chunk
            # fp-load drains what is in flight when the run ends without counting it: the
            # blocks written are those of the first `ios` offsets and the `qd` after them.
            lo, hi, chunks = written_blocks(SEED, (region or raid_bytes) // BLOCK, res["ios"], 32, chunk)
            e["unique_bytes_replay"] = [lo * BLOCK, hi * BLOCK]
            # The drained writes reached the disk too: the larger count is the one the file
            # comparison finds (the check below).
            e["unique_bytes"] = hi * BLOCK
            e["dirty_chunk_bytes"] = chunks * chunk if chunk else None
            if kind == "file":
                t = time.monotonic()
                blocks, _ = differing_blocks(paths[0], paths[1], off, length)
                e["compare_s"] = time.monotonic() - t
                e["unique_bytes_compared"] = blocks * BLOCK
                # The replay is right when the files say the same (a write may rewrite a block
                # with the data it had only by chance: never with random data).
                e["replay_agrees"] = lo <= blocks <= hi
            e["degraded_bytes_written"] = (c1["degraded_bytes_written"] or 0) - (c0["degraded_bytes_written"] or 0) \
                if c1["degraded_bytes_written"] is not None else None
            log(f"raid partial ({kind}): {res['bytes'] / MIB:.0f} MiB written, {e['unique_bytes'] / MIB:.1f} MiB of it "
                "unique; adding BaseB back")
            t = time.monotonic()
            self.raid_first_process = None
            fp.rpc("bdev_raid_add_base_bdev", {"raid_bdev": "Raid0", "base_bdev": "BaseB"})
            done, secs, kinds = self.raid_wait(fp, self.raid_rebuilt(degraded), "the partial rebuild", 600)
            e["rebuild_s"] = time.monotonic() - t
            e["process_types"] = kinds
            e["during_rebuild"] = getattr(self, "raid_first_process", None)
            e["after_rebuild"] = done
            c2 = self.counters(done)
            copied = (c2["rebuild_bytes_copied"] or 0) - (c1["rebuild_bytes_copied"] or 0) \
                if c2["rebuild_bytes_copied"] is not None else None
            e["bytes_copied"] = copied
            e["copied_per_unique"] = ratio(copied, e["unique_bytes"])
            e["copied_per_written"] = ratio(copied, res["bytes"])
            e["copied_per_dirty_chunks"] = ratio(copied, e["dirty_chunk_bytes"])
            left = None
            if kind == "file":
                # Both replicas hold the same data now (the metadata pages differ by design).
                left, _ = differing_blocks(paths[0], paths[1], off, length)
            e["blocks_differing_after"] = left
            log(f"raid partial ({kind}): copied {(copied or 0) / MIB:.1f} MiB in {e['rebuild_s']:.2f} s ({kinds}): "
                f"{e['copied_per_unique'] or 0:.3f}x the unique bytes, {e['copied_per_written'] or 0:.3f}x the "
                f"bytes written" + (f"; {left} blocks differ afterwards" if kind == "file" else ""))
        finally:
            if fp:
                fp.stop()
            shutil.rmtree(shm, ignore_errors=True)

    def raid_settle(self, fp, quiet_s=6.0, timeout=40.0):
        """Waits until the raid's bitmap writes moved and then stayed still for `quiet_s` (the
        clearing pass wrote the idle chunks' bits back); (seconds waited, whether it settled)."""
        t0 = time.monotonic()
        first = last = find_key(self.raid_info(fp), "bitmap_writes")
        since = time.monotonic()
        while time.monotonic() - t0 < timeout:
            time.sleep(0.5)
            now = find_key(self.raid_info(fp), "bitmap_writes")
            if now != last:
                last, since = now, time.monotonic()
            elif last != first and time.monotonic() - since >= quiet_s:
                return time.monotonic() - t0, True
        return time.monotonic() - t0, False

    # -- 3. full rebuild against a plain copy ----------------------------------------------------

    def raid_full(self, c, out):
        """One daemon, malloc bdevs MallocA and MallocB of `full_size` + META, and a fresh target
        MallocC for every copy. The plain copy: a mirror job (bdev_mirror_start) from MallocA,
        exported raw and written in full, to MallocC, timed to `ready` (every byte copied once),
        alone and with the guest load on MallocA's export. Then raid1 with a superblock over
        MallocA and MallocB, MallocB removed, and MallocC (fresh: an unknown base, so a full
        rebuild) added and waited for, alone and under the same guest load on the raid's export,
        removed again between rounds. The guest's IOPS without a copy: the degraded raid (reads
        come from MallocA alone, as during the rebuild) and the healthy one after."""
        size = c["full_size"] + META
        e = {"base_size": size, "guest": point_key("ram", GUEST), "copies": [], "rebuilds": [], "rebuilds_limited": [], "rebuilds_at_target": [],
             "guest_runs": {}}
        out["full"] = e
        fp = self.raid_daemon("flashpath-raid-full")
        try:
            for b in ("MallocA", "MallocB"):
                fp.rpc("bdev_malloc_create", {"name": b, "num_blocks": size // 512, "block_size": 512})
            sock = fp.export("vhost.a", "MallocA")
            log(f"raid full: filling MallocA ({size // MIB} MiB)")
            self.fill_ram(sock, size)
            # The guest alone on MallocA's own export: the plain copy's reference.
            e["guest_runs"]["source"] = [measure(fp, self.loader, sock, GUEST, c["secs"], False)
                                         for _ in range(c["reps"])]
            for loaded in (False, True):
                for _ in range(c["copy_reps"]):
                    self.fresh_target(fp)
                    r = self.timed_copy(fp, c, sock if loaded else None, "copy",
                                        lambda: fp.rpc("bdev_mirror_start", {"source": "MallocA", "target": "MallocC",
                                                                             "job_id": "copy"}),
                                        lambda: self.mirror_ready(fp))
                    fp.rpc("bdev_mirror_cancel", {"job_id": "copy"})
                    fp.rpc("bdev_mirror_cancel", {"job_id": "copy"})  # dismisses the ended job
                    e["copies"].append(r)
            fp.rpc("vhost_delete_controller", {"ctrlr": "vhost.a"})
            self.raid_create(fp, ["MallocA", "MallocB"], True)
            sock = fp.export("vhost.raid", "Raid0")
            fp.rpc("bdev_raid_remove_base_bdev", {"name": "MallocB"})
            self.raid_wait(fp, self.raid_degraded, "removing MallocB", 30)
            e["guest_runs"]["degraded"] = [measure(fp, self.loader, sock, GUEST, c["secs"], False)
                                           for _ in range(c["reps"])]
            # Alone, under the load, and under the load with the rebuild limited
            # (`process_max_bandwidth_mb_sec`) to a little over 0.8x the plain copy alone: what the
            # guest keeps when the rebuild runs just fast enough for the speed target. Last, the
            # share off (`process_weight` 100) and the rebuild held by the speed limit at
            # AT_TARGET of its own speed alone: what one core leaves the guest when the rebuild
            # runs at the copy-share target's speed, whatever rule shares the core.
            copy_alone = median([r["mb_per_s"] for r in e["copies"] if not r["loaded"]])
            limit = int(copy_alone * 0.85) + 1
            e["limit_mb_s"] = limit
            rounds = ([("rebuilds", False)] * c["copy_reps"] + [("rebuilds", True)] * c["copy_reps"]
                      + [("rebuilds_limited", True)] * c["copy_reps"] + [("rebuilds_at_target", True)] * c["copy_reps"])
            for i, (group, loaded) in enumerate(rounds):
                # The share is turned off only for the last group: the daemon's default before it.
                cap, opts = 0, {}
                if group == "rebuilds_limited":
                    cap = limit
                elif group == "rebuilds_at_target":
                    alone = median([r["mb_per_s"] for r in e["rebuilds"] if not r["loaded"]])
                    # The limit is in MiB/s (SPDK's unit), the bench's rates in MB/s.
                    cap, opts = max(1, round(alone * AT_TARGET * 1e6 / MIB)), {"process_weight": 100}
                    e["at_target_limit_mib_s"] = cap
                fp.rpc("bdev_raid_set_options", {"process_max_bandwidth_mb_sec": cap, **opts})
                self.fresh_target(fp)
                before = self.raid_info(fp)
                r = self.timed_copy(fp, c, sock if loaded else None, "rebuild",
                                    lambda: fp.rpc("bdev_raid_add_base_bdev",
                                                   {"raid_bdev": "Raid0", "base_bdev": "MallocC"}),
                                    self.rebuild_done(fp, before))
                r["counters"] = self.counters(self.raid_info(fp))
                r["counters_before"] = self.counters(before)
                r["limit_mb_s"] = cap
                r["share_off"] = bool(opts)
                e.setdefault(group, []).append(r)
                if i < len(rounds) - 1:
                    fp.rpc("bdev_raid_remove_base_bdev", {"name": "MallocC"})
                    self.raid_wait(fp, self.raid_degraded, "removing MallocC", 30)
            fp.rpc("bdev_raid_set_options", {"process_max_bandwidth_mb_sec": 0})
            e["guest_runs"]["healthy"] = [measure(fp, self.loader, sock, GUEST, c["secs"], False)
                                          for _ in range(c["reps"])]
            self.raid_full_summary(e)
        finally:
            fp.stop()

    def fresh_target(self, fp):
        """MallocC, new (never written: a full copy's target pays for its pages as a new disk does)."""
        names = {b["name"] for b in jsonrpc(fp.rpc_sock, "bdev_get_bdevs", {})}
        if "MallocC" in names:
            fp.rpc("bdev_malloc_delete", {"name": "MallocC"})
        size = self.results["raid"]["full"]["base_size"]
        fp.rpc("bdev_malloc_create", {"name": "MallocC", "num_blocks": size // 512, "block_size": 512})

    @staticmethod
    def mirror_ready(fp):
        jobs = jsonrpc(fp.rpc_sock, "bdev_mirror_get_jobs", {"job_id": "copy"})
        if jobs and jobs[0]["state"] == "failed":
            raise RuntimeError(f"mirror job failed: {jobs[0]}")
        return bool(jobs) and jobs[0]["state"] == "ready", (jobs[0] if jobs else None)

    def rebuild_done(self, fp, before):
        pred = self.raid_rebuilt(before)

        def done():
            e = self.raid_info(fp)
            return pred(e), e
        return done

    def timed_copy(self, fp, c, sock, kind, start, done):
        """Starts a copy (`start()`), polls `done()` -> (bool, state) until it says so; with `sock`,
        the guest load runs on that export from `lead_s` before the start until well after the
        end, with a timeline, and the rates before and during the copy come from its buckets."""
        bytes_ = c["full_size"] + META if kind == "copy" else None
        load = None
        if sock:
            # Long enough for a copy COPY_SLOWDOWN times slower than the same kind alone
            # (fp-load cannot be stopped early and still report); `covered` says whether the
            # load outlasted it. A copy that outlives the load finishes beside an idle guest,
            # unshared: its rate then overstates the shared one.
            est = max([r["seconds"] for r in self.results["raid"]["full"][LISTS[kind]] if not r["loaded"]] + [0.25])
            secs = c["lead_s"] + min(COPY_SLOWDOWN * est, 120) + 2.0
            load = self.loader.popen(sock, GUEST, secs, ["--timeline", f"{int(BUCKET_S * 1000)}ms"])
            time.sleep(c["lead_s"])
        t0 = time.monotonic()
        c0 = proc_cpu(fp.pid)
        react0 = reactor_sample(fp)
        load0 = os.getloadavg()[0]
        start()
        seen = set()
        while True:
            ok, state = done()
            if state and state.get("process"):
                seen.add(f"{state['process'].get('type')} ({find_key(state, 'rebuild_kind')})")
            if load and load.ended is None and load.poll() is not None:
                load.ended = time.monotonic()
            if ok:
                break
            if time.monotonic() - t0 > 600:
                raise RuntimeError(f"raid full: the {kind} did not end in 600 s: {state}")
            time.sleep(POLL_S)
        t1 = time.monotonic()
        c1 = proc_cpu(fp.pid)
        react1 = reactor_sample(fp)
        if kind == "rebuild":
            bytes_ = self.bdev_geometry(fp)[1]  # raid1: every byte of the data region
        r = {"kind": kind, "loaded": bool(sock), "seconds": t1 - t0, "bytes": bytes_,
             "mb_per_s": bytes_ / (t1 - t0) / 1e6, "server_cpu_s": (c1["sched_ns"] - c0["sched_ns"]) / 1e9,
             "server_wait_share": (c1["wait_ns"] - c0["wait_ns"]) / 1e9 / (t1 - t0), "loadavg": load0,
             "process_types": sorted(seen)}
        # The server core's busy share over the copy (the floor's figures: its busy ns per byte
        # alone, guest and copy together under load).
        busy = react1[0] - react0[0]
        r["reactor_busy_ns"] = busy
        r["reactor_busy_frac"] = busy / 1e9 / (t1 - t0)
        r["reactor_rounds"] = react1[1] - react0[1]
        r["reactor_busy_ns_per_byte"] = busy / bytes_ if bytes_ else None
        if load:
            res = self.loader.reap(load)
            run_start = load.ended - res["elapsed_s"]
            tl = res["timeline"]
            r["guest"] = {k: res[k] for k in ("iops", "ios", "elapsed_s", "p50_ns", "p99_ns")}
            r["covered"] = load.ended >= t1
            r["guest_before_iops"], r["guest_before_buckets"] = window_rate(
                tl, run_start, run_start + 2 * BUCKET_S, t0 - BUCKET_S)
            r["guest_during_iops"], r["guest_during_buckets"] = window_rate(
                tl, run_start, t0 + BUCKET_S, t1 - BUCKET_S)
        log(f"raid full: {kind}{' under guest load' if sock else ''}: {bytes_ / MIB:.0f} MiB in {t1 - t0:.2f} s = "
            f"{r['mb_per_s']:.0f} MB/s" + (f"; guest {r['guest_before_iops'] or 0:.0f} IOPS before, "
                                            f"{r['guest_during_iops'] or 0:.0f} during" if load else ""))
        return r

    @staticmethod
    def copy_floor(e, kind, s):
        """What one server core allows the guest and the copy of `kind` together: the guest
        alone takes `guest_busy_frac` of the core for its IOPS, the copy alone `busy_ns_per_byte`
        of it per byte; a guest at fraction g of its IOPS leaves (1 - g x guest_busy_frac) of the
        core, which at the copy's cost per byte is the copy's best fraction of its idle speed.
        Set against the measured pair (the guest's and the copy's fractions under load)."""
        guest = "degraded" if kind == "rebuild" else "source"
        runs = e["guest_runs"].get(guest) or []
        g_busy = median([sum((r.get("reactor_busy_frac") or {}).values()) for r in runs])
        g_ns = median([r.get("reactor_busy_ns_per_io") for r in runs])
        alone = [r for r in e[LISTS[kind]] if not r["loaded"]]
        loaded = [r for r in e[LISTS[kind]] if r["loaded"]]
        c_ns = median([r.get("reactor_busy_ns_per_byte") for r in alone])
        c_frac = median([r.get("reactor_busy_frac") for r in alone])
        rate = s[f"{kind}_alone_mb_per_s"]
        f = {"guest_alone_busy_frac": g_busy, "guest_alone_busy_ns_per_io": g_ns,
             "copy_alone_busy_ns_per_byte": c_ns, "copy_alone_busy_frac": c_frac,
             "loaded_busy_frac": median([r.get("reactor_busy_frac") for r in loaded])}
        if None in (g_busy, c_ns, rate):
            return f
        # The core's share the copy needs at its idle speed (its busy share alone, by its cost).
        full = c_ns * rate * 1e6 / 1e9
        guest_frac = ratio(median([r.get("guest_during_iops") for r in loaded]),
                           median([r["iops"] for r in runs]))
        copy_frac = ratio(s[f"{kind}_loaded_mb_per_s"], rate)
        # The same against the guest's rate in the 2 s before each copy, in the same fp-load run:
        # on a machine shared with other work the separate guest-alone runs drift.
        f["measured"] = {"guest": guest_frac, "copy": copy_frac,
                         "guest_vs_before": median([ratio(r.get("guest_during_iops"), r.get("guest_before_iops"))
                                                    for r in loaded])}
        if guest_frac is not None and copy_frac is not None:
            # The core the measured pair takes at the costs measured alone: 1.0 is the floor.
            f["measured"]["core_at_alone_costs"] = guest_frac * g_busy + copy_frac * full
        f["best_copy_at_guest"] = {str(g): max(0.0, 1 - g * g_busy) / full
                                   for g in (0.7, guest_frac) if g is not None}
        return f

    @staticmethod
    def raid_full_summary(e):
        def med(kind, loaded, key):
            return median([r.get(key) for r in e[LISTS[kind]] if r["loaded"] == loaded])

        s = {f"{k}_{'loaded' if ld else 'alone'}_mb_per_s": med(k, ld, "mb_per_s")
             for k in ("copy", "rebuild") for ld in (False, True)}
        for k in ("degraded", "healthy"):
            s[f"guest_{k}_iops"] = median([r["iops"] for r in e["guest_runs"][k]])
        s["guest_during_rebuild_iops"] = med("rebuild", True, "guest_during_iops")
        s["guest_during_copy_iops"] = med("copy", True, "guest_during_iops")
        s["guest_before_rebuild_iops"] = med("rebuild", True, "guest_before_iops")
        s["rebuild_loaded_vs_copy_alone"] = ratio(s["rebuild_loaded_mb_per_s"], s["copy_alone_mb_per_s"])
        s["rebuild_alone_vs_copy_alone"] = ratio(s["rebuild_alone_mb_per_s"], s["copy_alone_mb_per_s"])
        s["rebuild_loaded_vs_copy_loaded"] = ratio(s["rebuild_loaded_mb_per_s"], s["copy_loaded_mb_per_s"])
        s["guest_during_vs_degraded"] = ratio(s["guest_during_rebuild_iops"], s["guest_degraded_iops"])
        s["guest_during_vs_before"] = ratio(s["guest_during_rebuild_iops"], s["guest_before_rebuild_iops"])
        s["guest_during_copy_vs_degraded"] = ratio(s["guest_during_copy_iops"], s["guest_degraded_iops"])
        s["floor"] = {k: RaidSection.copy_floor(e, k, s) for k in ("copy", "rebuild")}
        loaded = [r for k in (*LISTS.values(), "rebuilds_limited", "rebuilds_at_target") for r in e.get(k) or [] if r.get("loaded")]
        s["loaded_runs"] = len(loaded)
        s["loaded_runs_uncovered"] = sum(1 for r in loaded if r.get("covered") is False)
        lim = e.get("rebuilds_limited") or []
        if lim:
            s["limited_mb_per_s"] = median([r["mb_per_s"] for r in lim])
            s["limited_vs_copy_alone"] = ratio(s["limited_mb_per_s"], s["copy_alone_mb_per_s"])
            s["guest_during_limited_iops"] = median([r.get("guest_during_iops") for r in lim])
            s["guest_during_limited_vs_before"] = ratio(s["guest_during_limited_iops"],
                                                        median([r.get("guest_before_iops") for r in lim]))
            s["guest_during_limited_vs_degraded"] = ratio(s["guest_during_limited_iops"], s["guest_degraded_iops"])
        tgt = e.get("rebuilds_at_target") or []
        if tgt:
            s["at_target_mb_per_s"] = median([r["mb_per_s"] for r in tgt])
            s["at_target_vs_rebuild_alone"] = ratio(s["at_target_mb_per_s"], s["rebuild_alone_mb_per_s"])
            s["guest_during_at_target_iops"] = median([r.get("guest_during_iops") for r in tgt])
            s["guest_during_at_target_vs_before"] = median([ratio(r.get("guest_during_iops"), r.get("guest_before_iops"))
                                                            for r in tgt])
            s["guest_during_at_target_vs_degraded"] = ratio(s["guest_during_at_target_iops"], s["guest_degraded_iops"])
        e["summary"] = s

