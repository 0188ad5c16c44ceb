"""Logical volumes: lvol on a RAM disk vs the RAM disk alone, first writes to thin clusters,
and the lvol layer's path length.
"""

from fpbench.common import MIB, log, median, ratio
from fpbench.load import lvol_spdk_note, measure, merge_hists, point_key, point_label, summarize
from fpbench.report_format import fmt_ratio
from fpbench.servers import Flashpath


class LvolSection:
    """Bench's methods for this section (mixed into bench.Bench)."""

    def run_lvol(self):
        """Logical volumes against their base: IOPS of a thick volume vs the raw malloc bdev,
        first-write and copy-on-write latency, instructions per I/O. docs/benchmarks.md,
        "Logical volumes", describes every step."""
        c = self.cfg["lvol"]
        e = {"size": c["size"], "cluster_size": c["cluster"], "pairs": c["pairs"], "points": [],
             "first_write": [], "callgrind": []}
        self.results["lvol"] = e
        self.lvol_iops(c, e)
        for cl in c["fw_clusters"]:
            self.lvol_first_write(c, cl, e)
        if c.get("callgrind") and self.cfg.get("callgrind"):
            self.lvol_callgrind(c, e)
        e["spdk"] = lvol_spdk_note()
        log(f"SPDK: {e['spdk']}")

    def lvol_iops(self, c, e):
        """Two flashpath daemons on the server CPU: one exports a malloc bdev raw, the other a
        THICK volume filling an lvstore on a malloc bdev of the same size; both disks fully
        written first. Each point runs `pairs` times on each, the order alternating (raw, lvol,
        lvol, raw, ...) so drift in the machine falls on both alike."""
        size, cl = c["size"], c["cluster"]
        cpu = str(self.server_cpu)
        raw = Flashpath(self.args.bin_dir, self.work, cpu, name="flashpath-lvol-raw")
        lv = Flashpath(self.args.bin_dir, self.work, cpu, name="flashpath-lvol-thick")
        try:
            socks = {"raw": raw.add_disk("ram", size)}
            vol, vol_size, lvs = lv.lvol_disk(size, cl)
            socks["lvol"] = lv.export("vhost.lvol", vol)
            e["thick_volume_size"] = vol_size
            e["lvstore"] = lvs
            log(f"filling the raw disk ({size // MIB} MiB) and the thick volume ({vol_size // MIB} MiB)")
            self.fill_ram(socks["raw"], size)
            self.fill_ram(socks["lvol"], vol_size)
            servers = {"raw": raw, "lvol": lv}
            for point in c["points"]:
                runs = {"raw": [], "lvol": []}
                for i in range(c["pairs"]):
                    for k in (("raw", "lvol") if i % 2 == 0 else ("lvol", "raw")):
                        runs[k].append(measure(servers[k], self.loader, socks[k], point, self.secs, False))
                p = dict(point_key("ram", point), runs=runs,
                         median={k: summarize(v) for k, v in runs.items()})
                iops = {k: [r["iops"] for r in v] for k, v in runs.items()}
                p["spread"] = {k: (max(v) - min(v)) / median(v) for k, v in iops.items()}
                p["ratio"] = ratio(p["median"]["lvol"]["iops"], p["median"]["raw"]["iops"])
                # Each pair's own ratio: how far single comparisons scatter.
                p["pair_ratios"] = [ratio(a, b) for a, b in zip(iops["lvol"], iops["raw"])]
                e["points"].append(p)
                log(f"lvol {point_label(p):<32} raw {p['median']['raw']['iops']:>10.0f}  lvol "
                    f"{p['median']['lvol']['iops']:>10.0f}  lvol/raw {fmt_ratio(p['ratio'])} (pairs "
                    f"{min(p['pair_ratios']):.2f}-{max(p['pair_ratios']):.2f})")
        finally:
            raw.stop()
            lv.stop()

    def lvol_first_write(self, c, cl, e):
        """QD1 4 KiB writes, one per cluster (fp-load --stride CLUSTER --ios N), on a fresh
        daemon per repetition, in this order on one malloc bdev (written in full first,
        as a RAM disk in use is):
        raw: the malloc bdev itself, exported raw (the baseline);
        allocate: a fresh THIN volume, so every write allocates (zeroes) its cluster;
        cow: the volume written in full, snapshotted, so every write copies its cluster;
        overwrite: the same writes again, to clusters the volume now owns.
        `cl`: the cluster size."""
        size = c["size"]
        n = size // cl
        base_size = 2 * size + 16 * cl  # the volume, its copies after the snapshot, metadata
        fw_args = ["--stride", str(cl), "--ios", str(n), "--size", str(size)]
        runs = {"raw": [], "allocate": [], "cow": [], "overwrite": []}
        for rep in range(c["fw_reps"]):
            fp = Flashpath(self.args.bin_dir, self.work, str(self.server_cpu),
                           name=f"flashpath-lvol-fw{cl // MIB}m-{rep}")
            try:
                fp.rpc("bdev_malloc_create", {"name": "Malloc0", "num_blocks": base_size // 512, "block_size": 512})
                sock = fp.export("vhost.base", "Malloc0")
                self.fill_ram(sock, base_size)
                runs["raw"].append(self.lvol_writes(fp, sock, n, fw_args))
                fp.rpc("vhost_delete_controller", {"ctrlr": "vhost.base"})
                fp.rpc("bdev_lvol_create_lvstore", {"bdev_name": "Malloc0", "lvs_name": "lvs0", "cluster_sz": cl})
                vol = fp.rpc("bdev_lvol_create", {"lvol_name": "vol0", "size_in_mib": size // MIB,
                                                  "thin_provision": True, "lvs_name": "lvs0"})
                sock = fp.export("vhost.lvol", vol)
                runs["allocate"].append(self.lvol_writes(fp, sock, n, fw_args))
                self.fill_ram(sock, size)
                fp.rpc("bdev_lvol_snapshot", {"lvol_name": "lvs0/vol0", "snapshot_name": "snap0"})
                free0 = fp.rpc("bdev_lvol_get_lvstores", {"lvs_name": "lvs0"})[0]["free_clusters"]
                runs["cow"].append(self.lvol_writes(fp, sock, n, fw_args))
                free1 = fp.rpc("bdev_lvol_get_lvstores", {"lvs_name": "lvs0"})[0]["free_clusters"]
                # Every write of the COW run took a cluster of its own: it really copied.
                if free0 - free1 != n:
                    raise RuntimeError(f"the COW run allocated {free0 - free1} clusters, not {n}")
                runs["overwrite"].append(self.lvol_writes(fp, sock, n, fw_args))
            finally:
                fp.stop()
        for kind, rs in runs.items():
            f = {"kind": kind, "writes": n, "cluster_size": cl, "runs": rs,
                 "histogram": merge_hists(rs)}
            for r in rs:
                r.pop("histogram", None)
            for m in ("p50_ns", "p99_ns", "lat_mean_ns", "lat_max_ns"):
                f[m] = median([r[m] for r in rs])
            e["first_write"].append(f)
            log(f"lvol QD1 4K write per {cl // MIB} MiB cluster, {kind:<9}: p50 {f['p50_ns'] / 1000:8.2f} µs  p99 "
                f"{f['p99_ns'] / 1000:8.2f} µs  mean {f['lat_mean_ns'] / 1000:8.2f} µs ({len(rs)} runs of {n})")

    def lvol_writes(self, server, sock, n, fw_args):
        """One run of `n` QD1 4 KiB writes a cluster apart; all must complete."""
        res = self.loader.run(sock, "write", 4096, 1, 1, True, 60.0, hist=True, extra=fw_args)
        if res["errors"] or res["ios"] != n:
            raise RuntimeError(f"{server.name}: {res['ios']} of {n} writes done, {res['errors']} failed")
        return {k: res[k] for k in ("ios", "elapsed_s", "lat_mean_ns", "p50_ns", "p99_ns", "lat_max_ns",
                                    "histogram")}

    def lvol_callgrind(self, c, e):
        """Instructions per I/O of the raw malloc bdev and of a thick volume on a malloc bdev of
        the same size (`cg_size`), as run_callgrind measures them: a long run's instructions
        less a short run's over the difference in I/Os, raw and lvol interleaved."""
        cg = self.cfg["callgrind"]
        size, cl = c["cg_size"], c["cluster"]

        def raw_disk(server):
            return server.add_disk("ram", size)

        def lvol_disk(server):
            vol, _, _ = server.lvol_disk(size, cl)
            return server.export("vhost.lvol", vol)

        disks = {"raw": raw_disk, "lvol": lvol_disk}
        for point in [p for p in c["points"] if p[2] == 32]:
            runs = {"raw": [], "lvol": []}
            for _ in range(cg["reps"]):
                for kind, disk in disks.items():
                    runs[kind].append(self.callgrind_ir_per_io("flashpath", point, cg, disk=disk))
            x = dict(point_key("ram", point), short_s=cg["short_s"], long_s=cg["long_s"], size=size, runs=runs)
            x["ir_per_io"] = {k: median([r["ir_per_io"] for r in v]) for k, v in runs.items()}
            x["range"] = {k: [min(r["ir_per_io"] for r in v), max(r["ir_per_io"] for r in v)]
                          for k, v in runs.items()}
            e["callgrind"].append(x)
            log(f"lvol callgrind {point_label(x):<30} raw {x['ir_per_io']['raw']:>7.0f}  lvol "
                f"{x['ir_per_io']['lvol']:>7.0f} instructions/IO")

    # -- quality of service (issue 12) -------------------------------------------------------
