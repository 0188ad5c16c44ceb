"""The raid1 section (issue 26, `--only raid`) in results.md, its targets and the check of its
outputs."""

from fpbench.common import MIB, ratio
from fpbench.load import point_key, point_label
from fpbench.report_format import fmt_iops as _iops, fmt_ns as _ns, fmt_ratio as _x, fmt_us as _us
from fpbench.sections.raid import BUCKET_S, LISTS


def _label(p):
    return f"{p['pattern']} 4K QD{p['qd']} {p['client']}"


def _num(v, form, scale=1):
    return "-" if v is None else form.format(v / scale if scale != 1 else v)


def _mib(v):
    return _num(v, "{:,.1f}", MIB)


# A run whose daemon waited for its CPU less than this share of the time: the machine left it alone.
CLEAN_WAIT = 0.05


def _join(rs, key, form):
    return ", ".join(form.format(r[key]) for r in rs)


def raid_markdown(res):
    e, m = res["raid"], res["meta"]
    c = e["config"]
    scpu, ccpu = m["server_cpu"], m["client_cpu"]
    variants = c["variants"]
    lines = ["", "## raid1 (issue 26)", "",
             f"Load average before the section {e['loadavg_before'][0]:.2f}, after "
             f"{e.get('loadavg_after', [0])[0]:.2f} (2 CPUs; other work on the machine shows there).", "",
             "### The cost of a mirrored write", "",
             f"One daemon per variant on CPU {scpu} (`flashpath serve --cpus {scpu}` under taskset; the others "
             f"sleep while one is measured), fp-load (libblkio, one polled queue) on CPU {ccpu}. **single**: a "
             f"{c['cost_size'] // MIB} MiB malloc bdev; **raid1**: `bdev_raid_create` raid1 with `superblock: true` "
             f"over two malloc bdevs of {c['cost_size'] // MIB} MiB + 8 MiB (every write passes the write-intent "
             "bitmap); **raid1-nosb**: the same without a superblock. Every disk written in full first. "
             f"{c['reps']} runs of {c['secs']:g} s per point and variant, the order rotating; medians. busy/IO: "
             "reactor busy time per I/O; other/IO: CPU time of the daemon's non-reactor threads (the raid's owner "
             "thread: bitmap and superblock writes) per I/O; **work/IO** = busy/IO + other/IO (the CPU a write "
             "costs, the figure the target is judged on); CPU/IO: all threads' CPU time per I/O (a polling "
             "reactor counts its idle polls there too); wait: the share of the run the daemon was runnable while "
             "something else had its CPU (schedstat): above a few %, the machine's other load is in the figures "
             "(busy time then includes time the reactor was preempted).", "",
             "| workload | variant | IOPS | spread | wait | p50 µs | p99 µs | busy/IO ns | other/IO ns | work/IO ns | "
             "CPU/IO ns | work/IO vs single | IOPS vs single |", "|" + "---|" * 13]
    for p in e["points"]:
        for v in variants:
            md = p["median"][v]
            r = p["ratios"].get(v, {})
            lines.append(f"| {_label(p)} | {v} | {_iops(md.get('iops'))} | {_num(md.get('iops_spread'), '{:.0%}')} | "
                         f"{_num(md.get('server_wait_share'), '{:.0%}')} | "
                         f"{_us(md.get('p50_ns'))} | {_us(md.get('p99_ns'))} | {_ns(md.get('reactor_busy_ns_per_io'))} | "
                         f"{_ns(md.get('other_threads_ns_per_io'))} | {_ns(md.get('work_ns_per_io'))} | "
                         f"{_ns(md.get('server_cpu_ns_per_io'))} | {_x(r.get('work_ns_per_io'))} | "
                         f"{_x(r.get('iops'))} |")
    clean = [(p, v, rs) for p in e["points"] for v in variants
             for rs in [[r for r in p["runs"][v] if r.get("server_wait_share", 1) < CLEAN_WAIT]] if rs]
    if clean:
        lines += ["", f"Only the runs the machine left alone (the daemon's wait under {CLEAN_WAIT:.0%}), each run "
                      "listed (IOPS / work per I/O in ns); on a loaded machine these are the figures to read:", "",
                  "| workload | variant | runs | IOPS | work/IO ns |", "|" + "---|" * 5]
        for p, v, rs in clean:
            lines.append(f"| {_label(p)} | {v} | {len(rs)} | {_join(rs, 'iops', '{:,.0f}')} | "
                         f"{_join(rs, 'work_ns_per_io', '{:,.0f}')} |")
    parts = [x for x in (e.get("partial"), e.get("partial_ram"), e.get("partial_region")) if x]
    if parts:
        pa = parts[0]
        lines += ["", "### Partial rebuild", "",
                  f"raid1 with a superblock over two bases of {pa['base_size'] // MIB} MiB, identical to start with: "
                  "**file**: two files on tmpfs (`bdev_uring_create`, O_DIRECT; random data), which the bench can "
                  "read; **ram**: two malloc bdevs (the raid written in full first, then left idle until the owner's lazy "
                  "clearing wrote the fill's bits back clean); **ram, writes in the first N MiB**: the same with the "
                  "writes confined to the start of the disk (what a partial rebuild saves; reported only). `bdev_raid_remove_base_bdev` of "
                  f"the second; {pa['write_secs']:g} s of QD32 4 KiB randwrite (polled client, `--seed {pa['seed']}`) "
                  "on the raid; `bdev_raid_add_base_bdev` of the same base; the rebuild waited for "
                  "(`bdev_raid_get_bdevs` every 20 ms). **unique**: the 4 KiB blocks the writes hit, from fp-load's "
                  "offsets replayed (its SplitMix64 with the same seed; the 32 writes in flight when it stops are "
                  "drained, not counted, and included here); on the files also compared block by block "
                  "(**replay = compare**: the replay's check). **copied**: the raid's `rebuild_bytes_copied` over the "
                  "rebuild. **dirty chunks**: the bitmap chunks (the raid's chunk size) holding a block written "
                  "meanwhile, the least a bitmap with that chunk copies. blocks differing after: the files compared "
                  "again once the rebuild ended (must be 0).", "",
                  "| bases | data MiB | write IOPS | written MiB | unique MiB | replay = compare | dirty chunks MiB "
                  "(chunk) | copied MiB | copied / unique | copied / written | copied / dirty chunks | rebuild s | "
                  "process | blocks differing after |", "|" + "---|" * 14]
        for pa in parts:
            w = pa.get("writes", {})
            chunk = pa.get("bitmap_chunk")
            agree = pa.get("replay_agrees")
            bases = pa.get("kind", "file") + (f", writes in the first {_mib(pa['region'])} MiB" if pa.get("region") else "")
            lines.append(f"| {bases} | {_mib(pa.get('data_bytes'))} | {_iops(w.get('iops'))} | "
                         f"{_mib(w.get('bytes'))} | {_mib(pa.get('unique_bytes'))} | "
                         f"{'-' if agree is None else ('yes' if agree else 'NO')} | "
                         f"{_mib(pa.get('dirty_chunk_bytes'))} ({'-' if not chunk else f'{chunk // 1024} KiB'}) | "
                         f"{_mib(pa.get('bytes_copied'))} | **{_x(pa.get('copied_per_unique'))}** | "
                         f"{_x(pa.get('copied_per_written'))} | {_x(pa.get('copied_per_dirty_chunks'))} | "
                         f"{pa.get('rebuild_s', 0):.2f} | {', '.join(pa.get('process_types') or []) or '-'} | "
                         f"{_num(pa.get('blocks_differing_after'), '{}')} |")
    fu = e.get("full")
    if fu and fu.get("summary"):
        s = fu["summary"]
        lines += ["", "### Full rebuild against a plain copy", "",
                  f"One daemon, malloc bdevs of {fu['base_size'] // MIB} MiB. **copy**: a mirror job "
                  "(`bdev_mirror_start`, the daemon's own block copier on its reactor) from the first malloc bdev, "
                  "written in full, to a fresh one, timed from the start to `ready` (every byte copied once). "
                  "**rebuild**: raid1 with a superblock over the first two, the second removed, a fresh malloc bdev "
                  "(unknown to the raid: a full rebuild) added, timed to the end of the rebuild; removed again between "
                  "rounds. Both with nothing else running and under the guest load: fp-load "
                  f"{_label(fu['guest'])} (completion-fd client) on the source's export from "
                  f"{c['lead_s']:g} s before the start, with a 100 ms timeline; during: the buckets wholly inside the "
                  "copy (one bucket of margin each side). The guest's IOPS without a copy: the degraded raid (reads "
                  "from the source alone, as in a rebuild) and the healthy raid after the last rebuild. The raid's "
                  "owner thread (the rebuild's copier) and the reactor share the server CPU.", "",
                  "| kind | guest load | MB/s (runs) | s | server CPU s | server wait | load avg | guest IOPS before | "
                  "guest IOPS during |", "|" + "---|" * 9]
        groups = [(kind, loaded, [r for r in fu[LISTS[kind]] if r["loaded"] == loaded])
                  for kind in ("copy", "rebuild") for loaded in (False, True)]
        groups.append((f"rebuild limited to {fu.get('limit_mb_s')} MB/s", True, fu.get("rebuilds_limited") or []))
        groups.append((f"rebuild held at {fu.get('at_target_limit_mib_s')} MiB/s, share off", True,
                       fu.get("rebuilds_at_target") or []))
        for kind, loaded, rs in groups:
            if rs:
                lines.append(f"| {kind} | {'yes' if loaded else 'no'} | "
                             f"{_join(rs, 'mb_per_s', '{:.0f}')} | {_join(rs, 'seconds', '{:.2f}')} | "
                             f"{_join(rs, 'server_cpu_s', '{:.2f}')} | {_join(rs, 'server_wait_share', '{:.0%}')} | "
                             f"{_join(rs, 'loadavg', '{:.1f}')} | "
                             f"{', '.join(_iops(r.get('guest_before_iops')) for r in rs) if loaded else '-'} | "
                             f"{', '.join(_iops(r.get('guest_during_iops')) for r in rs) if loaded else '-'} |")
        lines += ["", f"Guest IOPS without a copy: degraded {_iops(s.get('guest_degraded_iops'))}, healthy "
                      f"{_iops(s.get('guest_healthy_iops'))}. Rebuild vs copy (medians): alone "
                      f"{_x(s.get('rebuild_alone_vs_copy_alone'))}x, under load vs the copy alone "
                      f"{_x(s.get('rebuild_loaded_vs_copy_alone'))}x, under load vs the copy under the same load "
                      f"{_x(s.get('rebuild_loaded_vs_copy_loaded'))}x. Guest during the rebuild vs degraded "
                      f"{_x(s.get('guest_during_vs_degraded'))}x (vs the same run before the rebuild "
                      f"{_x(s.get('guest_during_vs_before'))}x; during the plain copy "
                      f"{_x(s.get('guest_during_copy_vs_degraded'))}x)."]
        if s.get("loaded_runs_uncovered"):
            lines += ["", f"⚑ {s['loaded_runs_uncovered']} of {s['loaded_runs']} copies under load outlived the "
                          "guest's load: they finished beside an idle guest, so their rates read high."]
        if s.get("limited_mb_per_s"):
            lines += ["", f"Limited (`bdev_raid_set_options` `process_max_bandwidth_mb_sec` {fu.get('limit_mb_s')}, "
                          f"0.85x the copy alone): {s['limited_mb_per_s']:.0f} MB/s = "
                          f"{_x(s.get('limited_vs_copy_alone'))}x the copy alone; the guest during it "
                          f"{_iops(s.get('guest_during_limited_iops'))} = {_x(s.get('guest_during_limited_vs_before'))}x "
                          f"the same run before, {_x(s.get('guest_during_limited_vs_degraded'))}x the degraded raid."]
        if s.get("at_target_mb_per_s"):
            lines += ["", f"Held at the share target's speed (`process_weight` 100, `process_max_bandwidth_mb_sec` "
                          f"{fu.get('at_target_limit_mib_s')} MiB/s, half the rebuild alone): "
                          f"{s['at_target_mb_per_s']:.0f} MB/s = {_x(s.get('at_target_vs_rebuild_alone'))}x the rebuild "
                          f"alone; the guest during it {_iops(s.get('guest_during_at_target_iops'))} = "
                          f"{_x(s.get('guest_during_at_target_vs_before'))}x the same run before, "
                          f"{_x(s.get('guest_during_at_target_vs_degraded'))}x the degraded raid: what one core leaves "
                          "the guest with the rebuild at that speed, whatever shares it."]
    return lines


def raid_targets(res, add):
    """Issue 26's targets: work per write <= 1.3x a single RAM disk's and reads at least as fast
    (QD1 and QD32); a partial rebuild copying <= 1.1x what was written (judged on the unique
    bytes, the total reported); a full rebuild >= 0.8x a plain copy while the guest keeps >= 0.7x
    its IOPS (judged on the rebuild under load against the copy alone and the degraded raid's
    guest IOPS)."""
    e = res.get("raid")
    if not e:
        return
    for p in e["points"]:
        s, r = p["median"]["single"], p["median"].get("raid1")
        if not r:
            continue
        q = p["ratios"]["raid1"]
        if "write" in p["pattern"]:
            x = q.get("work_ns_per_io")
            add(f"raid1 (superblock) over two RAM disks, {_label(p)}: work per write vs a single RAM disk",
                "<= 1.30x", f"{_ns(r.get('work_ns_per_io'))} vs {_ns(s.get('work_ns_per_io'))} ns = {_x(x)}x "
                f"(IOPS {_x(q.get('iops'))}x)", None if x is None else x <= 1.3)
        else:
            x = q.get("iops")
            add(f"raid1 (superblock) over two RAM disks, {_label(p)}: read IOPS vs a single RAM disk", ">= 1.00x",
                f"{_iops(r.get('iops'))} vs {_iops(s.get('iops'))} = {_x(x)}x", None if x is None else x >= 1.0)
    for pa in (x for x in (e.get("partial"), e.get("partial_ram"), e.get("partial_region")) if x):
        x = pa.get("copied_per_unique")
        after = pa.get("blocks_differing_after")
        region = pa.get("region")
        where = f", writes in the first {_mib(region)} MiB" if region else ""
        add(f"partial rebuild ({pa.get('kind', 'file')} bases{where}) after {pa['write_secs']:g} s of QD32 4K randwrite on a "
            f"{_mib(pa.get('data_bytes'))} MiB raid1: bytes copied / unique bytes written",
            "reported" if region else "<= 1.10x", f"{_mib(pa.get('bytes_copied'))} / {_mib(pa.get('unique_bytes'))} MiB = {_x(x)}x; per total "
            f"written ({_mib((pa.get('writes') or {}).get('bytes'))} MiB) {_x(pa.get('copied_per_written'))}x; per "
            f"dirty chunk {_x(pa.get('copied_per_dirty_chunks'))}x",
            None if x is None or region else x <= 1.1,
            ("" if after is None else f"replicas identical after: {after == 0}") +
            (f"copied {_num(ratio(pa.get('bytes_copied'), pa.get('data_bytes')), '{:.1%}')} of the disk" if region else ""))
    s = (e.get("full") or {}).get("summary")
    if s:
        x = s.get("rebuild_loaded_vs_copy_alone")
        add("full rebuild under guest QD32 randread vs a plain copy (mirror job) alone", ">= 0.80x",
            f"{_num(s.get('rebuild_loaded_mb_per_s'), '{:,.0f}')} vs {_num(s.get('copy_alone_mb_per_s'), '{:,.0f}')} MB/s = {_x(x)}x "
            f"(alone {_x(s.get('rebuild_alone_vs_copy_alone'))}x)", None if x is None else x >= 0.8)
        # Judged on the stricter of the two baselines: the degraded raid's own runs, and the same
        # run's seconds before the rebuild (adjacent in time: the machine's drift falls out).
        xs = [v for v in (s.get("guest_during_vs_degraded"), s.get("guest_during_vs_before")) if v is not None]
        x = min(xs) if xs else None
        add("guest QD32 randread IOPS during the full rebuild vs without (the stricter baseline)", ">= 0.70x",
            f"{_iops(s.get('guest_during_rebuild_iops'))} vs {_iops(s.get('guest_degraded_iops'))} (degraded raid) = "
            f"{_x(s.get('guest_during_vs_degraded'))}x, vs {_iops(s.get('guest_before_rebuild_iops'))} (the same run "
            f"before the rebuild) = {_x(s.get('guest_during_vs_before'))}x", None if x is None else x >= 0.7)
        held = (("limited", "the same with the rebuild limited to 0.85x the plain copy", "limited_vs_copy_alone",
                 "the copy alone"),
                ("at_target", "the rebuild held at 0.5x its speed alone (share off, speed limit)",
                 "at_target_vs_rebuild_alone", "the rebuild alone"))
        for key, what, speed, against in held:
            if s.get(f"{key}_mb_per_s"):
                xs = [v for v in (s.get(f"guest_during_{key}_vs_degraded"), s.get(f"guest_during_{key}_vs_before"))
                      if v is not None]
                add(f"{what}: rebuild speed; guest IOPS (stricter baseline)", "reported",
                    f"{_x(s.get(speed))}x {against}; guest {_x(min(xs) if xs else None)}x", None)


def validate_raid(res, c):
    """Every point on every variant with its runs and positive figures; the partial rebuild's
    byte counts and the replicas identical after it; every copy and rebuild timed."""
    problems = []
    e = res["raid"]
    got = {(p["pattern"], p["qd"]): p for p in e.get("points", [])}
    for pk in (point_key("ram", pt) for pt in c["points"]):
        p = got.get((pk["pattern"], pk["qd"]))
        if p is None:
            problems.append(f"raid: missing point {point_label(pk)}")
            continue
        for v in c["variants"]:
            rs = p["runs"].get(v) or []
            if len(rs) != c["reps"]:
                problems.append(f"raid {point_label(pk)} {v}: {len(rs)} runs")
            for k in ("iops", "p50_ns", "reactor_busy_ns_per_io", "work_ns_per_io"):
                x = p["median"].get(v, {}).get(k)
                if not isinstance(x, (int, float)) or x <= 0:
                    problems.append(f"raid {point_label(pk)} {v}: {k} = {x!r}")
    for key in ("partial", "partial_ram"):
        pa = e.get(key) or {}
        for k in ("unique_bytes", "bytes_copied", "copied_per_unique", "copied_per_written"):
            if not isinstance(pa.get(k), (int, float)) or pa[k] <= 0:
                problems.append(f"raid {key}: {k} = {pa.get(k)!r}")
    pa = e.get("partial") or {}
    if pa.get("blocks_differing_after") != 0:
        problems.append(f"raid partial: {pa.get('blocks_differing_after')!r} blocks differ after the rebuild")
    if pa.get("replay_agrees") is not True:
        problems.append("raid partial: the replayed offsets do not match the blocks the files differ in")
    fu = e.get("full") or {}
    for kind in ("copies", "rebuilds"):
        rs = fu.get(kind) or []
        if len(rs) != 2 * c["copy_reps"]:
            problems.append(f"raid full: {len(rs)} {kind}")
        for r in rs:
            # A copy of a few buckets (smoke sizes) has no bucket wholly inside it.
            short = r.get("seconds", 0) < 4 * BUCKET_S
            if not r.get("mb_per_s", 0) > 0 or (r["loaded"] and not short and not r.get("guest_during_iops")):
                problems.append(f"raid full: a {r['kind']} without its rate or the guest's: {r}")
    return problems
