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
