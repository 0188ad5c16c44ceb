"""The density section (many VMs on one server core) in results.md, its targets and the check of
its outputs. Plain helpers only: report.py and validate.py import this module, never the
reverse."""

from fpbench.report_format import SPREAD_NOTE, fmt_iops, fmt_ns, fmt_ratio, fmt_spread, fmt_us, with_spread

HEADING = "## Density: many VMs on one server core"
# The figures every run of every server must have as positive numbers (validate).
POSITIVE = ("total_iops", "mean_p99_ns", "max_p99_ns", "min_max_iops", "client_wakeups_per_io",
            "client_calls_per_io", "notifications_per_io")


def _per(v):
    return "-" if v is None else f"{v:.3f}"


def _x(r):
    """A ratio, with three decimals below 0.1 (p99 ratios here can be 0.003)."""
    return fmt_ratio(r) if r is None or r >= 0.1 else f"{r:.3f}"


def density_markdown(res):
    e, m = res["density"], res["meta"]
    c = e["config"]
    servers = e["servers"]
    peers = servers[1:]
    spdk = f" and SPDK's vhost target ({e.get('spdk_version') or 'SPDK'})" if "spdk" in servers else ""
    lines = ["", HEADING, "",
             f"N vhost-user-blk controllers, each on its own 1 GiB null disk with one queue, all served from CPU "
             f"{m['server_cpu']} by flashpath (one reactor), qemu-storage-daemon (one iothread){spdk}; N VMs at QD "
             f"each, 4 KiB random reads, driven by one `{e['client']}` process (fp-load's own vhost-user frontend, "
             f"one thread for every disk, each pass over them starting one disk further, sleeping in poll(2) on "
             f"the disks' completion fds) on CPU "
             f"{m['client_cpu']}. {c['reps']} round(s) of {c['secs']:g} s per point, the servers interleaved; "
             "medians, each with its spread across rounds in brackets ((max − min) / median). Per-VM p99: each "
             "VM's own p99, their mean and their maximum; min/max: the slowest VM's IOPS over the fastest's. "
             "The server-side figures cover the measured interval only (fp-load --mark-phases), not the "
             "connects: CPU/IO: the server's utime + stime (/proc/PID/stat) per I/O; server wake-ups/IO: its "
             "threads' voluntary context switches per I/O; client wake-ups/IO: the client's sleeps that ended "
             "with a completion fd ready; calls/IO and kicks/IO: the completion notifications the client read "
             "and the kicks it sent; notifications/IO: the two added. client cores: the client's CPU over the "
             "interval (1.00: the client, not the server, was the limit).", "", SPREAD_NOTE, "",
             "| VMs × QD | server | total IOPS | mean p99 µs | max p99 µs | min/max | CPU/IO ns | "
             "server wake-ups/IO | client wake-ups/IO | calls/IO | kicks/IO | notifications/IO | server cores | "
             "client cores |", "|" + "---|" * 14]
    for p in e["points"]:
        for kind in servers:
            x = p["servers"][kind]
            md, sp = x["median"], x["spread"]

            def cell(k, f):
                return with_spread(f(md.get(k)), sp.get(k))
            lines.append(
                f"| {p['vms']} × {p['qd']} | {kind} | {cell('total_iops', fmt_iops)} | "
                f"{cell('mean_p99_ns', fmt_us)} | {cell('max_p99_ns', fmt_us)} | {cell('min_max_iops', _per)} | "
                f"{cell('server_cpu_stat_ns_per_io', fmt_ns)} | {cell('server_wakeups_per_io', _per)} | "
                f"{cell('client_wakeups_per_io', _per)} | {cell('client_calls_per_io', _per)} | "
                f"{cell('client_kicks_per_io', _per)} | {cell('notifications_per_io', _per)} | "
                f"{_cores(md.get('server_cores'))} | {_cores(md.get('client_cores'))} |")
    head = "| VMs × QD | " + " | ".join(
        f"IOPS fp/{k} | mean p99 fp/{k} | max p99 fp/{k} | min/max fp/{k} | CPU/IO fp/{k} | notif./IO fp/{k}"
        for k in peers) + " |"
    lines += ["", head, "|" + "---|" * (1 + 6 * len(peers))]
    for p in e["points"]:
        cells = []
        for k in peers:
            r = p["ratios"][k]
            cells += [f"**{_x(r['total_iops'])}**", _x(r["mean_p99_ns"]), _x(r["max_p99_ns"]), _x(r["min_max_iops"]),
                      _x(r["server_cpu_stat_ns_per_io"]), _x(r["notifications_per_io"])]
        lines.append(f"| {p['vms']} × {p['qd']} | " + " | ".join(cells) + " |")
    lines += density_rounds_markdown(e)
    la, lb = e.get("loadavg_before"), e.get("loadavg_after")
    if la and lb:
        lines += ["", f"Load average (1, 5, 15 min) before the section: {', '.join(f'{x:.2f}' for x in la)}; after: "
                      f"{', '.join(f'{x:.2f}' for x in lb)}."]
    return lines


def density_rounds_markdown(e):
    """The round-by-round table: each server's cache-line sample before its run and flashpath's
    IOPS over each peer's in the round (points of runs made before the samples have none)."""
    servers, peers = e["servers"], e["servers"][1:]
    pts = [p for p in e["points"] if p.get("rounds")]
    if not pts:
        return []
    lines = ["", "Round by round, each run after a sample of one cache line's round trip between the two "
                 "CPUs (`bench/c2c.c`, ns; the host gives this VM's vCPUs two speeds of it, and the servers' "
                 "figures follow it):", "",
             "| VMs × QD | round | c2c ns " + " / ".join(servers) + " | " +
             " | ".join(f"IOPS fp/{k}" for k in peers) + " |", "|" + "---|" * (3 + len(peers))]
    for p in pts:
        for i, r in enumerate(p["rounds"]):
            c2c = " / ".join("-" if r["c2c_ns"].get(k) is None else f"{r['c2c_ns'][k]:.0f}" for k in servers)
            lines.append(f"| {p['vms']} × {p['qd']} | {i + 1} | {c2c} | " +
                         " | ".join(_x(r["iops_ratio"].get(k)) for k in peers) + " |")
    return lines


def _cores(v):
    return "-" if v is None else f"{v:.2f}"


def density_targets(res, add):
    """The issue's density targets (against SPDK: only in runs with --spdk)."""
    e = res.get("density")
    if not e:
        return
    pts = {(p["vms"], p["qd"]): p for p in e["points"]}
    for vms, qd, need_minmax in ((16, 8, True), (64, 1, False)):
        p = pts.get((vms, qd))
        name = (f"density {vms} VMs × QD{qd}: IOPS >= 1.2x SPDK's, mean per-VM p99 <= SPDK's"
                + (", min/max per-VM IOPS >= 0.95" if need_minmax else ""))
        goal = ">= 1.20x, <= 1.00x" + (", >= 0.95" if need_minmax else "")
        if p is None:
            continue
        if "spdk" not in p["servers"]:
            add(name, goal, "no SPDK in this run (--spdk DIR)", None)
            continue
        f, s, r = p["servers"]["flashpath"]["median"], p["servers"]["spdk"]["median"], p["ratios"]["spdk"]
        mm = f.get("min_max_iops")
        measured = (f"{fmt_iops(f.get('total_iops'))} vs {fmt_iops(s.get('total_iops'))} = "
                    f"{fmt_ratio(r['total_iops'])}x (spread {fmt_spread(p['servers']['flashpath']['spread'].get('total_iops'))}"
                    f" / {fmt_spread(p['servers']['spdk']['spread'].get('total_iops'))}); p99 {fmt_us(f.get('mean_p99_ns'))}"
                    f" vs {fmt_us(s.get('mean_p99_ns'))} µs = {fmt_ratio(r['mean_p99_ns'])}x")
        met = None if r["total_iops"] is None or r["mean_p99_ns"] is None else (
            r["total_iops"] >= 1.2 and r["mean_p99_ns"] <= 1.0)
        if need_minmax:
            measured += f"; min/max {_per(mm)} (SPDK {_per(s.get('min_max_iops'))})"
            met = None if met is None or mm is None else met and mm >= 0.95
        add(name, goal, measured, met)


def validate_density(res, c):
    """Every N × QD of `c` on every server of the run with `reps` rounds, each round with a
    positive figure for each of POSITIVE, one IOPS and p99 per VM and the cache-line sample
    taken before it; the ratios against every peer."""
    e = res.get("density")
    if not e:
        return ["results.json has no 'density'"]
    problems = []
    servers = e.get("servers", [])
    if servers[:2] != ["flashpath", "qsd"]:
        problems.append(f"density: servers {servers!r}")
    got = {(p["vms"], p["qd"]): p for p in e.get("points", [])}
    for n in c["ns"]:
        for qd in c["qds"]:
            p = got.get((n, qd))
            if p is None:
                problems.append(f"density: no {n} VMs × QD{qd}")
                continue
            for kind in servers:
                x = p["servers"].get(kind)
                if not x or len(x["runs"]) != c["reps"]:
                    problems.append(f"density {n}×{qd} {kind}: {len(x['runs']) if x else 0} rounds, want {c['reps']}")
                    continue
                for i, r in enumerate(x["runs"]):
                    bad = [k for k in POSITIVE if not isinstance(r.get(k), (int, float)) or r[k] <= 0]
                    if bad:
                        problems.append(f"density {n}×{qd} {kind} round {i}: " +
                                        ", ".join(f"{k} = {r.get(k)!r}" for k in bad))
                    if len(r.get("vm_iops", [])) != n or len(r.get("vm_p99_ns", [])) != n:
                        problems.append(f"density {n}×{qd} {kind} round {i}: {len(r.get('vm_iops', []))} VMs")
                    if not isinstance(r.get("server_cpu_stat_ns_per_io"), (int, float)):
                        problems.append(f"density {n}×{qd} {kind} round {i}: no server CPU per I/O")
                    c2c = r.get("c2c_ns")
                    if not isinstance(c2c, (int, float)) or c2c <= 0:
                        problems.append(f"density {n}×{qd} {kind} round {i}: no cache-line sample (c2c_ns {c2c!r})")
                for k in ("total_iops", "mean_p99_ns", "min_max_iops"):
                    if not isinstance(x["spread"].get(k), (int, float)):
                        problems.append(f"density {n}×{qd} {kind}: no spread of {k}")
            for k in servers[1:]:
                if not isinstance((p.get("ratios", {}).get(k) or {}).get("total_iops"), (int, float)):
                    problems.append(f"density {n}×{qd}: no IOPS ratio against {k}")
    return problems
