"""The vhost-user floor (bench/vhost_floor.c) against fp-load's own frontend, the client of the
SPDK section: it builds with the machine's C compiler, serves polled reads at QD1 and mixed
reads and writes at QD32 and with completion notifications, counts exactly the requests the
client sent (and busy time for them), takes a second client after the first one leaves, and
drops a client that sends what it does not serve while it keeps serving the next one.
Needs a built fp-load in `FLASHPATH_BIN_DIR` (default target/debug) and a few 2 MiB huge pages
(reserved here as root and given back afterwards):
`cd bench && FLASHPATH_BIN_DIR=../target/debug python3 -m unittest fpbench.tests_vhost_floor` (seconds).
"""

import os
import shutil
import socket
import struct
import tempfile
import unittest

from fpbench.common import wait_for
from fpbench.load import Loader
from fpbench.servers import kill_all_children
from fpbench.vhost_floor import VhostFloor, build_vhost_floor

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN_DIR = os.environ.get("FLASHPATH_BIN_DIR") or os.path.join(ROOT, "target", "debug")
BLOCKS = 1 << 20  # 512 MiB of 512-byte sectors
PAGES = 8  # 2 MiB huge pages: one fp-load run's region needs one or two
NR_HUGEPAGES = "/proc/sys/vm/nr_hugepages"
CLIENT = ("--hugetlb",)
SECS = 0.5


def _free_huge_pages():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("HugePages_Free:"):
                return int(line.split()[1])
    return 0


class VhostFloorTest(unittest.TestCase):
    def setUp(self):
        if not os.access(os.path.join(BIN_DIR, "fp-load"), os.X_OK):
            if os.environ.get("FLASHPATH_BIN_DIR"):
                self.fail(f"FLASHPATH_BIN_DIR={BIN_DIR} has no fp-load")
            self.skipTest(f"no built fp-load in {BIN_DIR} (set FLASHPATH_BIN_DIR)")
        if shutil.which("cc") is None:
            self.skipTest("no C compiler (cc)")
        if _free_huge_pages() < PAGES:
            if os.geteuid() != 0:
                self.skipTest(f"fewer than {PAGES} free 2 MiB huge pages, and not root to reserve them")
            with open(NR_HUGEPAGES) as f:
                before = int(f.read())
            self.addCleanup(self._set_pages, before)
            self._set_pages(before + PAGES - _free_huge_pages())
            if _free_huge_pages() < PAGES:
                self.skipTest(f"could not reserve {PAGES} huge pages (memory fragmented)")
        self.work = tempfile.mkdtemp(prefix="fp-vfloor-")
        self.addCleanup(shutil.rmtree, self.work, True)
        self.addCleanup(kill_all_children)
        self.floor = VhostFloor(build_vhost_floor(self.work), self.work, 0, BLOCKS)
        self.addCleanup(self.floor.stop)
        self.loader = Loader(BIN_DIR, 1, self.work)

    @staticmethod
    def _set_pages(n):
        with open(NR_HUGEPAGES, "w") as f:
            f.write(str(n))

    def _run(self, pattern, qd, poll):
        """One fp-load run; its result, and the floor's counters' change over it."""
        s0 = self.floor.stats()
        r = self.loader.run(self.floor.sock, pattern, 4096, qd, 1, poll, SECS, extra=CLIENT)
        s1 = self.floor.stats()
        what = f"{pattern} QD{qd} {'poll' if poll else 'fd'}"
        self.assertEqual(r["errors"], 0, f"{what}: {r.get('first_error')}")
        self.assertGreater(r["ios"], 0, f"{what}: nothing completed")
        d = {k: s1[k] - s0[k] for k in ("busy_ticks", "requests")}
        # The client's I/Os and its probe read before them; at most a queue's worth more, the
        # requests still in flight when its timer ended (completed, not counted as its I/Os).
        self.assertGreaterEqual(d["requests"], r["ios"] + 1, what)
        self.assertLessEqual(d["requests"], r["ios"] + 1 + qd, what)
        self.assertGreater(d["busy_ticks"], 0, what)
        return r, d

    def test_serves_fp_loads_frontend_polled_and_notified(self):
        self.assertGreater(self.floor.stats()["tick_hz"], 0)
        for pattern, qd, poll in (("randread", 1, True), ("randrw", 32, True), ("randrw", 1, False)):
            r, _ = self._run(pattern, qd, poll)
            # It asks for no kicks (a polling back end), in both client modes.
            self.assertEqual(r.get("kicks"), 0, f"{pattern} QD{qd}")
            if pattern == "randrw":
                self.assertGreater(r["reads"], 0)
                self.assertGreater(r["writes"], 0)
        busy = self.floor.reactors()[0]["busy"]
        self.assertGreater(busy, 0)

    def _raw_client(self):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(10)
        s.connect(self.floor.sock)
        return s

    def _dropped(self, n):
        with open(self.floor.log) as f:
            return f.read().count("dropping the client") >= n

    def test_a_bad_message_drops_the_client_and_the_floor_serves_on(self):
        self._run("randread", 1, True)
        # An answered request first (GET_FEATURES: version 1, no payload), then one the floor
        # does not serve (RESET_OWNER), then a GET_CONFIG whose size disagrees with its payload.
        s = self._raw_client()
        s.sendall(struct.pack("<3I", 1, 1, 0))
        hdr = s.recv(12, socket.MSG_WAITALL)
        self.assertEqual(struct.unpack("<3I", hdr)[:2], (1, 1 | 4))
        features, = struct.unpack("<Q", s.recv(8, socket.MSG_WAITALL))
        self.assertTrue(features & (1 << 32) and features & (1 << 30), hex(features))
        s.sendall(struct.pack("<3I", 4, 1, 0))
        self.assertEqual(s.recv(1), b"", "the floor closes the client's socket")
        s.close()
        wait_for(lambda: self._dropped(1), 10, "the first drop", self.floor.proc)
        s = self._raw_client()
        s.sendall(struct.pack("<3I3I", 24, 1, 12, 0, 200, 0))
        self.assertEqual(s.recv(1), b"")
        s.close()
        wait_for(lambda: self._dropped(2), 10, "the second drop", self.floor.proc)
        # A message header cut short, then the client gone.
        s = self._raw_client()
        s.sendall(b"\x01\x00")
        s.close()
        # Next clients, one after another: all served.
        self._run("randread", 1, True)
        self._run("randwrite", 32, True)
        self.assertIsNone(self.floor.proc.poll(), "the floor is still running")


if __name__ == "__main__":
    unittest.main()
