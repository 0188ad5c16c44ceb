"""The LUKS section (`--only luks`: opening against cryptsetup, re-encryption against `cryptsetup
reencrypt`, a guest's IOPS beside a limited job) in results.md, its targets and the check of its
outputs."""

from fpbench.common import median, ratio
from fpbench.report_format import fmt_iops, fmt_ratio as _x, fmt_spread
from fpbench.sections.luks import ALL_CPUS, FLOOR, IOPS_GOAL, KDFS, OPEN_GOAL, POINTS, REENC_GOAL

HEADING = "## LUKS volumes"


def _s(v):
    return "-" if v is None else f"{v:.3f}"


def _mib(v):
    return "-" if v is None else f"{v:,.0f}"


def _kdf(k):
    """A slot's KDF cost as luksDump says it."""
    if not k:
        return "-"
    if k.get("type") == "pbkdf2":
        return f"pbkdf2-{k.get('hash', '?')}, {k.get('iterations', '?'):,} iterations"
    return f"{k.get('type')}, time {k.get('time', '?')}, memory {k.get('memory', '?'):,} KiB, {k.get('cpus', '?')} lanes"


def _loads(e):
    return "; ".join(f"{x['when']} {x['loadavg'][0]:.2f}/{x['loadavg'][1]:.2f}" for x in e.get("loadavg", []))


def luks_markdown(res):
    e = res["luks"]
    c = e["config"]
    lines = ["", HEADING, "",
             f"{e.get('cryptsetup_version', 'cryptsetup')}; flashpath and cryptsetup on CPU {e['cpu']}, fp-load on CPU "
             f"{e['client_cpu']}. Load average (1 min/5 min) {_loads(e)}. This host's kernel has no dm-crypt, so "
             "cryptsetup's peer for opening is `cryptsetup open --test-passphrase` (the same KDF and digest work "
             "without loading a table).", "",
             f"### Opening a volume ({c['opens']} opens per tool and KDF)", "",
             f"A file formatted by `cryptsetup luksFormat --type luks2 --iter-time {c['iter_ms']}`; flashpath's "
             "`bdev_crypto_create luks_key_name` (with `luks_key_slot`) timed over its RPC socket, then "
             "`bdev_crypto_delete`; `cryptsetup open --test-passphrase --key-slot` timed per process; alternating. "
             "CPU: the daemon's CPU time over the call, cryptsetup's from wait4. The last row, a slot of PBKDF2 with 1000 "
             "iterations (`--pbkdf-force-iterations 1000`), is each tool's cost beside the KDF: the RPC or the "
             "process's start, reading the header, the digest. The row on every CPU: a volume formatted and opened by "
             "cryptsetup without `taskset`, as on a user's host (its Argon2 lanes run in parallel, and its `--iter-time` "
             "was measured so); flashpath's daemon as in the other rows (its lanes run one after the other).", "",
             "| KDF | slot's cost (luksDump) | flashpath s (spread) | cryptsetup s (spread) | fp / cryptsetup | "
             "CPU s fp / cryptsetup |",
             "|---|---|---:|---:|---:|---:|"]
    for kdf in (*KDFS, FLOOR, ALL_CPUS):
        r = (e.get("open") or {}).get(kdf)
        if not r:
            continue
        f, cs = r["flashpath_s"], r["cryptsetup_s"]
        note = {FLOOR: " (reported: the fixed cost)", ALL_CPUS: " (reported: cryptsetup on every CPU)"}.get(kdf, "")
        lines.append(f"| {kdf}{note} | {_kdf(r.get('slot_kdf'))} | {_s(f['median'])} ({fmt_spread(f['spread'])}) | "
                     f"{_s(cs['median'])} ({fmt_spread(cs['spread'])}) | **{_x(r['ratio'])}** | "
                     f"{_s((r.get('flashpath_cpu_s') or {}).get('median'))} / "
                     f"{_s((r.get('cryptsetup_cpu_s') or {}).get('median'))} = {_x(r.get('cpu_ratio'))} |")
    r = e.get("reencrypt")
    if r:
        f, cs = r["flashpath_mib_s"], r["cryptsetup_mib_s"]
        lines += ["", f"### Re-encryption ({r['size'] // (1 << 20)} MiB, {f['n']} runs per tool)", "",
                  "flashpath: a malloc bdev (4096-byte blocks) formatted LUKS2 by `bdev_luks_format` (PBKDF2, 1000 "
                  "iterations, 4096-byte sectors), opened, written in full, `bdev_luks_reencrypt_start` with no speed "
                  "limit timed to `done`. cryptsetup: a file of the same size on /dev/shm (random data, "
                  "`luksFormat --type luks2 --sector-size 4096`, the same KDF), `cryptsetup reencrypt "
                  "--force-offline-reencrypt --resilience checksum` timed per process. MiB/s of data rewritten "
                  f"(flashpath {r['flashpath_data_bytes'] // (1 << 20)} MiB, cryptsetup "
                  f"{r['cryptsetup_data_bytes'] // (1 << 20)} MiB).", "",
                  "| tool | MiB/s (median) | min–max | spread |", "|---|---:|---:|---:|",
                  f"| flashpath | {_mib(f['median'])} | {_mib(f['min'])}–{_mib(f['max'])} | {fmt_spread(f['spread'])} |",
                  f"| cryptsetup | {_mib(cs['median'])} | {_mib(cs['min'])}–{_mib(cs['max'])} | "
                  f"{fmt_spread(cs['spread'])} |", "", f"flashpath / cryptsetup: **{_x(r['ratio'])}x**."]
    if e.get("points"):
        lines += ["", f"### A guest's IOPS beside a re-encryption job at {c['speed_limit']} MiB/s", "",
                  f"A malloc bdev of {c['iops_size'] // (1 << 20)} MiB (4096-byte blocks) formatted LUKS2, opened, "
                  "exported over vhost-user, written in full; a re-encryption job started at the limit and paused, "
                  "resumed only for the runs beside it (large enough that it runs throughout: its state is checked "
                  f"after each). fp-load, one polled queue, {c['secs']} s per run, {c['reps']} rounds of alone then "
                  "beside; medians.", "",
                  "| point | alone IOPS (spread) | beside the job IOPS (spread) | job MiB/s measured | beside / alone | "
                  "per round |", "|---|---:|---:|---:|---:|---|"]
        for p in e["points"]:
            a, b = p["alone"], p["beside_job"]
            lines.append(f"| {p['pattern']} 4K QD{p['qd']} | {fmt_iops(a['median'])} ({fmt_spread(a['spread'])}) | "
                         f"{fmt_iops(b['median'])} ({fmt_spread(b['spread'])}) | {_mib(p['job_mib_s']['median'])} | "
                         f"**{_x(p['ratio'])}** | {', '.join(_x(x) for x in p['rep_ratios'])} |")
    lines += datapath_lines(e.get("datapath") or {})
    for n in e.get("notes", []):
        lines += ["", f"Note: {n}"]
    return lines


def luks_targets(res, add):
    """The issue's targets: opening at most 1.1x cryptsetup's time per KDF; re-encryption at least
    0.8x `cryptsetup reencrypt`'s speed; each point's IOPS beside the limited job at least 0.7x its
    IOPS alone."""
    e = res.get("luks")
    if not e:
        return
    for kdf in KDFS:
        r = (e.get("open") or {}).get(kdf)
        if not r:
            continue
        x = r["ratio"]
        add(f"LUKS: opening a volume ({kdf}, cryptsetup's --iter-time {e['config']['iter_ms']}) vs cryptsetup open "
            "--test-passphrase, the same slot", f"<= {OPEN_GOAL:g}x",
            f"{_s(r['flashpath_s']['median'])} vs {_s(r['cryptsetup_s']['median'])} s = {_x(x)}x",
            None if x is None else x <= OPEN_GOAL,
            f"CPU {_x(r.get('cpu_ratio'))}x; spreads {fmt_spread(r['flashpath_s']['spread'])} / "
            f"{fmt_spread(r['cryptsetup_s']['spread'])}")
    r = (e.get("open") or {}).get(ALL_CPUS)
    if r:
        x = r["ratio"]
        add("LUKS: opening a volume (argon2id) vs cryptsetup open --test-passphrase on every CPU, formatted there too "
            "(as on a user's host)", f"<= {OPEN_GOAL:g}x",
            f"{_s(r['flashpath_s']['median'])} vs {_s(r['cryptsetup_s']['median'])} s = {_x(x)}x",
            None if x is None else x <= OPEN_GOAL,
            f"CPU {_x(r.get('cpu_ratio'))}x: flashpath runs the Argon2 lanes one after the other, cryptsetup one "
            f"thread a lane; spreads {fmt_spread(r['flashpath_s']['spread'])} / {fmt_spread(r['cryptsetup_s']['spread'])}")
    r = e.get("reencrypt")
    if r:
        x = r["ratio"]
        add(f"LUKS: re-encryption of {r['size'] // (1 << 20)} MiB, no speed limit, vs cryptsetup reencrypt "
            "(offline, checksum resilience)", f">= {REENC_GOAL:g}x",
            f"{_mib(r['flashpath_mib_s']['median'])} vs {_mib(r['cryptsetup_mib_s']['median'])} MiB/s = {_x(x)}x",
            None if x is None else x >= REENC_GOAL,
            f"spreads {fmt_spread(r['flashpath_mib_s']['spread'])} / {fmt_spread(r['cryptsetup_mib_s']['spread'])}")
    for p in e.get("points") or []:
        x = p["ratio"]
        add(f"LUKS: {p['pattern']} 4K QD32 on a LUKS RAM disk beside re-encryption at "
            f"{e['config']['speed_limit']} MiB/s vs alone", f">= {IOPS_GOAL:g}x",
            f"{fmt_iops(p['beside_job']['median'])} vs {fmt_iops(p['alone']['median'])} IOPS = {_x(x)}x",
            None if x is None else x >= IOPS_GOAL,
            f"per round {', '.join(_x(y) for y in p['rep_ratios'])}; job measured "
            f"{_mib(p['job_mib_s']['median'])} MiB/s")


def validate_luks(res, c):
    """Both KDFs opened `opens` times by each tool with positive times; re-encryption runs by both
    tools with positive speeds; both points with their rounds alone and beside the job, positive
    IOPS and a job that moved during every run beside it."""
    e = res.get("luks")
    if not e:
        return ["results.json has no 'luks'"]
    problems = []
    for kdf in KDFS:
        r = (e.get("open") or {}).get(kdf)
        if not r:
            problems.append(f"luks open {kdf}: missing")
            continue
        for k in ("flashpath_s", "cryptsetup_s"):
            if r[k]["n"] != c["opens"] or not (r[k]["min"] or 0) > 0:
                problems.append(f"luks open {kdf} {k}: {r[k]['n']} opens (want {c['opens']}), min {r[k]['min']!r}")
        if not isinstance(r.get("ratio"), (int, float)):
            problems.append(f"luks open {kdf}: no ratio")
    r = e.get("reencrypt")
    if not r:
        problems.append("luks reencrypt: missing")
    else:
        for k in ("flashpath_mib_s", "cryptsetup_mib_s"):
            if r[k]["n"] != c["reenc_reps"] or not (r[k]["min"] or 0) > 0:
                problems.append(f"luks reencrypt {k}: {r[k]['n']} runs (want {c['reenc_reps']}), min {r[k]['min']!r}")
    got = {p["pattern"] for p in e.get("points") or []}
    for pattern in (pt[0] for pt in POINTS):
        if pattern not in got:
            problems.append(f"luks iops {pattern}: missing")
    for p in e.get("points") or []:
        for k in ("alone", "beside_job"):
            if p[k]["n"] != c["reps"] or not (p[k]["min"] or 0) > 0:
                problems.append(f"luks iops {p['pattern']} {k}: {p[k]['n']} runs (want {c['reps']}), min {p[k]['min']!r}")
        if any(not j["mib_s"] > 0 for j in p.get("job", [])):
            problems.append(f"luks iops {p['pattern']}: the job did not move during a run beside it")
    return problems


# -- the data path beside the LUKS work: the crypto and path-length sections, this branch vs main --

# The crypto section's disks compared, and the path-length section's exports.
DATAPATH_DISKS = ("fp-plain", "fp-crypto", "fp-crypto-512")


def datapath_figures(crypto, pathlen):
    """From one `--only crypto` and one `--only pathlen` results.json: each crypto point's median
    IOPS and server CPU ns per I/O per flashpath disk, and each export's median instructions per
    I/O (the null disk, callgrind)."""
    out = {"crypto": {}, "pathlen": {}, "loadavg": {}}
    for p in (crypto or {}).get("crypto", {}).get("points", []):
        out["crypto"][p["pattern"]] = {d: {"iops": p["median"][d].get("iops"),
                                           "iops_spread": p["median"][d].get("iops_spread"),
                                           "cpu_ns_per_io": p["median"][d].get("server_cpu_ns_per_io")}
                                       for d in DATAPATH_DISKS if d in p["median"]}
    for p in (pathlen or {}).get("pathlen", {}).get("points", []):
        xs = sorted(r["ir_per_io"] for r in p["runs"] if r.get("ir_per_io") is not None)
        if xs:
            out["pathlen"][p["export"]] = {"ir_per_io": median(xs), "min": xs[0], "max": xs[-1], "reps": len(xs)}
    if crypto:
        out["loadavg"]["crypto"] = [crypto["crypto"].get("loadavg_before"), crypto["crypto"].get("loadavg_after")]
    if pathlen:
        out["loadavg"]["pathlen"] = [pathlen["pathlen"].get("loadavg_before"), pathlen["pathlen"].get("loadavg_after")]
    return out


def datapath_lines(dp):
    """The comparison table: {build label: datapath_figures}, the first label the new build."""
    labels = list(dp)
    if len(labels) < 2:
        return []
    new, old = labels[0], labels[1]
    lines = ["", "### The data path beside this work: crypto and path length, this build vs main", "",
             f"The `--only crypto` and `--only pathlen` sections (quick) run with both builds' release binaries "
             f"({new}; {old}), one after the other on this machine. crypto: 4 KiB QD32, one polled queue, median "
             "IOPS (spread) and server CPU ns per I/O; path length: instructions per I/O on the null disk under "
             "callgrind (median, min–max).", "",
             f"| figure | {new} | {old} | new / main |", "|---|---:|---:|---:|"]
    a, b = dp[new], dp[old]
    for pattern in sorted(set(a["crypto"]) | set(b["crypto"])):
        for d in DATAPATH_DISKS:
            x, y = a["crypto"].get(pattern, {}).get(d, {}), b["crypto"].get(pattern, {}).get(d, {})
            lines.append(f"| crypto {pattern} {d} IOPS | {fmt_iops(x.get('iops'))} ({fmt_spread(x.get('iops_spread'))})"
                         f" | {fmt_iops(y.get('iops'))} ({fmt_spread(y.get('iops_spread'))}) | "
                         f"{_x(ratio(x.get('iops'), y.get('iops')))} |")
            lines.append(f"| crypto {pattern} {d} CPU ns/IO | {_n(x.get('cpu_ns_per_io'))} | "
                         f"{_n(y.get('cpu_ns_per_io'))} | {_x(ratio(x.get('cpu_ns_per_io'), y.get('cpu_ns_per_io')))} |")
    for export in list(dict.fromkeys([*a["pathlen"], *b["pathlen"]])):
        x, y = a["pathlen"].get(export, {}), b["pathlen"].get(export, {})
        lines.append(f"| path length {export} instructions/IO | {_n(x.get('ir_per_io'))} ({_n(x.get('min'))}–"
                     f"{_n(x.get('max'))}) | {_n(y.get('ir_per_io'))} ({_n(y.get('min'))}–{_n(y.get('max'))}) | "
                     f"{_x(ratio(x.get('ir_per_io'), y.get('ir_per_io')))} |")
    for label in labels[:2]:
        la = dp[label].get("loadavg", {})
        lines += ["", f"Load average (1/5/15 min) before/after, {label}: " + "; ".join(
            f"{k} {_la(v[0])} → {_la(v[1])}" for k, v in la.items() if v)]
    return lines


def _n(v):
    return "-" if v is None else f"{v:,.0f}"


def _la(v):
    return "-" if not v else "/".join(f"{x:.2f}" for x in v)


def main(argv):
    """`python3 -m fpbench.report_luks LUKS_DIR LABEL CRYPTO_DIR PATHLEN_DIR LABEL CRYPTO_DIR PATHLEN_DIR`:
    adds both builds' crypto and path-length figures to the LUKS run's results.json (key
    `luks.datapath`); `bench.py --replot LUKS_DIR` then rewrites its results.md."""
    import json
    import os
    luks_dir, rest = argv[0], argv[1:]
    path = os.path.join(luks_dir, "results.json")
    with open(path) as f:
        res = json.load(f)
    dp = {}
    for i in range(0, len(rest), 3):
        label, cdir, pdir = rest[i:i + 3]
        loaded = []
        for d in (cdir, pdir):
            with open(os.path.join(d, "results.json")) as f:
                loaded.append(json.load(f))
        dp[label] = datapath_figures(*loaded)
    res["luks"]["datapath"] = dp
    with open(path, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    import sys
    main(sys.argv[1:])
