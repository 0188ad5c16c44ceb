"""The paths section (`--only paths`: NVMe/TCP failover and the DH-HMAC-CHAP connect cost) in
results.md, its targets and the check of its outputs."""

from fpbench.common import MIB
from fpbench.report_format import fmt_ratio as _x
from fpbench.sections.paths import CONNECT_VARIANTS, GOAL_AUTH_MS, GOAL_RATIO, TIMELINE_S

HEADING = "## Paths: NVMe/TCP failover and DH-HMAC-CHAP connect cost"


def _s(v):
    return "-" if v is None else f"{v:.2f}"


def _ms(v):
    return "-" if v is None else f"{v:.2f}"


def _signed_ms(v):
    """A difference in ms with its sign (a row below the unauthenticated one is noise)."""
    return "-" if v is None else f"{v:+.2f}"


def _what(kind):
    return {"cut": "cut (connections closed, reconnects refused)",
            "stall": "stall (connections kept, nothing forwarded)"}.get(kind, kind)


def paths_markdown(res):
    e, m = res["paths"], res["meta"]
    c, b = e["config"], e.get("bound") or {}
    scpu, ccpu = m["server_cpu"], m["client_cpu"]
    secs = c["secs"]
    lines = ["", HEADING, "",
             f"Load average before the section {e['loadavg_before'][0]:.2f}, after "
             f"{e.get('loadavg_after', [0])[0]:.2f} ({m['machine']['cpus']} CPUs, shared with other work).", "",
             "### Failover", "",
             f"Target: `flashpath serve --cpus {ccpu}` (CPU {ccpu}) serving a {c['size_mib']} MiB RAM disk over "
             f"NVMe/TCP on 127.0.0.1. Initiator: `flashpath serve --cpus {scpu}` (CPU {scpu}) with "
             f"`bdev_nvme_set_options` keep_alive_timeout_ms {b.get('kato_ms')}, timeout_us and timeout_admin_us "
             f"{b.get('io_timeout_us')} (action reset), attaching the subsystem twice as `{'Nvme0'}` "
             "(`-x multipath`, ctrlr_loss_timeout_sec -1, reconnect_delay_sec 1), each path through a TCP relay "
             "in the bench's process, and exporting `Nvme0n1` over vhost-user (one queue). Client: fp-load "
             f"(libblkio, completion fd) on CPU {ccpu}, 4 KiB randrw 50/50, `--verify`, `--timeline "
             f"{int(TIMELINE_S * 1000)}ms`, {secs:g} s per run; the first path broken at {secs / 3:.2f} s, restored "
             f"at {2 * secs / 3:.2f} s; {c['reps']} repetition(s) of every row, interleaved. **Bound**: KATO + CQT "
             f"= {_s(b.get('bound_s'))} s (flashpath's target reports CQT 0, so the initiator waits its 1 s "
             "stand-in): the earliest a request held by the lost path may be sent through the other. **gap**: the "
             f"longest run of empty {int(TIMELINE_S * 1000)} ms timeline buckets after the cut (a lower bound; the "
             f"true stretch without a completion is less than 2 buckets longer); **longest request**: fp-load's "
             "lat_max; **ratio**: the larger of the two over the bound (goal <= "
             f"{GOAL_RATIO:g}x); **held**: the runs whose longest request lasted the bound (a request on the "
             "wire when the path broke must wait it; a run below it found none there, or sent one sooner). detected: when the initiator showed the path's controller not enabled, after the "
             "break (polled every 50 ms); failback: after the restore, when the first path's controller, enabled, "
             "had completed more I/O than at the poll before. Medians and the worst over the repetitions; failed, "
             "mismatched and verified bytes summed.", "",
             "| break | policy | QD | runs | bound s | gap s (median / worst) | longest request s (median / worst) "
             "| ratio (median / worst) | held | failed I/O | mismatches | verified MiB | detected s "
             "| failback s (median / worst) |",
             "|" + "---|" * 14]
    for s in e.get("failover", []):
        lines.append(f"| {s['kind']} | {s['policy']} | {s['qd']} | {s['runs']} | {_s(s['bound_s'])} | "
                     f"{_s(s['gap_s_median'])} / {_s(s['gap_s_worst'])} | "
                     f"{_s(s['lat_max_s_median'])} / {_s(s['lat_max_s_worst'])} | "
                     f"{_x(s['ratio_median'])} / **{_x(s['ratio_worst'])}** | {s.get('held_runs', '-')}/{s['runs']} | "
                     f"{s['errors']} | {s['mismatches']} | "
                     f"{s['verified_bytes'] / MIB:,.1f} | {_s(s['detected_s_median'])} | "
                     f"{_s(s['failback_s_median'])} / {_s(s['failback_s_worst'])} "
                     f"({s['failback_seen']}/{s['runs']} seen) |")
    dist = [r for r in e.get("runs", []) if r.get("disturbed")]
    if dist:
        lines += ["", f"{len(dist)} run(s) disturbed (the machine, not the failover; counted in the table and the "
                      "targets all the same): " + "; ".join(
                          f"{r['kind']} {r['policy']} QD{r['qd']} rep {r.get('rep')}: {', '.join(r['disturbed'])} "
                          f"(ratio {_x(r.get('ratio'))})" for r in dist) + "."]
    reached = [r for r in e.get("runs", []) if r.get("gap_reached_restore")]
    if reached:
        lines += ["", f"{len(reached)} run(s) had their gap last until the restore: there the restore, not the "
                      "failover, may have ended it, and the figure is a lower bound."]
    k = e.get("connect")
    if k and k.get("summary"):
        su = k["summary"]
        lines += ["", "### DH-HMAC-CHAP connect cost", "",
                  f"Target: `flashpath serve --cpus {ccpu}` with two subsystems on one listener: one open to any "
                  "host, one requiring DH-HMAC-CHAP from a listed host (`nvmf_subsystem_add_host` with dhchap_key "
                  "and dhchap_ctrlr_key, keyring_file_add_key; random 32-byte DHHC-1:00 secrets) and "
                  "`nvmf_set_config` limiting the digest to sha256 and the group to the row's (null: the transaction "
                  "without Diffie-Hellman, its messages and HMACs only). Initiator: "
                  f"`flashpath serve --cpus {scpu}` timing `bdev_nvme_attach_controller`'s JSON-RPC round trip "
                  f"(bidirectional keys for the authenticated rows), then detaching; {k['n']} timed attaches per row "
                  "after one untimed, the rows interleaved. queues: the queues that authenticated during one attach "
                  "(the initiator's log: the admin queue, and the I/O queues that the new bdev's examination "
                  "connected and closed again, each with its own transaction); "
                  "added: the row's median minus the unauthenticated median.", "",
                  "| authentication | attaches | median ms | p90 ms | min ms | max ms | queues | added ms | "
                  "added ms per queue |", "|" + "---|" * 9]
        for v, _, _ in CONNECT_VARIANTS:
            x = su.get(v)
            if not x:
                continue
            lines.append(f"| {v} | {x['n']} | {_ms(x['median_ms'])} | {_ms(x['p90_ms'])} | {_ms(x['min_ms'])} | "
                         f"{_ms(x['max_ms'])} | {x.get('queues', 1)} | "
                         f"{_ms(x.get('added_ms'))} | {_ms(x.get('added_ms_per_queue'))} |")
    for n in e.get("notes", []):
        lines += ["", n]
    return lines


def paths_targets(res, add):
    """The issue's targets: I/O resumes within 2x the detection time with no failed I/O (judged
    per break kind on the worst run of every policy and QD); authentication adds <= 5 ms to a
    connect at ffdhe2048 (judged on the medians); ffdhe4096 reported."""
    e = res.get("paths")
    if not e:
        return
    for kind in ("cut", "stall"):
        rows = [s for s in e.get("failover", []) if s["kind"] == kind]
        if not rows:
            continue
        worst = max((s["ratio_worst"] for s in rows if s["ratio_worst"] is not None), default=None)
        clean = max((s["ratio_worst_undisturbed"] for s in rows if s.get("ratio_worst_undisturbed") is not None),
                    default=None)
        ndist = sum(s.get("disturbed_runs", 0) for s in rows)
        failed = sum(s["errors"] for s in rows)
        bad = sum(s["mismatches"] for s in rows)
        verified = sum(s["verified_bytes"] for s in rows)
        runs = sum(s["runs"] for s in rows)
        add(f"NVMe/TCP failover, first path {_what(kind)}: I/O resumes within 2x KATO + CQT "
            f"({_s(rows[0]['bound_s'])} s), no failed I/O ({runs} verified runs: "
            f"{', '.join(sorted({s['policy'] for s in rows}))}; QD {'/'.join(str(q) for q in sorted({s['qd'] for s in rows}))})",
            f"<= {GOAL_RATIO:g}x, 0 failed",
            f"worst {_x(worst)}x; {failed} failed, {bad} mismatched, {verified / MIB:,.1f} MiB verified",
            None if worst is None else (worst <= GOAL_RATIO and failed == 0 and bad == 0),
            f"{ndist} run(s) disturbed by the machine; worst of the others {_x(clean)}x" if ndist else "")
    su = ((e.get("connect") or {}).get("summary")) or {}
    for v in ("null", "ffdhe2048", "ffdhe4096"):
        x = su.get(v)
        if not x or x.get("added_ms") is None:
            continue
        judged = v == "ffdhe2048"
        group = "no Diffie-Hellman (null group)" if v == "null" else v
        # A connect is one queue's (its Fabrics Connect and transaction): the attach connects
        # `queues` of them, so the goal is judged per queue.
        add(f"DH-HMAC-CHAP (sha256, {group}, bidirectional): added to a queue's connect (attach round trip "
            "over the queues it authenticated)",
            f"<= {GOAL_AUTH_MS:g} ms per queue" if judged else "reported",
            f"{_signed_ms(x['added_ms_per_queue'])} ms per queue ({_ms(x['median_ms'])} vs "
            f"{_ms(su['none']['median_ms'])} ms = {_signed_ms(x['added_ms'])} ms per attach, {x['queues']} queue(s))",
            (x["added_ms_per_queue"] <= GOAL_AUTH_MS) if judged else None)


def validate_paths(res, c):
    """Every failover row with its runs, a gap, a longest request and a ratio, the failover's
    failed and verified counts present, something verified in each run; every connect variant
    with its attaches and the added cost."""
    problems = []
    e = res.get("paths")
    if not e:
        return ["results.json has no 'paths'"]
    rows = {(s["kind"], s["policy"], s["qd"]): s for s in e.get("failover", [])}
    for kind in c["kinds"]:
        for policy in c["policies"]:
            for qd in c["qds"]:
                s = rows.get((kind, policy, qd))
                what = f"paths {kind} {policy} QD{qd}"
                if s is None:
                    problems.append(f"{what}: missing")
                    continue
                if s["runs"] != c["reps"]:
                    problems.append(f"{what}: {s['runs']} runs, want {c['reps']}")
                for k in ("bound_s", "gap_s_worst", "lat_max_s_worst", "ratio_worst"):
                    if not isinstance(s.get(k), (int, float)) or s[k] < 0:
                        problems.append(f"{what}: {k} = {s.get(k)!r}")
                for k in ("errors", "mismatches"):
                    if not isinstance(s.get(k), int):
                        problems.append(f"{what}: {k} = {s.get(k)!r}")
    for r in e.get("runs", []):
        if not r.get("verified_bytes"):
            problems.append(f"paths {r['kind']} {r['policy']} QD{r['qd']} rep {r.get('rep')}: nothing verified")
        if not (r.get("timeline") or {}).get("ios"):
            problems.append(f"paths {r['kind']} {r['policy']} QD{r['qd']} rep {r.get('rep')}: no timeline")
    su = (e.get("connect") or {}).get("summary") or {}
    for v, _, _ in CONNECT_VARIANTS:
        x = su.get(v)
        if not x:
            problems.append(f"paths connect {v}: missing")
            continue
        if x["n"] != c["attaches"]:
            problems.append(f"paths connect {v}: {x['n']} attaches, want {c['attaches']}")
        if not isinstance(x.get("median_ms"), (int, float)) or x["median_ms"] <= 0:
            problems.append(f"paths connect {v}: median_ms = {x.get('median_ms')!r}")
        if v != "none" and not isinstance(x.get("added_ms_per_queue"), (int, float)):
            problems.append(f"paths connect {v}: no added cost per queue")
    return problems
