"""SPDK's NVMe initiator benchmark, spdk_nvme_perf (a built SPDK tree's build/examples/perf), as
the client of any NVMe/TCP target: one run, the server measured around its I/O phase only.

perf prints "Initialization complete. Launching workers." when its I/O starts and a line of
"=" when it stops (run under `stdbuf -oL` so that each line arrives when printed): the
server's CPU time, its reactor counters and (in traced runs) its system calls are read at
those two lines, so the client's start (DPDK's setup, the connect) is left out, which matters
for a target that polls its core whether or not there is work. With -L perf ends with its
latency summary (percentiles from its own histogram); the figures read here are its "Total"
line (IOPS, MiB/s, mean) and the 50th, 99th and 99.9th percentiles.
"""

import os
import re
import subprocess
import time

from fpbench.common import proc_cpu
from fpbench.servers import CHILDREN

PERF = ("build", "examples", "perf")
START_LINE = "Launching workers."
# "Total   :   36558.49   142.81   875.54   45.82   39572.22" (IOPS, MiB/s, mean, min, max in µs)
TOTAL_RX = re.compile(r"^Total\s*:\s*([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s*$")
# " 50.00000% :   103.975us"
PCT_RX = re.compile(r"^\s*([\d.]+)%\s*:\s*([\d.]+)us\s*$")
PERF_MEM_MIB = 256  # perf's DPDK memory (-s), from huge pages


def perf_path(spdk_dir):
    return os.path.join(spdk_dir, *PERF)


# perf sends an empty HOSTNQN unless the transport ID names one; both targets let an empty one
# reach a subsystem open to any host, but a named host is what real initiators send (Linux's
# always does): the same one for both targets.
HOSTNQN = "nqn.2014-08.io.flashpath:fpbench-host"


def trid(port, nqn):
    return f"trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:{port} subnqn:{nqn} hostnqn:{HOSTNQN}"


def perf_cmd(spdk_dir, cpu, port, nqn, pattern, bs, qd, secs):
    """perf's command line; `secs` a whole number of seconds (perf's -t takes nothing else)."""
    return ["taskset", "-c", str(cpu), "stdbuf", "-oL", perf_path(spdk_dir), "-q", str(qd), "-o", str(bs),
            "-w", pattern, "-t", str(secs), "-c", hex(1 << cpu), "-s", str(PERF_MEM_MIB), "-L",
            "-r", trid(port, nqn)]


def parse(text):
    """perf's figures from its output: iops, mbps (MB/s), lat_mean_ns, p50/p99/p999_ns, lat_max_ns."""
    total, pct = None, {}
    for line in text.splitlines():
        m = TOTAL_RX.match(line)
        if m:
            total = [float(x) for x in m.groups()]
        m = PCT_RX.match(line)
        if m:
            pct[float(m.group(1))] = float(m.group(2)) * 1000.0
    if total is None:
        return None
    iops, mibs, mean, _lo, hi = total
    return {"iops": iops, "mbps": mibs * (1 << 20) / 1e6, "lat_mean_ns": mean * 1000.0, "lat_max_ns": hi * 1000.0,
            "p50_ns": pct.get(50.0), "p99_ns": pct.get(99.0), "p999_ns": pct.get(99.9)}


def perf_run(spdk_dir, cpu, port, nqn, pattern, bs, qd, secs, server, counter=None):
    """One perf run against `server` (pid, and `reactors()` if it has one); `counter`: a
    SyscallCounter whose window is the I/O phase. The figures, and per I/O: the server's CPU
    time (utime + stime of /proc/PID/stat, and schedstat's), reactor busy time, system calls.
    Per I/O means the server's rate over the I/O phase divided by perf's IOPS."""
    secs = max(1, round(secs))
    cmd = perf_cmd(spdk_dir, cpu, port, nqn, pattern, bs, qd, secs)
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True)
    CHILDREN.append(p)
    lines, c0, c1, r0, r1, t0, t1, calls = [], None, None, None, None, None, None, None
    reactors = getattr(server, "reactors", None)
    try:
        for line in p.stdout:
            lines.append(line)
            if c0 is None and START_LINE in line:
                # The reactor counters first (one RPC, a few ms of a run of seconds), then the
                # window's start.
                r0 = reactors() if reactors else None
                if counter:
                    counter.start()
                t0, c0 = time.monotonic(), proc_cpu(server.pid)
            elif c0 is not None and c1 is None and line.startswith("====="):
                t1, c1 = time.monotonic(), proc_cpu(server.pid)
                if counter:
                    calls = counter.stop()
                r1 = reactors() if reactors else None
        p.wait(timeout=secs + 60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(5)
    out = "".join(lines)
    r = parse(out)
    if p.returncode != 0 or r is None or c1 is None or not r["iops"]:
        raise RuntimeError(f"spdk_nvme_perf against {server.name} (port {port}) failed with status "
                           f"{p.returncode}: {' '.join(cmd)}\n{out.strip()[-1500:]}")
    window = t1 - t0
    io_rate = r["iops"]
    ios = io_rate * window
    r.update({"secs": secs, "window_s": window, "ios": ios,
              "server_cpu_stat_ns": c1["stat_ns"] - c0["stat_ns"], "server_cpu_ns": c1["sched_ns"] - c0["sched_ns"]})
    r["server_cpu_ns_per_io"] = r["server_cpu_stat_ns"] / ios
    r["server_cpu_sched_ns_per_io"] = r["server_cpu_ns"] / ios
    r["server_core_share"] = r["server_cpu_ns"] / (window * 1e9)
    # Time the server was runnable but not running (another process had its core): a run
    # where this is more than a few % measured the machine's load, not the server.
    r["server_wait_share"] = (c1["wait_ns"] - c0["wait_ns"]) / (window * 1e9)
    if r0 is not None:
        busy = sum(r1[k]["busy"] - r0[k]["busy"] for k in r1 if k in r0)
        r["reactor_busy_ns_per_io"] = busy / ios
    if calls is not None:
        r["syscalls"] = calls
        r["syscalls_per_io"] = calls["total"] / ios
    return r
