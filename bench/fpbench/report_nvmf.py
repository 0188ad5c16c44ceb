"""The NVMe/TCP section (issue 24: flashpath vs SPDK's nvmf_tgt) in results.md, its targets and
the check of its outputs."""

from fpbench.common import MIB, server_measured
from fpbench.sections.nvmf import FLOOR_BACKENDS
from fpbench.load import point_key, point_label
from fpbench.report_format import SPREAD_NOTE, fmt_spread
from fpbench.report_format import fmt_iops as _iops, fmt_ns as _ns, fmt_ratio as _x, fmt_us as _us


def _label(p):
    return f"{p['backend']} 4K {p['pattern']} QD{p['qd']}"


def _calls(traced):
    return "-" if not traced else f"{traced['syscalls_per_io']:.2f}"


def _top_calls(traced, ios, n=4):
    """The most frequent system calls of a traced run, per I/O."""
    calls = sorted(((k, v) for k, v in traced["syscalls"]["calls"].items() if v / ios >= 0.005),
                   key=lambda kv: -kv[1])[:n]
    return ", ".join(f"{k} {v / ios:.2f}" for k, v in calls)


def nvmf_markdown(res):
    e, m = res["nvmf"], res["meta"]
    c = e["config"]
    cpu = m["server_cpu"]
    sizes = ", ".join(f"{b} {c['sizes'][b] // MIB} MiB" for b in e["backends"])
    how = {"perf": "perf stat on the raw_syscalls:sys_enter tracepoint and the per-call ones (counts only)",
           "strace": "strace -c -f -p (counts only: ptrace slows the server down, so the rate is not its own)",
           None: f"not counted: {e.get('syscall_note')}"}[e.get("syscall_method")]
    fl = e.get("floor")
    floor_text = "" if not fl else (
        " The floor (`bench/tcp_floor.c`, beside the null disk only): one thread on the same CPU that answers "
        "ICReq, Connect and the admin commands the host sends with fixed data (one namespace of the null disk's "
        "size) and each read with one C2HData PDU flagged LAST_PDU and SUCCESS, no CapsuleResp (what both targets "
        "send by default), from one static buffer: the targets' PDUs and system calls, no NVMe logic. floor: "
        "flashpath's calls (a non-blocking recv on every connection per round, one gathered sendmsg per "
        "connection with something to send, epoll_wait only after 200 µs idle); floor-epoll: SPDK's "
        "(epoll_wait with timeout 0 per round, recv on the ready connections). Each target's distance is "
        "from the floor of its own kind (" + ", ".join(f"{k}: {v}" for k, v in fl["of"].items()) + ").")
    lines = ["", "## NVMe over TCP (flashpath vs SPDK's nvmf_tgt, and the floor)", "",
             f"{e.get('version') or 'SPDK'} `nvmf_tgt -m {hex(1 << cpu)}` and `flashpath serve --cpus {cpu}`, "
             f"each pinned to CPU {cpu}, configured with the same SPDK calls on their RPC sockets "
             "(`bdev_null_create` / `bdev_malloc_create`, `nvmf_create_transport -t TCP`, `nvmf_create_subsystem`, "
             "`nvmf_subsystem_add_ns`, `nvmf_subsystem_add_listener` on 127.0.0.1), one disk each "
             f"({sizes}; RAM disks written through once before the rounds). Client: SPDK's spdk_nvme_perf "
             f"(`perf -q QD -o 4096 -w randread -t {max(1, round(c['secs']))} -c {hex(1 << m['client_cpu'])} -s 256 -L`) on CPU "
             f"{m['client_cpu']} over 127.0.0.1, one I/O queue pair. {c['reps']} round(s) per point, the targets "
             "interleaved (the order alternating), SPDK frozen (SIGSTOP) outside its own runs; medians; spread: "
             "(max - min) / median of the rounds' IOPS. p50/p99: "
             "perf's latency summary (-L). Everything server-side is read between perf's \"Launching workers\" "
             "and the end of its I/O: CPU/IO: the server's utime + stime (/proc/PID/stat) per I/O; core: its "
             "CPU time (schedstat) over the window in cores (SPDK's reactor polls its core whether or not there "
             "is work, so its CPU/IO is one core's time divided by its IOPS); wait: the share of the window the "
             "server was runnable but another process had its core (schedstat; more than a few % means the run "
             "measured the machine's other load); busy/IO: reactor busy time per I/O "
             "(flashpath's busy ns, SPDK's busy ticks / tick_rate from `framework_get_reactors`). syscalls/IO: "
             f"from one more run of {c['trace_secs']} s per point and target with the server's system calls "
             f"counted, {how}; the calls seen most, per I/O, beside it. fp/SPDK: ratio of the medians; mean: "
             f"perf's mean latency.{floor_text}", "", SPREAD_NOTE, "",
             "| workload | target | IOPS | spread | mean µs | p50 µs | p99 µs | CPU/IO ns | core | wait | busy/IO ns | "
             "syscalls/IO | most frequent calls per I/O |", "|" + "---|" * 13]
    for p in e["points"]:
        for kind in (k for k in e["targets"] if k in p["servers"]):
            x = p["servers"][kind]
            md, tr = x["median"], x.get("traced")
            share = md.get("server_core_share")
            share = "-" if share is None else f"{share:.2f}"
            spread = fmt_spread(md.get("iops_spread"))
            wait = md.get("server_wait_share")
            wait = "-" if wait is None else f"{100 * wait:.0f} %"
            lines.append(f"| {_label(p)} | {kind} | {_iops(md.get('iops'))} | {spread} | {_us(md.get('lat_mean_ns'))} | "
                         f"{_us(md.get('p50_ns'))} | "
                         f"{_us(md.get('p99_ns'))} | {_ns(md.get('server_cpu_ns_per_io'))} | "
                         f"{share} | {wait} | {_ns(md.get('reactor_busy_ns_per_io'))} | {_calls(tr)} | "
                         f"{'-' if not tr else _top_calls(tr, tr['ios'])} |")
    la = e.get("loadavg_before"), e.get("loadavg_after")
    if all(la):
        lines += ["", f"Load average (1 min) when the section started and ended: {la[0][0]:.2f}, {la[1][0]:.2f} "
                  f"(on {res['meta']['machine']['cpus']} CPUs; the section's own processes count in the second)."]
    if all(k in e["targets"] for k in ("flashpath", "spdk")):
        lines += ["", "| workload | IOPS fp/SPDK | mean fp/SPDK | p50 fp/SPDK | p99 fp/SPDK | CPU/IO fp/SPDK | "
                  "busy/IO fp/SPDK | syscalls/IO fp/SPDK |", "|" + "---|" * 8]
        for p in e["points"]:
            r = p["ratios"]
            lines.append(f"| {_label(p)} | **{_x(r['iops'])}** | {_x(r.get('lat_mean'))} | {_x(r['p50'])} | {_x(r['p99'])} | "
                         f"{_x(r['server_cpu_per_io'])} | {_x(r['reactor_busy_per_io'])} | {_x(r['syscalls_per_io'])} |")
    else:
        lines += ["", f"Targets run: {', '.join(e['targets'])} only (`--nvmf-targets`): no ratios."]
    dist = [(p, k, d) for p in e["points"] for k, d in (p.get("floor_distance") or {}).items()]
    if dist:
        lines += ["", "Distance from the floor (medians): IOPS as a ratio to the floor's; mean latency, p50 and "
                  "server CPU per I/O as what the target takes above the floor (negative: below it).", "",
                  "| workload | target | floor | IOPS / floor | mean / floor | mean above floor µs | "
                  "p50 above floor µs | CPU/IO above floor ns |", "|" + "---|" * 8]
        for p, k, d in dist:
            lines.append(f"| {_label(p)} | {k} | {d['floor']} | **{_x(d['iops_ratio'])}** | {_x(d['lat_mean_ratio'])} | "
                         f"{_signed_us(d['lat_mean_ns_above'])} | {_signed_us(d['p50_ns_above'])} | "
                         f"{_signed_ns(d['server_cpu_ns_per_io_above'])} |")
    paired = [(p, k, d) for p in e["points"] for k, d in (p.get("paired_floor") or {}).items()]
    if paired:
        lines += ["", "Round by round: each target and its floor ran within seconds of each other, each run just "
                  "after a sample of one cache line's round trip between the two CPUs (`bench/c2c.c`, ns; the "
                  "host gives this VM's vCPUs two speeds of it). The last line of a target is the rounds' median.",
                  "", "| workload | target | round | c2c ns target / floor | mean / floor | IOPS / floor |",
                  "|" + "---|" * 6]
        for p, k, d in paired:
            for i, (lat, iops) in enumerate(zip(d["lat_mean"]["rounds"], d["iops"]["rounds"])):
                a, b = d["c2c_ns"][i]
                lines.append(f"| {_label(p)} | {k} | {i + 1} | {_c2c(a)} / {_c2c(b)} | {_x(lat)} | {_x(iops)} |")
            lines.append(f"| {_label(p)} | {k} | median | | **{_x(d['lat_mean']['median'])}** | "
                         f"**{_x(d['iops']['median'])}** |")
    return lines


def _c2c(ns):
    return "-" if ns is None else f"{ns:.0f}"


def _signed_us(ns):
    return "-" if ns is None else f"{ns / 1000:+.2f}"


def _signed_ns(ns):
    return "-" if ns is None else f"{ns:+.0f}"


def nvmf_targets(res, add):
    """Issue 24's targets on the null disk's points."""
    e = res.get("nvmf") or {}
    if not all(k in e.get("targets", ()) for k in ("flashpath", "spdk")):
        return
    pts = {(p["backend"], p["qd"]): p for p in e.get("points", [])}
    p = pts.get(("null", 32))
    if p:
        f, s, r = p["servers"]["flashpath"]["median"], p["servers"]["spdk"]["median"], p["ratios"]
        add("NVMe/TCP null QD32 4K randread: IOPS >= 1.3x SPDK nvmf_tgt's", ">= 1.30x",
            f"{_iops(f.get('iops'))} vs {_iops(s.get('iops'))} = {_x(r['iops'])}x",
            None if r["iops"] is None else r["iops"] >= 1.3)
    p = pts.get(("null", 1))
    if p:
        f, s, r = p["servers"]["flashpath"]["median"], p["servers"]["spdk"]["median"], p["ratios"]
        add("NVMe/TCP null QD1 4K randread: p50 <= SPDK nvmf_tgt's", "<= 1.00x",
            f"{_us(f.get('p50_ns'))} vs {_us(s.get('p50_ns'))} µs = {_x(r['p50'])}x",
            None if r["p50"] is None else r["p50"] <= 1.0)
        lat = r.get("lat_mean")
        add("NVMe/TCP null QD1 4K randread: mean latency <= 0.85x SPDK nvmf_tgt's", "<= 0.85x",
            f"{_us(f.get('lat_mean_ns'))} vs {_us(s.get('lat_mean_ns'))} µs = {_x(lat)}x",
            None if lat is None else lat <= 0.85)
    floor_targets(pts, add)
    for p in e.get("points", []):
        f, s, r = p["servers"]["flashpath"], p["servers"]["spdk"], p["ratios"]
        ft, st = f.get("traced"), s.get("traced")
        add(f"NVMe/TCP {_label(p)}: server CPU and system calls per I/O", "reported",
            f"CPU {_ns(f['median'].get('server_cpu_ns_per_io'))} vs {_ns(s['median'].get('server_cpu_ns_per_io'))} ns "
            f"= {_x(r['server_cpu_per_io'])}x; syscalls {_calls(ft)} vs {_calls(st)} per I/O",
            None)


def floor_targets(pts, add):
    """Issue 37's: flashpath within 10 % of the floor of its kind (QD32 IOPS, QD1 mean latency)."""
    for qd, what, key, limit in ((32, "IOPS", "iops_ratio", 0.9), (1, "mean latency", "lat_mean_ratio", 1.1)):
        d = ((pts.get(("null", qd)) or {}).get("floor_distance") or {}).get("flashpath")
        if not d:
            continue
        v = d[key]
        # The round-by-round ratios beside the medians' (the status stays the medians').
        pr = (((pts.get(("null", qd)) or {}).get("paired_floor") or {}).get("flashpath") or {}).get(
            "iops" if qd == 32 else "lat_mean")
        rounds = "" if not pr else (f"; round by round {', '.join(_x(x) for x in pr['rounds'])} "
                                    f"(median {_x(pr['median'])})")
        add(f"NVMe/TCP null QD{qd} 4K randread: {what} within 10 % of the floor's ({d['floor']})",
            ">= 0.90x" if qd == 32 else "<= 1.10x", f"{_x(v)}x the floor's{rounds}",
            None if v is None else (v >= limit if qd == 32 else v <= limit))


def _target_problems(what, x, reps, counted, floor=False):
    """A target's figures at one point: its runs, positive medians, system call counts (a floor
    has no reactor counters)."""
    bad = []
    keys = ("iops", "p50_ns", "p99_ns", "server_cpu_ns_per_io") + (() if floor else ("reactor_busy_ns_per_io",))
    if (server_measured(bad, what, x, reps, keys)
            and counted and not (x.get("traced") or {}).get("syscalls", {}).get("total")):
        bad.append(f"{what}: no system call counts")
    return bad


def validate_nvmf(res, c):
    """The NVMe/TCP section: every point of every disk on every target that ran."""
    problems = []
    e = res["nvmf"]
    pts = {(p["backend"], p["qd"]): p for p in e.get("points", [])}
    for pk in (point_key(b, pt) for b in e.get("backends", []) for pt in c["points"]):
        p = pts.get((pk["backend"], pk["qd"]))
        if p is None:
            problems.append(f"nvmf: missing point {point_label(pk)}")
            continue
        floors = (e.get("floor") or {}).get("modes", {})
        for kind in e["targets"]:
            if kind in floors and pk["backend"] not in FLOOR_BACKENDS:
                continue
            problems += _target_problems(f"nvmf {point_label(pk)} {kind}", p["servers"].get(kind), c["reps"],
                                         e.get("syscall_method"), floor=kind in floors)
        if all(k in e["targets"] for k in ("flashpath", "spdk")) and p["ratios"].get("iops") is None:
            problems.append(f"nvmf {point_label(pk)}: no IOPS ratio")
        for kind, floor in (e.get("floor") or {}).get("of", {}).items():
            if pk["backend"] in FLOOR_BACKENDS and not (p.get("floor_distance") or {}).get(kind, {}).get("iops_ratio"):
                problems.append(f"nvmf {point_label(pk)}: no distance of {kind} from {floor}")
    return problems
