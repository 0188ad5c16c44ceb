"""The guest-notification section (issue 23) in words: its table for results.md and its targets.
"""


def _f(v, fmt="{:,.0f}"):
    return "-" if v is None else fmt.format(v)


def _r(v):
    return "-" if v is None else f"{v:.2f}"


def _rng(x, k):
    v = x["range"].get(k)
    return "" if not v or x["runs"] < 2 else f" ({v[0]:.3f}–{v[1]:.3f})"


def guest_notify_markdown(res):
    e = res["guest_notify"]
    m = res["meta"]
    c = e["config"]
    lines = ["", "## Notifications in a real guest", ""]
    g = e.get("guest")
    if g:
        feats = "; ".join(f"{d['dev']} at {d['pci']}: EVENT_IDX {'on' if d['event_idx'] else 'off'}"
                          for d in g["disks"])
        lines += [
            f"One Linux guest (the guest tests' kernel and initramfs, {g['kernel']}; {g['vcpus']} vCPU, "
            f"{g['mem_mib']} MiB, QEMU {g['accel'].upper()} on CPU {m['client_cpu']}) with two vhost-user-blk "
            f"disks of one queue: a null disk from flashpath (PCI slot 4) and one from qemu-storage-daemon "
            f"(`null-co`, slot 5), both servers on CPU {m['server_cpu']}. In the guest, fio "
            f"{c['engine']}, 4 KiB randread, direct=1, {c['secs']} s per run on one disk at a time; "
            f"{c['reps']} runs per server and QD, interleaved; medians (min–max over the runs). "
            f"interrupts/IO: the disk's request vector in the guest's /proc/interrupts over fio's completed "
            f"I/Os; kicks/IO: hits of a kprobe on `{g['kick_probe']}` (the kicks that reached the device, "
            f"after the ring's suppression); chances/IO: hits on `{g['prepare_probe']}` (every time the "
            "driver could kick). Both are the guest's own counts, the same for either server. server "
            "notif./IO: flashpath's `notifications` counter (call eventfd writes) over the same run; "
            "under TCG QEMU turns the call eventfd into an interrupt itself, so several writes can "
            "become one interrupt; server kicks/IO: its `kicks` counter, where the daemon has one. CPU/IO: the server's CPU time per I/O; wait/IO: the time its threads were runnable but not running (schedstat), per I/O: a poller that suppresses the guest's kicks must also get the CPU to see the next request. TCG makes the guest slow: "
            f"its IOPS are the guest's limit, not the servers'. Negotiated: {feats}."
            + (f" flashpath ran with `{e['serve_args']}`." if e.get("serve_args") else ""),
            "",
            "| QD | server | guest IOPS | interrupts/IO | kicks/IO | chances/IO | server notif./IO | "
            "server kicks/IO | server CPU/IO µs | server wait/IO µs | fp/qsd interrupts | fp/qsd kicks | fp/qsd IOPS |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        errors = []
        for row in e.get("summary") or []:
            for kind in ("flashpath", "qsd"):
                x = row["servers"][kind]
                md = x["median"]
                rt = row["ratios"] if kind == "flashpath" else {}
                cpu, wait = md.get("server_cpu_ns_per_io"), md.get("server_wait_ns_per_io")
                lines.append(
                    f"| {row['qd']} | {kind} | {_f(md.get('iops'))} | {_f(md.get('irqs_per_io'), '{:.3f}')}"
                    f"{_rng(x, 'irqs_per_io')} | {_f(md.get('kicks_per_io'), '{:.3f}')}{_rng(x, 'kicks_per_io')} | "
                    f"{_f(md.get('prepares_per_io'), '{:.3f}')} | {_f(md.get('server_notifications_per_io'), '{:.3f}')} | "
                    f"{_f(md.get('server_kicks_per_io'), '{:.3f}')} | "
                    f"{_f(None if cpu is None else cpu / 1000, '{:.1f}')} | "
                    f"{_f(None if wait is None else wait / 1000, '{:.1f}')} | "
                    + (f"**{_r(rt.get('irqs_per_io'))}** | **{_r(rt.get('kicks_per_io'))}** | {_r(rt.get('iops'))} |"
                       if kind == "flashpath" else "| | |"))
                errors += [f"{kind} QD{row['qd']}: {err[:300]}" for err in x["errors"]]
        ck = e.get("checks") or {}
        lines += ["", f"Over all runs: kprobe hits missed {_f(ck.get('kicks_missed'))}, config interrupts "
                      f"{_f(ck.get('config_irqs'))}, the disks' reads minus fio's I/Os "
                      f"{_f(ck.get('disk_reads_minus_fio_ios'))}."]
        for err in errors:
            lines.append(f"Failed run: {err}")
    for n in e.get("notes") or []:
        lines.append(f"Note: {n}")
    lines.append("")
    return lines


def guest_notify_targets(res, add):
    """Issue 23's guest targets: interrupts and kicks per I/O at most qsd's at QD32, equal at
    QD1 (read as at most 2 % above qsd's: lower is no miss)."""
    e = res.get("guest_notify")
    if not e:
        return
    for row in e.get("summary") or []:
        f, q = row["servers"]["flashpath"]["median"], row["servers"]["qsd"]["median"]
        bound = 1.0 if row["qd"] > 1 else 1.02
        for k, what in (("irqs_per_io", "interrupts"), ("kicks_per_io", "kicks")):
            r = row["ratios"].get(k)
            add(f"guest fio QD{row['qd']}: {what} per I/O vs qsd's (TCG guest)",
                "<= qsd" if row["qd"] > 1 else "= qsd (<= 1.02x)",
                "not measured" if r is None else f"{f[k]:.3f} vs {q[k]:.3f} = {r:.2f}x",
                None if r is None else r <= bound)
