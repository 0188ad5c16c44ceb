"""Results into words and pictures: the targets, results.md (every section's tables) and the PNG
plots, and write_outputs, which writes them all beside results.json.
"""

import json
import math
import os
import statistics

from fpbench.common import MIB, median, ratio
from fpbench.load import point_label
from fpbench.machine import nbd_label
from fpbench.report_backup import backup_markdown, backup_targets
from fpbench.report_crypto import crypto_markdown, crypto_targets
from fpbench.report_density import density_markdown, density_targets
from fpbench.report_guest_notify import guest_notify_markdown, guest_notify_targets
from fpbench.report_format import SPREAD_NOTE, fmt_iops, fmt_ns, fmt_ratio, fmt_spread, fmt_us, spread_of
from fpbench.report_migration import migration_markdown, migration_targets
from fpbench.report_nvme_tcp import nvme_tcp_markdown, nvme_tcp_targets
from fpbench.report_raid import raid_markdown, raid_targets
from fpbench.report_nvmf import nvmf_markdown, nvmf_targets
from fpbench.report_pathlen import pathlen_markdown
from fpbench.report_paths import paths_markdown, paths_targets
from fpbench.report_tls import tls_markdown, tls_targets
from fpbench.report_ublk import ublk_markdown, ublk_targets
from fpbench.report_luks import luks_markdown, luks_targets
from fpbench.report_spdk import spdk_markdown, spdk_targets
from fpbench.servers import NBD_SERVERS


def qos_delta(s0, s1):
    """What the daemon's QoS counters did between two bdev_get_iostat samples (None where the
    daemon has no such field)."""
    out = {}
    for k in ("qos_queued_total", "qos_wait_ticks", "qos_throttled_ticks", "num_read_ops"):
        a, b = s0.get(k), s1.get(k)
        out[k] = b - a if isinstance(a, int) and isinstance(b, int) else None
    rate = s1.get("tick_rate")
    for k in ("qos_wait_ticks", "qos_throttled_ticks"):
        out[k.replace("_ticks", "_s")] = out[k] / rate if out[k] is not None and rate else None
    out["qos_queued_after"] = s1.get("qos_queued")
    return out


def hist_percentile(h, pct):
    """fp-load's percentile over a merged histogram: the upper bound of the bucket that holds
    rank ceil(pct/100 · count)."""
    total = h["count"]
    if not total:
        return None
    rank = max(1, min(total, math.ceil(pct / 100 * total)))
    seen = 0
    for _lo, hi, c in h["buckets"]:
        seen += c
        if seen >= rank:
            return hi
    return h["buckets"][-1][1]


def fmt_limit(kind, lim):
    return fmt_iops(lim) + " IOPS" if kind == "iops" else f"{lim} MiB/s"


def fmt_units(kind, v):
    if v is None:
        return "-"
    return f"{v:,.0f} IOPS" if kind == "iops" else f"{v / MIB:,.1f} MiB/s"


def find(points, server, **kw):
    for p in points:
        if p["server"] == server and all(p[k] == v for k, v in kw.items()):
            return p["median"]
    return None


def targets(res):
    """The issue's targets, evaluated on the medians of this run."""
    pts = res["points"]
    out = []

    def add(name, goal, measured, met, note=""):
        out.append({"target": name, "goal": goal, "measured": measured,
                    "status": None if met is None else ("MET" if met else "MISSED"), "note": note})

    q32 = dict(backend="null", pattern="randread", bs=4096, qd=32, queues=1, client="poll")
    f, q = find(pts, "flashpath", **q32), find(pts, "qsd", **q32)
    if f and q:
        r = f["iops"] / q["iops"]
        add("QD32, 1 queue, polled client: IOPS >= 10x qsd's", ">= 10.0x",
            f"{f['iops'] / 1e6:.2f} M vs {q['iops'] / 1e6:.2f} M IOPS = {r:.2f}x", r >= 10)
        b = f.get("reactor_busy_ns_per_io")
        if b is not None:
            add("QD32 polled: reactor busy time per I/O", "<= 300 ns", f"{b:.0f} ns "
                f"(reactor {100 * f['reactor_busy_frac'].get('0', 0):.0f} % busy)", b <= 300)
    q1 = dict(backend="null", pattern="randread", bs=4096, qd=1, queues=1)
    f = find(pts, "flashpath", client="poll", **q1)
    if f:
        add("QD1 polled: p50", "<= 0.75 us", f"{f['p50_ns'] / 1000:.2f} us", f["p50_ns"] <= 750)
        add("QD1 polled: p99.9", "<= 3 us", f"{f['p999_ns'] / 1000:.2f} us", f["p999_ns"] <= 3000)
    f, q = find(pts, "flashpath", client="fd", **q1), find(pts, "qsd", client="fd", **q1)
    if f and q:
        r = f["p50_ns"] / q["p50_ns"]
        add("QD1 completion-fd client: p50 <= 0.5x qsd's", "<= 0.50x",
            f"{f['p50_ns'] / 1000:.2f} us vs {q['p50_ns'] / 1000:.2f} us = {r:.2f}x", r <= 0.5)
    sc = {(e["queues"], e["client"], e["qd"]): e["median"] for e in res["scaling"]}
    for client in ("poll", "fd"):
        one, two = sc.get((1, client, 32)), sc.get((2, client, 32))
        if one and two:
            r = two["iops"] / one["iops"]
            add(f"2 queues on 2 reactors vs 1 ({client} client, QD32 per queue)", ">= 1.8x",
                f"{two['iops'] / 1e6:.2f} M vs {one['iops'] / 1e6:.2f} M = {r:.2f}x", r >= 1.8,
                "the client shares core 1 with the second reactor; see docs/benchmarks.md")
    for e in res["fio"]:
        if e["pattern"] != "randread" or e["qd"] not in (1, 32) or e["bs"] != 4096:
            continue
        for client in ("fd", "poll"):
            f = find(pts, "flashpath", backend="file", pattern="randread", bs=4096, qd=e["qd"],
                     queues=1, client=client)
            if f:
                r = f["iops"] / e["median"]["iops"]
                add(f"uring file QD{e['qd']} randread ({client} client) vs fio io_uring", ">= 0.97x",
                    f"{f['iops'] / 1e3:.1f} K vs fio {e['median']['iops'] / 1e3:.1f} K = {r:.2f}x",
                    r >= 0.97)
    for e in res["idle"]:
        if e["server"] == "flashpath":
            add(f"idle CPU, {e['backend']} disk attached", "<= 1 % of a core",
                f"{e['core_percent']:.3f} %", e["core_percent"] <= 1.0)
    lv = res.get("lvol")
    for p in (lv or {}).get("points", []):
        if p["qd"] != 32:
            continue
        raw, vol = p["median"]["raw"]["iops"], p["median"]["lvol"]["iops"]
        add(f"thick volume vs its raw malloc base, QD32 4K {p['pattern']} ({p['client']} client)",
            ">= 0.95x", f"{fmt_iops(vol)} vs {fmt_iops(raw)} IOPS = {p['ratio']:.2f}x (single pairs "
            f"{min(p['pair_ratios']):.2f}-{max(p['pair_ratios']):.2f})", p["ratio"] >= 0.95)
    for f in (lv or {}).get("first_write", []):
        if f["kind"] in ("allocate", "cow"):
            add(f"QD1 4K {'first write (allocating)' if f['kind'] == 'allocate' else 'copy-on-write'} "
                f"latency, {f['cluster_size'] // 1024} KiB clusters", "reported",
                f"p50 {f['p50_ns'] / 1000:.1f} µs, p99 {f['p99_ns'] / 1000:.1f} µs", None)
    if lv:
        add("the same points for SPDK's lvol on malloc", "reported", lv["spdk"], None)
    if res.get("qos"):
        qos_targets(res["qos"], add)
    for p in (res.get("rbd") or {}).get("points", []):
        f, q = p["servers"]["flashpath"]["median"], p["servers"]["qsd"]["median"]
        w = f"RBD 4K {p['pattern']} QD{p['qd']} ({p['client']} client)"
        r = p["ratios"]["iops"]
        add(f"{w}: IOPS vs qsd's rbd driver", ">= 0.95x",
            f"{fmt_iops(f.get('iops'))} vs {fmt_iops(q.get('iops'))} = {fmt_ratio(r)}x", None if r is None else r >= 0.95)
        r = p["ratios"]["server_cpu_per_io"]
        add(f"{w}: server CPU per I/O vs qsd's", "<= 0.50x",
            f"{fmt_us1(f.get('server_cpu_ns_per_io'))} vs {fmt_us1(q.get('server_cpu_ns_per_io'))} µs = "
            f"{fmt_ratio(r)}x", None if r is None else r <= 0.5,
            f"cluster {fmt_us1(sum(f.get('cluster_cpu_ns_per_io', {}).values()))} / "
            f"{fmt_us1(sum(q.get('cluster_cpu_ns_per_io', {}).values()))} µs per I/O")
    for p in (res.get("nbd") or {}).get("points", []):
        f = p["servers"]["flashpath"]["median"]
        w = f"NBD {nbd_label((p['pattern'], p['bs'], p['qd']))}"
        for other in ("qsd", "nbdkit"):
            o = p["servers"][other]["median"]
            r = p["ratios"][other]
            # Issue 14: at least 1.5x qsd's NBD export, "and against nbdkit's memory plugin",
            # read here as the same bar for both.
            ok = None if r["iops"] is None else r["iops"] >= 1.5
            add(f"{w}: IOPS vs {other} (server CPU per I/O reported)", ">= 1.5x IOPS",
                f"{fmt_iops(f.get('iops'))} vs {fmt_iops(o.get('iops'))} IOPS = {fmt_ratio(r['iops'])}x; "
                f"{fmt_us1(f.get('server_cpu_ns_per_io'))} vs {fmt_us1(o.get('server_cpu_ns_per_io'))} µs/IO = "
                f"{fmt_ratio(r['server_cpu_per_io'])}x", ok)
    migration_targets(res, add)
    guest_notify_targets(res, add)
    spdk_targets(res, add)
    density_targets(res, add)
    nvmf_targets(res, add)
    nvme_tcp_targets(res, add)
    raid_targets(res, add)
    crypto_targets(res, add)
    paths_targets(res, add)
    tls_targets(res, add)
    ublk_targets(res, add)
    luks_targets(res, add)
    backup_targets(res, add)
    return out


def spread(res, r, server):
    """(max - min) / median of a point's IOPS over its repetitions, in %."""
    for p in res["points"]:
        if p["server"] == server and all(p[k] == r[k] for k in ("backend", "pattern", "bs", "qd",
                                                                  "queues", "client")):
            return fmt_spread(spread_of([x["iops"] for x in p["runs"]]))
    return "-"


MAIN_POINTS = [  # (pattern, bs, qd, queues, client)
    ("randread", 4096, 1, 1, "poll"),
    ("randread", 4096, 1, 1, "fd"),
    ("randread", 4096, 32, 1, "poll"),
    ("randread", 4096, 32, 1, "fd"),
    ("randread", 4096, 128, 1, "poll"),
    ("randread", 4096, 32, 2, "poll"),
    ("randwrite", 4096, 32, 1, "poll"),
    ("read", 65536, 32, 1, "poll"),
]


def main_table(res):
    """The condensed side-by-side table (the README's)."""
    lines = ["| backend | workload | QD × queues | client | flashpath IOPS | qsd IOPS | fp/qsd | "
             "fp p50 µs | qsd p50 µs | fp p99.9 µs | qsd p99.9 µs | fp CPU/IO ns | qsd CPU/IO ns | "
             "fp busy/IO ns |",
             "|" + "---|" * 14]
    for r in res["ratios"]:
        if (r["pattern"], r["bs"], r["qd"], r["queues"], r["client"]) not in MAIN_POINTS:
            continue
        f, q = r["flashpath"], r["qsd"]
        lines.append(
            f"| {r['backend']} | {r['pattern']} {r['bs'] // 1024}K | {r['qd']} × {r['queues']} | "
            f"{r['client']} | {fmt_iops(f['iops'])} | {fmt_iops(q['iops'])} | "
            f"**{fmt_ratio(r['iops_ratio'])}** | {fmt_us(f['p50_ns'])} | {fmt_us(q['p50_ns'])} | "
            f"{fmt_us(f['p999_ns'])} | {fmt_us(q['p999_ns'])} | "
            f"{fmt_ns(f.get('server_cpu_ns_per_io'))} | {fmt_ns(q.get('server_cpu_ns_per_io'))} | "
            f"{fmt_ns(f.get('reactor_busy_ns_per_io'))} |")
    return lines


def other_cpu_note(res):
    xs = [(r.get("other_cpu_cores"), p) for p in res["points"] for r in p["runs"]]
    xs = [(x, p) for x, p in xs if x is not None]
    if not xs:
        return ""
    worst, p = max(xs, key=lambda t: t[0])
    return (f"Other CPU use during the runs (anything but the server under test and the client, "
            f"from /proc/stat): median {100 * statistics.median(x for x, _ in xs):.1f} %, "
            f"at most {100 * worst:.1f} % of a core ({point_label(p)}, {p['server']} run).")


def machine_line(m):
    mi = m["machine"]
    return (f"Machine: {mi['cpu_model']}, {mi['cpus']} CPUs"
            f"{' (virtual machine' if mi['hypervisor_guest'] else ' ('}"
            f"{', no KVM' if not mi['kvm'] else ''}), {mi['mem_gib']} GiB, {mi['os']}, Linux "
            f"{mi['kernel']}, clocksource {mi['clocksource']}. flashpath {mi['flashpath_commit']} "
            f"({m.get('build', 'release')} build).")


def markdown(res):
    m = res["meta"]
    mi = m["machine"]
    if m.get("only") == "lvol":
        # No qsd and no matrix: the volume section and its targets only.
        lines = [f"# flashpath: logical volumes vs their base ({m['mode']} run, {m['date']})", "",
                 machine_line(m), "",
                 f"Command: `{m['command']}`. Wall time {res['wall_s'] / 60:.1f} min. {lvol_other_cpu(res)}"]
        lines += lvol_markdown(res)
        return "\n".join(lines + targets_table(res))
    # Sections run alone that compare with qsd: (title, the section's Markdown).
    alone = {"rbd": ("flashpath vs qemu-storage-daemon on Ceph RBD", rbd_markdown),
             "nbd": ("flashpath vs qemu-storage-daemon and nbdkit over NBD", nbd_markdown),
             "qos": ("flashpath: quality of service", qos_markdown),
             "migration": ("flashpath vs qemu-storage-daemon: live migration", migration_markdown),
             "guest-notify": ("flashpath vs qemu-storage-daemon: notifications in a real guest",
                              guest_notify_markdown),
             "spdk": ("flashpath vs qemu-storage-daemon vs SPDK's vhost target", spdk_markdown),
             "nvmf": ("flashpath vs SPDK's nvmf_tgt over NVMe/TCP", nvmf_markdown),
             "nvme-tcp": ("flashpath vs SPDK as NVMe/TCP initiators", nvme_tcp_markdown),
             "raid": ("flashpath: raid1, its cost and its rebuilds", raid_markdown),
             "crypto": ("flashpath vs openssl and qemu-storage-daemon: AES-XTS", crypto_markdown),
             "pathlen": ("flashpath: the path length of every export", pathlen_markdown),
             "paths": ("flashpath: NVMe/TCP failover and DH-HMAC-CHAP connect cost", paths_markdown),
             "tls": ("flashpath: NVMe/TCP with TLS 1.3 against plain NVMe/TCP", tls_markdown),
             "ublk": ("flashpath: ublk, a null disk as a kernel block device vs null_blk and the kernel's NBD client",
                      ublk_markdown),
             "luks": ("flashpath vs cryptsetup: LUKS volumes (opening, re-encryption, IOPS beside a job)",
                      luks_markdown),
             "backup": ("flashpath: backups (dirty bitmaps, incrementals, throughput, live restore)", backup_markdown),
             "density": ("flashpath vs qemu-storage-daemon (and SPDK): many VMs on one core", density_markdown)}
    if m.get("only") in alone:
        title, section = alone[m["only"]]
        lines = [f"# {title} ({m['mode']} run, {m['date']})", "",
                 machine_line(m) + f" {' '.join(mi['qsd_version'])}.", "",
                 f"Command: `{m['command']}`. Wall time {res['wall_s'] / 60:.1f} min."]
        lines += section(res)
        return "\n".join(lines + targets_table(res))
    lines = [f"# flashpath vs qemu-storage-daemon ({m['mode']} run, {m['date']})", ""]
    lines += [
        f"Machine: {mi['cpu_model']}, {mi['cpus']} CPUs"
        f"{' (virtual machine' if mi['hypervisor_guest'] else ' ('}"
        f"{', no KVM' if not mi['kvm'] else ''}), {mi['mem_gib']} GiB, {mi['os']}, Linux "
        f"{mi['kernel']}, clocksource {mi['clocksource']}. "
        f"{' '.join(mi['qsd_version'])}; {mi['fio_version']}; flashpath {mi['flashpath_commit']} "
        f"({m.get('build', 'release')} build).",
        "",
        f"Servers on CPU {m['server_cpu']}, fp-load (libblkio) on CPU {m['client_cpu']}; "
        f"{m['time_s']} s per run, {m['reps']} runs per point and server, interleaved "
        f"(flashpath, qsd, flashpath, qsd, ...); figures are medians. QD is per queue. "
        f"CPU/IO: the server's CPU time (all threads, /proc/PID/task/*/schedstat) per I/O; "
        f"busy/IO: flashpath's reactor busy time (polls that did work) per I/O. "
        f"spread: (max - min) / median of the IOPS over the repetitions ({SPREAD_NOTE}) "
        f"Command: `{m['command']}`. Wall time {res['wall_s'] / 60:.1f} min. "
        f"{other_cpu_note(res)}",
        "",
        "## Main points",
        "",
    ]
    lines += main_table(res)
    lines += [
        "",
        "## Side by side (every point)",
        "",
        "| backend | workload | QD | queues | client | flashpath IOPS | qsd IOPS | fp/qsd | "
        "fp spread | qsd spread | fp MB/s | qsd MB/s | fp mean µs | qsd mean µs | fp p50 µs | "
        "qsd p50 µs | fp p99 µs | qsd p99 µs | fp p99.9 µs | qsd p99.9 µs | fp CPU/IO ns | "
        "qsd CPU/IO ns | fp busy/IO ns |",
        "|" + "---|" * 23,
    ]
    for r in res["ratios"]:
        f, q = r["flashpath"], r["qsd"]
        lines.append(
            f"| {r['backend']} | {r['pattern']} {r['bs'] // 1024}K | {r['qd']} | {r['queues']} | "
            f"{r['client']} | {fmt_iops(f['iops'])} | {fmt_iops(q['iops'])} | "
            f"**{fmt_ratio(r['iops_ratio'])}** | {spread(res, r, 'flashpath')} | "
            f"{spread(res, r, 'qsd')} | {f['mbps']:.0f} | {q['mbps']:.0f} | "
            f"{fmt_us(f['lat_mean_ns'])} | {fmt_us(q['lat_mean_ns'])} | {fmt_us(f['p50_ns'])} | "
            f"{fmt_us(q['p50_ns'])} | {fmt_us(f['p99_ns'])} | {fmt_us(q['p99_ns'])} | "
            f"{fmt_us(f['p999_ns'])} | {fmt_us(q['p999_ns'])} | "
            f"{fmt_ns(f.get('server_cpu_ns_per_io'))} | {fmt_ns(q.get('server_cpu_ns_per_io'))} | "
            f"{fmt_ns(f.get('reactor_busy_ns_per_io'))} |")
    if res["fio"]:
        lines += ["", "## File backend vs the host baseline (fio, io_uring, direct=1, same file)", "",
                  "fio runs on the client's CPU, interleaved with the two servers' runs.", "",
                  "| workload | QD | fio IOPS | fio p50 µs | flashpath fd / fio | flashpath poll / fio | "
                  "qsd fd / fio | qsd poll / fio |",
                  "|---|---|---|---|---|---|---|---|"]
        for e in res["fio"]:
            cells = []
            for server in ("flashpath", "qsd"):
                for client in ("fd", "poll"):
                    s = find(res["points"], server, backend="file", pattern=e["pattern"], bs=e["bs"],
                             qd=e["qd"], queues=1, client=client)
                    cells.append(fmt_ratio(ratio(s and s["iops"], e["median"]["iops"])))
            lines.append(f"| {e['pattern']} {e['bs'] // 1024}K | {e['qd']} | "
                         f"{fmt_iops(e['median']['iops'])} | {fmt_us(e['median']['p50_ns'])} | "
                         + " | ".join(cells) + " |")
    lines += ["", "## Idle CPU (disk attached, a connected client, no I/O)", "",
              "| backend | server | seconds | % of a core |", "|---|---|---|---|"]
    for e in res["idle"]:
        lines.append(f"| {e['backend']} | {e['server']} | {e['seconds']:.0f} | {e['core_percent']:.3f} |")
    if res["scaling"]:
        lines += ["", "## flashpath on two reactors (null, 4K randread; the client shares CPU "
                  f"{m['client_cpu']} with the second reactor)", "",
                  "| QD | client | queues | IOPS | busy/IO ns (all reactors) | reactor busy % |",
                  "|---|---|---|---|---|---|"]
        for e in res["scaling"]:
            md = e["median"]
            fr = ", ".join(f"r{k} {100 * v:.0f}" for k, v in sorted(md.get("reactor_busy_frac", {}).items()))
            lines.append(f"| {e['qd']} | {e['client']} | {e['queues']} | {fmt_iops(md['iops'])} | "
                         f"{fmt_ns(md.get('reactor_busy_ns_per_io'))} | {fr} |")
    if res.get("packed"):
        lines += ["", "## Packed vs split rings (flashpath, null, 4K randread, 1 queue)", "",
                  "fp-load `--packed` (virtio-driver, `VIRTIO_F_RING_PACKED`) vs the default split "
                  "rings (libblkio), interleaved run by run; medians.", "",
                  "| QD | client | split IOPS | packed IOPS | packed vs split | split p50 µs | "
                  "packed p50 µs | split busy/IO ns | packed busy/IO ns |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for e in res["packed"]:
            sp, pk = e["split"]["median"], e["packed"]["median"]
            lines.append(f"| {e['qd']} | {e['client']} | {fmt_iops(sp['iops'])} | {fmt_iops(pk['iops'])} | "
                         f"{fmt_ratio(e['ratio'])} | {fmt_us(sp['p50_ns'])} | {fmt_us(pk['p50_ns'])} | "
                         f"{fmt_ns(sp.get('reactor_busy_ns_per_io'))} | "
                         f"{fmt_ns(pk.get('reactor_busy_ns_per_io'))} |")
    if res.get("iostat"):
        lines += ["", "## The disk layer's cost (flashpath, null, 4K randread, 1 polled queue)", "",
                  "Statistics off (`serve --no-iostat`), counters on, counters and latency histograms "
                  "on, interleaved run by run; medians.", "",
                  "| QD | variant | IOPS | vs off | p50 µs | p99 µs | busy/IO ns | instructions/IO |",
                  "|---|---|---|---|---|---|---|---|"]
        for e in res["iostat"]:
            for k in ("off", "counters", "histograms"):
                md = e["variants"][k]["median"]
                r = "1.00" if k == "off" else fmt_ratio(e["ratios"][k])
                ir = e.get("ir_per_io", {}).get(k)
                lines.append(f"| {e['qd']} | {k} | {fmt_iops(md['iops'])} | {r} | {fmt_us(md['p50_ns'])} | "
                             f"{fmt_us(md['p99_ns'])} | {fmt_ns(md.get('reactor_busy_ns_per_io'))} | "
                             f"{'-' if ir is None else f'{ir:.0f}'} |")
    c = res.get("client_ceiling")
    if c:
        md = c["median"]
        lines += ["", "## The client's own ceiling", "",
                  f"fp-load `--client-busy` on null, 4K randread, QD32, 1 polled queue, flashpath: "
                  f"{fmt_iops(md['iops'])} IOPS; client busy {md['client_busy_ns_per_io']:.0f} ns per I/O "
                  f"({100 * md['client_busy_frac']:.0f} % of its core in passes that completed "
                  f"something), ceiling ≈ {fmt_iops(1e9 / md['client_busy_ns_per_io'])} IOPS; reactor "
                  f"busy {md['reactor_busy_ns_per_io']:.0f} ns per I/O."]
    if res.get("callgrind"):
        lines += ["", "## Path length (instructions per I/O under callgrind)", "",
                  f"Each figure: (instructions of a {res['callgrind'][0]['long_s']:g} s run − those of "
                  f"a {res['callgrind'][0]['short_s']:g} s run) / (I/Os of the long run − I/Os of the "
                  "short run), all the server's threads, each run a fresh server under "
                  f"{mi.get('valgrind_version') or 'valgrind'} (callgrind) on CPU {m['server_cpu']} and "
                  f"fp-load natively on CPU {m['client_cpu']}; the median over the repetitions. "
                  "spread: (max − min) / median. See docs/benchmarks.md.", "",
                  "| workload | client | server | instructions/IO | repetitions | spread |",
                  "|---|---|---|---|---|---|"]
        for e in res["callgrind"]:
            lines.append(f"| {e['backend']} {e['pattern']} {e['bs'] // 1024}K, QD{e['qd']} × "
                         f"{e['queues']} | {e['client']} | {e['server']} | {e['ir_per_io']:,.0f} | "
                         f"{len(e['runs'])} | {fmt_spread(e['spread'], 1)} |")
    # The sections of a full run, in the order results.md shows those that ran.
    for key, section in (("pathlen", pathlen_markdown), ("lvol", lvol_markdown), ("rbd", rbd_markdown),
                         ("nbd", nbd_markdown), ("migration", migration_markdown),
                         ("guest_notify", guest_notify_markdown), ("spdk", spdk_markdown),
                         ("nvmf", nvmf_markdown), ("nvme_tcp", nvme_tcp_markdown), ("density", density_markdown)):
        if res.get(key):
            lines += section(res)
    return "\n".join(lines + targets_table(res))


def fmt_us1(ns):
    return "-" if ns is None else f"{ns / 1000:,.1f}"


def rbd_markdown(res):
    """The Ceph RBD section (issue 13)."""
    e = res["rbd"]
    m = res["meta"]
    c = e["config"]
    daemons = e.get("cluster_daemons", [])
    lines = ["", "## Ceph RBD: qsd's rbd driver vs flashpath's rbd bdev", "",
             f"One {e['size'] // MIB} MiB image (`{e['image']}`) on a single-node cluster (tests/ceph/cluster.sh: "
             f"{', '.join(daemons)}, memstore; {m['machine'].get('ceph_version') or 'ceph'}), written in full "
             f"first ({e.get('fill', {}).get('seconds', 0):.1f} s). One server at a time on CPU {m['server_cpu']} "
             f"(qsd `driver=rbd,cache.direct=on`; flashpath "
             f"`serve{' ' + e['serve_args'] if e.get('serve_args') else ''}`, `bdev_rbd_register_cluster` with "
             f"config_param {json.dumps(e['config_param'])}, `bdev_rbd_create`), both with librbd's cache off; fp-load with "
             f"completion-fd queues and the cluster's daemons on CPU {e['cluster_cpu']}. {c['rounds']} round(s) of "
             f"{c['secs']:g} s per point and server, each round a fresh server, the order alternating "
             "(flashpath, qsd, qsd, flashpath, ...); medians. CPU/IO: CPU time per I/O of the server (all its "
             "threads, librbd's included), of each cluster daemon (/proc/PID/task/*/schedstat); busy/IO: "
             "flashpath's reactor busy time per I/O. cluster: the daemons' CPU over the run. "
             "other: CPU used by anything but the server, the client and the cluster.", "",
             "| workload | QD | server | IOPS | spread | p50 µs | p99 µs | p99.9 µs | server CPU/IO µs | "
             "reactor busy/IO µs | " + " | ".join(f"{d} CPU/IO µs" for d in daemons) +
             " | cluster, % of a core | other, % of a core |",
             "|" + "---|" * (12 + len(daemons))]
    for p in e["points"]:
        for kind in ("flashpath", "qsd"):
            x = p["servers"][kind]
            md = x["median"]
            cl = md.get("cluster_cpu_ns_per_io", {})
            sp = fmt_spread(x["spread"])
            lines.append(
                f"| {p['pattern']} {p['bs'] // 1024}K | {p['qd']} | {kind} | {fmt_iops(md.get('iops'))} | {sp} | "
                f"{fmt_us1(md.get('p50_ns'))} | {fmt_us1(md.get('p99_ns'))} | {fmt_us1(md.get('p999_ns'))} | "
                f"{fmt_us1(md.get('server_cpu_ns_per_io'))} | {fmt_us1(md.get('reactor_busy_ns_per_io'))} | "
                + " | ".join(fmt_us1(cl.get(d)) for d in daemons) +
                f" | {fmt_share(md.get('cluster_cores'))} | {fmt_share(md.get('other_cpu_cores'))} |")
    lines += ["", "| workload | QD | IOPS flashpath/qsd (target ≥ 0.95) | server CPU/IO flashpath/qsd "
              "(target ≤ 0.5) | p50 flashpath/qsd | p99 flashpath/qsd |", "|---|---|---|---|---|---|"]
    for p in e["points"]:
        r = p["ratios"]
        lines.append(f"| {p['pattern']} {p['bs'] // 1024}K | {p['qd']} | **{fmt_ratio(r['iops'])}** | "
                     f"**{fmt_ratio(r['server_cpu_per_io'])}** | {fmt_ratio(r['p50'])} | {fmt_ratio(r['p99'])} |")
    lines += ["", "Where each server's CPU time per I/O goes, by thread (names with their digits dropped, "
              "largest first, those of at least 2 % of the server's total; µs per I/O, medians):", "",
              "| workload | QD | server | threads |", "|---|---|---|---|"]
    for p in e["points"]:
        for kind in ("flashpath", "qsd"):
            th = p["servers"][kind]["median"].get("server_threads_ns_per_io", {})
            tot = sum(th.values()) or 1
            top = sorted(((v, n) for n, v in th.items() if v >= 0.02 * tot), reverse=True)
            lines.append(f"| {p['pattern']} {p['bs'] // 1024}K | {p['qd']} | {kind} | "
                         + ", ".join(f"{n} {fmt_us1(v)}" for v, n in top) + " |")
    left = [x for x in e["rounds"] if x["locks_left"]]
    lines += ["", "Server start to exported disk: " + ", ".join(
        f"{kind} {median([x['ready_s'] for x in e['rounds'] if x['server'] == kind]):.2f} s"
        for kind in ("flashpath", "qsd")) + " (medians). " +
        ("Locks left on the image after a server's exit (broken before the next round): " +
         "; ".join(f"round {x['round']} {x['server']}" for x in left) if left else
         "No server left a lock on the image.")]
    return lines


def nbd_markdown(res):
    """The NBD section (issue 14)."""
    e = res["nbd"]
    m = res["meta"]
    c = e["config"]
    mi = m["machine"]
    lines = ["", "## NBD over a Unix socket: flashpath vs qsd vs nbdkit", "",
             f"A {e['size'] // MIB} MiB RAM disk exported over NBD on a Unix socket by each server, all three "
             f"running on CPU {m['server_cpu']} (taskset): flashpath `bdev_malloc_create` + `nbd_start_disk`; "
             f"{' '.join(mi['qsd_version'])} `--nbd-server addr.type=unix` + `--export type=nbd,iothread=iot0` of a "
             f"file on /dev/shm (`driver=file,aio=io_uring,cache.direct=off`); "
             f"{e['versions'].get('nbdkit') or 'nbdkit'} `memory {e['size']} allocator=malloc`. Each disk written in "
             "full through NBD first. The client: fio's nbd engine (libnbd, one connection; "
             f"{mi['fio_version']}) on CPU {m['client_cpu']}, the same for all three. {c['reps']} run(s) of "
             f"{c['secs']:g} s per point and server, interleaved (the first server rotating); medians. "
             "Latency: fio's total (submission to completion). CPU/IO: the server's CPU time per I/O, all "
             "threads, those that exited included (utime + stime of /proc/PID/stat, in clock ticks: nbdkit's "
             "workers live as long as their connection); busy/IO: flashpath's reactor busy time per I/O. "
             "other: CPU used by anything but the server under test and fio.", "",
             "| workload | server | IOPS | MB/s | spread | mean µs | p50 µs | p99 µs | p99.9 µs | server CPU/IO µs | "
             "reactor busy/IO µs | other, % of a core |",
             "|" + "---|" * 12]
    for p in e["points"]:
        for kind in NBD_SERVERS:
            x = p["servers"][kind]
            md = x["median"]
            sp = fmt_spread(x["spread"])
            lines.append(
                f"| {nbd_label((p['pattern'], p['bs'], p['qd']))} | {kind} | {fmt_iops(md.get('iops'))} | "
                f"{md.get('mbps', 0):,.0f} | {sp} | {fmt_us1(md.get('lat_mean_ns'))} | {fmt_us1(md.get('p50_ns'))} | "
                f"{fmt_us1(md.get('p99_ns'))} | {fmt_us1(md.get('p999_ns'))} | "
                f"{fmt_us1(md.get('server_cpu_ns_per_io'))} | {fmt_us1(md.get('reactor_busy_ns_per_io'))} | "
                f"{fmt_share(md.get('other_cpu_cores'))} |")
    lines += ["", "| workload | IOPS fp/qsd | IOPS fp/nbdkit | server CPU/IO fp/qsd | server CPU/IO fp/nbdkit | "
              "p50 fp/qsd | p50 fp/nbdkit | p99 fp/qsd | p99 fp/nbdkit |", "|" + "---|" * 9]
    for p in e["points"]:
        q, k = p["ratios"]["qsd"], p["ratios"]["nbdkit"]
        lines.append(f"| {nbd_label((p['pattern'], p['bs'], p['qd']))} | **{fmt_ratio(q['iops'])}** | "
                     f"**{fmt_ratio(k['iops'])}** | **{fmt_ratio(q['server_cpu_per_io'])}** | "
                     f"**{fmt_ratio(k['server_cpu_per_io'])}** | {fmt_ratio(q['p50'])} | {fmt_ratio(k['p50'])} | "
                     f"{fmt_ratio(q['p99'])} | {fmt_ratio(k['p99'])} |")
    lines += ["", "Fill (one sequential 1 MiB QD8 pass): " + ", ".join(
        f"{k} {v['seconds']:.1f} s" for k, v in e["fills"].items()) + "."]
    return lines


def targets_table(res):
    """The targets section every results.md ends with."""
    lines = ["", "## Targets (from the issue; results, not assertions)", "",
             "| target | goal | measured | status |", "|---|---|---|---|"]
    for t in res["targets"]:
        note = f" ({t['note']})" if t["note"] else ""
        lines.append(f"| {t['target']} | {t['goal']} | {t['measured']}{note} | {t['status'] or '-'} |")
    lines.append("")
    return lines


def lvol_other_cpu(res):
    xs = [r["other_cpu_cores"] for p in res["lvol"]["points"] for rs in p["runs"].values() for r in rs
          if r.get("other_cpu_cores") is not None]
    if not xs:
        return ""
    return (f"Other CPU use during the IOPS runs (anything but the server under test and the client, "
            f"from /proc/stat): median {100 * statistics.median(xs):.0f} %, at most {100 * max(xs):.0f} % "
            "of a core.")


def lvol_markdown(res):
    """The logical-volume section (`--only lvol`)."""
    lv, m = res["lvol"], res["meta"]
    lines = ["", "## Logical volumes (issue 11)", "",
             f"Two flashpath daemons on CPU {m['server_cpu']}, fp-load on CPU {m['client_cpu']}: **raw** "
             f"exports a {lv['size'] // MIB} MiB malloc bdev, **lvol** a THICK volume of "
             f"{lv.get('thick_volume_size', 0) // MIB} MiB (every data cluster of an lvstore with "
             f"{lv['cluster_size'] // 1024} KiB clusters on a {lv['size'] // MIB} MiB malloc bdev); both "
             f"written in full first. {lv['pairs']} runs of {m['time_s']} s per point and disk, the order "
             "alternating (raw, lvol, lvol, raw, ...); medians. spread: (max − min) / median of the IOPS; "
             "pairs: the lowest and highest lvol/raw of single consecutive pairs.", "",
             "| workload | QD | client | raw IOPS | lvol IOPS | lvol/raw | pairs | raw spread | lvol spread | "
             "raw p50 µs | lvol p50 µs | raw p99 µs | lvol p99 µs | raw busy/IO ns | lvol busy/IO ns |",
             "|" + "---|" * 15]
    for p in lv["points"]:
        r, v = p["median"]["raw"], p["median"]["lvol"]
        lines.append(f"| {p['pattern']} {p['bs'] // 1024}K | {p['qd']} | {p['client']} | {fmt_iops(r['iops'])} | "
                     f"{fmt_iops(v['iops'])} | **{fmt_ratio(p['ratio'])}** | {min(p['pair_ratios']):.2f}–"
                     f"{max(p['pair_ratios']):.2f} | {fmt_spread(p['spread']['raw'])} | "
                     f"{fmt_spread(p['spread']['lvol'])} | {fmt_us(r['p50_ns'])} | {fmt_us(v['p50_ns'])} | "
                     f"{fmt_us(r['p99_ns'])} | {fmt_us(v['p99_ns'])} | {fmt_ns(r.get('reactor_busy_ns_per_io'))} | "
                     f"{fmt_ns(v.get('reactor_busy_ns_per_io'))} |")
    fw = lv.get("first_write", [])
    for cl in sorted({f["cluster_size"] for f in fw}):
        fs = [f for f in fw if f["cluster_size"] == cl]
        f0 = fs[0]
        lines += ["", f"### One 4 KiB write per cluster, QD1 ({cl // 1024} KiB clusters)", "",
                  f"fp-load `--pattern write --bs 4k --qd 1 --poll --stride {cl} --ios "
                  f"{f0['writes']}`: {f0['writes']} writes, each to the next cluster of a "
                  f"{lv['size'] // MIB} MiB volume, on a malloc bdev written in full first. raw: that bdev "
                  "exported raw; allocate: a fresh thin volume (each write allocates and zeroes its "
                  "cluster); cow: the same volume written in full and snapshotted (each write copies its "
                  "cluster from the snapshot); overwrite: the same writes again (clusters owned). A fresh "
                  "daemon per repetition; medians of the repetitions' figures. The copy cost scales with "
                  "the cluster size.", "",
                  "| kind | p50 µs | p99 µs | mean µs | max µs | repetitions |", "|---|---|---|---|---|---|"]
        for f in fs:
            lines.append(f"| {f['kind']} | {fmt_us(f['p50_ns'])} | {fmt_us(f['p99_ns'])} | "
                         f"{fmt_us(f['lat_mean_ns'])} | {fmt_us(f['lat_max_ns'])} | {len(f['runs'])} |")
    cg = lv.get("callgrind", [])
    if cg:
        lines += ["", "### Instructions per I/O (callgrind)", "",
                  f"As in the path-length section of a full run (docs/benchmarks.md), but each server with a {cg[0]['size'] // MIB} MiB malloc bdev "
                  "exported raw, or a thick volume filling an lvstore on such a bdev; a long run's "
                  f"({cg[0]['long_s']:g} s) instructions less a short run's ({cg[0]['short_s']:g} s) over "
                  "the difference in I/Os; median (range) of the repetitions.", "",
                  "| workload | client | raw | lvol | lvol − raw |", "|---|---|---|---|---|"]
        for x in cg:
            ir, rg = x["ir_per_io"], x["range"]
            lines.append(f"| {x['pattern']} {x['bs'] // 1024}K, QD{x['qd']} | {x['client']} | "
                         f"{ir['raw']:,.0f} ({rg['raw'][0]:,.0f}–{rg['raw'][1]:,.0f}) | "
                         f"{ir['lvol']:,.0f} ({rg['lvol'][0]:,.0f}–{rg['lvol'][1]:,.0f}) | "
                         f"{ir['lvol'] - ir['raw']:+,.0f} |")
    lines += ["", f"SPDK: {lv['spdk']}"]
    return lines


def qos_other_cpu(res):
    xs = [r["other_cpu_cores"] for v in (res["qos"].get("overhead") or {}).get("variants", {}).values()
          for r in v["runs"] if r.get("other_cpu_cores") is not None]
    if not xs:
        return ""
    return (f"Other CPU use during the overhead runs (anything but the server under test and the client, "
            f"from /proc/stat): median {100 * statistics.median(xs):.0f} %, at most {100 * max(xs):.0f} % of a core.")


def noisy_other_cpu(nz):
    xs = [r["other_cpu_cores"] for r in nz["runs"]]
    if not xs:
        return ""
    st = [r["steal"] for r in nz["runs"] if r.get("steal") is not None]
    return (f"Other CPU use during these runs (from /proc/stat, less the server and the client): median "
            f"{100 * statistics.median(xs):.0f} %, at most {100 * max(xs):.0f} % of a core. Steal (the largest share "
            f"of a CPU the hypervisor took): median {fmt_share(median(st))}, at most {fmt_share(max(st, default=None))}.")


def fmt_share(x):
    return "-" if x is None else f"{100 * x:.0f} %"


def pct(x, signed=True):
    return "-" if x is None else (f"{100 * x:+.2f} %" if signed else f"{100 * x:.2f} %")


def qos_reachable(p):
    """A limit the disk can be pushed past: no ceiling was measured (a limit far below the top
    one), or the unlimited run beat the limit by more than the tolerance."""
    return p["ceiling"] is None or p["ceiling"] > 1.03 * p["limit_units_per_s"]


def qos_markdown(res):
    """The quality-of-service section (`--only qos`)."""
    q, m = res["qos"], res["meta"]
    c = q["config"]
    two = f"{m['server_cpu']},{m['client_cpu']}"
    lines = ["", "## Quality of service (issue 12)", ""]
    acc = q.get("accuracy", [])
    if acc:
        secs = acc[0]["secs"]
        lines += [f"Per-disk limits (`bdev_set_qos_limit`) on one null disk of a daemon with two reactors "
                  f"(`--cpus {two}`; queue i runs on reactor i mod 2), fp-load on CPU {m['client_cpu']} "
                  f"with completion fds, 4 KiB randread at QD{c['iops_qd']} per queue for IOPS limits and "
                  f"QD{c['bw_qd']} per queue for bandwidth limits (the block size in the table). One run of "
                  f"{secs:g} s per point, flooding; delivered is what the client completed, over the whole run "
                  f"and over each {acc[0]['window_s']:g} s window of fp-load's timeline; error = delivered / "
                  "limit − 1. *unlimited*: the same load with no limit (measured for the highest limit of each "
                  "kind); a limit above it cannot be reached, and its row says so instead of an error. "
                  "queued: requests the daemon held for QoS during the run (its `qos_queued_total`). steal: the "
                  "largest share of a CPU the hypervisor took from this virtual machine during the run "
                  "(/proc/stat): a reactor that does not run cannot release a request on time, and a limiter "
                  "cannot give back time that has passed. other: CPU time used by anything but this daemon and the "
                  "client during the run (/proc/stat), in cores: another process on the machine.", ""]
        for kind, title in (("iops", "IOPS limits"), ("bw", "Bandwidth limits (rw_mbytes_per_sec, MiB = 2^20 B)")):
            ps = [p for p in acc if p["kind"] == kind]
            if not ps:
                continue
            lines += [f"### {title}", "",
                      f"| limit | bs | queues | delivered | error, whole run ({secs:g} s) | {acc[0]['window_s']:g} s windows: "
                      f"worst error | {acc[0]['window_s']:g} s windows: range | unlimited | queued | steal | other | status (±3 %) |",
                      "|" + "---|" * 12]
            for p in ps:
                lo, hi = min(p["window_errors"]), max(p["window_errors"])
                ok = qos_reachable(p)
                met = abs(p["error"]) <= 0.03 and abs(p["worst_window_error"]) <= 0.03
                status = ("met" if met else "**missed**") if ok else "not reachable here"
                lines.append(f"| {fmt_limit(kind, p['limit'])} | {p['bs'] // 1024} K | {p['queues']} | "
                             f"{fmt_units(kind, p['delivered'])} | {pct(p['error'])} | {pct(p['worst_window_error'])} | "
                             f"{pct(lo)} … {pct(hi)} | {fmt_units(kind, p['ceiling'])} | "
                             f"{p['qos_counters'].get('qos_queued_total') if p['qos_counters'].get('qos_queued_total') is not None else '-'} | "
                             f"{fmt_share(p.get('steal'))} | {fmt_share(p.get('other_cpu_cores'))} | {status} |")
            lines.append("")
    b = q.get("burst")
    if b:
        lines += ["### Burst", "",
                  f"A fresh group (`bdev_qos_group_create` iops_total {b['avg']}, iops_total_max {b['max']}, "
                  f"iops_total_max_length {b['length_s']}) with one null disk, 2 queues at QD{b['qd']} on the "
                  f"two reactors, flooded for {b['secs']:g} s from idle. Delivered IOPS per {b['window_s']:g} s "
                  "(the last window holds the run's tail and is left out of the average phase's figures):", "",
                  "| window | " + " | ".join(f"{i * b['window_s']:g}–{(i + 1) * b['window_s']:g} s"
                                            for i in range(len(b["windows"]))) + " |",
                  "|---|" + "---|" * len(b["windows"]),
                  "| IOPS | " + " | ".join(f"{w:,.0f}" for w in b["windows"]) + " |",
                  "| phase | " + " | ".join(b["phase"]) + " |", "",
                  f"Ceiling phase: mean {b['max_mean'] or 0:,.0f} IOPS ({pct(b['max_error'])} of {b['max']:,}), worst "
                  f"window {pct(b['max_worst_window_error'])}. Average phase: mean {b['avg_mean'] or 0:,.0f} "
                  f"({pct(b['avg_error'])} of {b['avg']:,}), worst window {pct(b['avg_worst_window_error'])}.", ""]
    s = q.get("shares")
    if s:
        bi = s["b_idle"]
        lines += ["### Weighted shares", "",
                  f"A group of {s['limit']:,} IOPS (`iops_total`); disk A weight {s['weights']['A']}, B weight "
                  f"{s['weights']['B']}; each disk 2 queues at QD{s['qd']} from its own client thread (fp-load "
                  f"`--thread-per-disk`), {s['secs']:g} s. Then the same with B stopping after {bi['b_ios']:,} "
                  f"requests (about a third of the run): A's rate over the whole windows after B's last completion.",
                  "", f"| run | disk | target | delivered | error | {s['window_s']:g} s windows: worst error | per-window IOPS |",
                  "|---|---|---|---|---|---|---|"]
        for d in ("A", "B"):
            x = s["both"][d]
            lines.append(f"| both flooding | {d} | {s['want'][d]:,.0f} | {x['rate']:,.0f} | {pct(x['error'])} | "
                         f"{pct(x['worst_window_error'])} | {' '.join(f'{w:.0f}' for w in x['windows'])} |")
        lines.append(f"| B idle after window {bi['b_last_window']} | A | {bi['want']:,.0f} | "
                     f"{bi['a_alone'] or 0:,.0f} | {pct(bi.get('error'))} | {pct(bi.get('worst_window_error'))} | "
                     f"A: {' '.join(f'{w:.0f}' for w in bi['a_windows'])}; B: "
                     f"{' '.join(f'{w:.0f}' for w in bi['b_windows'])} |")
        lines.append("")
    nz = q.get("noisy")
    if nz:
        n = nz["config"]
        lines += ["### Noisy neighbour", "",
                  f"{n['disks']} null disks on one reactor (flashpath `--cpus {m['server_cpu']}`; qsd: one iothread "
                  f"on CPU {m['server_cpu']}), each its own vhost-user-blk export with one queue. One fp-load "
                  f"process on CPU {m['client_cpu']}, one polled client thread for all disks (with a thread per "
                  "disk the quiet disks' threads wait for the scheduler behind the flooder's, milliseconds that "
                  f"would be the latency measured): disk 0 floods at "
                  f"QD{n['flood_qd']}; disks 1–{n['disks'] - 1} run QD1 paced at {n['qd1_rate']:,} IOPS each. "
                  f"Scenarios: **none** (no QoS); **limits**: the flooder {n['flood_limit']:,} IOPS, each QD1 disk "
                  f"{n['qd1_limit']:,} IOPS (above its pace, so its own limit never delays it; flashpath "
                  "`bdev_set_qos_limit`, qsd a throttle group per disk, `x-iops-total`); **group**: all "
                  f"{n['disks']} disks in one group of {n['group_limit']:,} IOPS (flashpath: weight 1 each, "
                  "weighted fair sharing; qsd: one throttle group, whose members take turns). "
                  f"{n['secs']:g} s per run, {n['reps']} round(s), the scenarios interleaved; medians. QD1 "
                  f"latency: the quiet disks' histograms merged. {noisy_other_cpu(nz)}", "",
                  "| server | scenario | flooder IOPS | QD1 disks IOPS (sum) | QD1 p50 µs | QD1 p99 µs | QD1 p99.9 µs | "
                  "worst QD1 disk p99 µs |", "|---|---|---|---|---|---|---|---|"]
        for r in nz["summary"]:
            lines.append(f"| {r['server']} | {r['scenario']} | {r['flood_iops']:,.0f} | {r['qd1_iops']:,.0f} | "
                         f"{fmt_us(r['qd1_p50_ns'])} | {fmt_us(r['qd1_p99_ns'])} | {fmt_us(r['qd1_p999_ns'])} | "
                         f"{fmt_us(r['qd1_worst_disk_p99_ns'])} |")
        lines.append("")
    o = q.get("overhead")
    if o:
        v = o["variants"]
        lines += ["### Cost of QoS that does not limit", "",
                  f"Null 4 KiB randread, QD32, one polled queue (the main matrix's point), one daemon pinned to "
                  f"CPU {m['server_cpu']} whose disk is switched before each run: **off** (no QoS), **limit** "
                  f"(`rw_ios_per_sec` {o['limit']:,} and `rw_mbytes_per_sec` {o['limit_mib']:,}), **group** (a "
                  f"member of a group with iops_total {o['limit']:,}). {o['reps']} runs of {o['secs']:g} s each, "
                  "interleaved, the order reversed every repetition; medians. Requests the daemon queued for QoS "
                  "in the runs (`qos_queued_total`): " + ", ".join(f"{k} {v}" for k, v in o["qos_counters"].items())
                  + f". {qos_other_cpu(res)}", "",
                  "| variant | IOPS | vs off | spread | p50 µs | busy/IO ns |", "|---|---|---|---|---|---|"]
        for k in ("off", "limit", "group"):
            md = v[k]["median"]
            lines.append(f"| {k} | {fmt_iops(md['iops'])} | {fmt_ratio(o['ratios'].get(k, 1.0))} | "
                         f"{fmt_spread(o['spread'][k])} | {fmt_us(md['p50_ns'])} | "
                         f"{fmt_ns(md.get('reactor_busy_ns_per_io'))} |")
        lines.append("")
    return lines


def qos_targets(q, add):
    """Issue 12's targets from a QoS run."""
    acc = q.get("accuracy", [])
    for kind in ("iops", "bw"):
        for lim in sorted({p["limit"] for p in acc if p["kind"] == kind}):
            ps = [p for p in acc if p["kind"] == kind and p["limit"] == lim]
            reach = [p for p in ps if qos_reachable(p)]
            qs = ", ".join(str(p["queues"]) for p in ps)
            name = (f"{fmt_limit(kind, lim)} limit delivered within ±3 % (whole run and every {ps[0]['window_s']:g} s "
                    f"window; {qs} queues)")
            if not reach:
                add(name, "±3 %", "not reachable on this machine: unlimited " +
                    ", ".join(f"{fmt_units(kind, p['ceiling'])} ({p['queues']} q)" for p in ps) + "; delivered " +
                    ", ".join(f"{fmt_units(kind, p['delivered'])}" for p in ps), None)
                continue
            worst = max((p for p in reach), key=lambda p: max(abs(p["error"]), abs(p["worst_window_error"])))
            met = all(abs(p["error"]) <= 0.03 and abs(p["worst_window_error"]) <= 0.03 for p in reach)
            notes = []
            if len(reach) < len(ps):
                notes.append("not reachable with " + ", ".join(f"{p['queues']} queue(s)" for p in ps if p not in reach))
            steal = [p["steal"] for p in ps if p.get("steal") is not None]
            other = [p["other_cpu_cores"] for p in ps if p.get("other_cpu_cores") is not None]
            if steal and other:
                notes.append(f"during these runs steal up to {fmt_share(max(steal))} of a CPU, other processes up to "
                             f"{fmt_share(max(other))} of a core")
            note = "; ".join(notes)
            add(name, "±3 %", "whole run " + ", ".join(pct(p["error"]) for p in reach) +
                f"; worst window {pct(worst['worst_window_error'])} ({worst['queues']} q)", met, note)
    b = q.get("burst")
    if b and b.get("max_worst_window_error") is not None and b.get("avg_worst_window_error") is not None:
        add(f"burst: {b['max']:,} IOPS for {b['length_s']} s, then {b['avg']:,} (every {b['window_s']:g} s window)", "±3 %",
            f"ceiling windows mean {b['max_mean']:,.0f} (worst {pct(b['max_worst_window_error'])}), average windows "
            f"mean {b['avg_mean']:,.0f} (worst {pct(b['avg_worst_window_error'])})",
            abs(b["max_worst_window_error"]) <= 0.03 and abs(b["avg_worst_window_error"]) <= 0.03)
    s = q.get("shares")
    if s:
        a, bb = s["both"]["A"], s["both"]["B"]
        add(f"weighted shares, {s['limit']:,} IOPS, weights {s['weights']['A']}:{s['weights']['B']}, both flooding",
            "±5 % of each target", f"A {a['rate']:,.0f} ({pct(a['error'])}), B {bb['rate']:,.0f} ({pct(bb['error'])})",
            abs(a["error"]) <= 0.05 and abs(bb["error"]) <= 0.05)
        bi = s["b_idle"]
        if bi.get("error") is not None:
            add("B idle: A takes the whole group", "±5 %", f"A {bi['a_alone']:,.0f} of {bi['want']:,.0f} "
                f"({pct(bi['error'])}; worst window {pct(bi['worst_window_error'])})", abs(bi["error"]) <= 0.05)
        else:
            add("B idle: A takes the whole group", "±5 %", "no whole window after B stopped", False)
    nz = q.get("noisy")
    if nz:
        by = {(r["server"], r["scenario"]): r for r in nz["summary"]}
        add("noisy neighbour: QD1 disks' p99 without and with QoS, flashpath and qsd", "reported",
            "; ".join(f"{sv} " + ", ".join(f"{sc} {fmt_us(by[(sv, sc)]['qd1_p99_ns'])} µs"
                                          for sc in nz["config"]["scenarios"] if (sv, sc) in by)
                      for sv in ("flashpath", "qsd")), None)
    o = q.get("overhead")
    if o:
        for k in ("limit", "group"):
            r = o["ratios"][k]
            # The reactor's busy time per I/O depends less on the client than IOPS do: a second view.
            busy = {v: o["variants"][v]["median"].get("reactor_busy_ns_per_io") for v in ("off", k)}
            note = ""
            if None not in busy.values():
                note = (f"reactor busy per I/O {busy[k]:.0f} vs {busy['off']:.0f} ns = "
                        f"{fmt_ratio(ratio(busy[k], busy['off']))}x")
            add(f"QoS configured but not limiting ({k}): null QD32 IOPS vs no QoS", ">= 0.97x",
                f"{fmt_iops(o['variants'][k]['median']['iops'])} vs {fmt_iops(o['variants']['off']['median']['iops'])} "
                f"= {fmt_ratio(r)}x (spreads {100 * o['spread'][k]:.0f} % / {100 * o['spread']['off']:.0f} %)",
                r is not None and r >= 0.97, note)


SERVER_STYLE = {"flashpath": "tab:blue", "qsd": "tab:red"}


def plots(res, out_dir):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    files = []
    backends = sorted({p["backend"] for p in res["points"]},
                      key=lambda b: ["null", "ram", "file"].index(b))
    for backend in backends:
        pats = [pat for pat in ("randread", "randwrite")
                if any(p["backend"] == backend and p["pattern"] == pat and p["bs"] == 4096
                       for p in res["points"])]
        if not pats:
            continue
        fig, axes = plt.subplots(1, len(pats), figsize=(6.5 * len(pats), 4.8), squeeze=False)
        for ax, pat in zip(axes[0], pats):
            for server in ("flashpath", "qsd"):
                for client, marker in (("poll", "o"), ("fd", "s")):
                    for queues, ls in ((1, "-"), (2, "--")):
                        pts = sorted((p["qd"], p["median"]["iops"]) for p in res["points"]
                                     if p["backend"] == backend and p["pattern"] == pat
                                     and p["bs"] == 4096 and p["server"] == server
                                     and p["client"] == client and p["queues"] == queues)
                        if not pts:
                            continue
                        ax.plot([x for x, _ in pts], [y / 1e6 for _, y in pts], ls, marker=marker,
                                color=SERVER_STYLE[server], alpha=1.0 if client == "poll" else 0.55,
                                label=f"{server}, {client} client, {queues} queue{'s' * (queues > 1)}")
            if backend == "file":
                pts = sorted((e["qd"], e["median"]["iops"]) for e in res["fio"]
                             if e["pattern"] == pat and e["bs"] == 4096)
                if pts:
                    ax.plot([x for x, _ in pts], [y / 1e6 for _, y in pts], ":", marker="^",
                            color="black", label="fio io_uring (host, no server)")
            ax.set_xscale("log", base=2)
            qds = sorted({p["qd"] for p in res["points"] if p["backend"] == backend})
            ax.set_xticks(qds)
            ax.set_xticklabels([str(q) for q in qds])
            ax.set_xlabel("queue depth (per queue)")
            ax.set_ylabel("M IOPS")
            ax.set_title(f"{backend}: 4 KiB {pat}")
            ax.grid(True, which="both", alpha=0.3)
            ax.set_ylim(bottom=0)
            ax.legend(fontsize=7)
        fig.suptitle(f"IOPS vs queue depth, {backend} backend, server on 1 core "
                     f"(CPU {res['meta']['server_cpu']}), libblkio client on CPU {res['meta']['client_cpu']}",
                     fontsize=10)
        fig.tight_layout()
        path = os.path.join(out_dir, f"iops_vs_qd_{backend}.png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        files.append(path)

    cdf_backends = [b for b in backends if any(p["backend"] == b and p["qd"] == 1 and "histogram" in p
                                               and p["pattern"] == "randread" for p in res["points"])]
    fig, axes = plt.subplots(1, len(cdf_backends), figsize=(5.5 * len(cdf_backends), 4.5), squeeze=False)
    for ax, backend in zip(axes[0], cdf_backends):
        for p in res["points"]:
            if not (p["backend"] == backend and p["qd"] == 1 and p["pattern"] == "randread"
                    and p["queues"] == 1 and p["bs"] == 4096 and "histogram" in p):
                continue
            h = p["histogram"]
            total = h["count"]
            if not total:
                continue
            xs, ys, acc = [], [], 0
            for lo, hi, c in h["buckets"]:
                acc += c
                xs.append(hi / 1000.0)
                ys.append(acc / total)
            ax.step(xs, ys, where="post", color=SERVER_STYLE[p["server"]],
                    ls="-" if p["client"] == "poll" else "--",
                    label=f"{p['server']}, {p['client']} client (p50 {p['median']['p50_ns'] / 1000:.2f} µs)")
        ax.set_xscale("log")
        ax.set_xlabel("completion latency (µs, log)")
        ax.set_ylabel("fraction of requests")
        ax.set_title(f"{backend}: 4 KiB randread, QD1")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
    fig.suptitle("QD1 latency CDF (all repetitions merged)", fontsize=10)
    fig.tight_layout()
    path = os.path.join(out_dir, "qd1_latency_cdf.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    files.append(path)
    return files


def build_ratios(res):
    out = []
    seen = set()
    for p in res["points"]:
        key = (p["backend"], p["pattern"], p["bs"], p["qd"], p["queues"], p["client"])
        if key in seen:
            continue
        seen.add(key)
        kw = dict(zip(("backend", "pattern", "bs", "qd", "queues", "client"), key))
        f, q = find(res["points"], "flashpath", **kw), find(res["points"], "qsd", **kw)
        if not (f and q):
            continue
        out.append(dict(kw, flashpath=f, qsd=q, iops_ratio=ratio(f["iops"], q["iops"]),
                        p50_ratio=ratio(f["p50_ns"], q["p50_ns"]),
                        p999_ratio=ratio(f["p999_ns"], q["p999_ns"]),
                        cpu_per_io_ratio=ratio(f.get("server_cpu_ns_per_io"),
                                               q.get("server_cpu_ns_per_io"))))
    return out


def write_outputs(res, out_dir):
    res["ratios"] = build_ratios(res)
    res["targets"] = targets(res)
    with open(os.path.join(out_dir, "results.json"), "w") as f:
        json.dump(res, f, indent=1)
    with open(os.path.join(out_dir, "results.md"), "w") as f:
        f.write(markdown(res))
    if not res["points"]:
        return []  # --only: no matrix to plot
    return plots(res, out_dir)
