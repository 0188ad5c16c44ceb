"""The load side: fp-load (libblkio) runs against a vhost-user socket with the server's CPU
measured around them, fio runs (the host baseline, the NBD engine), callgrind path-length
runs, and the per-point summaries (medians over repetitions).
"""

import json
import os
import subprocess
import time

from fpbench.common import machine_busy_ns, median, own_cpu_ns, proc_cpu, run
from fpbench.servers import CHILDREN


class Loader:
    def __init__(self, bin_dir, client_cpu, work):
        self.bin = os.path.join(bin_dir, "fp-load")
        self.cpu = client_cpu
        self.work = work
        self.n = 0

    def run(self, sock, pattern, bs, qd, queues, poll, secs, hist=False, client_busy=False,
            packed=False, extra=()):
        cmd = [self.bin, "--socket", sock, "--pattern", pattern, "--bs", str(bs), "--qd", str(qd),
               "--queues", str(queues), "--time", f"{secs}s", "--cpu", str(self.cpu), "--json", *extra]
        if poll:
            cmd.append("--poll")
        if packed:
            cmd.append("--packed")
        if client_busy:
            cmd.append("--client-busy")
        hist_path = None
        if hist:
            self.n += 1
            hist_path = os.path.join(self.work, f"hist-{self.n}.json")
            cmd += ["--hist-out", hist_path]
        out = run(cmd, secs + 90).stdout
        res = json.loads(out)
        if hist_path:
            with open(hist_path) as f:
                res["histogram"] = json.load(f)
            os.unlink(hist_path)
        return res

    def popen(self, sock, point, secs, extra=()):
        """fp-load on `point` for `secs` in the background (a load beside something the bench
        times); `reap` gives its result. `ended`: when the bench saw it exit (set by the caller
        while it polls, else by `reap`)."""
        pattern, bs, qd, queues, poll = point
        cmd = [self.bin, "--socket", sock, "--pattern", pattern, "--bs", str(bs), "--qd", str(qd),
               "--queues", str(queues), "--time", f"{secs}s", "--cpu", str(self.cpu), "--json", *extra]
        if poll:
            cmd.append("--poll")
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        p.secs = secs
        p.ended = None
        CHILDREN.append(p)
        return p

    def reap(self, p):
        out, err = p.communicate(timeout=p.secs + 90)
        if p.ended is None:
            p.ended = time.monotonic()
        if p.returncode != 0:
            raise RuntimeError(f"fp-load {' '.join(p.args)}: exit {p.returncode}: {err.strip()}")
        return json.loads(out)

    def hold(self, sock, queues, secs):
        cmd = [self.bin, "--socket", sock, "--idle", "--queues", str(queues), "--time", f"{secs}s",
               "--cpu", str(self.cpu), "--json"]
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        CHILDREN.append(p)
        return p


def server_sample(pid):
    """What a process has used so far, for `interrupt_figures`: its CPU time (`proc_cpu`: utime +
    stime of /proc/PID/stat, and schedstat) and its threads' context switches, summed over
    /proc/PID/task/*/status (a process's own status file counts its main thread only):
    voluntary ones are its sleeps, each ended by a wake-up."""
    vol = invol = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                for line in f:
                    if line.startswith("voluntary_ctxt_switches:"):
                        vol += int(line.split()[1])
                    elif line.startswith("nonvoluntary_ctxt_switches:"):
                        invol += int(line.split()[1])
        except (FileNotFoundError, ProcessLookupError):
            pass
    c = proc_cpu(pid)
    return {"stat_ns": c["stat_ns"], "sched_ns": c["sched_ns"], "voluntary": vol, "involuntary": invol,
            "t": time.monotonic()}


def interrupt_figures(s0, s1, client):
    """The server-side figures of an interrupt-driven client's run, the same for every server:
    from two `server_sample`s of the server around the I/O and fp-load's JSON result (a single
    disk's, or a multi-disk run's total) `client`.

    server_cpu_stat_ns_per_io: the server's utime + stime per I/O (clock ticks, so meaningful
    over runs of a second or more); server_wakeups_per_io: its voluntary context switches per
    I/O; client_wakeups_per_io: the client's sleeps on its completion fds that ended with one
    ready; client_calls_per_io: the completion notifications (call eventfd writes) it read;
    client_kicks_per_io: the kicks it sent (fp-load's own frontend only); notifications_per_io:
    calls + kicks, every notification that crossed between the two per I/O."""
    ios = client["ios"]
    per = lambda v: v / ios if ios and v is not None else None  # noqa: E731
    r = {"server_cpu_stat_ns": s1["stat_ns"] - s0["stat_ns"],
         "server_wakeups": s1["voluntary"] - s0["voluntary"],
         "server_involuntary_switches": s1["involuntary"] - s0["involuntary"]}
    r["server_cpu_stat_ns_per_io"] = per(r["server_cpu_stat_ns"])
    r["server_wakeups_per_io"] = per(r["server_wakeups"])
    w = client.get("wakeups") or {}
    kicks = client.get("kicks")
    calls = w.get("notifications")
    r["client_wakeups_per_io"] = per(w.get("wakeups"))
    r["client_calls_per_io"] = per(calls)
    r["client_kicks_per_io"] = per(kicks)
    r["notifications_per_io"] = per(calls + kicks) if calls is not None and kicks is not None else None
    return r


def measure(server, loader, sock, point, secs, want_hist, client_busy=False, packed=False, extra=()):
    """One fp-load run against `server`, with the server's CPU and reactor deltas; `extra`:
    more fp-load arguments. With --dirty-log, the log's report is kept as "dirty_log"."""
    pattern, bs, qd, queues, poll = point
    react0 = server.reactors() if hasattr(server, "reactors") else None
    side0 = server_sample(server.pid)
    cpu0 = proc_cpu(server.pid)
    m0, o0 = machine_busy_ns(), own_cpu_ns()
    res = loader.run(sock, pattern, bs, qd, queues, poll, secs, hist=want_hist, client_busy=client_busy,
                     packed=packed, extra=extra)
    m1, o1 = machine_busy_ns(), own_cpu_ns()
    cpu1 = proc_cpu(server.pid)
    side1 = server_sample(server.pid)
    react1 = server.reactors() if react0 is not None else None
    if res["errors"]:
        raise RuntimeError(f"{server.name} {point}: {res['errors']} requests failed "
                           f"(first {res['first_error']})")
    ios = res["ios"]
    el = res["elapsed_s"]
    r = {
        "iops": res["iops"],
        "mbps": res["mbps"],
        "ios": ios,
        "elapsed_s": el,
        "lat_mean_ns": res["lat_mean_ns"],
        "p50_ns": res["p50_ns"],
        "p99_ns": res["p99_ns"],
        "p999_ns": res["p999_ns"],
        "lat_max_ns": res["lat_max_ns"],
        "server_cpu_ns": cpu1["sched_ns"] - cpu0["sched_ns"],
        "server_cpu_stat_ns": cpu1["stat_ns"] - cpu0["stat_ns"],
    }
    # CPU time used by anything else on the machine during the run (other processes, the idle
    # peer server, kernel threads), as a share of one core: a check that nothing disturbed it.
    # Resolution: one clock tick per CPU.
    other = (m1 - m0) - (o1 - o0) - r["server_cpu_ns"]
    r["other_cpu_cores"] = max(0.0, other / 1e9 / el) if el else None
    r["server_cpu_ns_per_io"] = r["server_cpu_ns"] / ios if ios else None
    # The client's CPU time (fp-load, a waited-for child, plus this process's own slice, which
    # is small beside it): with a peer sharing the client's CPU, it bounds what any server sees.
    r["client_cpu_ns"] = o1 - o0
    r["client_cpu_ns_per_io"] = (o1 - o0) / ios if ios else None
    r["server_cpu_stat_ns_per_io"] = r["server_cpu_stat_ns"] / ios if ios else None
    # Share of one core, over the fp-load process's life (a little longer than `elapsed`).
    r["server_cores"] = r["server_cpu_ns"] / 1e9 / el if el else None
    if react0 is not None:
        busy = {k: react1[k]["busy"] - react0[k]["busy"] for k in react1}
        tot_busy = sum(busy.values())
        r["reactor_busy_ns"] = tot_busy
        r["reactor_busy_ns_per_io"] = tot_busy / ios if ios else None
        # Busy share of the measured interval. (busy + idle) is no use as the denominator
        # here: a reactor credits a whole sleep when it wakes, so the first wake-up of a run
        # brings in the time it slept through the previous server's run.
        r["reactor_busy_frac"] = {str(k): busy[k] / 1e9 / el if el else None for k in busy}
    if client_busy:
        r["client_busy_ns"] = res["client_busy_ns"]
        r["client_busy_ns_per_io"] = res["client_busy_ns"] / ios if ios else None
        r["client_busy_frac"] = res["client_busy_ns"] / 1e9 / el if el else None
    if want_hist:
        r["histogram"] = res["histogram"]
    if res.get("dirty_log"):
        r["dirty_log"] = res["dirty_log"]
    if res.get("kicks") is not None:
        # fp-load's own frontend: the kicks it sent (the device did not ask for none).
        r["client_kicks"] = res["kicks"]
        r["client_kicks_per_io"] = res["kicks"] / ios if ios else None
    if not poll:
        # Interrupt-driven: the server's wake-ups and the notifications both ways, per I/O
        # (the whole fp-load process: a connect and a drain around the run).
        r.update((k, v) for k, v in interrupt_figures(side0, side1, res).items()
                 if k not in ("server_cpu_stat_ns", "server_cpu_stat_ns_per_io"))
    w = res.get("wakeups")
    if w:
        # The client's sleeps on its completion fds and the notifications it read there.
        r["wakeups"] = w["wakeups"]
        r["notifications"] = w["notifications"]
        r["completions_per_wakeup"] = w["completions_per_wakeup"]
        r["completions_per_notification"] = w["completions_per_notification"]
    return r


def fio_run(path, size, point, secs, cpu):
    pattern, bs, qd, _queues, _poll = point
    cmd = ["taskset", "-c", str(cpu), "fio", "--name=baseline", f"--filename={path}",
           "--ioengine=io_uring", "--direct=1", f"--rw={pattern}", f"--bs={bs}",
           f"--iodepth={qd}", "--numjobs=1", f"--size={size}", "--time_based",
           f"--runtime={round(secs * 1000)}ms", f"--cpus_allowed={cpu}", "--norandommap", "--randrepeat=0",
           "--percentile_list=50:99:99.9", "--output-format=json"]
    out = run(cmd, secs + 90).stdout
    job = json.loads(out[out.index("{"):])["jobs"][0]
    side = job["write"] if "write" in pattern else job["read"]
    pct = side["clat_ns"].get("percentile", {})

    def p(key):
        for k, v in pct.items():
            if abs(float(k) - key) < 1e-6:
                return v
        return None

    return {
        "iops": side["iops"],
        "mbps": side["bw_bytes"] / 1e6,
        "lat_mean_ns": side["lat_ns"]["mean"],
        "p50_ns": p(50.0),
        "p99_ns": p(99.0),
        "p999_ns": p(99.9),
        "elapsed_s": job["job_runtime"] / 1000.0,
    }


def fio_nbd(uri, pattern, bs, qd, cpu, secs=None):
    """One fio job (the nbd engine: libnbd, one connection) on `uri`, pinned to `cpu`: for
    `secs` seconds, or once over the whole disk without `secs` (the fill). Latency is fio's
    total (lat_ns: submission to completion), percentiles from its histogram."""
    cmd = ["taskset", "-c", str(cpu), "fio", "--name=nbd", "--ioengine=nbd", f"--uri={uri}",
           f"--rw={pattern}", f"--bs={bs}", f"--iodepth={qd}", "--numjobs=1", "--norandommap",
           "--randrepeat=0", "--lat_percentiles=1", "--percentile_list=50:99:99.9", "--output-format=json"]
    if secs:
        # In milliseconds: fio reads "0.5s" as 0 s (and then runs over the whole disk once).
        cmd += ["--time_based", f"--runtime={round(secs * 1000)}ms"]
    out = run(cmd, (secs or 600) + 90).stdout
    job = json.loads(out[out.index("{"):])["jobs"][0]
    side = job["write"] if "write" in pattern else job["read"]
    pct = side["lat_ns"].get("percentile", {})

    def p(key):
        return next((v for k, v in pct.items() if abs(float(k) - key) < 1e-6), None)

    return {"iops": side["iops"], "mbps": side["bw_bytes"] / 1e6, "ios": side["total_ios"],
            "bytes": side["io_bytes"], "errors": job.get("error", 0),
            "lat_mean_ns": side["lat_ns"]["mean"], "p50_ns": p(50.0), "p99_ns": p(99.0),
            "p999_ns": p(99.9), "elapsed_s": job["job_runtime"] / 1000.0}


# Path length: each server under callgrind (all threads, no cache simulation; --dump-line=no
# only shortens the profile it writes at exit). Callgrind counts every iteration of a
# rep-prefixed string instruction as one instruction, and on CPUs with ERMS glibc's memset and
# memcpy switch to `rep stosb` / `rep movsb` from 2 to 4 KiB up: qsd's three 16 KiB memsets per
# request would read as ~46,000 instructions. The tunables keep glibc on its vector loops at every size, which
# callgrind counts as a CPU executes them; both servers run with them.
CALLGRIND = ["env", "GLIBC_TUNABLES=glibc.cpu.x86_rep_stosb_threshold=1000000000:"
                    "glibc.cpu.x86_rep_movsb_threshold=1000000000",
             "valgrind", "--tool=callgrind", "--cache-sim=no", "--dump-line=no"]


def callgrind_total(path):
    """The total instruction count (Ir) of a callgrind profile, all threads."""
    with open(path) as f:
        for line in f:
            if line.startswith(("summary:", "totals:")):
                return int(line.split()[1])
    raise RuntimeError(f"{path}: no totals line")


def lvol_spdk_note():
    """Why this run has no SPDK lvol figures."""
    d = os.environ.get("SPDK_DIR")
    if not d:
        return "SPDK_DIR is not set: no SPDK lvol figures in this run."
    return (f"SPDK_DIR={d} is set, but this section's client is libblkio, whose vhost-user driver "
            "(virtio-driver 0.6) requires the CONFIGURE_MEM_SLOTS protocol feature that SPDK 23.01's rte_vhost "
            "does not offer (fp-load --hugetlb drives SPDK, bench.py --spdk; not used here yet); no SPDK lvol "
            "figures in this run.")


# ---------------------------------------------------------------------------------------------
# Summaries

METRICS = ["iops", "mbps", "lat_mean_ns", "p50_ns", "p99_ns", "p999_ns", "server_cpu_ns_per_io",
           "server_cpu_stat_ns_per_io", "server_cores", "reactor_busy_ns_per_io",
           "client_busy_ns_per_io", "client_busy_frac", "completions_per_wakeup",
           "completions_per_notification", "server_requests_per_notification", "server_kicks_per_io", "client_kicks_per_io",
           "server_wakeups_per_io", "client_wakeups_per_io", "client_calls_per_io", "notifications_per_io",
           "server_syscalls_per_io", "server_writes_per_io"]


def summarize(runs):
    med = {}
    for m in METRICS:
        vals = [r.get(m) for r in runs]
        if any(v is not None for v in vals):
            med[m] = median(vals)
    fr = [r["reactor_busy_frac"] for r in runs if "reactor_busy_frac" in r]
    if fr:
        med["reactor_busy_frac"] = {k: median([f[k] for f in fr]) for k in fr[0]}
    return med


def merge_hists(runs):
    buckets = {}
    count = 0
    for r in runs:
        h = r.get("histogram")
        if not h:
            continue
        count += h["count"]
        for low, high, c in h["buckets"]:
            buckets[(low, high)] = buckets.get((low, high), 0) + c
    return {"unit": "ns", "count": count,
            "buckets": [[lo, hi, c] for (lo, hi), c in sorted(buckets.items())]}


def point_key(backend, point):
    pattern, bs, qd, queues, poll = point
    return {"backend": backend, "pattern": pattern, "bs": bs, "qd": qd, "queues": queues,
            "client": "poll" if poll else "fd"}


def point_label(p):
    return f"{p['backend']} {p['pattern']} {p['bs'] // 1024}K qd{p['qd']} q{p['queues']} {p['client']}"


def point_id(p):
    """A measured point's identity, server included, for set comparisons."""
    return (p["server"], p["backend"], p["pattern"], p["bs"], p["qd"], p["queues"], p["client"])
