"""The NVMe/TCP initiator section (issue 25: flashpath's bdev_nvme vs SPDK's, both over TCP to
one SPDK nvmf_tgt) in results.md, its target and the check of its outputs."""

from fpbench.common import MIB, server_measured
from fpbench.load import point_key, point_label
from fpbench.report_format import SPREAD_NOTE, fmt_spread
from fpbench.report_format import fmt_iops as _iops, fmt_ns as _ns, fmt_ratio as _x, fmt_us as _us
from fpbench.report_nvmf import _top_calls

INITIATORS = ("flashpath", "spdk")


def _label(p):
    return f"null 4K {p['pattern']} QD{p['qd']} {p['client']}"


def _pct(v):
    return "-" if v is None else f"{100 * v:.0f} %"


def nvme_tcp_markdown(res):
    e, m = res["nvme_tcp"], res["meta"]
    c = e["config"]
    scpu, ccpu = m["server_cpu"], m["client_cpu"]
    lines = ["", "## NVMe/TCP initiator (flashpath's bdev_nvme vs SPDK's, one SPDK nvmf_tgt)", "",
             f"Target: {e.get('version') or 'SPDK'} `nvmf_tgt -m {hex(1 << ccpu)}` on CPU {ccpu} (the client's), "
             f"a null bdev ({c['size'] // MIB} MiB, 512-byte blocks) as namespace 1 of one subsystem listening on "
             f"127.0.0.1; target mode: {e.get('target_mode')}. Initiators, each on CPU {scpu}: `flashpath serve "
             f"--cpus {scpu}` and SPDK's `vhost -m {hex(1 << scpu)}`, each given the same "
             "`bdev_nvme_attach_controller` (TCP, IPv4, 127.0.0.1, the subsystem's NQN, defaults otherwise) and "
             "a vhost-user-blk controller (`vhost_create_blk_controller`) for the namespace's bdev `Nvme0n1`. "
             f"Client: `{e['client']}` (fp-load's own vhost-user frontend over 2 MiB huge pages) on CPU {ccpu}, one "
             "virtqueue; poll: it polls its used ring; fd: it sleeps on its completion fd. "
             f"{c['reps']} round(s) of {c['secs']:g} s per point, the initiators interleaved (flashpath, SPDK, "
             "flashpath, ...), SPDK's vhost frozen (SIGSTOP) outside its own runs (its reactor polls whether or "
             "not there is work); medians; spread: (max - min) / median of the rounds' IOPS. CPU/IO: the "
             "initiator's CPU time (schedstat, all threads) per I/O; wait: the share of the run the initiator was runnable while another process had its CPU (schedstat; more than a few % means the run measured the machine's other load too); busy/IO: its reactor busy time per I/O "
             "(flashpath's busy ns, SPDK's busy ticks / tick_rate from `framework_get_reactors`); tgt busy/IO: the "
             "target reactor's busy time per I/O (its CPU is the whole core: it polls); other: CPU time of "
             "everything but the initiator during the run, in cores (the target's polling included: it shares "
             "the client CPU with the client, so it gets less than a core). client CPU/IO: fp-load's CPU time per "
             "I/O; bound: one over tgt busy/IO plus client CPU/IO, the IOPS the shared client CPU allows any "
             "initiator, even one that cost nothing. fp/SPDK: ratio of the medians.", "", SPREAD_NOTE, "",
             "| workload | initiator | IOPS | spread | p50 µs | p99 µs | CPU/IO ns | wait | busy/IO ns | tgt busy/IO ns "
             "| client CPU/IO ns | bound |",
             "|" + "---|" * 12]
    for p in e["points"]:
        for kind in INITIATORS:
            md = p["servers"][kind]["median"]
            lines.append(f"| {_label(p)} | {kind} | {_iops(md.get('iops'))} | {fmt_spread(md.get('iops_spread'))} | "
                         f"{_us(md.get('p50_ns'))} | {_us(md.get('p99_ns'))} | "
                         f"{_ns(md.get('server_cpu_ns_per_io'))} | {_pct(md.get('server_wait_share'))} | "
                         f"{_ns(md.get('reactor_busy_ns_per_io'))} | "
                         f"{_ns(md.get('target_busy_ns_per_io'))} | {_ns(md.get('client_cpu_ns_per_io'))} | "
                         f"{_iops(md.get('shared_cpu_bound_iops'))} |")
    lines += ["", "| workload | IOPS fp/SPDK | p50 fp/SPDK | p99 fp/SPDK | CPU/IO fp/SPDK | busy/IO fp/SPDK | "
              "tgt busy/IO fp/SPDK |", "|" + "---|" * 7]
    for p in e["points"]:
        r = p["ratios"]
        lines.append(f"| {_label(p)} | **{_x(r['iops'])}** | {_x(r['p50'])} | {_x(r['p99'])} | "
                     f"{_x(r['server_cpu_per_io'])} | {_x(r['reactor_busy_per_io'])} | "
                     f"{_x(r['target_busy_per_io'])} |")
    traced = [p for p in e["points"] if all(p["servers"][k].get("traced") for k in INITIATORS)]
    if traced:
        lines += ["", f"System calls per I/O, from one more run per point and initiator with the target's and the "
                      f"initiator's calls counted ({e.get('syscall_method')}; the window includes the client's "
                      "connect, when the polling target makes only epoll_wait calls), the calls seen most beside "
                      "each total:", "",
                  "| workload | initiator | IOPS (traced) | target calls/IO | target's most frequent | "
                  "initiator calls/IO | initiator's most frequent |", "|" + "---|" * 7]
        for p in traced:
            for kind in INITIATORS:
                t = p["servers"][kind]["traced"]
                lines.append(f"| {_label(p)} | {kind} | {_iops(t.get('iops'))} | "
                             f"{t['target_syscalls_per_io']:.2f} | {_top_calls({'syscalls': t['target_syscalls']}, t['ios'])} | "
                             f"{t['initiator_syscalls_per_io']:.2f} | "
                             f"{_top_calls({'syscalls': t['initiator_syscalls']}, t['ios'])} |")
    elif e.get("syscall_note"):
        lines += ["", f"System calls: not counted ({e['syscall_note']})."]
    others = [run.get("other_cpu_cores") for p in e["points"] for k in INITIATORS
              for run in p["servers"][k]["runs"]]
    others = [o for o in others if o is not None]
    if others:
        lines += ["", f"Other CPU during the runs (everything but the initiator, target included): "
                      f"{_x(min(others))} to {_x(max(others))} cores; load average before "
                      f"{e['loadavg_before'][0]:.2f}, after {e.get('loadavg_after', [0])[0]:.2f}."]
    return lines


def nvme_tcp_targets(res, add):
    """The initiator's target: >= 1.3x SPDK's IOPS at QD32, the same client for both. Judged on
    the completion-fd client; the polled one is reported only: it and the polling target share
    one CPU, so its runs measure the scheduler's time slices more than either initiator. The
    shared client CPU's bound (a cost-free initiator's IOPS) is given beside it: a goal above
    that bound is out of any initiator's reach on this machine."""
    for p in (res.get("nvme_tcp") or {}).get("points", []):
        if p["qd"] != 32:
            continue
        f, s, r = p["servers"]["flashpath"]["median"], p["servers"]["spdk"]["median"], p["ratios"]
        fd = p["client"] == "fd"
        bound = f.get("shared_cpu_bound_iops")
        reach = bound / s["iops"] if bound and s.get("iops") else None
        note = ("" if reach is None else
                f"the shared client CPU bounds any initiator at {_iops(bound)} = {_x(reach)}x SPDK's; "
                f"flashpath at {_x(f['iops'] / bound)}x of that bound")
        add(f"NVMe/TCP initiator: vhost -> bdev_nvme(TCP) -> nvmf_tgt(null) vs SPDK's vhost -> bdev_nvme(TCP), "
            f"{_label(p)} client: IOPS", ">= 1.30x" if fd else "reported",
            f"{_iops(f.get('iops'))} vs {_iops(s.get('iops'))} = {_x(r['iops'])}x",
            (None if r["iops"] is None else r["iops"] >= 1.3) if fd else None,
            note if fd else "polled client and polling target share the client CPU: scheduler-bound")


def validate_nvme_tcp(res, c):
    """Every point on both initiators with its rounds, positive IOPS, latencies, CPU and busy
    time per I/O, and the IOPS ratio."""
    problems = []
    e = res["nvme_tcp"]
    got = {(p["qd"], p["client"]): p for p in e.get("points", [])}
    for pk in (point_key("null", pt) for pt in c["points"]):
        p = got.get((pk["qd"], pk["client"]))
        if p is None:
            problems.append(f"nvme-tcp: missing point {point_label(pk)}")
            continue
        for kind in INITIATORS:
            x = p["servers"].get(kind)
            if not server_measured(problems, f"nvme-tcp {point_label(pk)} {kind}", x, c["reps"],
                                   ("iops", "p50_ns", "p99_ns", "server_cpu_ns_per_io", "reactor_busy_ns_per_io",
                                    "target_busy_ns_per_io")):
                continue
            t = x.get("traced") or {}
            if e.get("syscall_method") and not (t.get("target_syscalls_per_io") and t.get("initiator_syscalls_per_io")):
                problems.append(f"nvme-tcp {point_label(pk)} {kind}: no system call counts")
        if not isinstance(p.get("ratios", {}).get("iops"), (int, float)):
            problems.append(f"nvme-tcp {point_label(pk)}: no IOPS ratio")
    return problems
