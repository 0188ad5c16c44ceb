"""The SPDK-as-a-peer section (`--spdk DIR`, issue 23) in results.md, and its targets. Points
with the vhost-user floor (runs before it had none) also get the floor's row and the servers'
busy time per I/O (polled points) or CPU time per I/O (completion-fd points, in runs that had the
floor there) as a multiple of the floor's."""

from fpbench.common import MIB
from fpbench.report_format import SPREAD_NOTE, spread_of, with_spread
from fpbench.report_format import fmt_iops as _iops, fmt_ns as _ns, fmt_ratio as _x, fmt_us as _us


def _per(v):
    return "-" if v is None else f"{v:.1f}"


def _k(v):
    return "-" if v is None else f"{v:.3f}"


def _syscalls(md):
    n, w = md.get("server_syscalls_per_io"), md.get("server_writes_per_io")
    return "-" if n is None else f"{n:.3f} ({_k(w)})"


def _label(p):
    return f"{p['backend']} 4K {p['pattern']} QD{p['qd']} {p['client']}"


def spdk_markdown(res):
    e, m = res["spdk"], res["meta"]
    c = e["config"]
    servers = ("flashpath", "qsd", "spdk")
    sizes = ", ".join(f"{b} {c['sizes'][b] // MIB} MiB" for b in c["backends"])
    lines = ["", "## SPDK as a peer (flashpath vs qsd vs SPDK's vhost target)", "",
             f"{e.get('version') or 'SPDK'} (`{e['dir']}/build/bin/vhost -m {hex(1 << m['server_cpu'])}`, "
             f"`bdev_null_create` / `bdev_malloc_create`, `vhost_create_blk_controller`), flashpath and qsd, each on "
             f"CPU {m['server_cpu']} with its own disk ({sizes}; qsd's RAM disk a file on tmpfs), all three driven by "
             f"one client, `{e['client']}` (fp-load's own vhost-user frontend, its memory in 2 MiB huge pages: the only "
             f"fp-load client SPDK 23.01 accepts) on CPU {m['client_cpu']}. {c['reps']} round(s) of {c['secs']:g} s per "
             "point, the servers interleaved (flashpath, qsd, SPDK, ...); medians. CPU/IO: the server's CPU time "
             "(schedstat, all threads) per I/O; busy/IO: reactor busy time per I/O (flashpath's busy ns, SPDK's "
             "busy ticks / tick_rate from `framework_get_reactors`); per wake-up: completions per client wake-up on "
             "its completion fd (fd clients; the same measure for all three servers); per notification: completions "
             "per call-eventfd write the client read; kicks/IO: the client's kicks per I/O (it kicks unless the "
             "server's used ring says VRING_USED_F_NO_NOTIFY); fp/SPDK: ratio of the medians. Completion-fd "
             "points also: CPU/IO stat: the server's utime + stime (/proc/PID/stat) per I/O; server wake-ups/IO: "
             "its threads' voluntary context switches per I/O; notifications/IO: the call-eventfd writes the "
             "client read plus the kicks it sent, per I/O (all over the client's whole run); server syscalls/IO "
             "(writes): the server's system calls per I/O, all threads, and of them its writes (the call "
             "eventfd's signals), counted by perf over the client's run. The IOPS and p99 "
             "cells carry their spread across rounds ((max − min) / median).", "", SPREAD_NOTE, "",
             "| workload | server | IOPS | p50 µs | p99 µs | CPU/IO ns | busy/IO ns | per wake-up | "
             "per notification | kicks/IO | CPU/IO stat ns | server wake-ups/IO | notifications/IO | "
             "server syscalls/IO (writes) |",
             "|" + "---|" * 14]
    for p in e["points"]:
        for kind in servers + tuple(k for k in ("floor", "floor_guess") if k in p["servers"]):
            md = p["servers"][kind]["median"]
            runs = p["servers"][kind]["runs"]
            sp = {k: spread_of([r.get(k) for r in runs]) for k in ("iops", "p99_ns")}
            lines.append(f"| {_label(p)} | {kind} | {with_spread(_iops(md.get('iops')), sp['iops'])} | "
                         f"{_us(md.get('p50_ns'))} | {with_spread(_us(md.get('p99_ns')), sp['p99_ns'])} | "
                         f"{_ns(md.get('server_cpu_ns_per_io'))} | "
                         f"{_ns(md.get('reactor_busy_ns_per_io'))} | {_per(md.get('completions_per_wakeup'))} | "
                         f"{_per(md.get('completions_per_notification'))} | {_k(md.get('client_kicks_per_io'))} | "
                         f"{_ns(md.get('server_cpu_stat_ns_per_io')) if p['client'] == 'fd' else '-'} | "
                         f"{_k(md.get('server_wakeups_per_io'))} | {_k(md.get('notifications_per_io'))} | "
                         f"{_syscalls(md)} |")
    lines += ["", "| workload | IOPS fp/SPDK | IOPS qsd/SPDK | p50 fp/SPDK | p99 fp/SPDK | CPU/IO fp/SPDK | "
              "busy/IO fp/SPDK | per wake-up fp/SPDK |", "|" + "---|" * 8]
    for p in e["points"]:
        r = p["ratios"]
        q, s = p["servers"]["qsd"]["median"].get("iops"), p["servers"]["spdk"]["median"].get("iops")
        lines.append(f"| {_label(p)} | **{_x(r['iops'])}** | {_x(q / s if q and s else None)} | {_x(r['p50'])} | "
                     f"{_x(r['p99'])} | {_x(r['server_cpu_per_io'])} | {_x(r['reactor_busy_per_io'])} | "
                     f"{_x(r['completions_per_wakeup'])} |")
    floored = [p for p in e["points"] if "floor" in p["servers"] and p["client"] == "poll"]
    if floored:
        lines += ["", "The vhost-user floor (`bench/vhost_floor.c`, the row \"floor\" above): a vhost-user-blk "
                  "back end that does the least a back end must do per request (read avail->idx, walk the chain "
                  "through the one memory region, read the header, write the status byte and the used element, publish "
                  "used->idx; a null disk, nothing copied, no bdev layer, no notifications asked for by the polled "
                  "client), one busy-polling thread on the same CPU with a reactor's busy accounting, driven by the "
                  "same client on the null disk's polled points. Its busy time per I/O is what the cache lines "
                  "the ring shares with the client's core cost; a server's busy/IO as a multiple of it (x floor) "
                  "is how far its own work adds to that. The row \"floor_guess\" is the same floor "
                  "prefetching the last request's head descriptor and header when new requests show "
                  "(`--predict`), as flashpath does: the floor of a back end that hides those misses "
                  "(x guess: flashpath's busy/IO as a multiple of it).", "",
                  "| workload | floor IOPS | floor busy/IO ns | floor_guess busy/IO ns | flashpath busy/IO ns | "
                  "x floor | x guess | SPDK busy/IO ns | x floor |", "|" + "---|" * 9]
        for p in floored:
            md = {k: p["servers"][k]["median"] for k in ("floor", "flashpath", "spdk")}
            guess = (p["servers"].get("floor_guess") or {}).get("median") or {}
            fr = p.get("floor_ratios") or {}
            lines.append(f"| {_label(p)} | {_iops(md['floor'].get('iops'))} | "
                         f"{_ns(md['floor'].get('reactor_busy_ns_per_io'))} | "
                         f"{_ns(guess.get('reactor_busy_ns_per_io'))} | "
                         f"{_ns(md['flashpath'].get('reactor_busy_ns_per_io'))} | {_x(fr.get('flashpath'))} | "
                         f"{_x(fr.get('flashpath_guess'))} | "
                         f"{_ns(md['spdk'].get('reactor_busy_ns_per_io'))} | {_x(fr.get('spdk'))} |")
    lines += _floor_fd_table(e)
    paired = [p for p in e["points"] if p.get("paired") and p["client"] == "poll"]
    if paired:
        lines += ["", "Round by round (polled points): the servers of one round ran one after the other within "
                  "seconds, each run just after a sample of one cache line's round trip between the two CPUs "
                  "(`bench/c2c.c`, ns; the host gives this VM's vCPUs two speeds of it, and a request's cost "
                  "follows). busy/IO ratios within the round; the last line of a point is their median.", "",
                  "| workload | round | c2c ns fp / SPDK / floor | busy/IO fp/SPDK | fp/floor | SPDK/floor |",
                  "|" + "---|" * 6]
        for p in paired:
            lines += _round_rows(p, ("busy_fp_spdk", "busy_fp_floor", "busy_spdk_floor"))
    lines += _paired_fd_table(e)
    return lines


def _floor_fd_table(e):
    """The completion-fd points that had the floor: its IOPS, CPU/IO stat and notifications/IO
    beside flashpath's and SPDK's CPU/IO stat as multiples of its own, and its figures over SPDK's."""
    pts = [p for p in e["points"] if "floor" in p["servers"] and p["client"] == "fd"]
    if not pts:
        return []
    lines = ["", "The floor at the completion-fd points (the row \"floor\" above at fd points): the same "
             "back end, signalling the call eventfd after each round that completed requests while the "
             "client waits on it. Every server here polls its core through the run, so CPU/IO stat (utime + "
             "stime per I/O) is about 1 / IOPS: where the floor is no faster than SPDK (floor/SPDK near 1), "
             "the point is bound below the servers (the client, the cross-core traffic), not by their work. "
             "x floor: a server's CPU/IO stat as a multiple of the floor's; floor/SPDK: the floor's "
             "figure over SPDK's.", "",
             "| workload | floor IOPS | floor CPU/IO stat ns | floor notifications/IO | flashpath CPU/IO stat ns | "
             "x floor | SPDK CPU/IO stat ns | x floor | floor/SPDK CPU/IO stat | floor/SPDK IOPS | "
             "floor/SPDK notifications/IO |", "|" + "---|" * 11]
    for p in pts:
        md = {k: p["servers"][k]["median"] for k in ("floor", "flashpath", "spdk")}
        fr = p.get("floor_fd_ratios") or {}
        stat = "server_cpu_stat_ns_per_io"
        lines.append(f"| {_label(p)} | {_iops(md['floor'].get('iops'))} | {_ns(md['floor'].get(stat))} | "
                     f"{_k(md['floor'].get('notifications_per_io'))} | {_ns(md['flashpath'].get(stat))} | "
                     f"{_x(fr.get('cpu_stat_fp_floor'))} | {_ns(md['spdk'].get(stat))} | "
                     f"{_x(fr.get('cpu_stat_spdk_floor'))} | **{_x(fr.get('cpu_stat_floor_spdk'))}** | "
                     f"{_x(fr.get('iops_floor_spdk'))} | {_x(fr.get('notifications_floor_spdk'))} |")
    return lines


def _paired_fd_table(e):
    """The completion-fd points' rounds: CPU/IO stat ratios within each round beside its c2c samples."""
    pts = [p for p in e["points"] if (p.get("paired") or {}).get("cpu_stat_fp_spdk") and p["client"] == "fd"]
    if not pts:
        return []
    lines = ["", "Round by round (completion-fd points): as above, with the server CPU per I/O from "
             "/proc/PID/stat (CPU/IO stat) in place of busy/IO.", "",
             "| workload | round | c2c ns fp / SPDK / floor | CPU/IO stat fp/SPDK | fp/floor | floor/SPDK |",
             "|" + "---|" * 6]
    for p in pts:
        lines += _round_rows(p, ("cpu_stat_fp_spdk", "cpu_stat_fp_floor", "cpu_stat_floor_spdk"))
    return lines


def _round_rows(p, keys):
    """A point's rows in a round-by-round table: per round its c2c samples and the `paired`
    ratios `keys` (the first one's median in bold on the last line); "-" where a ratio is missing."""
    pr = p["paired"]
    ratios = [pr.get(k) or {} for k in keys]
    lines = [f"| {_label(p)} | {i + 1} | {_c2c(c)} | " + " | ".join(_x(_round(r, i)) for r in ratios) + " |"
             for i, c in enumerate(pr["c2c_ns"])]
    medians = [_x(r.get("median")) for r in ratios]
    lines.append(f"| {_label(p)} | median | | **{medians[0]}** | " + " | ".join(medians[1:]) + " |")
    return lines


def _c2c(c):
    """One round's c2c samples: flashpath's / SPDK's / the floor's run's (those the round had)."""
    return " / ".join(_ns(c.get(k)) for k in ("flashpath", "spdk", "floor") if k in c)


def _round(per_round, i):
    """Round i of a paired ratio, None where the point had no such ratio."""
    rounds = per_round.get("rounds") or []
    return rounds[i] if i < len(rounds) else None


def spdk_targets(res, add):
    """Issue 23's targets against SPDK, on this section's null points."""
    pts = {(p["backend"], p["qd"], p["client"]): p for p in (res.get("spdk") or {}).get("points", [])}

    def both(qd, client):
        p = pts.get(("null", qd, client))
        if p is None:
            return None, None, None
        return p["servers"]["flashpath"]["median"], p["servers"]["spdk"]["median"], p["ratios"]

    def floor_note(qd, client):
        """"; floor X ns: flashpath at A x the floor, SPDK at B x" where the point had the floor."""
        p = pts.get(("null", qd, client))
        if p is None or "floor" not in p["servers"]:
            return ""
        fr = p.get("floor_ratios") or {}
        note = (f"; floor {_ns(p['servers']['floor']['median'].get('reactor_busy_ns_per_io'))} ns: flashpath at "
                f"{_x(fr.get('flashpath'))}x the floor, SPDK at {_x(fr.get('spdk'))}x")
        pr = p.get("paired")
        if pr:
            rounds = ", ".join(_x(x) for x in pr["busy_fp_spdk"]["rounds"])
            note += (f"; round by round {_x(pr['busy_fp_spdk']['median'])}x ({rounds}), the floor "
                     f"{_x((pr.get('busy_floor_spdk') or {}).get('median'))}x SPDK's")
        return note

    def floor_fd_note(qd, client):
        """"; floor X ns, F x SPDK's; round by round fp/SPDK R x (r1 at c2c a/b ns, ...)" where the
        point had the floor (the floor's parts) and rounds with their c2c samples."""
        p = pts.get(("null", qd, client))
        if p is None:
            return ""
        note = ""
        if "floor" in p["servers"]:
            fr = p.get("floor_fd_ratios") or {}
            note = (f"; floor {_ns(p['servers']['floor']['median'].get('server_cpu_stat_ns_per_io'))} ns, "
                    f"{_x(fr.get('cpu_stat_floor_spdk'))}x SPDK's")
        pr = p.get("paired") or {}
        if pr.get("cpu_stat_fp_spdk"):
            fps, fls = pr["cpu_stat_fp_spdk"], pr.get("cpu_stat_floor_spdk") or {}
            rounds = ", ".join(
                f"{_x(x)}" + (f" (floor {_x(_round(fls, i))})" if fls else "") + f" at c2c {_c2c(c)} ns"
                for i, (x, c) in enumerate(zip(fps["rounds"], pr["c2c_ns"])))
            note += f"; round by round fp/SPDK {_x(fps['median'])}x: {rounds}"
        return note

    f, s, r = both(32, "fd")
    if f:
        add("SPDK peer, QD32 completion-fd client: IOPS >= 1.3x SPDK's", ">= 1.30x",
            f"{_iops(f.get('iops'))} vs {_iops(s.get('iops'))} = {_x(r['iops'])}x",
            None if r["iops"] is None else r["iops"] >= 1.3)
        a, b = f.get("server_cpu_stat_ns_per_io"), s.get("server_cpu_stat_ns_per_io")
        rc = a / b if a is not None and b else None
        add("SPDK peer, QD32 completion-fd client: server CPU per I/O <= 0.8x SPDK's", "<= 0.80x",
            f"{_ns(a)} vs {_ns(b)} ns = {_x(rc)}x{floor_fd_note(32, 'fd')}", None if rc is None else rc <= 0.8)
        a, b = f.get("notifications_per_io"), s.get("notifications_per_io")
        add("SPDK peer, QD32 completion-fd client: notifications per I/O <= SPDK's", "<= 1.00x",
            f"{_k(a)} vs {_k(b)}", None if a is None or b is None else a <= b)
        a, b = f.get("completions_per_wakeup"), s.get("completions_per_wakeup")
        add("SPDK peer, QD32 fd: completions per client wake-up >= SPDK's", ">= 1.00x",
            f"{_per(a)} vs {_per(b)}", None if a is None or b is None else a >= b)
    f, s, r = both(32, "poll")
    if f:
        add("SPDK peer, QD32 polled client: IOPS >= SPDK's", ">= 1.00x",
            f"{_iops(f.get('iops'))} vs {_iops(s.get('iops'))} = {_x(r['iops'])}x",
            None if r["iops"] is None else r["iops"] >= 1.0)
    for client in ("poll", "fd"):
        f, s, r = both(1, client)
        if f:
            add(f"SPDK peer, QD1 {client} client: p50 <= SPDK's", "<= 1.00x",
                f"{_us(f.get('p50_ns'))} vs {_us(s.get('p50_ns'))} µs = {_x(r['p50'])}x",
                None if r["p50"] is None else r["p50"] <= 1.0)
    f, s, r = both(1, "poll")
    if f:
        add("SPDK peer, QD1 polled: reactor busy time per I/O <= 0.8x SPDK's", "<= 0.80x",
            f"{_ns(f.get('reactor_busy_ns_per_io'))} vs {_ns(s.get('reactor_busy_ns_per_io'))} ns = "
            f"{_x(r['reactor_busy_per_io'])}x{floor_note(1, 'poll')}",
            None if r["reactor_busy_per_io"] is None else r["reactor_busy_per_io"] <= 0.8)
