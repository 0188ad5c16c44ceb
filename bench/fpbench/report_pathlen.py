"""The path length of every export (`--only pathlen`, and part of full and quick runs) in
results.md and the check of its outputs. Plain helpers only: report.py imports this module,
never the reverse."""

import math

from fpbench.report_format import fmt_spread

EXPORT_NAMES = {"vhost-user": "vhost-user-blk", "nbd": "NBD (Unix socket)", "nvmf-target": "NVMe/TCP target",
                "nvmf-host": "NVMe/TCP host"}
HEADING = "## Path length of every export"


def pathlen_markdown(res):
    e, m = res["pathlen"], res["meta"]
    c = e["config"]
    mi = m.get("machine", {})
    scpu, ccpu = m["server_cpu"], m["client_cpu"]
    lines = ["", f"{HEADING} (instructions per I/O under callgrind)", "",
             f"Each figure: (instructions of a {c['long_s']:g} s run − those of a {c['short_s']:g} s run) / "
             "(I/Os of the long run − I/Os of the short run), all the threads of the flashpath measured, each "
             f"run a fresh server under {mi.get('valgrind_version') or 'valgrind'} (callgrind) on CPU {scpu}, "
             f"the client natively on CPU {ccpu}; a 1 GiB null disk, 4 KiB random reads; the median over "
             "the repetitions, the exports interleaved in each. vhost-user-blk: fp-load polling its used ring. "
             "NBD: fio's nbd engine (libnbd, one connection) on the export's Unix socket. NVMe/TCP: flashpath A "
             "serves the null disk over NVMe/TCP on 127.0.0.1, flashpath B attaches to it "
             "(`bdev_nvme_attach_controller`, TCP) and exports the namespace over vhost-user-blk to fp-load "
             f"(sleeping on its completion fd); target: A measured, B native on CPU {ccpu}; host: B measured, A "
             f"native on CPU {scpu}; the native one with `serve {' '.join(e.get('peer_serve_args', []))}` (it "
             "sleeps whenever a round finds no work). spread: (max − min) / median. See docs/benchmarks.md.", "",
             "| export | workload | client | measured | instructions/IO | range | repetitions | spread |",
             "|---|---|---|---|---|---|---|---|"]
    for p in e["points"]:
        lo, hi = p["range"]
        lines.append(f"| {EXPORT_NAMES.get(p['export'], p['export'])} | null randread 4K, QD{p['qd']} | "
                     f"{p['client']} | {e['measured'][p['export']]} | {p['ir_per_io']:,.0f} | "
                     f"{lo:,.0f}–{hi:,.0f} | {len(p['runs'])} | {fmt_spread(p['spread'], 1)} |")
    la, lb = e.get("loadavg_before"), e.get("loadavg_after")
    if la and lb:
        lines += ["", f"Load average (1, 5, 15 min) before the section: {', '.join(f'{x:.2f}' for x in la)}; after: "
                      f"{', '.join(f'{x:.2f}' for x in lb)} (other work on the machine makes the clients fall "
                      "behind at times, and the measured server's extra idle polls count)."]
    return lines


def validate_pathlen(res, c):
    """Every export at every QD of `c` with `reps` long-minus-short runs, each run's I/Os and
    instructions positive and the long run longer; a finite positive median and spread."""
    e = res.get("pathlen")
    if not e:
        return ["results.json has no 'pathlen'"]
    problems = []
    got = {(p["export"], p["qd"]): p for p in e.get("points", [])}
    for qd in c["qds"]:
        for x in EXPORT_NAMES:
            p = got.get((x, qd))
            if p is None:
                problems.append(f"pathlen: no {x} QD{qd}")
                continue
            v = p.get("ir_per_io")
            if not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                problems.append(f"pathlen {x} QD{qd}: instructions/IO = {v!r}")
            if not isinstance(p.get("spread"), (int, float)) or p["spread"] < 0:
                problems.append(f"pathlen {x} QD{qd}: spread = {p.get('spread')!r}")
            if len(p.get("runs", [])) != c["reps"]:
                problems.append(f"pathlen {x} QD{qd}: {len(p.get('runs', []))} runs, want {c['reps']}")
            for r in p.get("runs", []):
                s, lg = r["short"], r["long"]
                if not (0 < s["ios"] < lg["ios"] and 0 < s["ir"] < lg["ir"]):
                    problems.append(f"pathlen {x} QD{qd}: short {s['ios']} I/Os {s['ir']} Ir, long {lg['ios']} I/Os "
                                    f"{lg['ir']} Ir")
    return problems
