"""The TLS section (`--only tls`: NVMe/TCP with TLS 1.3 against plain NVMe/TCP) in results.md,
its target and the check of its outputs."""

from fpbench.report_format import fmt_ratio as _x
from fpbench.sections.tls import GOAL_POINT, GOAL_RATIO, VARIANTS, point_name

HEADING = "## TLS: NVMe/TCP with TLS 1.3 against plain NVMe/TCP"


def _iops(v):
    return "-" if v is None else f"{v:,.0f}"


def _us(v):
    return "-" if v is None else f"{v / 1000:.2f}"


def tls_markdown(res):
    e, m = res["tls"], res["meta"]
    c, s = e["config"], e.get("setup") or {}
    scpu, ccpu = m["server_cpu"], m["client_cpu"]
    lines = ["", HEADING, "",
             f"Load average before the section {e['loadavg_before'][0]:.2f}, after "
             f"{e.get('loadavg_after', [0])[0]:.2f} ({m['machine']['cpus']} CPUs, shared with other work).", "",
             f"Target: `flashpath serve --cpus {scpu}` (CPU {scpu}, alone) serving two {c['size_mib']} MiB RAM "
             f"disks over NVMe/TCP on 127.0.0.1, one subsystem per disk: plain (any host) and TLS (a "
             f"`secure_channel` listener, host {s.get('host_nqn', '-')} added with a PSK, SHA-256: "
             f"TLS_AES_128_GCM_SHA256). Initiator: `flashpath serve --cpus {ccpu}` (CPU {ccpu}) attaching both, "
             f"the second with `psk`, exporting each namespace over vhost-user to fp-load (CPU {ccpu}, one queue, "
             f"sleeping on its completion fd). {c['reps']} repetitions of {c['secs']:g} s, plain and TLS "
             "interleaved; medians. Busy: a reactor's busy time per I/O (its work); target CPU: the target "
             "process's CPU time per I/O (a polling reactor's idle rounds included).", "",
             "| point | plain IOPS | TLS IOPS | TLS / plain | target busy µs/IO plain / TLS | "
             "target CPU µs/IO plain / TLS | initiator busy µs/IO plain / TLS | p99 µs plain / TLS |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    _table_rows(e, lines)
    cipher = [x["bytes_per_sec"] for x in e.get("cipher", [])]
    if cipher:
        lines += ["", f"The floor: `openssl speed -evp aes-128-gcm -bytes 4096` on CPU {scpu}, {len(cipher)} times between "
                  f"the runs: {min(cipher) / 1e9:.2f}–{max(cipher) / 1e9:.2f} GB/s, so encrypting one read's 4 KiB costs "
                  f"{_us((e.get('summary') or [{}])[0].get('floor', {}).get('cipher_ns_per_io'))} µs (median). A TLS "
                  "target costs at least its plain path plus that: the bound column is plain / (plain + cipher), "
                  "the best TLS / plain any TLS target reaches beside this plain one; over floor is the TLS "
                  "target's busy time over that least cost.", "",
                  "| point | TLS / plain IOPS | target busy TLS / plain | bound | TLS target busy over floor |",
                  "|---|---:|---:|---:|---:|"]
        for row in e.get("summary", []):
            f = row.get("floor") or {}
            lines.append(f"| {point_name(tuple(row['point']))} | {_x(row['ratio']['iops'])}x | "
                         f"{_x(row['ratio']['target_busy_ns_per_io'])}x | {_x(f.get('bound'))}x | {_x(f.get('over'))}x |")
    return lines


def _table_rows(e, lines):
    for row in e.get("summary", []):
        p, t, r = row["plain"], row["tls"], row["ratio"]
        lines.append(f"| {point_name(tuple(row['point']))} | {_iops(p['iops'])} | {_iops(t['iops'])} | "
                     f"{_x(r['iops'])}x | {_us(p['target_busy_ns_per_io'])} / {_us(t['target_busy_ns_per_io'])} | "
                     f"{_us(p['target_cpu_ns_per_io'])} / {_us(t['target_cpu_ns_per_io'])} | "
                     f"{_us(p['initiator_busy_ns_per_io'])} / {_us(t['initiator_busy_ns_per_io'])} | "
                     f"{_us(p['p99_ns'])} / {_us(t['p99_ns'])} |")


def tls_targets(res, add):
    """The issue's target: 4 KiB randread QD32 over TLS >= 0.8x plain TCP on the same cores."""
    e = res.get("tls")
    if not e:
        return
    for row in e.get("summary", []):
        if tuple(row["point"]) != GOAL_POINT:
            continue
        r = row["ratio"]["iops"]
        f = row.get("floor") or {}
        note = ""
        if f.get("bound") is not None:
            note = (f"the cipher alone (openssl aes-128-gcm, 4 KiB) costs {_us(f['cipher_ns_per_io'])} µs per read "
                    f"against the plain target's whole {_us(row['plain']['target_busy_ns_per_io'])} µs: no TLS target "
                    f"beside it passes {_x(f['bound'])}x; flashpath's TLS target busy {_x(f.get('over'))}x that floor")
        add(f"NVMe/TCP with TLS 1.3: {point_name(GOAL_POINT)} IOPS against plain TCP (same target, initiator "
            "and cores)", f">= {GOAL_RATIO:g}x",
            f"{_iops(row['tls']['iops'])} vs {_iops(row['plain']['iops'])} IOPS = {_x(r)}x",
            None if r is None else r >= GOAL_RATIO, note)


def validate_tls(res, c):
    """Every point with both variants, each with its repetitions and positive IOPS, and a ratio."""
    e = res.get("tls")
    if not e:
        return ["results.json has no 'tls'"]
    problems = []
    rows = {tuple(r["point"]): r for r in e.get("summary", [])}
    for p in c["points"]:
        row = rows.get(tuple(p))
        what = f"tls {point_name(tuple(p))}"
        if row is None:
            problems.append(f"{what}: missing")
            continue
        for v in VARIANTS:
            if row[v]["runs"] != c["reps"]:
                problems.append(f"{what} {v}: {row[v]['runs']} runs, want {c['reps']}")
            if not isinstance(row[v].get("iops"), (int, float)) or row[v]["iops"] <= 0:
                problems.append(f"{what} {v}: iops = {row[v].get('iops')!r}")
        if not isinstance(row["ratio"].get("iops"), (int, float)):
            problems.append(f"{what}: no ratio")
    return problems
