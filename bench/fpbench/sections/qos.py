"""Quality of service: limit accuracy, bursts, shares, the noisy neighbour, and the cost of QoS
when no limit binds.
"""

import json
import os
import statistics

from fpbench.common import (
    GIB, MIB, log, machine_busy_ns, median, own_cpu_ns, proc_cpu, ratio, run, steal_share, steal_ticks)
from fpbench.load import measure, merge_hists, point_key, summarize
from fpbench.report import fmt_limit, fmt_units, hist_percentile, qos_delta
from fpbench.report_format import fmt_ratio
from fpbench.servers import Flashpath, QsdMulti


class QosSection:
    """Bench's methods for this section (mixed into bench.Bench)."""

    def run_qos(self):
        """Issue 12's accuracy and cost figures: delivered rate against per-disk limits over
        1 s windows and the whole run, a burst group's timeline, weighted shares in a group,
        the noisy-neighbour latency on flashpath and on qsd with throttle groups, and the cost
        of QoS configured but not limiting. docs/benchmarks.md, "Quality of service (issue 12)",
        describes every step."""
        c = self.cfg["qos"]
        e = {"config": dict(c), "accuracy": [], "ceilings": [], "burst": None,
             "shares": None, "noisy": None, "overhead": None}
        self.results["qos"] = e
        log("--- qos: accuracy of per-disk limits (two reactors)")
        self.qos_accuracy(c, e)
        log("--- qos: a burst group")
        self.qos_burst(c, e)
        log("--- qos: weighted shares in a group")
        self.qos_shares(c, e)
        log("--- qos: noisy neighbour (flashpath and qsd)")
        self.qos_noisy(c, e)
        log("--- qos: the cost of QoS configured but not limiting")
        self.qos_overhead(c, e)

    def qos_daemon(self, name, two_reactors=True):
        """A flashpath daemon for the QoS runs: reactors on the server and the client CPU (the
        client shares the second core, as in the scaling section), or on the server CPU only."""
        cpus = f"{self.server_cpu},{self.client_cpu}" if two_reactors else str(self.server_cpu)
        return Flashpath(self.args.bin_dir, self.work, cpus, name=name)

    def qos_null(self, fp, name, ctrlr, queues):
        fp.rpc("bdev_null_create", {"name": name, "num_blocks": GIB // 512, "block_size": 512})
        return fp.export(ctrlr, name, queues)

    def qos_run(self, sock, bs, qd, queues, secs, window):
        """One fp-load run (completion fds, the client on its CPU) with a per-`window` timeline."""
        r = self.loader.run(sock, "randread", bs, qd, queues, False, secs, extra=["--timeline", f"{window}s"])
        if r["errors"]:
            raise RuntimeError(f"{sock}: {r['errors']} requests failed (first {r['first_error']})")
        return r

    def qos_multi(self, disks, secs, window=None, hist=False, poll=False, thread_per_disk=True):
        """One fp-load process driving several disks (`--disk` values) from the client CPU, one
        thread per disk or one for all; the parsed JSON (with per-disk histograms when `hist`)."""
        cmd = [self.loader.bin, "--time", f"{secs}s", "--cpu", str(self.client_cpu), "--json"]
        if thread_per_disk:
            cmd.append("--thread-per-disk")
        if poll:
            cmd.append("--poll")
        if window:
            cmd += ["--timeline", f"{window}s"]
        for d in disks:
            cmd += ["--disk", d]
        hist_path = None
        if hist:
            self.loader.n += 1
            hist_path = os.path.join(self.work, f"hist-{self.loader.n}.json")
            cmd += ["--hist-out", hist_path]
        res = json.loads(run(cmd, secs + 90).stdout)
        if res["total"]["errors"]:
            raise RuntimeError(f"{res['total']['errors']} requests failed (first {res['total']['first_error']})")
        if hist_path:
            with open(hist_path) as f:
                h = json.load(f)
            os.unlink(hist_path)
            for d, dh in zip(res["disks"], h["disks"]):
                d["histogram"] = dh
        return res

    def qos_iostat(self, fp, bdev):
        """The daemon's QoS counters for `bdev` (absent fields are None)."""
        io = fp.rpc("bdev_get_iostat", {"name": bdev})
        b = io["bdevs"][0]
        out = {k: b.get(k) for k in ("qos_queued", "qos_queued_total", "qos_wait_ticks", "qos_throttled_ticks",
                                     "num_read_ops")}
        out["tick_rate"] = io.get("tick_rate")
        return out

    def qos_accuracy(self, c, e):
        """Per-disk limits on one null disk of a daemon with two reactors: for each limit and
        number of queues (queue i on reactor i mod 2) one flooding run of `acc_secs` with a
        timeline of `window` s. Delivered is what the client completed; the error of a window
        is (delivered rate - limit) / limit. The highest limit of each kind also gets an
        unlimited run per number of queues: its ceiling here."""
        secs, window = c["acc_secs"], c["window"]
        fp = self.qos_daemon("flashpath-qos-accuracy")
        try:
            sock = self.qos_null(fp, "Null0", "vhost.qos", max(c["queues"]))
            points = [("iops", lim, 4096, c["iops_qd"]) for lim in c["iops_limits"]]
            points += [("bw", mib, bs, c["bw_qd"]) for mib, bs in c["bw_limits"]]
            tops = {"iops": max(c["iops_limits"]), "bw": max(m for m, _ in c["bw_limits"])}
            for kind, lim, bs, qd in points:
                for queues in c["queues"]:
                    ceiling = None
                    if lim == tops[kind]:
                        fp.rpc("bdev_set_qos_limit", {"name": "Null0", "rw_ios_per_sec": 0, "rw_mbytes_per_sec": 0})
                        r = self.qos_run(sock, bs, qd, queues, c["ceiling_secs"], window)
                        ceiling = r["iops"] if kind == "iops" else r["bytes"] / r["elapsed_s"]
                        e["ceilings"].append({"kind": kind, "bs": bs, "qd": qd, "queues": queues,
                                              "secs": c["ceiling_secs"], "units_per_s": ceiling,
                                              "iops": r["iops"]})
                    if kind == "iops":
                        fp.rpc("bdev_set_qos_limit", {"name": "Null0", "rw_ios_per_sec": lim, "rw_mbytes_per_sec": 0})
                        want = float(lim)
                    else:
                        fp.rpc("bdev_set_qos_limit", {"name": "Null0", "rw_ios_per_sec": 0, "rw_mbytes_per_sec": lim})
                        want = float(lim * MIB)
                    s0, st0 = self.qos_iostat(fp, "Null0"), steal_ticks()
                    c0, m0, o0 = proc_cpu(fp.pid), machine_busy_ns(), own_cpu_ns()
                    r = self.qos_run(sock, bs, qd, queues, secs, window)
                    m1, o1, c1 = machine_busy_ns(), own_cpu_ns(), proc_cpu(fp.pid)
                    s1, st1 = self.qos_iostat(fp, "Null0"), steal_ticks()
                    # CPU time anything but this daemon and the client used meanwhile, in cores.
                    other = (m1 - m0) - (o1 - o0) - (c1["sched_ns"] - c0["sched_ns"])
                    unit = 1 if kind == "iops" else bs
                    tl = r["timeline"]
                    win = [n * unit / tl["interval_s"] for n in tl["ios"]]
                    whole = r["ios"] * unit / r["elapsed_s"]
                    p = {"kind": kind, "limit": lim, "limit_units_per_s": want, "bs": bs, "qd": qd,
                         "queues": queues, "secs": secs, "window_s": tl["interval_s"],
                         "ios": r["ios"], "elapsed_s": r["elapsed_s"], "delivered": whole,
                         "error": whole / want - 1, "windows": win,
                         "window_errors": [w / want - 1 for w in win],
                         "p50_ns": r["p50_ns"], "p99_ns": r["p99_ns"], "ceiling": ceiling,
                         "qos_counters": qos_delta(s0, s1), "steal": steal_share(st0, st1, r["elapsed_s"]),
                         "other_cpu_cores": max(0.0, other / 1e9 / r["elapsed_s"])}
                    p["worst_window_error"] = max(p["window_errors"], key=abs)
                    e["accuracy"].append(p)
                    log(f"qos {kind} limit {fmt_limit(kind, lim)} q{queues} bs {bs // 1024}K: delivered "
                        f"{fmt_units(kind, whole)} ({100 * p['error']:+.2f} %), 1 s windows worst "
                        f"{100 * p['worst_window_error']:+.2f} %"
                        + (f", unlimited {fmt_units(kind, ceiling)}" if ceiling is not None else ""))
            fp.rpc("bdev_set_qos_limit", {"name": "Null0", "rw_ios_per_sec": 0, "rw_mbytes_per_sec": 0})
        finally:
            fp.stop()

    def qos_burst(self, c, e):
        """A fresh group with iops_total avg, iops_total_max and iops_total_max_length and one
        null disk in it, idle since the group was made, flooded for `secs` with a timeline: the
        ceiling for `length` s, then the average."""
        b = c["burst"]
        fp = self.qos_daemon("flashpath-qos-burst")
        try:
            sock = self.qos_null(fp, "Null0", "vhost.burst", 2)
            fp.rpc("bdev_qos_group_create", {"name": "burst", "iops_total": b["avg"], "iops_total_max": b["max"],
                                             "iops_total_max_length": b["length"]})
            fp.rpc("bdev_qos_group_add_bdev", {"name": "burst", "bdev_name": "Null0"})
            group = fp.rpc("bdev_qos_get_groups", {"name": "burst"})
            r = self.qos_run(sock, 4096, b["qd"], 2, b["secs"], b["window"])
            tl = r["timeline"]
            step = tl["interval_s"]
            win = [n / step for n in tl["ios"]]
            # Window i covers [i·step, (i+1)·step): the ceiling while it ends by `length`, the
            # average once it starts at or after it (none straddles with whole-second steps).
            phase = ["max" if (i + 1) * step <= b["length"] + 1e-9 else
                     "avg" if i * step >= b["length"] - 1e-9 else "edge" for i in range(len(win))]
            want = {"max": b["max"], "avg": b["avg"]}
            x = {"avg": b["avg"], "max": b["max"], "length_s": b["length"], "secs": b["secs"], "qd": b["qd"],
                 "queues": 2, "window_s": step, "windows": win, "phase": phase, "group": group,
                 "ios": r["ios"], "elapsed_s": r["elapsed_s"]}
            for ph in ("max", "avg"):
                xs = [w for w, p in zip(win, phase) if p == ph]
                # The last window holds the run's tail (a batch past the end): leave it out of
                # the average phase only if there are others.
                if ph == "avg" and len(xs) > 1:
                    xs = xs[:-1]
                x[f"{ph}_mean"] = statistics.mean(xs) if xs else None
                x[f"{ph}_error"] = (x[f"{ph}_mean"] / want[ph] - 1) if xs else None
                x[f"{ph}_worst_window_error"] = max((w / want[ph] - 1 for w in xs), key=abs) if xs else None
            e["burst"] = x
            log(f"qos burst avg {b['avg']} max {b['max']} for {b['length']} s: per {step:g} s "
                + " ".join(f"{w:.0f}" for w in win))
        finally:
            fp.stop()

    def qos_shares(self, c, e):
        """Group of `limit` IOPS, disk A weight 3 and B weight 1, each flooding from its own
        client thread: delivered shares against limit·w/Σw. Then a second run where B stops
        after about a third of the time (a request count) and A floods on: A's rate once B is
        idle."""
        s = c["shares"]
        fp = self.qos_daemon("flashpath-qos-shares")
        try:
            socks = {}
            for disk in ("A", "B"):
                socks[disk] = self.qos_null(fp, f"Null{disk}", f"vhost.{disk}", 2)
            fp.rpc("bdev_qos_group_create", {"name": "fair", "iops_total": s["limit"]})
            weights = {"A": s["weights"][0], "B": s["weights"][1]}
            for disk, w in weights.items():
                fp.rpc("bdev_qos_group_add_bdev", {"name": "fair", "bdev_name": f"Null{disk}", "weight": w})
            total_w = sum(weights.values())
            want = {d: s["limit"] * w / total_w for d, w in weights.items()}
            disk_arg = {d: f"socket={socks[d]},qd={s['qd']},queues=2,label={d}" for d in socks}
            r = self.qos_multi([disk_arg["A"], disk_arg["B"]], s["secs"], window=s["window"])
            group = fp.rpc("bdev_qos_get_groups", {"name": "fair"})
            x = {"limit": s["limit"], "weights": weights, "want": want, "secs": s["secs"], "qd": s["qd"],
                 "queues": 2, "window_s": s["window"], "group_after": group, "both": {}, "b_idle": {}}
            for d, dr in zip(("A", "B"), r["disks"]):
                win = [n / dr["timeline"]["interval_s"] for n in dr["timeline"]["ios"]]
                rate = dr["ios"] / dr["elapsed_s"]
                x["both"][d] = {"rate": rate, "error": rate / want[d] - 1, "windows": win,
                                "worst_window_error": max((w / want[d] - 1 for w in win), key=abs)}
            # B stops after a third of the run at its share; A alone from then on.
            b_ios = max(1, int(want["B"] * s["secs"] / 3))
            r2 = self.qos_multi([disk_arg["A"], disk_arg["B"] + f",ios={b_ios}"], s["secs"], window=s["window"])
            a, bd = r2["disks"]
            step = a["timeline"]["interval_s"]
            b_last = max([i for i, n in enumerate(bd["timeline"]["ios"]) if n], default=-1)
            a_win = [n / step for n in a["timeline"]["ios"]]
            # Whole windows after B's last completion, the run's last (its tail) left out when
            # others remain.
            after = a_win[b_last + 1:]
            if len(after) > 1:
                after = after[:-1]
            x["b_idle"] = {"b_ios": b_ios, "b_elapsed_s": bd["elapsed_s"], "b_last_window": b_last,
                           "a_windows": a_win, "b_windows": [n / step for n in bd["timeline"]["ios"]],
                           "a_alone": statistics.mean(after) if after else None, "want": float(s["limit"])}
            if after:
                x["b_idle"]["error"] = x["b_idle"]["a_alone"] / s["limit"] - 1
                x["b_idle"]["worst_window_error"] = max((w / s["limit"] - 1 for w in after), key=abs)
            e["shares"] = x
            log(f"qos shares: A {x['both']['A']['rate']:.0f} (want {want['A']:.0f}), B {x['both']['B']['rate']:.0f} "
                f"(want {want['B']:.0f}); B idle: A {x['b_idle']['a_alone'] or 0:.0f} (want {s['limit']})")
        finally:
            fp.stop()

    def qos_noisy(self, c, e):
        """16 null disks on one reactor (flashpath --cpus SERVER, or one qsd iothread), each
        its own controller with one queue; one fp-load process on the
        client CPU, one polled thread for all. Disk 0 floods at QD128; disks 1..15 run QD1 paced at
        `qd1_rate` each (below their limit, so a limit never delays them: their latency is the
        neighbour's doing). Scenarios: none (no QoS); limits (flooder `flood_limit` IOPS, each
        QD1 disk `qd1_limit`); group (all 16 in one group of `group_limit` IOPS, weight 1 each;
        on qsd one throttle group, whose members take turns). `reps` rounds, scenarios
        interleaved; the QD1 disks' latency merged over their histograms."""
        n = c["noisy"]
        e["noisy"] = x = {"config": n, "runs": []}
        for rep in range(n["reps"]):
            for server in ("flashpath", "qsd"):
                for scen in n["scenarios"]:
                    r = self.noisy_run(n, server, scen, rep)
                    x["runs"].append(r)
                    log(f"qos noisy {server:<9} {scen:<6} rep {rep}: flooder {r['flood_iops']:>9.0f} IOPS, QD1 "
                        f"disks {r['qd1_iops']:>7.0f} IOPS, p50 {r['qd1_p50_ns'] / 1000:.1f} µs, p99 "
                        f"{r['qd1_p99_ns'] / 1000:.1f} µs, p99.9 {r['qd1_p999_ns'] / 1000:.1f} µs")
        x["summary"] = []
        for server in ("flashpath", "qsd"):
            for scen in n["scenarios"]:
                rs = [r for r in x["runs"] if r["server"] == server and r["scenario"] == scen]
                x["summary"].append({"server": server, "scenario": scen, "reps": len(rs),
                                     **{k: median([r[k] for r in rs]) for k in
                                        ("flood_iops", "qd1_iops", "qd1_p50_ns", "qd1_p99_ns", "qd1_p999_ns",
                                         "qd1_worst_disk_p99_ns")}})

    def noisy_run(self, n, server, scen, rep):
        ndisks = n["disks"]
        secs = n["secs"]
        name = f"{server}-noisy-{scen}-{rep}"
        if server == "flashpath":
            srv = self.qos_daemon(name, two_reactors=False)
            try:
                socks = [self.qos_null(srv, f"Null{i}", f"vhost.{i}", 1) for i in range(ndisks)]
                if scen == "limits":
                    srv.rpc("bdev_set_qos_limit", {"name": "Null0", "rw_ios_per_sec": n["flood_limit"]})
                    for i in range(1, ndisks):
                        srv.rpc("bdev_set_qos_limit", {"name": f"Null{i}", "rw_ios_per_sec": n["qd1_limit"]})
                elif scen == "group":
                    srv.rpc("bdev_qos_group_create", {"name": "all", "iops_total": n["group_limit"]})
                    for i in range(ndisks):
                        srv.rpc("bdev_qos_group_add_bdev", {"name": "all", "bdev_name": f"Null{i}"})
                res = self.noisy_load(n, srv, socks, secs)
            finally:
                srv.stop()
        else:
            srv = QsdMulti(self.work, self.server_cpu, ndisks, name, scen, n)
            try:
                res = self.noisy_load(n, srv, srv.socks, secs)
            finally:
                srv.stop()
        flood, quiet = res["disks"][0], res["disks"][1:]
        h = merge_hists([{"histogram": d["histogram"]} for d in quiet])
        return {"server": server, "scenario": scen, "rep": rep, "secs": secs,
                "flood_iops": flood["iops"], "flood_p99_ns": flood["p99_ns"],
                "qd1_iops": sum(d["iops"] for d in quiet),
                "qd1_p50_ns": hist_percentile(h, 50), "qd1_p99_ns": hist_percentile(h, 99),
                "qd1_p999_ns": hist_percentile(h, 99.9),
                "qd1_worst_disk_p99_ns": max(d["p99_ns"] for d in quiet),
                "qd1_disk_p99_ns": [d["p99_ns"] for d in quiet], "qd1_histogram": h,
                "other_cpu_cores": res["other_cpu_cores"], "steal": res["steal"]}

    def noisy_load(self, n, srv, socks, secs):
        """The noisy-neighbour load on `socks` of server `srv`, with the CPU time anything else
        used meanwhile (as `measure` records it)."""
        disks = [f"socket={socks[0]},qd={n['flood_qd']},label=flood"]
        disks += [f"socket={s},qd=1,rate={n['qd1_rate']},label=quiet{i}" for i, s in enumerate(socks[1:], 1)]
        cpu0, m0, o0, st0 = proc_cpu(srv.pid), machine_busy_ns(), own_cpu_ns(), steal_ticks()
        res = self.qos_multi(disks, secs, hist=True, poll=True, thread_per_disk=False)
        m1, o1, cpu1, st1 = machine_busy_ns(), own_cpu_ns(), proc_cpu(srv.pid), steal_ticks()
        res["steal"] = steal_share(st0, st1, secs)
        other = (m1 - m0) - (o1 - o0) - (cpu1["sched_ns"] - cpu0["sched_ns"])
        res["other_cpu_cores"] = max(0.0, other / 1e9 / secs)
        return res

    def qos_overhead(self, c, e):
        """Null QD32 IOPS, one polled queue (the main matrix's point), on one daemon pinned to
        the server CPU whose disk is switched between three states before each run: no QoS;
        a per-disk limit far above what is reached (`limit` IOPS and `limit_mib` MiB/s); a
        member of a group whose iops_total is `limit`. One disk and one daemon, so the three
        differ only in QoS (separate daemons differ by more than 3 % among themselves on this
        machine); the order reverses every repetition so drift falls on all alike."""
        o = c["overhead"]
        fp = Flashpath(self.args.bin_dir, self.work, str(self.server_cpu), name="flashpath-qos-overhead")
        try:
            sock = fp.add_disk("null", GIB, queues=1)
            fp.rpc("bdev_qos_group_create", {"name": "roomy", "iops_total": o["limit"]})
            on = {"off": lambda: None,
                  "limit": lambda: fp.rpc("bdev_set_qos_limit", {"name": "Null0", "rw_ios_per_sec": o["limit"],
                                                                 "rw_mbytes_per_sec": o["limit_mib"]}),
                  "group": lambda: fp.rpc("bdev_qos_group_add_bdev", {"name": "roomy", "bdev_name": "Null0"})}
            off = {"off": lambda: None,
                   "limit": lambda: fp.rpc("bdev_set_qos_limit", {"name": "Null0", "rw_ios_per_sec": 0,
                                                                  "rw_mbytes_per_sec": 0}),
                   "group": lambda: fp.rpc("bdev_qos_group_remove_bdev", {"name": "roomy", "bdev_name": "Null0"})}
            point = ("randread", 4096, 32, 1, True)
            runs = {k: [] for k in on}
            counters = {}
            for rep in range(o["reps"]):
                for k in (list(on) if rep % 2 == 0 else list(reversed(on))):
                    on[k]()
                    s0 = self.qos_iostat(fp, "Null0")
                    runs[k].append(measure(fp, self.loader, sock, point, o["secs"], False))
                    # Nothing waited: the limit did not limit.
                    d = qos_delta(s0, self.qos_iostat(fp, "Null0"))
                    counters.setdefault(k, []).append(d["qos_queued_total"])
                    off[k]()
            x = dict(point_key("null", point), limit=o["limit"], limit_mib=o["limit_mib"], reps=o["reps"],
                     secs=o["secs"], variants={k: dict(runs=v, median=summarize(v)) for k, v in runs.items()},
                     qos_counters=counters)
            base = x["variants"]["off"]["median"]["iops"]
            x["ratios"] = {k: ratio(x["variants"][k]["median"]["iops"], base) for k in ("limit", "group")}
            x["spread"] = {k: (max(r["iops"] for r in v) - min(r["iops"] for r in v)) / median([r["iops"] for r in v])
                           for k, v in runs.items()}
            e["overhead"] = x
            log(f"qos overhead: off {base:>10.0f}  limit {x['variants']['limit']['median']['iops']:>10.0f} "
                f"({fmt_ratio(x['ratios']['limit'])})  group {x['variants']['group']['median']['iops']:>10.0f} "
                f"({fmt_ratio(x['ratios']['group'])}); queued by QoS: {counters}")
        finally:
            fp.stop()

    # -- Ceph RBD (issue 13) -----------------------------------------------------------------
