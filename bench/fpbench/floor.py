"""The NVMe/TCP floor: bench/tcp_floor.c, a responder that speaks just enough NVMe/TCP for
SPDK's perf and flashpath's initiator to connect and read, answering each read with the PDUs
the targets send (one C2HData flagged SUCCESS) from a static buffer, with the target's kind of
system calls (non-blocking recv and one gathered sendmsg per connection per round, one polling
thread). What a target costs above it is its own work; what the floor costs is the kernel's TCP
path and the client's. Built with the machine's C compiler (scripts/install.sh installs
build-essential) into the run's work directory.
"""

import os
import re

from fpbench.common import run, wait_for
from fpbench.servers import spawn, stop

SOURCE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tcp_floor.c")
LISTEN_RX = re.compile(r"tcp_floor: listening on 127\.0\.0\.1:(\d+)")
# The floor's system calls: "poll" (flashpath's target: a recv on every connection each round)
# or "epoll" (SPDK's posix sock group: epoll_wait with timeout 0, recv on the ready ones).
MODES = ("poll", "epoll")


def build_floor(work):
    """bench/tcp_floor.c compiled into `work`; the binary's path."""
    out = os.path.join(work, "tcp_floor")
    run(["cc", "-O2", "-Wall", "-pthread", "-o", out, SOURCE], 120)
    return out


class Floor:
    """tcp_floor on `cpu` serving one namespace of `blocks` blocks of `block_size` bytes on
    127.0.0.1 (a free port of its own choosing, `port`). Any subsystem NQN reaches it. Not
    frozen between runs as SPDK is: after 200 µs without work it sleeps in epoll_wait."""
    kind = "floor"

    def __init__(self, binary, work, cpu, blocks, block_size=512, mode="poll", name="floor"):
        if mode not in MODES:
            raise ValueError(f"floor mode {mode!r}: one of {', '.join(MODES)}")
        self.name = name
        self.mode = mode
        self.dir = os.path.join(work, name)
        os.makedirs(self.dir, exist_ok=True)
        self.cmd = ["taskset", "-c", str(cpu), binary, "--port", "0", "--blocks", str(blocks),
                    "--block-size", str(block_size)] + (["--epoll"] if mode == "epoll" else [])
        self.log = os.path.join(self.dir, "tcp_floor.log")
        self.proc = spawn(self.cmd, self.log)
        self.pid = self.proc.pid
        self.port = None
        wait_for(self._listening, 10, "tcp_floor", self.proc)

    def _listening(self):
        with open(self.log) as f:
            m = LISTEN_RX.search(f.read())
        if m:
            self.port = int(m.group(1))
        return self.port is not None

    def stop(self):
        stop(self.proc)
