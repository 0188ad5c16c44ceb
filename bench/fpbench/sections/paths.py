"""Paths (`--only paths`): NVMe/TCP multipath failover time and the DH-HMAC-CHAP connect cost.

Failover: flashpath A (the target, on the client CPU) serves a RAM disk over NVMe/TCP;
flashpath B (the initiator, on the server CPU) attaches it twice under one name
(`bdev_nvme_attach_controller -x multipath`), each path through a relay of the bench's own
(fpbench/relay.py), and exports the namespace over vhost-user to fp-load (client CPU), which
runs verified 4 KiB randrw with a 50 ms timeline. A third of the way into the run the first
path is cut (connections closed, reconnects refused) or stalled (connections kept, nothing
forwarded); two thirds in it is restored. The figures: the longest stretch without a
completion (timeline) and the longest request (lat_max_ns) against the bound the initiator
promises, KATO + CQT (docs/nvme.md, "Multipath"), failed and mismatched I/O, the bytes
verified, and when the first path carried I/O again (failback).

Connect cost: flashpath C (target, client CPU) with one subsystem open to any host and one
that requires DH-HMAC-CHAP from a listed host (bidirectional keys); flashpath D (initiator,
server CPU) attaches and detaches each in turn, the attach's JSON-RPC round trip timed.

docs/benchmarks.md, "Paths", describes every step. Never in CI: a benchmark, not a test.
"""

import base64
import json
import os
import subprocess
import threading
import time
import zlib

from fpbench.common import MIB, keyring_files, log, median, ratio
from fpbench.modes import paths_config
from fpbench.relay import RelayProcess
from fpbench.sections.nvmf import free_port, serve_disk
from fpbench.servers import CHILDREN, Flashpath, jsonrpc

NAME = "Nvme0"
BDEV = "Nvme0n1"
VHOST_CTRLR = "vhost.paths"
# fp-load's timeline interval: the resolution of the gap without completions.
TIMELINE_S = 0.05
# flashpath's target leaves Identify Controller's CQT (bytes 387:386) at 0, so the initiator
# waits its stand-in (docs/nvme.md, "Multipath").
CQT_STANDIN_S = 1.0
# The path state poll while a path is broken or coming back (direct JSON-RPC: no CLI process).
POLL_S = 0.05
# What a path must do after the run, at most, to be back before the next run.
BACK_TIMEOUT_S = 60.0
# The connect part: the subsystems, the host's NQN, the keyring names.
PLAIN_NQN = "nqn.2016-06.io.spdk:fpbench-paths-plain"
AUTH_NQN = "nqn.2016-06.io.spdk:fpbench-paths-auth"
HOST_NQN = "nqn.2014-08.org.nvmexpress:uuid:5e1ec7ed-0000-4000-8000-0000000000f9"
KEYS = ("host0", "ctrl0")
# What the initiator logs (at info, its default) when a queue has authenticated at its connect.
AUTHENTICATED_LINE = b": authenticated (DH-HMAC-CHAP) as "
# (variant, digest, DH group): no authentication; the transaction without Diffie-Hellman (the
# null group: its messages and HMACs only, what the groups' rows add to it is the arithmetic);
# the group; a bigger one.
CONNECT_VARIANTS = (("none", None, None), ("null", "sha256", "null"), ("ffdhe2048", "sha256", "ffdhe2048"),
                    ("ffdhe4096", "sha256", "ffdhe4096"))
# A break or restore later than this (the bench's own polling held up) marks the run disturbed.
LATE_S = 0.2
# A run "held" a request for the bound when its longest request reached this share of it (the
# bound is measured from when the channel saw the path down, a little after the break).
HELD_SHARE = 0.99
# The goals (the issue's): I/O back within this many times the bound, authentication's added
# cost per connect at ffdhe2048.
GOAL_RATIO = 2.0
GOAL_AUTH_MS = 5.0


# -- pure parts (fpbench/tests_paths.py) -------------------------------------------------------


def longest_gap(timeline, from_s=0.0):
    """The longest run of empty buckets in fp-load's `timeline` ({interval_s, ios}) among the
    buckets that end after `from_s` (seconds from the measured start): {"buckets", "gap_s",
    "start_s", "end_s"}. gap_s = buckets x interval is a lower bound of the longest time without
    a completion there; the true one is shorter than (buckets + 2) x interval."""
    step = timeline["interval_s"]
    ios = timeline["ios"]
    first = max(0, int(from_s / step)) if step > 0 else 0
    best_n, best_at, n, at = 0, None, 0, None
    for i in range(first, len(ios)):
        if ios[i] == 0:
            if n == 0:
                at = i
            n += 1
            if n > best_n:
                best_n, best_at = n, at
        else:
            n = 0
    if best_at is None:
        return {"buckets": 0, "gap_s": 0.0, "start_s": None, "end_s": None}
    return {"buckets": best_n, "gap_s": best_n * step, "start_s": best_at * step, "end_s": (best_at + best_n) * step}


def failover_bound_s(kato_ms, cqt_ms=0):
    """The initiator's promise for a request held by a lost path: KATO + CQT, CQT's stand-in
    when the controller reports 0."""
    cqt = cqt_ms / 1000 if cqt_ms else CQT_STANDIN_S
    return kato_ms / 1000 + cqt


def run_figures(res, cut_s, bound_s, bs):
    """One failover run's figures from fp-load's JSON `res` and the cut's offset `cut_s` from
    the measured start: the gap after the cut, the longest request, each against the bound, the
    worse of the two ("ratio", what the goal is judged on), failed and mismatched I/O and the
    bytes read back and compared."""
    gap = longest_gap(res["timeline"], cut_s) if res.get("timeline") else {"gap_s": None}
    lat_max_s = res["lat_max_ns"] / 1e9 if res.get("lat_max_ns") is not None else None
    worst = max([x for x in (gap["gap_s"], lat_max_s) if x is not None], default=None)
    verified = res.get("verified") or 0
    return {"gap": gap, "gap_s": gap["gap_s"], "lat_max_s": lat_max_s, "bound_s": bound_s,
            "gap_ratio": ratio(gap["gap_s"], bound_s), "lat_max_ratio": ratio(lat_max_s, bound_s),
            "ratio": ratio(worst, bound_s), "errors": res.get("errors", 0), "mismatches": res.get("mismatches") or 0,
            "verified_reads": verified, "verified_bytes": verified * bs, "ios": res.get("ios"),
            "iops": res.get("iops")}


def disturbed(r, secs):
    """Why a run measured the machine rather than the failover, if it did: the bench broke or
    restored the path late (its own polling held up), or the surviving path reset during the
    run (its generation moved: a keep-alive or a request missed its timeout), which leaves no
    path to fail over to. [] for a clean run."""
    why = []
    for what, at, want in (("break", r.get("cut_s"), secs / 3), ("restore", r.get("restore_s"), 2 * secs / 3)):
        if at is not None and at - want > LATE_S:
            why.append(f"{what} {at - want:.2f} s late")
    ps = r.get("paths") or {}
    start, end = ps.get("start") or [], ps.get("end") or []
    for i in range(1, min(len(start), len(end))):
        if start[i].get("generation") != end[i].get("generation"):
            why.append(f"surviving path {i} reset (generation {start[i].get('generation')} -> {end[i].get('generation')})")
    return why


def nearest_rank(xs, q):
    """The `q` quantile of `xs` by nearest rank (p90 of ten values: the ninth smallest)."""
    xs = sorted(x for x in xs if x is not None)
    if not xs:
        return None
    k = max(1, -(-len(xs) * q // 1))
    return xs[int(k) - 1]


def failover_summary(runs):
    """Per (kind, policy, qd): the runs' medians and worst of the gap, the longest request and
    the ratio, the failed and mismatched I/O summed, the bytes verified, failback times."""
    groups = {}
    for r in runs:
        groups.setdefault((r["kind"], r["policy"], r["qd"]), []).append(r)
    out = []
    for (kind, policy, qd), rs in groups.items():
        def col(k):
            return [x.get(k) for x in rs if x.get(k) is not None]
        fb = [x.get("failback_s") for x in rs]
        e = {"kind": kind, "policy": policy, "qd": qd, "runs": len(rs), "bound_s": rs[0]["bound_s"],
             "errors": sum(x["errors"] for x in rs), "mismatches": sum(x["mismatches"] for x in rs),
             "verified_bytes": sum(x["verified_bytes"] for x in rs),
             # Runs in which some request waited out the bound: a request on the wire when the path
             # broke must (docs/nvme.md); a run below it found none there or sent one sooner.
             "held_runs": sum(1 for x in rs if x.get("lat_max_s") is not None
                              and x["lat_max_s"] >= HELD_SHARE * x["bound_s"]),
             "failback_seen": sum(1 for x in fb if x is not None), "failback_s_median": median(fb),
             "failback_s_worst": max([x for x in fb if x is not None], default=None)}
        for k in ("gap_s", "lat_max_s", "ratio", "detected_s"):
            e[f"{k}_median"] = median(col(k))
            e[f"{k}_worst"] = max(col(k), default=None)
        clean = [x["ratio"] for x in rs if not x.get("disturbed") and x.get("ratio") is not None]
        e["disturbed_runs"] = sum(1 for x in rs if x.get("disturbed"))
        e["ratio_worst_undisturbed"] = max(clean, default=None)
        e["met"] = (e["ratio_worst"] is not None and e["ratio_worst"] <= GOAL_RATIO and e["errors"] == 0
                    and e["mismatches"] == 0)
        out.append(e)
    return out


def connect_summary(attaches, queues):
    """Per variant: median, p90, min and max of the attach's round trip (ms); against "none":
    the added median per attach and per queue that authenticated during the attach
    (`queues[variant]`, the most seen in one attach: the admin queue and the I/O queues the
    bdev's examination connected, each with its own DH-HMAC-CHAP transaction)."""
    out = {}
    for v, xs in attaches.items():
        out[v] = {"n": len(xs), "median_ms": median(xs), "p90_ms": nearest_rank(xs, 0.9),
                  "min_ms": min(xs, default=None), "max_ms": max(xs, default=None),
                  "queues": max(1, queues.get(v, 1))}
    base = (out.get("none") or {}).get("median_ms")
    for v, e in out.items():
        if v == "none" or base is None or e["median_ms"] is None:
            continue
        e["added_ms"] = e["median_ms"] - base
        e["added_p90_ms"] = e["p90_ms"] - out["none"]["p90_ms"]
        e["added_ms_per_queue"] = e["added_ms"] / e["queues"]
    return out


def dhchap_secret(key):
    """A DH-HMAC-CHAP secret as `nvme gen-dhchap-key` writes it: DHHC-1, no transformation
    (00), base64 of the key and its CRC-32 (little-endian)."""
    crc = zlib.crc32(key).to_bytes(4, "little")
    return f"DHHC-1:00:{base64.b64encode(key + crc).decode()}:"


def _s(v):
    return "-" if v is None else f"{v:.2f} s"


def _x(v):
    return "-" if v is None else f"{v:.2f}x"


# -- the section -------------------------------------------------------------------------------


class LoadRun:
    """fp-load in the background with --mark-phases: `started` is when it printed "measuring"
    (the timeline's zero) on the bench's clock; `result()` its JSON, kept also when it exits
    non-zero (a verified run that saw errors reports them and exits 3)."""

    def __init__(self, bin_path, cmd_args, secs, work, n):
        self.out_path = os.path.join(work, f"paths-load-{n}.json")
        self.out = open(self.out_path, "w+")
        self.cmd = [bin_path, *cmd_args]
        self.secs = secs
        self.proc = subprocess.Popen(self.cmd, stdout=self.out, stderr=subprocess.PIPE, text=True)
        CHILDREN.append(self.proc)
        self.started = None
        self.err = []
        self.marked = threading.Event()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.proc.stderr:
            if "fp-load: measuring" in line and self.started is None:
                self.started = time.monotonic()
                self.marked.set()
            else:
                self.err.append(line.rstrip())

    def wait_started(self, timeout):
        if not self.marked.wait(timeout):
            raise RuntimeError(f"fp-load did not start measuring in {timeout} s: {self.err[-5:]}")

    def result(self):
        try:
            self.proc.wait(self.secs + 90)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise RuntimeError(f"fp-load ran {self.secs + 90} s past its start: killed")
        self.reader.join(5)
        self.out.seek(0)
        text = self.out.read()
        self.out.close()
        os.unlink(self.out_path)
        try:
            res = json.loads(text)
        except ValueError:
            raise RuntimeError(f"fp-load exited {self.proc.returncode} without a result: {self.err[-5:]}")
        res["exit_status"] = self.proc.returncode
        return res


def controllers(fp):
    """The multipath controller's paths (`ctrlrs`), in attach order."""
    return jsonrpc(fp.rpc_sock, "bdev_nvme_get_controllers", {"name": NAME})[0]["ctrlrs"]


def path_completed(p):
    return (p.get("stats") or {}).get("completed")


class PathsSection:
    """Bench's methods for this section (mixed into bench.Bench)."""

    def run_paths(self):
        c = dict(paths_config(self.args.mode))
        c.update({k: v for k, v in (("secs", self.args.time), ("reps", self.args.reps)) if v})
        out = {"config": c, "loadavg_before": os.getloadavg(), "runs": [], "notes": []}
        self.results["paths"] = out
        self.paths_failover(c, out)
        self.paths_connect(c, out)
        out["failover"] = failover_summary(out["runs"])
        out["loadavg_after"] = os.getloadavg()

    # -- failover --------------------------------------------------------------------------

    def paths_failover(self, c, out):
        kato = c["kato_ms"]
        bound = failover_bound_s(kato)
        out["bound"] = {"kato_ms": kato, "cqt_ms": 0, "cqt_standin_s": CQT_STANDIN_S, "bound_s": bound,
                        "io_timeout_us": c["io_timeout_us"]}
        tgt = host = None
        relays = []
        try:
            tgt = Flashpath(self.args.bin_dir, self.work, str(self.client_cpu), name="flashpath-paths-target")
            port = free_port()
            nqn = serve_disk(tgt, "ram", c["size_mib"] * MIB, port)
            relays = [RelayProcess(port), RelayProcess(port)]
            host = Flashpath(self.args.bin_dir, self.work, str(self.server_cpu), name="flashpath-paths-host")
            opts = {"keep_alive_timeout_ms": kato, "timeout_us": c["io_timeout_us"],
                    "timeout_admin_us": c["io_timeout_us"], "action_on_timeout": "reset"}
            host.rpc("bdev_nvme_set_options", opts)
            attach = []
            for r in relays:
                p = {"name": NAME, "trtype": "TCP", "adrfam": "IPv4", "traddr": "127.0.0.1",
                     "trsvcid": str(r.port), "subnqn": nqn, "multipath": "multipath",
                     "ctrlr_loss_timeout_sec": -1, "reconnect_delay_sec": 1}
                host.rpc("bdev_nvme_attach_controller", p)
                attach.append(p)
            out["setup"] = {"target_cpu": self.client_cpu, "host_cpu": self.server_cpu, "client_cpu": self.client_cpu,
                            "nqn": nqn, "target_port": port, "relay_ports": [r.port for r in relays],
                            "set_options": opts, "attach": attach, "disk_mib": c["size_mib"]}
            sock = host.export(VHOST_CTRLR, BDEV, queues=1)
            n = 0
            for rep in range(c["reps"]):
                for kind in c["kinds"]:
                    for policy in c["policies"]:
                        for qd in c["qds"]:
                            n += 1
                            r = self.paths_run(host, relays, sock, kind, policy, qd, c, bound, n)
                            r["rep"] = rep
                            out["runs"].append(r)
                            log(f"paths: {kind:<5} {policy:<14} QD{qd:<2} gap {_s(r['gap_s'])}, longest request "
                                f"{_s(r['lat_max_s'])}, bound {bound:.2f} s: {_x(r['ratio'])}; {r['errors']} failed, "
                                f"{r['mismatches']} mismatched, {r['verified_bytes'] / MIB:.1f} MiB verified; "
                                f"detected {_s(r['detected_s'])}, failback {_s(r['failback_s'])}")
        finally:
            if host is not None:
                host.stop()
            for r in relays:
                r.stop()
            if tgt is not None:
                tgt.stop()

    def paths_wait_up(self, host, timeout=BACK_TIMEOUT_S):
        """Waits until every path's controller is enabled; the seconds waited."""
        t0 = time.monotonic()
        while True:
            ps = controllers(host)
            if all(p["state"] == "enabled" for p in ps):
                return time.monotonic() - t0
            if time.monotonic() - t0 > timeout:
                raise RuntimeError(f"paths: not every path back after {timeout} s: {[p['state'] for p in ps]}")
            time.sleep(POLL_S)

    def paths_run(self, host, relays, sock, kind, policy, qd, c, bound, n):
        """One verified run with the first path broken (`kind`: cut or stall) at secs / 3 and
        restored at 2 secs / 3."""
        waited = self.paths_wait_up(host)
        params = {"name": BDEV, "policy": policy}
        if policy == "active_active":
            params["selector"] = "round_robin"
        host.rpc("bdev_nvme_set_multipath_policy", params)
        secs = c["secs"]
        args = ["--socket", sock, "--pattern", "randrw", "--bs", "4096", "--qd", str(qd), "--queues", "1",
                "--time", f"{secs}s", "--cpu", str(self.client_cpu), "--verify", "--timeline",
                f"{int(TIMELINE_S * 1000)}ms", "--mark-phases", "--json"]
        load = LoadRun(self.loader.bin, args, secs, self.work, n)
        load.wait_started(30)
        t0 = load.started
        before = controllers(host)
        time.sleep(max(0.0, t0 + secs / 3 - time.monotonic()))
        at_cut = controllers(host)
        cut_at = time.monotonic()
        (relays[0].cut if kind == "cut" else relays[0].stall)()
        # When the initiator showed the first path down (its controller's state), and when the
        # path carried I/O again after the restore: polled.
        detected = None
        restore_at = t0 + 2 * secs / 3
        while time.monotonic() < restore_at:
            if detected is None and controllers(host)[0]["state"] != "enabled":
                detected = time.monotonic() - cut_at
            time.sleep(min(POLL_S, max(0.0, restore_at - time.monotonic())))
        at_restore = controllers(host)
        restored = time.monotonic()
        relays[0].restore()
        failback, current_back, last = None, None, None
        end = t0 + secs
        while time.monotonic() < end - POLL_S and failback is None:
            ps = controllers(host)
            done = path_completed(ps[0])
            if ps[0]["state"] == "enabled" and last is not None and done is not None and done > last:
                failback = time.monotonic() - restored
            last = done if ps[0]["state"] == "enabled" else None
            if current_back is None and policy == "active_passive":
                if any(p.get("current") and p["transport"]["trsvcid"] == str(relays[0].port)
                       for g in jsonrpc(host.rpc_sock, "bdev_nvme_get_io_paths", {"name": BDEV})["poll_groups"]
                       for p in g["io_paths"]):
                    current_back = time.monotonic() - restored
            time.sleep(POLL_S)
        res = load.result()
        after = controllers(host)
        cut_s = cut_at - t0
        r = {"kind": kind, "policy": policy, "qd": qd, "cut_s": cut_s, "restore_s": restored - t0,
             "detected_s": detected, "failback_s": failback, "current_back_s": current_back,
             "waited_for_paths_s": waited, "exit_status": res["exit_status"], "first_error": res.get("first_error"),
             "first_mismatch": res.get("first_mismatch"), "elapsed_s": res.get("elapsed_s"),
             "timeline": res.get("timeline"), "lat_p99_ns": res.get("p99_ns"),
             # Each path's state and completed count (stats.completed: its I/O queues, every
             # channel) at the run's start, at the break, at the restore and after the run: which
             # path carried the I/O in each part.
             "paths": {when: [{"state": p["state"], "completed": path_completed(p), "generation": p.get("generation"),
                               "io_queues": p.get("io_queues")}
                              for p in ps]
                       for when, ps in (("start", before), ("break", at_cut), ("restore", at_restore), ("end", after))}}
        r.update(run_figures(res, cut_s, bound, 4096))
        r["disturbed"] = disturbed(r, secs)
        # A gap that reached the restore may have been ended by the restore, not the failover.
        g = r["gap"]
        r["gap_reached_restore"] = g["end_s"] is not None and g["end_s"] >= r["restore_s"] - TIMELINE_S
        return r

    # -- connect cost ----------------------------------------------------------------------

    def paths_connect(self, c, out):
        tgt = host = None
        e = {"variants": [v[0] for v in CONNECT_VARIANTS], "attaches": {v[0]: [] for v in CONNECT_VARIANTS},
             "queues": {}, "n": c["attaches"]}
        out["connect"] = e
        try:
            tgt = Flashpath(self.args.bin_dir, self.work, str(self.client_cpu), name="flashpath-paths-auth-target")
            host = Flashpath(self.args.bin_dir, self.work, str(self.server_cpu), name="flashpath-paths-auth-host")
            keyring_files(os.path.join(self.work, "paths-keys"),
                          {name: dhchap_secret(os.urandom(32)) for name in KEYS}, (tgt, host))
            tgt.rpc("nvmf_create_transport", {"trtype": "TCP"})
            port = free_port()
            listen = {"trtype": "TCP", "adrfam": "IPv4", "traddr": "127.0.0.1", "trsvcid": str(port)}
            for i, nqn in enumerate((PLAIN_NQN, AUTH_NQN)):
                tgt.rpc("bdev_malloc_create", {"name": f"Malloc{i}", "num_blocks": 16 * MIB // 512, "block_size": 512})
                tgt.rpc("nvmf_create_subsystem", {"nqn": nqn, "allow_any_host": nqn == PLAIN_NQN,
                                                  "serial_number": f"FPBENCHPATHS{i}"})
                tgt.rpc("nvmf_subsystem_add_ns", {"nqn": nqn, "namespace": {"bdev_name": f"Malloc{i}"}})
                tgt.rpc("nvmf_subsystem_add_listener", {"nqn": nqn, "listen_address": listen})
            tgt.rpc("nvmf_subsystem_add_host", {"nqn": AUTH_NQN, "host": HOST_NQN, "dhchap_key": KEYS[0],
                                                "dhchap_ctrlr_key": KEYS[1]})
            e["setup"] = {"target_cpu": self.client_cpu, "host_cpu": self.server_cpu, "port": port,
                          "host_nqn": HOST_NQN, "bidirectional": True}
            # One untimed attach of each variant first: the first connect of a daemon pays for
            # things the others do not (a thread, the first socket).
            for i in range(c["attaches"] + 1):
                for variant, digest, group in CONNECT_VARIANTS:
                    ms, queues = self.paths_attach_once(tgt, host, port, variant, digest, group)
                    if i:
                        e["attaches"][variant].append(ms)
                        e["queues"][variant] = max(e["queues"].get(variant, 0), queues)
            e["summary"] = connect_summary(e["attaches"], e["queues"])
            for v, s in e["summary"].items():
                log(f"paths: attach {v:<9} median {s['median_ms']:.2f} ms, p90 {s['p90_ms']:.2f} ms"
                    + (f", added {s['added_ms']:.2f} ms ({s['added_ms_per_queue']:.2f} ms per queue, "
                       f"{s['queues']} queue(s))" if "added_ms" in s else ""))
        finally:
            if host is not None:
                host.stop()
            if tgt is not None:
                tgt.stop()

    @staticmethod
    def paths_attach_once(tgt, host, port, variant, digest, group):
        """One timed attach (the JSON-RPC round trip) and its detach; (ms, the queues that
        authenticated during the attach, counted in the initiator's log: the admin queue and the
        I/O queues that the new bdev's examination connected and closed again)."""
        params = {"name": "Auth0", "trtype": "TCP", "adrfam": "IPv4", "traddr": "127.0.0.1", "trsvcid": str(port),
                  "subnqn": PLAIN_NQN if group is None else AUTH_NQN, "hostnqn": HOST_NQN}
        if group is not None:
            tgt.rpc("nvmf_set_config", {"dhchap_digests": [digest], "dhchap_dhgroups": [group]})
            params.update(dhchap_key=KEYS[0], dhchap_ctrlr_key=KEYS[1])
        log_path = os.path.join(host.dir, "serve.log")
        before = os.path.getsize(log_path)
        t0 = time.perf_counter()
        jsonrpc(host.rpc_sock, "bdev_nvme_attach_controller", params)
        ms = (time.perf_counter() - t0) * 1000
        jsonrpc(host.rpc_sock, "bdev_nvme_detach_controller", {"name": "Auth0"})
        with open(log_path, "rb") as f:
            f.seek(before)
            queues = f.read().count(AUTHENTICATED_LINE)
        return ms, queues
