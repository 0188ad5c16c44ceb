"""The live-migration section (issue 22) in words: its tables for results.md and its targets.
"""

from fpbench.common import MIB


def _f(v, fmt="{:,.0f}"):
    return "-" if v is None else fmt.format(v)


def _r(v):
    return "-" if v is None else f"{v:.2f}"


def migration_markdown(res):
    e = res["migration"]
    m = res["meta"]
    lines = ["", "## Live migration", ""]
    lg = e.get("logging") or []
    if lg:
        c = e["config"]["logging"]
        lines += [
            "### The dirty log's cost",
            "",
            f"fp-load's own vhost-user frontend (`--frontend`: the vhost crate for set-up, split rings of its own) "
            f"with the dirty log off, and on (`--dirty-log`: `VHOST_F_LOG_ALL`, a memfd log sized for its memory "
            f"through `SET_LOG_BASE`, `VHOST_VRING_F_LOG` on the ring, a thread scanning and clearing the log "
            f"every 100 ms as QEMU's `vhost_log_sync`), on a {c['size_mib']} MiB RAM disk of each server (server CPU "
            f"{m['server_cpu']}, fp-load CPU {m['client_cpu']}), QD{c['qd']} 4 KiB, one polled queue; {c['reps']} "
            f"runs of {c['secs']:g} s per mode, off and on interleaved, the order reversed every repetition; "
            "medians; pairs: each repetition's on/off (they ran back to back); reactor busy/IO: flashpath's "
            "reactor busy time per I/O, on over off (median of the pairs). Back end's pages per I/O: flashpath's `logged_pages` / `logged_data_pages` counters "
            "(every mark, a page marked twice counts twice). Log scans: the distinct pages the sync thread "
            "found over the run, by what they hold (data: the request buffers, which a read writes and a "
            "write does not; expected: every slot's buffer for reads, none for writes).",
            "",
            "| server | workload | IOPS off | IOPS on | on/off | pairs on/off | reactor busy/IO on/off | back end "
            "pages/IO (data) | data pages seen / expected | header pages | ring pages | other pages | bits cleared/IO |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for x in lg:
            if x.get("error") and not x["runs"]["on"]:
                lines.append(f"| {x['server']} | {x['pattern']} 4K | {_f(x['median_iops']['off'])} | - | - | - | - | "
                             f"not measured: {x['error'][:160]} | | | | | |")
                continue
            p = x.get("pages") or {}
            bp = ("-" if p.get("logged_pages_per_io") is None else
                  f"{p['logged_pages_per_io']:.2f} ({p['logged_data_pages_per_io']:.2f})")
            seen = p.get("data_pages")
            seen = "-" if seen is None else f"{', '.join(str(s) for s in seen)} / {p['data_pages_expected']}"
            pr = [v for v in x.get("pair_ratios") or [] if v is not None]
            pairs = f"{min(pr):.2f}–{max(pr):.2f}" if pr else "-"
            lines.append(f"| {x['server']} | {x['pattern']} 4K | {_f(x['median_iops']['off'])} | "
                         f"{_f(x['median_iops']['on'])} | **{_r(x['ratio'])}** | {pairs} | "
                         f"{_r(x.get('busy_per_io_ratio'))} | {bp} | {seen} | "
                         f"{_f(p.get('header_pages'))} | {_f(p.get('ring_pages'))} | {_f(p.get('other_pages'))} | "
                         f"{_f(p.get('bits_seen_per_io'), '{:.4f}')} |")
        lines.append("")
    migs = e.get("migrations") or []
    g = e.get("guest")
    if g or e.get("notes"):
        c = e["config"]["migrate"]
        lines += ["### Migration downtime and total time", ""]
        if g:
            lines += [
                f"A Linux guest (the guest tests' kernel, {g['vcpus']} vCPU, {g['mem_mib']} MiB, QEMU {g['accel'].upper()}) "
                f"on a {c['size_mib']} MiB RAM disk, migrated over a Unix socket between two QEMUs on CPU "
                f"{m['client_cpu']} (`migrate`, `query-migrate`; parameters {g['params']}); the disk's server on CPU "
                f"{m['server_cpu']} serves both: flashpath two controllers on one bdev (the destination's with "
                "`migrate_from`), qemu-storage-daemon two vhost-user-blk exports of one node (a file on tmpfs). "
                "idle: the guest only prints its progress; load: bench/guestload.c in the guest, 4 KiB random "
                "writes at QD32 (O_DIRECT, native AIO). Downtime, total and setup time are QEMU's; guest IOPS from "
                "the guest's /proc/diskstats, before the migration and on the destination after it (TCG makes "
                f"them low). {c['reps']} migration(s) per server and mode, the servers interleaved; medians.",
                "",
                "| server | guest | migrations completed | downtime ms | (min–max) | total ms | (min–max) | setup ms | "
                "guest write IOPS before | after | errors |",
                "|---|---|---|---|---|---|---|---|---|---|---|",
            ]

            def rng(v):
                return "-" if not v else f"{v[0]:,}–{v[1]:,}"

            for s in e.get("migration_summary") or []:
                lines.append(f"| {s['server']} | {s['mode']} | {s['completed']} of {s['runs']} | {_f(s['downtime_ms'])} | "
                             f"{rng(s.get('downtime_range'))} | {_f(s['total_time_ms'])} | {rng(s.get('total_time_range'))} | "
                             f"{_f(s['setup_time_ms'])} | "
                             f"{_f(s['guest_write_iops_before'])} | {_f(s['guest_write_iops_after'])} | "
                             f"{'; '.join(x[:200] for x in s['errors']) or '-'} |")
            lines += ["", "Every migration: " + "; ".join(
                f"{r['server']} {r['mode']} #{r['rep']}: {r.get('status')}"
                + (f" {r['downtime_ms']}/{r['total_time_ms']} ms" if r.get("status") == "completed" else "")
                for r in migs) + "."]
        for n in e.get("notes") or []:
            lines.append(f"Note: {n}")
        lines.append("")
    mr = e.get("mirror")
    if mr:
        c = mr["config"]
        lines += [
            "### The mirror vs nbdcopy",
            "",
            f"Two flashpath daemons, the source on CPU {m['server_cpu']} and the destination on CPU "
            f"{m['client_cpu']}, each with a {mr['size'] // MIB} MiB RAM disk exported over NBD on a Unix socket; "
            f"the source disk written in full first. nbdcopy (CPU {m['client_cpu']}, its defaults) copies the "
            "source export to the destination export (after one copy not counted, which takes the destination's "
            "page faults); the mirror job does the same from inside the source "
            "daemon (`bdev_nbd_client_create` on the destination's socket, `bdev_mirror_start`, "
            "`bdev_mirror_get_jobs` every 20 ms until `ready`), onto a destination first zeroed, and the two disks "
            "are then compared (SHA-256 of each export). Source IOPS: fp-load on CPU "
            f"{m['client_cpu']} (shared with the destination daemon), QD32 4 KiB randwrite, one queue with "
            "completion fds (a polling client would starve the destination daemon on their shared CPU), on "
            "the source disk through vhost-user: alone, during a mirror's copy phase (fp-load's 100 ms "
            "timeline over the windows between the job's start and `ready`) and with the job ready (every write "
            f"mirrored). {c['reps']} run(s) each; medians.",
            "",
            "| copier | MB/s | vs nbdcopy | runs (s) |",
            "|---|---|---|---|",
            f"| nbdcopy | {_f(mr.get('nbdcopy_mbps'))} | 1.00 | "
            + ", ".join(_f(x.get("seconds"), "{:.2f}") for x in mr.get("nbdcopy", [])) + " |",
        ]
        if mr.get("mirror"):
            same = ", ".join(str(x) for x in mr.get("targets_identical", []))
            lines.append(f"| mirror job | {_f(mr.get('mirror_mbps'))} | **{_r(mr.get('ratio'))}** | "
                         + ", ".join(_f(x.get("seconds"), "{:.2f}") for x in mr["mirror"])
                         + f" (identical after: {same}) |")
        io = mr.get("iops") or {}
        if io:
            lines += ["", "| source disk | IOPS | vs alone |", "|---|---|---|",
                      f"| alone | {_f(io.get('alone'))} | 1.00 |"]
            if "during_copy" in io:
                lines.append(f"| during the copy ({_f(io.get('copy_s_under_load'), '{:.2f}')} s to ready under load) | "
                             f"{_f(io.get('during_copy'))} | **{_r(io.get('ratio_during_copy'))}** |")
                lines.append(f"| job ready (writes mirrored) | {_f(io.get('ready'))} | {_r(io.get('ratio_ready'))} |")
            lim = io.get("limited") or {}
            if lim.get("during_copy") is not None:
                lines.append(f"| during a copy limited to {lim['speed'] / 1e6:,.0f} MB/s (`speed`; "
                             f"{_f(lim.get('copy_s_under_load'), '{:.2f}')} s to ready) | {_f(lim['during_copy'])} | "
                             f"{_r(lim.get('ratio_during_copy'))} |")
            wb = io.get("write_blocking") or {}
            if wb.get("during_copy") is not None:
                lines.append(f"| during a write-blocking copy (`copy_mode`; "
                             f"{_f(wb.get('copy_s_under_load'), '{:.2f}')} s to ready) | {_f(wb['during_copy'])} | "
                             f"{_r(wb.get('ratio_during_copy'))} |")
        for n in mr.get("notes") or []:
            lines.append(f"Note: {n}")
        lines.append("")
    return lines


def migration_targets(res, add):
    """Issue 22's targets from a migration run."""
    e = res.get("migration")
    if not e:
        return
    for x in e.get("logging") or []:
        if x["server"] != "flashpath":
            continue
        r = x.get("ratio")
        add(f"dirty log on vs off, QD32 4K {x['pattern']} (flashpath RAM disk)", ">= 0.90x",
            "not measured: " + x["error"][:200] if r is None else
            f"{x['median_iops']['on']:,.0f} vs {x['median_iops']['off']:,.0f} IOPS = {r:.2f}x (pairs "
            + ", ".join(_r(v) for v in x.get("pair_ratios") or []) + f"; reactor busy per I/O {_r(x.get('busy_per_io_ratio'))}x)",
            None if r is None else r >= 0.90)
        p = x.get("pages") or {}
        if x["pattern"] == "randread" and p.get("data_pages") is not None:
            ok = all(s == p["data_pages_expected"] for s in p["data_pages"]) and p.get("other_pages") == 0
            per = p.get("logged_data_pages_per_io")
            # Exact up to the requests in flight when fp-load stopped counting (<= the depth).
            span = p.get("data_pages_minus_ios")
            exact = span is None or (0 <= span[0] and span[1] <= x["qd"])
            add("pages logged per 4 KiB read = pages written", "exact",
                f"data pages in the log {', '.join(str(s) for s in p['data_pages'])} of {p['data_pages_expected']} "
                f"written, {p.get('other_pages')} outside; back end: "
                + ("-" if per is None else f"{per:.4f} data pages per read (data pages - reads counted: "
                   f"{span[0]} to {span[1]}, the requests still in flight at the end), "
                   f"{p['logged_pages_per_io']:.2f} pages in all"),
                ok and exact)
        if x["pattern"] == "randwrite" and p.get("data_pages") is not None:
            ok = all(s == 0 for s in p["data_pages"]) and p.get("other_pages") == 0
            add("no data page logged for a write (the device only reads it)", "0 pages",
                f"{', '.join(str(s) for s in p['data_pages'])} data pages", ok)
    summ = {(s["server"], s["mode"]): s for s in e.get("migration_summary") or []}
    for mode in ("idle", "load"):
        f, q = summ.get(("flashpath", mode)), summ.get(("qsd", mode))
        if not (f and q):
            continue
        for key, what in (("downtime_ms", "downtime"), ("total_time_ms", "total time")):
            if f[key] is None:
                add(f"migration {what}, guest {mode}: flashpath <= qsd's", "<= qsd",
                    f"flashpath did not migrate ({'; '.join(f['errors'])[:200] or 'no completed run'}); qsd "
                    f"{_f(q[key])} ms", False)
                continue
            add(f"migration {what}, guest {mode}: flashpath <= qsd's", "<= qsd",
                f"{f[key]:,.0f} vs {_f(q[key])} ms", None if q[key] is None else f[key] <= q[key])
    mr = e.get("mirror") or {}
    if mr.get("ratio") is not None:
        add(f"mirror copy of {mr['size'] // MIB} MiB over NBD vs nbdcopy", ">= 0.80x",
            f"{mr['mirror_mbps']:,.0f} vs {mr['nbdcopy_mbps']:,.0f} MB/s = {mr['ratio']:.2f}x; identical after: "
            f"{mr.get('targets_identical')}", mr["ratio"] >= 0.8 and all(mr.get("targets_identical") or [False]))
    elif mr:
        add("mirror copy over NBD vs nbdcopy", ">= 0.80x",
            f"not measured ({'; '.join(mr.get('notes') or [])[:200]}); nbdcopy {_f(mr.get('nbdcopy_mbps'))} MB/s", None)
    io = mr.get("iops") or {}
    if io.get("ratio_during_copy") is not None:
        add("source IOPS during the mirror's copy vs alone (QD32 4K randwrite)", ">= 0.70x",
            f"{io['during_copy']:,.0f} vs {io['alone']:,.0f} = {io['ratio_during_copy']:.2f}x; job ready: "
            f"{_r(io.get('ratio_ready'))}x", io["ratio_during_copy"] >= 0.7)
    wb = io.get("write_blocking") or {}
    if wb.get("ratio_during_copy") is not None:
        add("the same, the copy writing blocking (copy_mode write-blocking)", ">= 0.70x",
            f"{wb['during_copy']:,.0f} vs {io['alone']:,.0f} = {wb['ratio_during_copy']:.2f}x, "
            f"{_f(wb.get('copy_s_under_load'), '{:.2f}')} s to ready", wb["ratio_during_copy"] >= 0.7)
