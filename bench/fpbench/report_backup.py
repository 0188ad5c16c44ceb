"""The backup section (`--only backup`: the dirty bitmap's cost, incrementals, throughput against
rclone, live restore) in results.md, its targets and the check of its outputs."""

from fpbench.common import MIB
from fpbench.report_format import fmt_ns as _ns
from fpbench.report_format import fmt_ratio as _x
from fpbench.sections.backup import (BOOT_VARIANTS, JOB_RPCS, GOAL_BITMAP_COST, GOAL_BITMAP_POINT, GOAL_BOOT,
                                     GOAL_FIRST_READ, GOAL_GUEST_IOPS, GOAL_INCREMENTAL, GOAL_REPEAT_FULL,
                                     GOAL_THROUGHPUT, VARIANTS, point_name)

HEADING = "## Backups: dirty bitmaps, incrementals, throughput, live restore"


def _iops(v):
    return "-" if v is None else f"{v:,.0f}"


def _mib(v):
    return "-" if v is None else f"{v / MIB:,.1f}"


def _range(x):
    lo, hi = x["range"]
    return f"{lo:,.0f}–{hi:,.0f}"


def _x3(v):
    return "-" if v is None else f"{v:.3f}"


def _pct(v):
    return "-" if v is None else f"{100 * v:+.1f} %"


def _size(v):
    if v is None:
        return "-"
    if isinstance(v, (list, tuple)):
        return f"below fp_backup's 64 KiB minimum ({_size(v[1])})"
    return f"{v // MIB} MiB" if v >= MIB else f"{v // 1024} KiB"


def backup_markdown(res):
    e, m = res["backup"], res["meta"]
    c = e["config"]
    b = c["bitmap"]
    scpu, ccpu = m["server_cpu"], m["client_cpu"]
    lines = ["", HEADING, "",
             f"Load average before the section {e['loadavg_before'][0]:.2f}, after "
             f"{e.get('loadavg_after', [0])[0]:.2f} ({m['machine']['cpus']} CPUs, shared with other work: compare "
             "figures within this run only).", "",
             "### (A) What one dirty bitmap costs", "",
             f"`flashpath serve --cpus {scpu}` (CPU {scpu}, alone) with one {b['size_mib']} MiB disk "
             f"({', '.join(b['backends'])}) exported over vhost-user to fp-load (CPU {ccpu}, one queue, polling). "
             f"Each point runs without a bitmap and with one (`bdev_dirty_bitmap_add`, granularity "
             f"{b['granularity'] // 1024} KiB, removed after its run), the order alternating repetition by "
             f"repetition; {b['reps']} repetitions of {b['secs']:g} s. Each repetition's two runs are back to back, "
             "so their ratio sees the same machine; the cost is 1 - the median of those ratios (negative: the "
             "runs with the bitmap were faster). Reads mark nothing: the randread row's cost is this run's "
             "noise, the floor below which a write cost is not resolved. Busy: the reactor's busy "
             "time per I/O. Bitmap count: the dirty bytes the bitmap held after its run (it marked).", "",
             "| disk | point | IOPS without | IOPS with | with / without, each pair | median of the pairs | cost | "
             "busy ns/IO without / with | IOPS without (every run) | IOPS with (every run) | bitmap count after "
             "the run |",
             "|---|---|---:|---:|---|---:|---:|---:|---|---|---|"]
    for row in (e.get("bitmap") or {}).get("summary", []):
        o, n = row["off"], row["on"]
        counts = ", ".join("-" if x is None else f"{x / MIB:,.0f} MiB" for x in row.get("bitmap_counts", []))
        lines.append(f"| {row['backend']} | {point_name(tuple(row['point']))} | {_iops(o['iops'])} | "
                     f"{_iops(n['iops'])} | {', '.join(f'{x:.3f}' for x in row['paired_ratios'])} | "
                     f"{_x3(row['ratio'])}x | {_pct(row['cost'])} | "
                     f"{_ns(o['reactor_busy_ns_per_io'])} / {_ns(n['reactor_busy_ns_per_io'])} | "
                     f"{', '.join(_iops(x) for x in o['iops_all'])} | {', '.join(_iops(x) for x in n['iops_all'])} | "
                     f"{counts} |")
    shares = [row[v].get("server_busy_share") for row in (e.get("bitmap") or {}).get("summary", []) for v in VARIANTS]
    shares = [x for x in shares if x is not None]
    if shares and max(shares) < 0.9:
        lines += ["", f"The server's reactor was busy {100 * min(shares):.0f}–{100 * max(shares):.0f} % of the runs "
                  "(medians): the client, not the server, bounds these IOPS, so they show what a guest sees on this "
                  "layout, not what the bitmap costs the server. The busy time per I/O and the path length below "
                  "show that."]
    pl = (e.get("bitmap") or {}).get("pathlen")
    if pl and pl.get("ratio") is not None:
        cg = pl["config"]
        lines += ["", f"Path length (the load of the machine does not move it): flashpath under callgrind on the null "
                  f"disk, {point_name(tuple(pl['point']))}, instructions per write as (long life − short life) / "
                  f"(their I/Os' difference), {cg['short_s']:g} s and {cg['long_s']:g} s lives, {cg['reps']} "
                  f"repetitions per variant: {pl['off']['ir_per_io']:,.0f} without a bitmap "
                  f"({_range(pl['off'])}), {pl['on']['ir_per_io']:,.0f} with one ({_range(pl['on'])}) = "
                  f"{_x3(pl['ratio'])}x ({_pct(pl['ratio'] - 1)} instructions per write)."]
    lines += _jobs_markdown(e, c)
    if e.get("notes"):
        lines += ["", "Notes:", ""] + [f"* {n}" for n in e["notes"]]
    return lines


def _jobs_markdown(e, c):
    lines = ["", "### (B) What incrementals upload", ""]
    if not e.get("incremental"):
        lines.append("Not measured in this run (see the notes).")
    else:
        lines += [f"A {c['disk_mib']} MiB disk of random data (a file through io_uring: every chunk unique and "
                  f"incompressible), chunk size {_size(c['chunk_size'])}. \"1 % changed\" two ways, both written "
                  "with random bytes through an NBD export of the disk (so the bitmap marks them): **chunks**, "
                  f"{100 * c['changed_frac']:g} % of the disk's chunks rewritten whole at random chunk offsets; "
                  f"**scattered**, {100 * c['changed_frac']:g} % of the disk's bytes as 4 KiB writes at distinct "
                  "random 4 KiB offsets. An incremental (`sync: incremental`, the bitmap) follows each; a second "
                  "full backup of the unchanged disk comes last. Uploaded: `bytes_uploaded` of the job's "
                  "progress (encoded chunk objects, manifests not counted).", "",
                  "| store | backup | writes | changed MiB | chunks touched | uploaded MiB | uploaded / changed | "
                  "chunk size that would meet ≤ 1.2x |",
                  "|---|---|---:|---:|---:|---:|---:|---|"]
        for inc in e["incremental"]:
            f = inc["full"]
            lines.append(f"| {inc['store']} | first full | - | {_mib(inc['disk'])} | - | {_mib(f['bytes_uploaded'])} | "
                         f"{_x(f['bytes_uploaded'] / inc['disk'] if f.get('bytes_uploaded') else None)}x | - |")
            for r in inc["changes"]:
                lines.append(f"| {inc['store']} | incremental after {r['change']} | {r['writes']:,} | "
                             f"{_mib(r['changed_bytes'])} | {r['chunks_touched']:,} | {_mib(r['bytes_uploaded'])} | "
                             f"{_x(r['ratio'])}x | {_size(r.get('chunk_size_needed')) if r['change'] == 'scattered' else '-'} |")
            rf = inc.get("repeat_full") or {}
            lines.append(f"| {inc['store']} | second full, unchanged | - | 0 | - | {_mib(rf.get('bytes_uploaded'))} | "
                         f"{_pct(rf.get('ratio'))[1:]} of the disk | - |")
    lines += ["", "### (C) Full backup throughput and the guest beside it", ""]
    t = e.get("throughput") or {}
    if "ratio" not in t:
        lines.append("Not measured in this run (see the notes).")
    else:
        lines += [f"A full backup of the {c['disk_mib']} MiB disk to the local RADOS Gateway against `rclone copy "
                  f"{' '.join(c['rclone_flags'])}` of the same raw image to the same gateway: "
                  f"{t['backup_mbps']:.0f} MB/s vs {t['rclone_mbps']:.0f} MB/s = {_x(t['ratio'])}x."]
        if "guest_ratio" in t:
            lines += ["", f"The guest ({point_name(tuple(c['guest_point']))}, fp-load on the disk's vhost-user export, "
                      f"completion fd) with a backup limited to {c['speed'] // MIB} MiB/s running: "
                      f"{_iops(t['guest_iops']['on'])} vs {_iops(t['guest_iops']['off'])} IOPS without = "
                      f"{_x(t['guest_ratio'])}x."]
        else:
            lines += ["", "The guest beside a limited backup: not measured in this run (see the notes)."]
    lines += ["", "### (D) Live restore", ""]
    r = e.get("restore") or {}
    if "first_read_ratio" not in r or "restore_mbps" not in r:
        lines.append("Not measured in this run (see the notes).")
    else:
        fr, pin = r["first_read"], r.get("first_read_pinned") or {}
        lines += [f"GETs of chunk objects (one curl --aws-sigv4 for all, the connection reused; median of "
                  f"{len(r['get'])}): {r['get_s'] * 1e6:.0f} µs. First 4 KiB reads of absent chunks (QD1, random "
                  f"offsets over {fr['chunks']} chunks, read_ahead 0, background copy at "
                  f"{c['restore_hold_speed'] // MIB} MiB/s), on a daemon laid out as deployed (the reactor alone on "
                  f"the server CPU, its other threads free to run on the other): p50 {fr['p50_ns'] / 1000:.0f} µs, "
                  f"p99 {fr['p99_ns'] / 1000:.0f} µs over {fr['ios']} reads = {_x(r['first_read_ratio'])}x one GET."]
        if "p50_ns" in pin:
            lines += ["", f"The same on the section's daemon, every thread on the server CPU beside its busy-polling "
                      f"reactor (each hop of a fetch waits for the scheduler): p50 {pin['p50_ns'] / 1000:.0f} µs, p99 "
                      f"{pin['p99_ns'] / 1000:.0f} µs over {pin['ios']} reads = "
                      f"{_x(r.get('first_read_pinned_ratio'))}x one GET."]
        lines += ["", f"A whole restore without a limit: {r['restore_secs']:.1f} s, {r['restore_mbps']:.0f} MB/s."]
    lines += _boot_markdown(r.get("boot") or {}, c)
    return lines


def _boot_markdown(bt, c):
    if "ratio" not in bt:
        return ["", "Boots from a live-restored disk: not measured in this run (see the notes)."]
    b = c["boot"]
    lines = ["", f"Boots: a {bt['root_mib']} MiB ext4 root ({bt['files_bytes'] / MIB:.0f} MiB of files: the guest "
             f"tests' initramfs unpacked) backed up to the gateway ({_mib(bt['backup_uploaded'])} MiB uploaded), and "
             f"one guest (TCG, one vCPU, {b['mem_mib']} MiB) booted from it {b['reps']} times per variant, in turn: "
             "from the local disk (io_uring on the image), from a live restore whose background copy runs "
             f"unlimited (`restore`), and from one whose copy is held at {b['held_speed'] // MIB} MiB/s, so that "
             "what the boot reads is fetched on demand (`restore-held`). Wall: QEMU's start to the root's "
             "booted line (its programs run, every file read once); uptime: the guest's own clock then; root: "
             "the guest's uptime when stage one had mounted the disk.", "",
             "| variant | wall, median | uptime, median | / local (wall) | each boot: wall s (root at s, MiB read, "
             "chunks restored after) |", "|---|---:|---:|---:|---|"]
    for v in BOOT_VARIANTS:
        runs = [x for x in bt["runs"] if x["variant"] == v]
        each = ", ".join(f"{x['wall_s']:.1f} ({x['root_at_s']:.1f}, {x['read_kib'] // 1024}"
                         + (f", {x.get('chunks_restored_after')}/{x.get('chunks')}" if v != "local" else "") + ")"
                         for x in runs)
        mw, mu = bt["median_wall_s"].get(v), bt["median_uptime_s"].get(v)
        lines.append(f"| {v} | {'-' if mw is None else f'{mw:.1f} s'} | {'-' if mu is None else f'{mu:.1f} s'} | "
                     f"{'-' if v == 'local' else _x(bt['ratio'].get(v)) + 'x'} | {each} |")
    return lines


def backup_targets(res, add):
    """The issue's targets: (A) <= 3 % IOPS for one bitmap, randwrite 4 KiB QD32; (B) incremental
    <= 1.2x the changed bytes, a second full < 1 % of the disk; (C) >= 0.8x rclone, guest IOPS
    >= 0.8x; (D) a first read <= 2x one GET."""
    e = res.get("backup")
    if not e:
        return
    summary = (e.get("bitmap") or {}).get("summary", [])
    for row in summary:
        if tuple(row["point"]) != GOAL_BITMAP_POINT:
            continue
        cost = row["cost"]
        noise = [x for x in summary if x["backend"] == row["backend"] and x["point"][0] in ("randread", "read")]
        note = (f"pairs {', '.join(f'{x:.3f}' for x in row['paired_ratios'])}; busy "
                f"{_ns(row['off']['reactor_busy_ns_per_io'])} / {_ns(row['on']['reactor_busy_ns_per_io'])} ns per I/O")
        if noise:
            note += (f"; noise: {point_name(tuple(noise[0]['point']))}, which marks nothing, measured "
                     f"{_pct(noise[0]['cost'])} the same way")
        add(f"Backups (A): one dirty bitmap's cost, {row['backend']} disk, {point_name(GOAL_BITMAP_POINT)} IOPS",
            f"<= {100 * GOAL_BITMAP_COST:g} %",
            f"{_iops(row['on']['iops'])} with vs {_iops(row['off']['iops'])} without (medians); median of the "
            f"pairs {_x3(row['ratio'])}x = cost {_pct(cost)}",
            None if cost is None else cost <= GOAL_BITMAP_COST, note)
    pl = (e.get("bitmap") or {}).get("pathlen")
    if pl and pl.get("ratio") is not None:
        add(f"Backups (A), reported: instructions per write with one bitmap vs without, null disk, "
            f"{point_name(tuple(pl['point']))} (callgrind)", "-",
            f"{pl['on']['ir_per_io']:,.0f} vs {pl['off']['ir_per_io']:,.0f} = {_pct(pl['ratio'] - 1)}", None,
            "the path length: what the machine's load does not move")
    missing = e.get("rpcs_missing")
    for inc in e.get("incremental") or []:
        for r in inc["changes"]:
            note = ""
            if r["change"] == "scattered":
                note = (f"{r['chunks_touched']:,} chunks touched by {r['writes']:,} writes; a chunk size of "
                        f"{_size(r.get('chunk_size_needed'))} would meet it")
            add(f"Backups (B): incremental after 1 % changed ({r['change']}), {inc['store']} store, uploaded / changed",
                f"<= {GOAL_INCREMENTAL:g}x", f"{_mib(r['bytes_uploaded'])} / {_mib(r['changed_bytes'])} MiB = "
                f"{_x(r['ratio'])}x", r["ok"], note)
        rf = inc.get("repeat_full") or {}
        add(f"Backups (B): second full backup of an unchanged disk, {inc['store']} store, uploaded / disk",
            f"< {100 * GOAL_REPEAT_FULL:g} %", f"{_mib(rf.get('bytes_uploaded'))} MiB = {_pct(rf.get('ratio'))[1:]}",
            rf.get("ok"))
    t = e.get("throughput") or {}
    if "ratio" in t:
        add("Backups (C): full backup throughput to the local RGW vs rclone copy of the raw image",
            f">= {GOAL_THROUGHPUT:g}x", f"{t['backup_mbps']:.0f} vs {t['rclone_mbps']:.0f} MB/s = {_x(t['ratio'])}x",
            None if t["ratio"] is None else t["ratio"] >= GOAL_THROUGHPUT)
    if "guest_ratio" in t:
        add("Backups (C): guest IOPS while a speed-limited backup runs vs without", f">= {GOAL_GUEST_IOPS:g}x",
            f"{_iops(t['guest_iops']['on'])} vs {_iops(t['guest_iops']['off'])} = {_x(t['guest_ratio'])}x",
            None if t["guest_ratio"] is None else t["guest_ratio"] >= GOAL_GUEST_IOPS)
    r = e.get("restore") or {}
    if "first_read_ratio" in r and "restore_mbps" in r:
        add("Backups (D): live restore, first 4 KiB read of an absent chunk vs one GET of a chunk",
            f"<= {GOAL_FIRST_READ:g}x", f"{r['first_read']['p50_ns'] / 1000:.0f} vs {r['get_s'] * 1e6:.0f} µs = "
            f"{_x(r['first_read_ratio'])}x",
            None if r["first_read_ratio"] is None else r["first_read_ratio"] <= GOAL_FIRST_READ,
            f"a whole restore {r['restore_mbps']:.0f} MB/s")
        pin = r.get("first_read_pinned") or {}
        if "p50_ns" in pin:
            add("Backups (D), reported: the same first read with every thread of the daemon on the server CPU",
                "-", f"{pin['p50_ns'] / 1000:.0f} vs {r['get_s'] * 1e6:.0f} µs = {_x(r.get('first_read_pinned_ratio'))}x",
                None)
    bt = r.get("boot") or {}
    if "ratio" in bt:
        for v in BOOT_VARIANTS[1:]:
            x = bt["ratio"].get(v)
            add(f"Backups (D): a guest's boot from a live-restored disk ({v}) vs from the local disk, wall time",
                f"<= {GOAL_BOOT:g}x", f"{bt['median_wall_s'][v]:.1f} vs {bt['median_wall_s']['local']:.1f} s = {_x(x)}x",
                None if x is None else x <= GOAL_BOOT)
    if missing and any(m in JOB_RPCS for m in missing):
        add("Backups (B)-(D): incrementals, throughput vs rclone, live restore", "see (B)-(D)",
            f"not measured: this build has no {', '.join(missing)}", None)
    elif missing:
        add("Backups (D): live restore, first read vs one GET, restore throughput", f"<= {GOAL_FIRST_READ:g}x",
            f"not measured: this build has no {', '.join(missing)}", None)


def validate_backup(res, c):
    """(A) every backend and point with both variants, their repetitions, positive IOPS, a ratio,
    and a bitmap that marked after every write run; (B)-(D) when the RPCs were there: every store
    with its changes and ratios, the throughput and the restore."""
    e = res.get("backup")
    if not e:
        return ["results.json has no 'backup'"]
    problems = []
    b = c["bitmap"]
    rows = {(r["backend"], tuple(r["point"])): r for r in (e.get("bitmap") or {}).get("summary", [])}
    for backend in b["backends"]:
        for p in b["points"]:
            row = rows.get((backend, tuple(p)))
            what = f"backup bitmap {backend} {point_name(tuple(p))}"
            if row is None:
                problems.append(f"{what}: missing")
                continue
            for v in VARIANTS:
                if row[v]["runs"] != b["reps"]:
                    problems.append(f"{what} {v}: {row[v]['runs']} runs, want {b['reps']}")
                if not isinstance(row[v].get("iops"), (int, float)) or row[v]["iops"] <= 0:
                    problems.append(f"{what} {v}: iops = {row[v].get('iops')!r}")
            if not isinstance(row.get("ratio"), (int, float)):
                problems.append(f"{what}: no ratio")
            if p[0] in ("randwrite", "write") and not all(isinstance(x, int) and x > 0 for x in row["bitmap_counts"]):
                problems.append(f"{what}: the bitmap did not mark every run: {row['bitmap_counts']!r}")
    if e.get("rpcs_missing") is None:
        problems.append("backup: no record of which backup RPCs the build has")
    elif not any(m in JOB_RPCS for m in e["rpcs_missing"]):
        incs = {i["store"]: i for i in e.get("incremental") or []}
        for s in c["stores"]:
            inc = incs.get(s)
            if inc is None:
                problems.append(f"backup incremental {s}: missing")
                continue
            kinds = {r["change"]: r for r in inc["changes"]}
            for k in ("chunks", "scattered"):
                if not isinstance((kinds.get(k) or {}).get("ratio"), (int, float)):
                    problems.append(f"backup incremental {s} {k}: no ratio")
            if not isinstance((inc.get("repeat_full") or {}).get("ratio"), (int, float)):
                problems.append(f"backup incremental {s}: no second full backup's ratio")
        if "rgw" in c["stores"]:
            if not isinstance((e.get("throughput") or {}).get("ratio"), (int, float)):
                problems.append("backup throughput: no ratio")
            if not e["rpcs_missing"] and not isinstance((e.get("restore") or {}).get("first_read_ratio"),
                                                        (int, float)):
                problems.append("backup restore: no first-read ratio")
            boot = (e.get("restore") or {}).get("boot") or {}
            if not e["rpcs_missing"]:
                for v in BOOT_VARIANTS:
                    n = sum(1 for x in boot.get("runs", []) if x["variant"] == v)
                    if n != c["boot"]["reps"]:
                        problems.append(f"backup boot {v}: {n} boots, want {c['boot']['reps']}")
                for v in BOOT_VARIANTS[1:]:
                    if not isinstance((boot.get("ratio") or {}).get(v), (int, float)):
                        problems.append(f"backup boot {v}: no ratio")
    return problems
