"""Constants and small helpers shared by every part of the benchmark: logging,
subprocess runs, CPU-time readings of processes and threads, medians and ratios.
"""

import os
import statistics
import subprocess
import time


GIB = 1 << 30
MIB = 1 << 20


def log(msg):
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def note(section, text):
    """Records in a section's results why a part of it did not run or stopped, and logs it."""
    section["notes"].append(text)
    log(text)


def server_measured(problems, what, x, reps, metrics):
    """Whether a server's figures `x` at one point hold their `reps` runs; if so, also that each
    of `metrics` is a positive number in their median. What is wrong goes in `problems`, naming
    `what`; a caller goes on with its own checks only when this is true."""
    if not x or len(x["runs"]) != reps:
        problems.append(f"{what}: {len(x['runs']) if x else 0} runs, want {reps}")
        return False
    problems += [f"{what}: {m} = {x['median'].get(m)!r}" for m in metrics
                 if not isinstance(x["median"].get(m), (int, float)) or x["median"][m] <= 0]
    return True


def run(cmd, timeout, **kw):
    return subprocess.run(cmd, timeout=timeout, check=True, text=True, capture_output=True, **kw)


CLK_TCK = os.sysconf("SC_CLK_TCK")


def proc_cpu(pid):
    """CPU time of every thread of `pid`, in ns, two ways.

    `sched_ns`: the sum over /proc/PID/task/*/schedstat (nanosecond resolution; threads that
    exited between two samples are lost, which neither server does during a run).
    `stat_ns`: utime + stime of /proc/PID/stat (all threads, exited ones included, in clock
    ticks of 1/CLK_TCK s).
    `wait_ns`: the time the threads were runnable but waiting for a CPU (schedstat's second
    field, summed)."""
    sched = wait = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                fields = f.read().split()
            sched += int(fields[0])
            wait += int(fields[1])
        except (FileNotFoundError, ProcessLookupError):
            pass
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)
    return {"sched_ns": sched, "stat_ns": ticks * 1_000_000_000 // CLK_TCK, "wait_ns": wait}


def thread_cpu(pid):
    """CPU time (ns, schedstat) of each thread of `pid`, summed by thread name with its digits
    dropped (`msgr-worker-0` and `msgr-worker-1` count together): where a server's cycles go."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                name = "".join(ch for ch in f.read().strip() if not ch.isdigit()).strip("-_") or "?"
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                ns = int(f.read().split()[0])
        except (FileNotFoundError, ProcessLookupError):
            continue
        out[name] = out.get(name, 0) + ns
    return out


def machine_busy_ns():
    """CPU time all CPUs spent outside idle and iowait since boot (/proc/stat), in ns."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:9]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = v
    return (user + nice + system + irq + softirq + steal) * 1_000_000_000 // CLK_TCK


def steal_ticks():
    """Each CPU's steal time since boot (/proc/stat, clock ticks): time the hypervisor ran
    something else while this virtual CPU wanted to run."""
    out = {}
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith("cpu") and line[3].isdigit():
                v = line.split()
                out[v[0]] = int(v[8])
    return out


def steal_share(t0, t1, secs):
    """The largest share of one CPU stolen between two `steal_ticks` samples `secs` apart."""
    return max((t1[k] - t0[k]) / CLK_TCK / secs for k in t1) if secs else None


def own_cpu_ns():
    """CPU time of this process and its waited-for children (fp-load, fio, the RPC CLI)."""
    t = os.times()
    return int((t.user + t.system + t.children_user + t.children_system) * 1e9)


def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def ratio(a, b):
    if a is None or b is None or b == 0:
        return None
    return a / b


def wait_for(pred, timeout, what, proc=None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what}: the process exited with status {proc.returncode}")
        time.sleep(0.05)
    raise RuntimeError(f"{what}: not ready after {timeout} s")


def write_random_file(path, size):
    """A fully written (not sparse) file of random data, flushed to the device."""
    chunk = os.urandom(4 * MIB)
    with open(path, "wb") as f:
        left = size
        while left > 0:
            n = min(left, len(chunk))
            f.write(chunk[:n])
            # Vary the data a little so the blocks are not all one pattern.
            chunk = chunk[1:] + chunk[:1]
            left -= n
        f.flush()
        os.fsync(f.fileno())


def keyring_files(keydir, keys, daemons):
    """Writes each of `keys` ({name: text}) to its own file in `keydir` (0700; the files
    0600, as the keyring requires) and adds it to every daemon's keyring under its name."""
    os.makedirs(keydir, mode=0o700, exist_ok=True)
    for name, text in keys.items():
        path = os.path.join(keydir, name)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        for d in daemons:
            d.rpc("keyring_file_add_key", {"name": name, "path": path})
