"""NBD over a Unix socket: flashpath vs qsd vs nbdkit, driven by fio's nbd engine.
"""

import os
import tempfile

from fpbench.common import MIB, log, machine_busy_ns, median, own_cpu_ns, proc_cpu, ratio
from fpbench.load import fio_nbd, summarize
from fpbench.machine import nbd_label, nbd_version
from fpbench.report_format import fmt_iops, fmt_ratio
from fpbench.servers import FlashpathNbd, NBD_SERVERS, Nbdkit, QsdNbd


class NbdSection:
    """Bench's methods for this section (mixed into bench.Bench)."""

    def run_nbd(self):
        """flashpath, qsd and nbdkit each exporting a RAM disk over NBD on a Unix socket, all
        three running on the server CPU; fio's nbd engine on the client CPU drives one at a time,
        `reps` runs of every point on each, the order rotating run by run. docs/benchmarks.md,
        "NBD (issue 14)", describes every step."""
        c = self.cfg["nbd"]
        size = c["size_mib"] * MIB
        e = {"config": {k: v for k, v in c.items() if k != "points"}, "size": size, "fills": {},
             "points": [], "versions": {"nbdkit": nbd_version("nbdkit")}}
        self.results["nbd"] = e
        if not getattr(self, "shm_dir", None):
            self.shm_dir = tempfile.mkdtemp(prefix="fp-bench.", dir="/dev/shm")
        path = os.path.join(self.shm_dir, "nbd.img")
        with open(path, "wb") as f:
            f.truncate(size)  # written in full through qsd below, like the other two disks
        servers = {}
        try:
            servers["flashpath"] = FlashpathNbd(self.args.bin_dir, self.work, str(self.server_cpu), size)
            servers["qsd"] = QsdNbd(self.work, self.server_cpu, path)
            servers["nbdkit"] = Nbdkit(self.work, self.server_cpu, size)
            e["uris"] = {k: s.uri for k, s in servers.items()}
            # Every disk starts empty: RAM never written reads as the zero page (flashpath,
            # nbdkit) or as a hole (qsd's sparse file). One sequential pass writes them all.
            for kind, s in servers.items():
                f = fio_nbd(s.uri, "write", MIB, 8, self.client_cpu)
                e["fills"][kind] = {"bytes": f["bytes"], "seconds": f["elapsed_s"]}
                if f["bytes"] < size:
                    raise RuntimeError(f"filling {kind}'s NBD disk wrote only {f['bytes']} of {size} bytes")
            log(f"{size // MIB} MiB written to each server's disk: " +
                ", ".join(f"{k} {v['seconds']:.1f} s" for k, v in e["fills"].items()))
            for point in c["points"]:
                runs = {kind: [] for kind in NBD_SERVERS}
                for rep in range(c["reps"]):
                    # Rotate who goes first, so drift within a point falls on all three alike.
                    order = NBD_SERVERS[rep % 3:] + NBD_SERVERS[:rep % 3]
                    for kind in order:
                        runs[kind].append(self.nbd_measure(servers[kind], point, c["secs"]))
                e["points"].append(self.nbd_point(point, runs))
        finally:
            for s in servers.values():
                s.stop()

    def nbd_measure(self, server, point, secs):
        """One fio run against `server`, with the server's CPU time (schedstat and utime+stime)
        and, for flashpath, its reactor's busy time over the run."""
        pattern, bs, qd = point
        react0 = server.reactors() if server.kind == "flashpath" else None
        cpu0 = proc_cpu(server.pid)
        m0, o0 = machine_busy_ns(), own_cpu_ns()
        r = fio_nbd(server.uri, pattern, bs, qd, self.client_cpu, secs)
        m1, o1 = machine_busy_ns(), own_cpu_ns()
        cpu1 = proc_cpu(server.pid)
        if r["errors"]:
            raise RuntimeError(f"{server.name} {point}: fio reported error {r['errors']}")
        ios, el = r["ios"], r["elapsed_s"]
        # utime + stime of /proc/PID/stat, not schedstat: a server may serve a connection on
        # threads of its own (nbdkit starts its workers per connection), which are gone when
        # fio has disconnected, and /proc/PID/stat keeps the time of exited threads.
        r["server_cpu_ns"] = cpu1["stat_ns"] - cpu0["stat_ns"]
        r["server_cpu_sched_ns"] = cpu1["sched_ns"] - cpu0["sched_ns"]
        r["server_cpu_ns_per_io"] = r["server_cpu_ns"] / ios if ios else None
        r["server_cores"] = r["server_cpu_ns"] / 1e9 / el if el else None
        other = (m1 - m0) - (o1 - o0) - r["server_cpu_ns"]
        r["other_cpu_cores"] = max(0.0, other / 1e9 / el) if el else None
        if react0 is not None:
            react1 = server.reactors()
            busy = sum(react1[k]["busy"] - react0[k]["busy"] for k in react1)
            r["reactor_busy_ns_per_io"] = busy / ios if ios else None
        log(f"nbd {server.kind:<9} {nbd_label(point):<22} {r['iops']:>9.0f} IOPS {r['mbps']:>8.1f} MB/s  "
            f"p50 {r['p50_ns'] / 1000:8.1f} µs  server {r['server_cpu_ns_per_io'] / 1000:6.1f} µs/IO")
        return r

    def nbd_point(self, point, runs):
        """A point's entry: each server's runs and medians, and flashpath's ratios to qsd and to
        nbdkit (IOPS, server CPU per I/O, p50, p99)."""
        pattern, bs, qd = point
        p = {"pattern": pattern, "bs": bs, "qd": qd, "servers": {}, "ratios": {}}
        for kind, rs in runs.items():
            md = summarize(rs)
            md["other_cpu_cores"] = median([r["other_cpu_cores"] for r in rs])
            iops = [r["iops"] for r in rs]
            sp = (max(iops) - min(iops)) / median(iops) if iops and median(iops) else None
            p["servers"][kind] = {"runs": rs, "median": md, "spread": sp}
        f = p["servers"]["flashpath"]["median"]
        for other in ("qsd", "nbdkit"):
            o = p["servers"][other]["median"]
            p["ratios"][other] = {"iops": ratio(f.get("iops"), o.get("iops")),
                                  "server_cpu_per_io": ratio(f.get("server_cpu_ns_per_io"),
                                                             o.get("server_cpu_ns_per_io")),
                                  "p50": ratio(f.get("p50_ns"), o.get("p50_ns")),
                                  "p99": ratio(f.get("p99_ns"), o.get("p99_ns"))}
        log(f"nbd {nbd_label(point):<22} flashpath {fmt_iops(f.get('iops'))} IOPS: "
            + ", ".join(f"vs {o} IOPS {fmt_ratio(p['ratios'][o]['iops'])}x, CPU/IO "
                        f"{fmt_ratio(p['ratios'][o]['server_cpu_per_io'])}x" for o in ("qsd", "nbdkit")))
        return p
