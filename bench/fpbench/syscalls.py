"""System calls a server makes over a window, counted per system call without timing them:
perf's syscall tracepoints (counting only, the cheapest way to see them) where perf works,
else strace -c (ptrace stops the server at every call, so its rate drops; the counts per I/O
are what the section reports, not the rate). The window is opened and closed by the caller
(`start()` / `stop()`) around the client's I/O phase.
"""

import errno
import os
import re
import select
import shutil
import signal
import subprocess
import tempfile
import time

TRACEFS = ("/sys/kernel/tracing/events/syscalls", "/sys/kernel/debug/tracing/events/syscalls")
# The calls a polled NVMe/TCP target can make per I/O or per poll, counted one by one; the
# total (raw_syscalls:sys_enter) covers every other call as "other". One event per call keeps
# perf's start short (all ~350 syscalls:sys_enter_* tracepoints take ~20 s to open).
NAMED = ("read", "write", "readv", "writev", "recvfrom", "recvmsg", "recvmmsg", "sendto", "sendmsg",
         "sendmmsg", "epoll_wait", "epoll_pwait", "epoll_pwait2", "poll", "ppoll", "io_uring_enter",
         "accept", "accept4", "futex", "nanosleep", "clock_nanosleep", "sched_yield", "getrusage",
         "ioctl", "setsockopt", "getsockopt")


def tracefs():
    for d in TRACEFS:
        if os.path.isdir(d):
            return d
    return None


def method():
    """How this machine counts: "perf", "strace" or None, with the reason for None."""
    if shutil.which("perf") and tracefs():
        probe = subprocess.run(["perf", "stat", "-x,", "-e", "raw_syscalls:sys_enter", "--", "true"],
                               capture_output=True, text=True, timeout=30)
        if probe.returncode == 0:
            return "perf", None
    if shutil.which("strace"):
        return "strace", None
    return None, "neither perf (with the syscall tracepoints) nor strace works here"


class SyscallCounter:
    """Counts the system calls of every thread of `pid` between `start()` and `stop()`."""

    def __init__(self, pid, how, work):
        self.pid = pid
        self.how = how
        self.dir = tempfile.mkdtemp(prefix="syscalls.", dir=work)
        self.out = os.path.join(self.dir, "counts")
        self.proc = None
        if how == "perf":
            td = tracefs()
            events = ["raw_syscalls:sys_enter"] + [f"syscalls:sys_enter_{n}" for n in NAMED
                                                   if os.path.isdir(os.path.join(td, f"sys_enter_{n}"))]
            self.ctl = os.path.join(self.dir, "ctl")
            self.ack = os.path.join(self.dir, "ack")
            os.mkfifo(self.ctl)
            os.mkfifo(self.ack)
            # -D -1: the events start disabled; "enable" / "disable" on the control fifo bound
            # the window exactly (perf answers each with "ack").
            self.proc = subprocess.Popen(
                ["perf", "stat", "-x,", "-D", "-1", "--control", f"fifo:{self.ctl},{self.ack}",
                 "-o", self.out, "-e", ",".join(events), "-p", str(pid)],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            # Non-blocking opens, so that a perf that fails early cannot hang the run: the ack
            # fifo first (perf's own open of it for writing waits for a reader), then the
            # control fifo once perf holds it open (it opens it read-write).
            self.ack_fd = os.open(self.ack, os.O_RDONLY | os.O_NONBLOCK)
            deadline = time.monotonic() + 60
            while True:
                try:
                    self.ctl_fd = os.open(self.ctl, os.O_WRONLY | os.O_NONBLOCK)
                    break
                except OSError as e:
                    if e.errno != errno.ENXIO:
                        raise
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"perf stat -p {pid} did not start: {self.proc.stderr.read().strip()[-500:]}")
                time.sleep(0.02)

    def _command(self, cmd):
        os.write(self.ctl_fd, (cmd + "\n").encode())
        got = b""
        deadline = time.monotonic() + 30
        # perf writes "ack\n" and the string's terminating NUL.
        while b"\n" not in got:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"perf stat did not acknowledge {cmd!r} (got {got!r})")
            ready, _, _ = select.select([self.ack_fd], [], [], 0.1)
            if ready:
                chunk = os.read(self.ack_fd, 64)
                if not chunk:  # no writer yet (perf opens the ack fifo after the control fifo)
                    time.sleep(0.02)
                got += chunk
        if got.strip(b"\0 \n") != b"ack":
            raise RuntimeError(f"perf stat answered {got!r} to {cmd!r}")

    def start(self):
        if self.how == "perf":
            self._command("enable")
        else:
            self.proc = subprocess.Popen(["strace", "-c", "-f", "-q", "-o", self.out, "-p", str(self.pid)],
                                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                         stderr=subprocess.PIPE, text=True)

    def stop(self):
        """Closes the window; {"total": n, "calls": {name: n}} (names of calls seen at least once)."""
        if self.how == "perf":
            self._command("disable")
        self.proc.send_signal(signal.SIGINT)
        _, err = self.proc.communicate(timeout=60)
        if self.how == "perf":
            os.close(self.ctl_fd)
            os.close(self.ack_fd)
        with open(self.out) as f:
            text = f.read()
        shutil.rmtree(self.dir, ignore_errors=True)
        counts = parse_perf(text) if self.how == "perf" else parse_strace(text)
        if counts is None:
            raise RuntimeError(f"{self.how}: no counts for pid {self.pid}: {err.strip()[-500:]}")
        return counts


def parse_perf(text):
    """perf stat -x, output: "count,unit,event,..." lines."""
    total, calls = None, {}
    for line in text.splitlines():
        f = line.split(",")
        if len(f) < 3 or not f[0].strip().isdigit():
            continue
        n, event = int(f[0]), f[2]
        if event == "raw_syscalls:sys_enter":
            total = n
        elif event.startswith("syscalls:sys_enter_") and n:
            calls[event[len("syscalls:sys_enter_"):]] = n
    if total is None:
        return None
    # The events are enabled one after the other, so the total and the named counts can differ
    # by a few hundred calls out of hundreds of thousands: "other" only when it is clearly more.
    other = total - sum(calls.values())
    if other > 0:
        calls["other"] = other
    return {"total": total, "calls": calls}


STRACE_ROW = re.compile(r"^\s*[\d.]+\s+[\d.]+\s+\d+\s+(\d+)\s+(?:\d+\s+)?(\w+)\s*$")


def parse_strace(text):
    """strace -c's table: % time, seconds, usecs/call, calls, [errors,] syscall; the total row."""
    calls, total = {}, None
    for line in text.splitlines():
        m = STRACE_ROW.match(line)
        if not m:
            continue
        if m.group(2) == "total":
            total = int(m.group(1))
        else:
            calls[m.group(2)] = int(m.group(1))
    if total is None:
        return None
    return {"total": total, "calls": calls}
