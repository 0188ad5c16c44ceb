"""The vhost-user floor: bench/vhost_floor.c, a vhost-user-blk back end that does the least a
back end must do per request (walk the split ring's chain through the one memory region, read
the request header, write the status byte and the used element, publish used->idx; a null disk,
nothing copied) on one busy-polling thread, with a reactor's busy accounting. Driven by the
same client as flashpath and SPDK (fp-load's own frontend over huge pages), what a target's
reactor spends per I/O above it is its own work; what the floor spends is the cache lines the
ring shares with the client's core. Built with the machine's C compiler into the run's work
directory.
"""

import os
import re
import signal
import struct

from fpbench.common import run, wait_for
from fpbench.servers import spawn, stop

SOURCE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "vhost_floor.c")
LISTENING = re.compile(r"vhost_floor: listening on ")
# The stats file's head: busy ticks, idle ticks, requests completed, ticks per second.
STATS = struct.Struct("<4Q")


C2C_SOURCE = os.path.join(os.path.dirname(SOURCE), "c2c.c")


def build_c2c(work):
    """bench/c2c.c compiled into `work`; the binary's path."""
    out = os.path.join(work, "c2c")
    run(["cc", "-O2", "-Wall", "-pthread", "-o", out, C2C_SOURCE], 120)
    return out


def c2c_ns(binary):
    """One cache line's round trip between CPU 0 and CPU 1 now, in ns (c2c's 200,000 round
    trips, tens of ms): which of its speeds the host gives the two vCPUs at the moment, since a
    vhost-user request's cost follows it."""
    return float(run([binary], 60).stdout.strip())


def build_vhost_floor(work):
    """bench/vhost_floor.c compiled into `work`; the binary's path."""
    out = os.path.join(work, "vhost_floor")
    run(["cc", "-O2", "-Wall", "-pthread", "-o", out, SOURCE], 120)
    return out


class VhostFloor:
    """vhost_floor on `cpu` serving a null disk of `blocks` 512-byte sectors on the socket
    `sock`, one client at a time. It polls its core whenever a client is connected (and blocks
    in accept or on the control socket otherwise); like SPDK it is paused (SIGSTOP) outside its
    own runs in the SPDK section. `variant`: the floor's options for what flashpath does beyond
    the textbook (`--lazy-calls`, `--predict`; see bench/vhost_floor.c)."""
    kind = "vfloor"

    def __init__(self, binary, work, cpu, blocks, name="vfloor", variant=()):
        self.name = name
        self.dir = os.path.join(work, name)
        os.makedirs(self.dir, exist_ok=True)
        self.sock = os.path.join(self.dir, "vhost.sock")
        self.stats_path = os.path.join(self.dir, "stats")
        self.cmd = ["taskset", "-c", str(cpu), binary, "--socket", self.sock, "--blocks", str(blocks),
                    "--stats", self.stats_path] + list(variant)
        self.log = os.path.join(self.dir, "vhost_floor.log")
        self.proc = spawn(self.cmd, self.log)
        self.pid = self.proc.pid
        self.paused = False
        wait_for(self._listening, 10, "vhost_floor", self.proc)

    def _listening(self):
        with open(self.log) as f:
            return LISTENING.search(f.read()) is not None

    def stats(self):
        """The counters as the floor last stored them: busy_ticks, idle_ticks, requests, tick_hz."""
        with open(self.stats_path, "rb") as f:
            busy, idle, requests, hz = STATS.unpack(f.read(STATS.size))
        return {"busy_ticks": busy, "idle_ticks": idle, "requests": requests, "tick_hz": hz}

    def reactors(self):
        """Its one polling thread's busy and idle time in ns, as the servers' reactors report theirs."""
        s = self.stats()
        hz = s["tick_hz"] or 1
        return {0: {"busy": s["busy_ticks"] * 1e9 / hz, "idle": s["idle_ticks"] * 1e9 / hz, "sleeps": 0}}

    def pause(self):
        """Freezes the floor (SIGSTOP): it would poll a whole core through the other servers' runs
        if a client were connected, and must not take the core from them."""
        os.kill(self.pid, signal.SIGSTOP)
        self.paused = True

    def resume(self):
        os.kill(self.pid, signal.SIGCONT)
        self.paused = False

    def stop(self):
        if self.proc.poll() is None:
            self.resume()  # a stopped process would not act on SIGTERM
        stop(self.proc)
