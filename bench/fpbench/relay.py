"""A TCP relay in the bench's own process: one NVMe/TCP path the paths section can break.

It listens on a loopback port of its own and copies every connection to the target's port,
both ways, one thread per direction. `cut()` closes every connection and the listening socket
(a host's reconnect is refused: nothing listens); `stall()` keeps every connection (and
accepts new ones) but forwards nothing either way, a path that "accepts the connection then
stalls", which only a timeout on the host notices; `restore()` listens again on the same port
and forwards again (a stalled connection still open resumes where it stopped, as a network
that heals does). Every wait is bounded: the threads poll their sockets with a short timeout
and look at the relay's state between polls.
"""

import select
import socket
import threading
import time

# How long a copying thread waits on its socket before it looks at the relay's state again:
# the delay with which a stall or a cut takes effect on a connection that has data moving.
POLL_S = 0.02
# Bytes a thread copies at a time (a 128 KiB H2CData PDU passes in a few reads).
CHUNK = 256 * 1024
# The longest a copying thread waits to hand data to a peer that does not read it.
SEND_S = 10.0
# How long stop() waits for each thread.
JOIN_S = 2.0


class Relay:
    """A relay from a port of its own on 127.0.0.1 (`port`) to 127.0.0.1:`to`."""

    def __init__(self, to):
        self.to = to
        self.lock = threading.Lock()
        self.stalled = False
        self.closed = False
        self.conns = []  # [client socket, upstream socket] pairs still open
        self.threads = []
        self.accepted = 0
        self.listener = self._listen(0)
        self.port = self.listener.getsockname()[1]
        self._start_acceptor()

    # -- control ---------------------------------------------------------------------------

    def cut(self):
        """Closes the listening socket and every connection: the path is gone, reconnects are
        refused."""
        with self.lock:
            lst, self.listener = self.listener, None
            conns, self.conns = self.conns, []
        if lst is not None:
            _close(lst)
        for pair in conns:
            for s in pair:
                _close(s)

    def stall(self):
        """Stops forwarding both ways on every connection, present and future; connections
        stay open and new ones are accepted (and held)."""
        with self.lock:
            self.stalled = True

    def restore(self):
        """Forwards again and, after a cut, listens again on the same port."""
        with self.lock:
            self.stalled = False
            relisten = self.listener is None and not self.closed
        if relisten:
            lst = self._listen(self.port)
            with self.lock:
                self.listener = lst
            self._start_acceptor()

    def stop(self):
        """Closes everything and waits (bounded) for the threads."""
        with self.lock:
            self.closed = True
        self.cut()
        for t in self.threads:
            t.join(JOIN_S)

    # -- inside ----------------------------------------------------------------------------

    @staticmethod
    def _listen(port):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
        s.listen(16)
        s.settimeout(POLL_S * 5)
        return s

    def _thread(self, target, *args):
        t = threading.Thread(target=target, args=args, daemon=True)
        self.threads.append(t)
        t.start()

    def _start_acceptor(self):
        self._thread(self._accept, self.listener)

    def _accept(self, lst):
        """Accepts on `lst` until it is closed (a cut or stop)."""
        while True:
            try:
                client, _ = lst.accept()
            except socket.timeout:
                with self.lock:
                    if self.listener is not lst:
                        return
                continue
            except OSError:
                return
            try:
                up = socket.create_connection(("127.0.0.1", self.to), timeout=5)
            except OSError:
                _close(client)
                continue
            for s in (client, up):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                # Bounds a send to a peer that stopped reading.
                s.settimeout(SEND_S)
            with self.lock:
                if self.listener is not lst:
                    # Cut while connecting: this connection is part of the lost path.
                    _close(client)
                    _close(up)
                    return
                self.conns.append([client, up])
                self.accepted += 1
            self._thread(self._pump, client, up)
            self._thread(self._pump, up, client)

    def _pump(self, src, dst):
        """Copies `src` to `dst` until either closes; forwards nothing while stalled."""
        while True:
            with self.lock:
                stalled = self.stalled
                alive = any(src in pair for pair in self.conns)
            if not alive:
                return
            if stalled:
                time.sleep(POLL_S)
                continue
            try:
                ready, _, _ = select.select([src], [], [], POLL_S)
                if not ready:
                    continue
                data = src.recv(CHUNK)
                if not data:
                    break
                dst.sendall(data)
            except (OSError, ValueError):
                break
        # One side ended: the connection is over, both ways.
        with self.lock:
            pair = next((p for p in self.conns if src in p), None)
            if pair is not None:
                self.conns.remove(pair)
        for s in (src, dst):
            _close(s)


def _close(s):
    try:
        s.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    try:
        s.close()
    except OSError:
        pass


# -- the relay in a process of its own -----------------------------------------------------------

# The relays' niceness: they stand for the network, not for anything measured, and the bench's
# machine is shared; a relay starved for a second made a keep-alive miss its timeout and reset
# the surviving path (root only; without the right the relay runs at the default).
NICE = -10


class RelayProcess:
    """A `Relay` in a child process (`python3 -m fpbench.relay PORT`), so that neither the
    bench's own polling nor its interpreter lock delays the copying: the same `port`, `cut()`,
    `stall()`, `restore()` and `stop()`, each a line on the child's stdin answered by a line.
    The child dies with the bench (its stdin closes)."""

    def __init__(self, to, timeout=10.0):
        import os
        import subprocess
        import sys
        from fpbench.servers import CHILDREN, die_with_the_bench
        here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        self.timeout = timeout
        self.proc = subprocess.Popen([sys.executable, "-m", "fpbench.relay", str(to)], cwd=here,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1,
                                     preexec_fn=die_with_the_bench)
        CHILDREN.append(self.proc)
        self.port = int(self._line())

    def _line(self):
        ready, _, _ = select.select([self.proc.stdout], [], [], self.timeout)
        line = self.proc.stdout.readline() if ready else ""
        if not line:
            raise RuntimeError(f"relay process: no answer in {self.timeout} s (exit {self.proc.poll()})")
        return line.strip()

    def _do(self, what):
        self.proc.stdin.write(what + "\n")
        self.proc.stdin.flush()
        got = self._line()
        if got != "ok":
            raise RuntimeError(f"relay process: {what}: {got}")

    def cut(self):
        self._do("cut")

    def stall(self):
        self._do("stall")

    def restore(self):
        self._do("restore")

    def stop(self):
        if self.proc.poll() is None:
            try:
                self._do("stop")
            except (OSError, RuntimeError):
                pass
            try:
                self.proc.wait(self.timeout)
            except Exception:
                self.proc.kill()


def _serve(to):
    """The child's side: a relay to `to`, its port on stdout, then one command a line."""
    import os
    import sys
    try:
        os.setpriority(os.PRIO_PROCESS, 0, NICE)
    except OSError:
        pass
    r = Relay(to)
    print(r.port, flush=True)
    for line in sys.stdin:
        cmd = line.strip()
        if cmd in ("cut", "stall", "restore"):
            getattr(r, cmd)()
        elif cmd == "stop":
            r.stop()
            print("ok", flush=True)
            return
        else:
            print(f"unknown command {cmd!r}", flush=True)
            continue
        print("ok", flush=True)
    r.stop()  # the bench went away


if __name__ == "__main__":
    import sys
    _serve(int(sys.argv[1]))
