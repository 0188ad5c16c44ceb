"""Ceph RBD: qsd's rbd driver vs flashpath's rbd bdev on a throwaway single-node cluster, one
server at a time.
"""

import json
import os
import time

from fpbench.common import MIB, log, median, ratio, thread_cpu
from fpbench.load import measure, merge_hists, point_key, point_label, summarize
from fpbench.report_format import fmt_iops, fmt_ratio
from fpbench.servers import CephCluster, Flashpath, Qsd, RBD_CONFIG_PARAM, RBD_IMAGE, RBD_POOL


class RbdSection:
    """Bench's methods for this section (mixed into bench.Bench)."""

    def run_rbd(self):
        """qsd's rbd driver against flashpath's rbd bdev on one image of a single-node cluster,
        one server at a time: `rounds` rounds, each starting one server, running every point
        and stopping it, the order alternating (flashpath, qsd, qsd, flashpath, ...). The
        cluster's daemons run on the client CPU. docs/benchmarks.md, "Ceph RBD (issue 13)",
        describes every step."""
        c = self.cfg["rbd"]
        size = c["size_mib"] * MIB
        image = f"{RBD_POOL}/{RBD_IMAGE}"
        e = {"config": {k: v for k, v in c.items() if k != "points"}, "image": image, "size": size,
             "cluster_cpu": self.client_cpu, "config_param": RBD_CONFIG_PARAM,
             "serve_args": self.args.rbd_serve_args, "points": [], "rounds": []}
        self.results["rbd"] = e
        self.ceph_dir = os.path.join(self.work, "ceph")
        t0 = time.monotonic()
        cl = CephCluster(self.ceph_dir, self.client_cpu)
        try:
            e["cluster_start_s"] = time.monotonic() - t0
            e["cluster_daemons"] = sorted(cl.pids)
            log(f"cluster up in {e['cluster_start_s']:.1f} s ({', '.join(sorted(cl.pids))} on CPU "
                f"{self.client_cpu}); {cl.conf}")
            cl.rbd("create", "--size", str(c["size_mib"]), image)
            # A thin image answers reads of unwritten objects without data: write it all once,
            # with the rbd CLI, so neither server's figures include the fill.
            t0 = time.monotonic()
            cl.rbd("bench", "--io-type", "write", "--io-pattern", "seq", "--io-size", str(4 * MIB),
                   "--io-threads", "4", "--io-total", str(size), image)
            du = json.loads(cl.rbd("du", "--format", "json", image))["images"][0]
            e["fill"] = {"seconds": time.monotonic() - t0, "used_size": du["used_size"], "size": size}
            if du["used_size"] < size:
                raise RuntimeError(f"filling {image} left {size - du['used_size']} bytes unwritten")
            log(f"{image}: {size // MIB} MiB written in {e['fill']['seconds']:.1f} s")
            runs = {point: {"flashpath": [], "qsd": []} for point in c["points"]}
            for rnd in range(c["rounds"]):
                for kind in (("flashpath", "qsd") if rnd % 2 == 0 else ("qsd", "flashpath")):
                    e["rounds"].append(self.rbd_round(kind, rnd, cl, c, size, runs))
            for point in c["points"]:
                e["points"].append(self.rbd_point(point, runs[point]))
        finally:
            cl.stop()

    def rbd_round(self, kind, rnd, cl, c, size, runs):
        """One server of `kind` on the image: started, warmed up, every point measured once
        (appended to `runs`), stopped; the round's record."""
        t0 = time.monotonic()
        name = f"{kind}-rbd-{rnd}"
        if kind == "flashpath":
            server = Flashpath(self.args.bin_dir, self.work, str(self.server_cpu), name=name,
                               extra=self.args.rbd_serve_args.split())
        else:
            server = Qsd(self.work, self.server_cpu, "rbd", size, cl.conf, name=name)
        try:
            sock = server.rbd_disk(cl.conf) if kind == "flashpath" else server.sock
            ready = time.monotonic() - t0
            if c["warmup"]:
                # The first write takes the image's exclusive lock (and the first reads load
                # its object map): not part of any measured run.
                w = self.loader.run(sock, "randwrite", 4096, 1, 1, False, c["warmup"])
                if w["errors"]:
                    raise RuntimeError(f"{name}: warm-up writes failed (first {w['first_error']})")
            for point in c["points"]:
                r = self.rbd_measure(server, sock, point, c["secs"], cl)
                runs[point][kind].append(r)
                log(f"round {rnd} {kind:<9} {point_label(point_key('rbd', point)):<28} "
                    f"{r['iops']:>9.0f} IOPS  p50 {r['p50_ns'] / 1000:8.1f} µs  server "
                    f"{r['server_cpu_ns_per_io'] / 1000:6.1f} µs/IO  cluster "
                    f"{sum(r['cluster_cpu_ns_per_io'].values()) / 1000:6.1f} µs/IO")
        finally:
            server.stop()
        return {"round": rnd, "server": kind, "ready_s": ready, "seconds": time.monotonic() - t0,
                "locks_left": self.rbd_locks_left(cl, name)}

    def rbd_locks_left(self, cl, name):
        """The image's locks after a server's exit, broken if any: a server that exits without
        closing the image leaves its exclusive lock, and the next server's first write would
        wait for it. Normally none."""
        image = f"{RBD_POOL}/{RBD_IMAGE}"
        locks = json.loads(cl.rbd("lock", "ls", "--format", "json", image) or "[]")
        for lk in locks:
            log(f"WARNING: {name} left a lock on {image} ({lk}); breaking it")
            cl.rbd("lock", "rm", image, lk["id"], lk["locker"])
        return locks

    def rbd_measure(self, server, sock, point, secs, cl):
        """measure() with the cluster daemons' CPU time over the run (each daemon, ns per I/O);
        other_cpu_cores then excludes the cluster."""
        k0, t0 = cl.cpu(), thread_cpu(server.pid)
        r = measure(server, self.loader, sock, point, secs, point[2] == 1)
        k1, t1 = cl.cpu(), thread_cpu(server.pid)
        ios, el = r["ios"], r["elapsed_s"]
        # The server's CPU per I/O by thread name (its reactor or iothread, librbd's threads).
        r["server_threads_ns_per_io"] = {n: (v - t0.get(n, 0)) / ios for n, v in t1.items() if ios}
        r["cluster_cpu_ns"] = {d: k1[d]["sched_ns"] - k0[d]["sched_ns"] for d in k1}
        r["cluster_cpu_ns_per_io"] = {d: v / ios if ios else None for d, v in r["cluster_cpu_ns"].items()}
        tot = sum(r["cluster_cpu_ns"].values())
        r["cluster_cores"] = tot / 1e9 / el if el else None
        if r["other_cpu_cores"] is not None and el:
            r["other_cpu_cores"] = max(0.0, r["other_cpu_cores"] - tot / 1e9 / el)
        return r

    def rbd_point(self, point, runs):
        """A point's entry: each server's runs, medians (cluster CPU per daemon too), the QD1
        histograms merged; the flashpath/qsd ratios of the medians."""
        p = dict(point_key("rbd", point), servers={})
        for kind, rs in runs.items():
            x = {"runs": rs, "median": summarize(rs)}
            daemons = rs[0]["cluster_cpu_ns_per_io"].keys() if rs else []
            x["median"]["cluster_cpu_ns_per_io"] = {d: median([r["cluster_cpu_ns_per_io"][d] for r in rs])
                                                    for d in daemons}
            x["median"]["cluster_cores"] = median([r["cluster_cores"] for r in rs])
            names = {n for r in rs for n in r["server_threads_ns_per_io"]}
            x["median"]["server_threads_ns_per_io"] = {
                n: median([r["server_threads_ns_per_io"].get(n, 0) for r in rs]) for n in sorted(names)}
            x["median"]["other_cpu_cores"] = median([r["other_cpu_cores"] for r in rs])
            iops = [r["iops"] for r in rs]
            x["spread"] = (max(iops) - min(iops)) / median(iops) if iops and median(iops) else None
            if point[2] == 1:
                x["histogram"] = merge_hists(rs)
                for r in rs:
                    r.pop("histogram", None)
            p["servers"][kind] = x
        f, q = p["servers"]["flashpath"]["median"], p["servers"]["qsd"]["median"]
        p["ratios"] = {"iops": ratio(f.get("iops"), q.get("iops")),
                       "server_cpu_per_io": ratio(f.get("server_cpu_ns_per_io"), q.get("server_cpu_ns_per_io")),
                       "p50": ratio(f.get("p50_ns"), q.get("p50_ns")),
                       "p99": ratio(f.get("p99_ns"), q.get("p99_ns"))}
        log(f"{point_label(p):<28} flashpath {fmt_iops(f.get('iops'))} IOPS, qsd {fmt_iops(q.get('iops'))}: "
            f"IOPS ratio {fmt_ratio(p['ratios']['iops'])}, server CPU/IO ratio "
            f"{fmt_ratio(p['ratios']['server_cpu_per_io'])}")
        return p

    # -- NBD (issue 14) ------------------------------------------------------------------------
