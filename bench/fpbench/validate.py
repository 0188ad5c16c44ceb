"""--validate: checks a run's outputs (the CI smoke run's check): every file, point, ratio and
section the mode promises.
"""

import json
import math
import os

from fpbench.common import server_measured
from fpbench.load import point_id, point_key, point_label
from fpbench.machine import nbd_label
from fpbench.modes import mode_config
from fpbench.report_backup import HEADING as BACKUP_HEADING
from fpbench.report_backup import validate_backup
from fpbench.report_crypto import validate_crypto
from fpbench.report_density import HEADING as DENSITY_HEADING
from fpbench.report_density import validate_density
from fpbench.report_nvme_tcp import validate_nvme_tcp
from fpbench.report_raid import validate_raid
from fpbench.report_nvmf import validate_nvmf
from fpbench.report_pathlen import HEADING as PATHLEN_HEADING
from fpbench.report_pathlen import validate_pathlen
from fpbench.report_paths import HEADING as PATHS_HEADING
from fpbench.report_paths import validate_paths
from fpbench.report_tls import HEADING as TLS_HEADING
from fpbench.report_tls import validate_tls
from fpbench.report_ublk import HEADING as UBLK_HEADING
from fpbench.report_ublk import validate_ublk
from fpbench.report_luks import HEADING as LUKS_HEADING
from fpbench.report_luks import validate_luks
from fpbench.sections.crypto import crypto_config
from fpbench.sections.density import density_config
from fpbench.sections.guest_notify import SERVERS as GN_SERVERS
from fpbench.sections.guest_notify import guest_notify_config
from fpbench.sections.raid import raid_config
from fpbench.servers import NBD_SERVERS


def validate_rbd(res, rc):
    """The RBD section: every point on both servers, each run with positive IOPS, latency and
    CPU per I/O (the server's and each cluster daemon's), the QD1 histograms, the ratios."""
    problems = []
    e = res.get("rbd")
    if not e:
        return ["results.json has no 'rbd'"]
    got = {(p["pattern"], p["bs"], p["qd"], p["queues"], p["client"]): p for p in e.get("points", [])}
    for pt in rc["points"]:
        pk = point_key("rbd", pt)
        p = got.get((pk["pattern"], pk["bs"], pk["qd"], pk["queues"], pk["client"]))
        if p is None:
            problems.append(f"rbd: missing point {point_label(pk)}")
            continue
        for kind in ("flashpath", "qsd"):
            x = p["servers"].get(kind)
            if not server_measured(problems, f"rbd {point_label(pk)} {kind}", x, rc["rounds"],
                                   ("iops", "p50_ns", "p99_ns", "server_cpu_ns_per_io")):
                continue
            cl = x["median"].get("cluster_cpu_ns_per_io", {})
            if not any(d.startswith("osd.") for d in cl) or not all(isinstance(v, (int, float)) and v >= 0
                                                                    for v in cl.values()):
                problems.append(f"rbd {point_label(pk)} {kind}: cluster CPU per I/O = {cl!r}")
            if kind == "flashpath" and not isinstance(x["median"].get("reactor_busy_ns_per_io"), (int, float)):
                problems.append(f"rbd {point_label(pk)}: no reactor busy time")
            if pt[2] == 1 and not x.get("histogram", {}).get("buckets"):
                problems.append(f"rbd {point_label(pk)} {kind}: no histogram")
        if not isinstance(p["ratios"].get("iops"), (int, float)):
            problems.append(f"rbd {point_label(pk)}: no IOPS ratio")
    if e.get("fill", {}).get("used_size", 0) < e.get("size", 1):
        problems.append("rbd: the image was not written in full")
    return problems


def validate_nbd(res, nc):
    """The NBD section: every point on the three servers with its runs, a positive IOPS, MB/s,
    p50, p99 and server CPU per I/O, flashpath's reactor busy time, both ratios, full fills."""
    problems = []
    e = res.get("nbd")
    if not e:
        return ["results.json has no 'nbd'"]
    got = {(p["pattern"], p["bs"], p["qd"]): p for p in e.get("points", [])}
    for pt in nc["points"]:
        p = got.get(tuple(pt))
        if p is None:
            problems.append(f"nbd: missing point {nbd_label(pt)}")
            continue
        for kind in NBD_SERVERS:
            x = p["servers"].get(kind)
            if not server_measured(problems, f"nbd {nbd_label(pt)} {kind}", x, nc["reps"],
                                   ("iops", "mbps", "p50_ns", "p99_ns", "server_cpu_ns_per_io")):
                continue
            if kind == "flashpath" and not isinstance(x["median"].get("reactor_busy_ns_per_io"), (int, float)):
                problems.append(f"nbd {nbd_label(pt)}: no reactor busy time")
        for other in ("qsd", "nbdkit"):
            if not isinstance(p["ratios"].get(other, {}).get("iops"), (int, float)):
                problems.append(f"nbd {nbd_label(pt)}: no IOPS ratio to {other}")
    for kind in NBD_SERVERS:
        if e.get("fills", {}).get(kind, {}).get("bytes", 0) < e.get("size", 1):
            problems.append(f"nbd: {kind}'s disk was not written in full")
    return problems


def validate_guest_notify(res, c):
    """The guest-notification section, unless it recorded why it did not run: every QD on both
    servers with all its runs, positive IOPS and interrupts and kicks per I/O, both ratios."""
    e = res.get("guest_notify")
    if not e:
        return ["results.json has no 'guest_notify'"]
    if not e.get("runs") and any(n.startswith("not run:") for n in e.get("notes", [])):
        return []
    problems = []
    rows = {row["qd"]: row for row in e.get("summary", [])}
    for qd in c["qds"]:
        row = rows.get(qd)
        if row is None:
            problems.append(f"guest-notify: no QD{qd} summary")
            continue
        for kind in GN_SERVERS:
            x = row["servers"][kind]
            if x["runs"] != c["reps"]:
                problems.append(f"guest-notify QD{qd} {kind}: {x['runs']} runs, want {c['reps']}")
            for k in ("iops", "irqs_per_io", "kicks_per_io"):
                v = x["median"].get(k)
                if not isinstance(v, (int, float)) or v <= 0:
                    problems.append(f"guest-notify QD{qd} {kind}: {k} = {v!r}")
        for k in ("irqs_per_io", "kicks_per_io"):
            if not isinstance(row["ratios"].get(k), (int, float)):
                problems.append(f"guest-notify QD{qd}: no {k} ratio")
    return problems


def validate_spdk(res, sc):
    """The SPDK section (only in runs with --spdk): every point on the three servers with its
    rounds, positive IOPS, latency and server CPU per I/O, both reactors' busy time, the fd
    clients' completions per wake-up, the IOPS ratio; where the run had the vhost-user floor (runs
    before it had none), the floor on its backends' points for the clients `floor.clients` names
    with its busy time and the servers' multiples of it (at completion-fd points also its CPU
    time and notifications per I/O and the CPU/IO stat multiples)."""
    problems = []
    got = {(p["backend"], p["pattern"], p["bs"], p["qd"], p["queues"], p["client"]): p
           for p in res["spdk"].get("points", [])}
    # The backends the run chose (--backends narrows the section); at least one of the mode's.
    ran = res["spdk"].get("backends", sc["backends"])
    if not ran or any(b not in sc["backends"] for b in ran):
        problems.append(f"spdk: backends {ran!r}, the mode's are {sc['backends']!r}")
    for b in ran:
        for pt in sc["points"]:
            pk = point_key(b, pt)
            p = got.get((b, pk["pattern"], pk["bs"], pk["qd"], pk["queues"], pk["client"]))
            if p is None:
                problems.append(f"spdk: missing point {point_label(pk)}")
                continue
            for kind in ("flashpath", "qsd", "spdk"):
                want = ["iops", "p50_ns", "p99_ns", "server_cpu_ns_per_io"]
                if kind != "qsd":
                    want.append("reactor_busy_ns_per_io")
                if pk["client"] == "fd":
                    want.append("completions_per_wakeup")
                server_measured(problems, f"spdk {point_label(pk)} {kind}", p["servers"].get(kind), sc["reps"], want)
            if not isinstance(p.get("ratios", {}).get("iops"), (int, float)):
                problems.append(f"spdk {point_label(pk)}: no IOPS ratio")
            fl = res["spdk"].get("floor") or {}
            floored = b in fl.get("backends", ())
            if (floored and pk["client"] in floor_clients(fl, "floor")) or "floor" in p["servers"]:
                want = ["iops", "p50_ns", "p99_ns", "reactor_busy_ns_per_io"]
                if pk["client"] == "fd":
                    want += ["server_cpu_stat_ns_per_io", "notifications_per_io"]
                server_measured(problems, f"spdk {point_label(pk)} floor", p["servers"].get("floor"), sc["reps"], want)
                for kind in ("flashpath", "spdk"):
                    if not isinstance((p.get("floor_ratios") or {}).get(kind), (int, float)):
                        problems.append(f"spdk {point_label(pk)}: no busy/IO ratio of {kind} to the floor")
                if pk["client"] == "fd":
                    for k in ("cpu_stat_fp_floor", "cpu_stat_spdk_floor", "cpu_stat_floor_spdk"):
                        if not isinstance((p.get("floor_fd_ratios") or {}).get(k), (int, float)):
                            problems.append(f"spdk {point_label(pk)}: no CPU/IO stat ratio {k}")
            # The guessing floor, in runs that had it (later than the floor itself).
            if floored and "floor_guess" in fl.get("variants", {}) and pk["client"] in floor_clients(fl, "floor_guess"):
                server_measured(problems, f"spdk {point_label(pk)} floor_guess", p["servers"].get("floor_guess"),
                                sc["reps"], ["iops", "reactor_busy_ns_per_io"])
                if not isinstance((p.get("floor_ratios") or {}).get("flashpath_guess"), (int, float)):
                    problems.append(f"spdk {point_label(pk)}: no busy/IO ratio of flashpath to the guessing floor")
    return problems


def floor_clients(fl, kind):
    """The clients a run's floor `kind` ran with: `floor.clients` maps each variant to its clients;
    runs before the floor ran at the completion-fd points give one list for all variants."""
    clients = fl.get("clients", ())
    return clients.get(kind, ()) if isinstance(clients, dict) else clients


# Sections run alone (`--only`) that validate.py checks by themselves: (their check, the heading
# results.md must have). --time/--reps may override the mode's settings: the run's own config wins.
ALONE = {
    "raid": (lambda res, mode: validate_raid(res, dict(raid_config(mode), **res["raid"]["config"])), "## raid1"),
    "crypto": (lambda res, mode: validate_crypto(res, dict(crypto_config(mode), **res["crypto"]["config"])),
               "## AES-XTS"),
    # The run's own config: --reps may override the mode's.
    "pathlen": (lambda res, mode: validate_pathlen(res, res["pathlen"]["config"]), PATHLEN_HEADING),
    "nvmf": (lambda res, mode: validate_nvmf(res, res["nvmf"]["config"]), "## NVMe over TCP"),
    # The run's own config: --time/--reps may override the mode's.
    "paths": (lambda res, mode: validate_paths(res, res["paths"]["config"]), PATHS_HEADING),
    # The run's own config: --time/--reps may override the mode's.
    "tls": (lambda res, mode: validate_tls(res, res["tls"]["config"]), TLS_HEADING),
    # The run's own config.
    "ublk": (lambda res, mode: validate_ublk(res, res["ublk"]["config"]), UBLK_HEADING),
    # The run's own config: --time/--reps may override the mode's.
    "luks": (lambda res, mode: validate_luks(res, res["luks"]["config"]), LUKS_HEADING),
    # The run's own config: --time/--reps may override the mode's.
    "backup": (lambda res, mode: validate_backup(res, res["backup"]["config"]), BACKUP_HEADING),
    # The run's own config (--time/--reps may override the mode's); its N and QD the mode's.
    "density": (lambda res, mode: validate_density(res, dict(res["density"]["config"], ns=density_config(mode)["ns"],
                                                             qds=density_config(mode)["qds"])), DENSITY_HEADING),
}


def validate(out_dir, mode):
    """Checks the outputs are well formed; asserts no absolute number."""
    problems = []
    with open(os.path.join(out_dir, "results.json")) as f:
        res = json.load(f)
    alone = ALONE.get(res.get("meta", {}).get("only"))
    if alone:
        # The section alone: no matrix.
        check, heading = alone
        problems = check(res, mode)
        with open(os.path.join(out_dir, "results.md")) as f:
            if heading not in f.read():
                problems.append(f"results.md has no '{heading}'")
        return problems
    for k in ("meta", "points", "ratios", "idle", "fio", "scaling", "targets", "wall_s"):
        if k not in res:
            problems.append(f"results.json has no '{k}'")
    cfg = mode_config(mode)
    want = set()
    for b in cfg["backends"]:
        for pt in cfg.get(f"{b}_points", cfg["points"]):
            pk = point_key(b, pt)
            for s in ("flashpath", "qsd"):
                want.add(point_id(dict(pk, server=s)))
    got = set()
    for p in res.get("points", []):
        got.add(point_id(p))
        if len(p["runs"]) != res["meta"]["reps"]:
            problems.append(f"{point_label(p)} {p['server']}: {len(p['runs'])} runs")
        for m in ("iops", "mbps", "lat_mean_ns", "p50_ns", "p99_ns", "p999_ns", "server_cpu_ns_per_io"):
            v = p["median"].get(m)
            if not isinstance(v, (int, float)) or v <= 0:
                problems.append(f"{point_label(p)} {p['server']}: {m} = {v!r}")
        if p["server"] == "flashpath" and not isinstance(p["median"].get("reactor_busy_ns_per_io"), (int, float)):
            problems.append(f"{point_label(p)}: no reactor busy time")
        if p["qd"] == 1 and p["pattern"] == "randread" and not p.get("histogram", {}).get("buckets"):
            problems.append(f"{point_label(p)} {p['server']}: no histogram")
    if want - got:
        problems.append(f"missing points: {sorted(want - got)}")
    if len(res.get("ratios", [])) * 2 != len(got):
        problems.append("ratios do not pair every point")
    if len(res.get("idle", [])) != 2 * len(cfg["backends"]):
        problems.append(f"{len(res.get('idle', []))} idle measurements")
    if "file" in cfg["backends"] and not res.get("fio"):
        problems.append("no fio baseline")
    cg = cfg.get("callgrind")
    if cg:
        want_cg = {point_id(dict(point_key("null", pt), server=s)) for pt in cg["points"]
                   for s in ("flashpath", "qsd")}
        got_cg = set()
        for e in res.get("callgrind", []):
            got_cg.add(point_id(e))
            v = e.get("ir_per_io")
            if not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                problems.append(f"callgrind {point_label(e)} {e['server']}: instructions/IO = {v!r}")
            if len(e["runs"]) != cg["reps"]:
                problems.append(f"callgrind {point_label(e)} {e['server']}: {len(e['runs'])} runs")
        if want_cg - got_cg:
            problems.append(f"missing callgrind figures: {sorted(want_cg - got_cg)}")
    if not res.get("density"):
        problems.append("results.json has no 'density'")  # checked below (ALONE)
    if cfg.get("pathlen") and not res.get("pathlen"):
        problems.append("results.json has no 'pathlen'")  # checked below when present (ALONE)
    with open(os.path.join(out_dir, "results.md")) as f:
        md = f.read()
    rows = [ln for ln in md.splitlines() if ln.startswith("| ") and not ln.startswith("| backend")]
    if len(rows) < len(res.get("ratios", [])):
        problems.append(f"results.md has {len(rows)} table rows")
    sections = ["## Main points", "## Side by side", "## Idle CPU", "## Targets"]
    if cg:
        sections.append("## Path length")
    for needed in sections:
        if needed not in md:
            problems.append(f"results.md has no '{needed}'")
    pngs = [f"iops_vs_qd_{b}.png" for b in cfg["backends"]] + ["qd1_latency_cdf.png"]
    for name in pngs:
        path = os.path.join(out_dir, name)
        if not os.path.exists(path):
            problems.append(f"{name} missing")
            continue
        with open(path, "rb") as f:
            head = f.read(8)
        if head != b"\x89PNG\r\n\x1a\n":
            problems.append(f"{name} is not a PNG")
        if os.path.getsize(path) <= 1024:
            problems.append(f"{name} is only {os.path.getsize(path)} bytes")
    rc = cfg.get("rbd")
    if rc and res.get("meta", {}).get("rbd", True):
        problems += validate_rbd(res, rc)
        if "## Ceph RBD" not in md:
            problems.append("results.md has no '## Ceph RBD'")
    nc = cfg.get("nbd")
    if nc and res.get("meta", {}).get("nbd", True):
        problems += validate_nbd(res, nc)
        if "## NBD" not in md:
            problems.append("results.md has no '## NBD'")
    gc = guest_notify_config(mode)
    if gc and res.get("meta", {}).get("guest_notify"):
        problems += validate_guest_notify(res, gc)
        if "## Notifications in a real guest" not in md:
            problems.append("results.md has no '## Notifications in a real guest'")
    if res.get("spdk"):
        problems += validate_spdk(res, cfg["spdk"])
        if "## SPDK as a peer" not in md:
            problems.append("results.md has no '## SPDK as a peer'")
    if res.get("nvmf"):
        problems += validate_nvmf(res, res["nvmf"]["config"])  # --time/--reps may override the mode's
        if "## NVMe over TCP" not in md:
            problems.append("results.md has no '## NVMe over TCP'")
    if res.get("nvme_tcp"):
        problems += validate_nvme_tcp(res, res["nvme_tcp"]["config"])  # --time/--reps may override the mode's
        if "## NVMe/TCP initiator" not in md:
            problems.append("results.md has no '## NVMe/TCP initiator'")
    for key, (check, heading) in ALONE.items():
        if res.get(key):
            problems += check(res, mode)
            if heading not in md:
                problems.append(f"results.md has no '{heading}'")
    if cfg.get("iostat_reps"):
        ios = res.get("iostat", [])
        if len(ios) != 1:
            problems.append(f"{len(ios)} disk-layer cost entries")
        for e in ios:
            for k in ("off", "counters", "histograms"):
                v = e["variants"][k]["median"].get("iops")
                if not isinstance(v, (int, float)) or v <= 0:
                    problems.append(f"disk-layer cost {k}: iops = {v!r}")
            # Counters on: the daemon saw at least every I/O the client completed.
            if e["daemon_read_ops"] < e["client_ios"]:
                problems.append(f"the daemon counted {e['daemon_read_ops']} reads, the client did {e['client_ios']}")
    return problems
