"""The ublk section (`--only ublk`: a null disk through ublk in a TCG guest against null_blk and
the kernel's NBD client, and the recovery after `kill -9`) in results.md, its targets and the
check of its outputs."""

from fpbench.report_format import fmt_ratio as _x
from fpbench.sections.ublk import DEVICES, GOAL_NBD, GOAL_NULL_BLK, GOAL_RECOVERY_S

HEADING = "## ublk: a null disk as a kernel block device"
LABELS = {"null_blk": "kernel `null_blk` (/dev/nullb0)", "ublk": "flashpath through ublk (/dev/ublkb7)",
          "nbd": "kernel NBD client → flashpath's NBD export (/dev/nbd0)"}


def _iops(v):
    return "-" if v is None else f"{v:,.0f}"


def _s(v):
    return "-" if v is None else f"{v:.2f}"


def _range(xs):
    return "-" if not xs else f"{min(xs):.2f}–{max(xs):.2f}"


def ublk_markdown(res):
    e = res["ublk"]
    c, g = e["config"], e.get("guest") or {}
    s, rc = e.get("summary") or {}, e.get("recovery") or {}
    lines = ["", HEADING, "",
             f"One TCG guest, {g.get('vcpus', c['vcpus'])} vCPUs (QEMU on host CPUs {g.get('qemu_cpus', '-')}, "
             f"{c['mem_mib']} MiB, kernel {g.get('kernel', '-')}), the guest tests' image with this section's init, "
             "flashpath (stripped) and nbd-client appended. In the guest: `flashpath serve --cpus 1` under "
             f"`taskset -c 1` (pinned: {g.get('pin', '-')}) serving a 1 GiB null bdev (4096-byte blocks) as "
             "/dev/ublkb7 (one queue of 128 on the reactor of vCPU 1, user recovery) and a second one made alike (a "
             "ublk disk claims its bdev) over NBD on a Unix socket that nbd-client connects as /dev/nbd0; `null_blk` "
             f"loaded with `{e.get('null_blk_params', '-')}`. fio "
             f"({c['engine']}, direct, 4 KiB randread, QD{c['qd']}, {c['secs']} s, pinned to vCPU 0) on the "
             f"three devices in turn, {c['reps']} repetitions, the order rotated each one; medians. A TCG guest "
             "shows ratios within one guest, not what the devices reach on hardware.", "",
             "| device | runs | IOPS (median) | min–max | mean completion latency µs |",
             "|---|---:|---:|---:|---:|"]
    for d in DEVICES:
        x = (s.get("devices") or {}).get(d) or {}
        lines.append(f"| {LABELS[d]} | {x.get('runs', 0)} | {_iops(x.get('iops'))} | {_iops(x.get('min'))}–"
                     f"{_iops(x.get('max'))} | {_s(x.get('clat_mean_us'))} |")
    rr = s.get("rep_ratios") or {}
    r = s.get("ratios") or {}
    lines += ["", f"ublk / null_blk: {_x(r.get('null_blk'))}x (per repetition {_range(rr.get('null_blk'))}); "
              f"ublk / NBD: {_x(r.get('nbd'))}x (per repetition {_range(rr.get('nbd'))}).", "",
              f"Recovery, {len(e.get('recoveries', []))} times: fio writing /dev/ublkb7 (QD32), `kill -9` of the "
              "daemon, a direct 4 KiB read started while no daemon serves (the kernel holds it), the daemon "
              "restarted with a configuration file holding `[[ublk_recover_disk]]`; the times run until that read "
              "completes (the guest's /proc/uptime, 10 ms steps). A negative time from the socket: the read "
              "completed before the socket first answered (polled every 10 ms). The "
              "daemon's own log clock: its start to the recovery done.", "",
              "| # | from the daemon's start s | from its socket answering s | from the kill s | daemon log s | "
              "read held | device kept | fio after (writes in 1 s, err) |",
              "|---:|---:|---:|---:|---:|---|---|---|"]
    for x in e.get("recoveries", []):
        lines.append(f"| {x['rep']} | {_s(x.get('from_start_s'))} | {_s(x.get('from_rpc_s'))} | "
                     f"{_s(x.get('from_kill_s'))} | {_s(x.get('log_recovered_s'))} | {x.get('held', '-')} | "
                     f"{x.get('kept', '-')} | {x.get('writes_after', '-')}, {x.get('fio_err', '-')} |")
    if rc.get("runs"):
        lines += ["", f"Median from the start {_s(rc['from_start_s']['median'])} s (worst "
                  f"{_s(rc['from_start_s']['max'])}), from the socket {_s(rc['from_rpc_s']['median'])} s (worst "
                  f"{_s(rc['from_rpc_s']['max'])})."]
    for n in e.get("notes", []):
        lines += ["", f"Note: {n}"]
    return lines


def ublk_targets(res, add):
    """The issue's targets: ublk >= 0.8x null_blk and >= the kernel NBD client at 4 KiB randread
    QD32 on the null disk; the device served again under 1 s after the daemon is back (every
    repetition, counted from the restarted daemon's start, the stricter of the two clocks)."""
    e = res.get("ublk")
    if not e or not e.get("runs"):
        return
    s = e["summary"]
    d, r = s["devices"], s["ratios"]
    for other, goal in (("null_blk", GOAL_NULL_BLK), ("nbd", GOAL_NBD)):
        name = "null_blk" if other == "null_blk" else "the kernel NBD client to flashpath's NBD export"
        add(f"ublk: 4 KiB randread QD32 on a null disk vs {name} (TCG guest)", f">= {goal:g}x",
            f"{_iops(d['ublk']['iops'])} vs {_iops(d[other]['iops'])} IOPS = {_x(r[other])}x",
            None if r[other] is None else r[other] >= goal,
            f"per repetition {_range(s['rep_ratios'][other])}")
    rc = e.get("recovery") or {}
    worst = (rc.get("from_start_s") or {}).get("max")
    if rc.get("runs"):
        add("ublk: recovery after kill -9, the device serving again after the daemon is back",
            f"< {GOAL_RECOVERY_S:g} s",
            f"worst {_s(worst)} s from the restarted daemon's start ({_s(rc['from_rpc_s']['max'])} s from its socket "
            f"answering), {rc['runs']} recoveries",
            None if worst is None or rc["runs"] != len(e.get("recoveries", [])) else worst < GOAL_RECOVERY_S)


def validate_ublk(res, c):
    """The three devices with their repetitions and positive IOPS, both ratios, and every
    recovery completed with its times, the probe held while no daemon served and the device
    kept."""
    e = res.get("ublk")
    if not e:
        return ["results.json has no 'ublk'"]
    if not e.get("runs") and any(n.startswith("not run:") for n in e.get("notes", [])):
        return []
    problems = []
    s = e.get("summary") or {}
    for d in DEVICES:
        x = (s.get("devices") or {}).get(d) or {}
        if x.get("runs") != c["reps"]:
            problems.append(f"ublk {d}: {x.get('runs', 0)} runs, want {c['reps']}")
        if not isinstance(x.get("iops"), (int, float)) or x["iops"] <= 0:
            problems.append(f"ublk {d}: iops = {x.get('iops')!r}")
    for other in ("null_blk", "nbd"):
        if not isinstance((s.get("ratios") or {}).get(other), (int, float)):
            problems.append(f"ublk: no ublk/{other} ratio")
    rc = e.get("recovery") or {}
    want = c["recovery_reps"]
    if rc.get("runs") != want:
        problems.append(f"ublk recovery: {rc.get('runs', 0)} completed, want {want}")
    for k in ("from_start_s", "from_rpc_s"):
        if not isinstance((rc.get(k) or {}).get("max"), (int, float)):
            problems.append(f"ublk recovery: no {k}")
    for k in ("held", "kept"):
        if rc.get(k) != want:
            problems.append(f"ublk recovery: {k} in {rc.get(k, 0)} of {want}")
    return problems
