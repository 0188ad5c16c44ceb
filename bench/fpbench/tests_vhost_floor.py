"""The vhost-user floor (bench/vhost_floor.c) against fp-load's own frontend, the client of the
SPDK section: it builds with the machine's C compiler, serves polled reads at QD1 and mixed
reads and writes at QD32 and with completion notifications, counts exactly the requests the
client sent (and busy time for them), takes a second client after the first one leaves, and
drops a client that sends what it does not serve while it keeps serving the next one. Also the
SPDK section's floor figures (its rows, the busy/IO multiples, the QD1 target's note, --validate
of results with and without the floor), without a daemon.
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
from fpbench.load import Loader, point_key
from fpbench.modes import mode_config
from fpbench.report_spdk import spdk_markdown, spdk_targets
from fpbench.sections.spdk import floor_ratios, paired_ratios, spdk_ratios
from fpbench.validate import validate_spdk
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


def _server(iops, busy_ns, reactor=True):
    md = {"iops": iops, "p50_ns": 1e9 / iops, "p99_ns": 2e9 / iops, "server_cpu_ns_per_io": 2 * busy_ns,
          "completions_per_wakeup": 1.5}
    if reactor:
        md["reactor_busy_ns_per_io"] = busy_ns
    return {"runs": [dict(md)], "median": md}


def _spdk_result(floor=True):
    """A smoke run's SPDK section on the null disk: flashpath busy 170 ns per I/O, SPDK 200 ns,
    the floor (polled points only, when `floor`) 100 ns and the guessing floor 85 ns."""
    sc = mode_config("smoke")["spdk"]
    points = []
    for pt in sc["points"]:
        e = dict(point_key("null", pt), servers={
            "flashpath": _server(300_000, 170), "qsd": _server(200_000, 250, False), "spdk": _server(250_000, 200)})
        if floor and pt[4]:
            e["servers"]["floor"] = _server(400_000, 100)
            e["servers"]["floor_guess"] = _server(500_000, 85)
        e["ratios"] = spdk_ratios(e)
        if "floor" in e["servers"]:
            e["floor_ratios"] = floor_ratios(e)
        points.append(e)
    spdk = {"dir": "/spdk", "config": sc, "client": "fp-load --hugetlb", "points": points, "backends": ["null"],
            "version": "SPDK v23.01.1"}
    if floor:
        spdk["floor"] = {"source": "bench/vhost_floor.c", "backends": ["null"], "clients": ["poll"],
                         "variants": {"floor": [], "floor_guess": ["--predict"]}}
    return {"spdk": spdk, "meta": {"server_cpu": 0, "client_cpu": 1}}, sc


class SpdkFloorReportTest(unittest.TestCase):
    def test_floor_rows_multiples_and_the_qd1_target_note(self):
        res, _ = _spdk_result()
        p = res["spdk"]["points"][0]
        self.assertAlmostEqual(p["floor_ratios"]["flashpath"], 1.7)
        self.assertAlmostEqual(p["floor_ratios"]["spdk"], 2.0)
        self.assertAlmostEqual(p["floor_ratios"]["flashpath_guess"], 2.0)
        text = "\n".join(spdk_markdown(res))
        self.assertIn("| null 4K randread QD1 poll | floor | 400.0 K (0 %) |", text)
        self.assertIn("| null 4K randread QD1 poll | floor_guess | 500.0 K (0 %) |", text)
        self.assertIn("| null 4K randread QD1 poll | 400.0 K | 100 | 85 | 170 | 1.70 | 2.00 | 200 | 2.00 |", text)
        self.assertNotIn("QD1 fd | floor", text)
        got = {}
        spdk_targets(res, lambda name, goal, measured, ok: got.__setitem__(name, (measured, ok)))
        measured, ok = got["SPDK peer, QD1 polled: reactor busy time per I/O <= 0.8x SPDK's"]
        self.assertIs(ok, False)
        self.assertIn("floor 100 ns: flashpath at 1.70x the floor, SPDK at 2.00x", measured)

    def test_rounds_are_compared_pairwise_where_medians_mix_the_hosts_speeds(self):
        # Three rounds: the host fast (c2c 150 ns) in rounds 1 and 3, slow (400 ns) in round 2 for
        # flashpath only. The medians pair flashpath's slow round with SPDK's fast one; the rounds
        # do not.
        def runs(busy, c2c):
            return {"runs": [{"reactor_busy_ns_per_io": b, "c2c_ns": c} for b, c in zip(busy, c2c)]}
        e = {"servers": {"flashpath": runs([150, 500, 160], [150, 400, 150]),
                         "spdk": runs([200, 190, 205], [150, 150, 150]),
                         "qsd": runs([None] * 3, [150, 150, 150]),
                         "floor": runs([130, 140, 135], [150, 150, 150])}}
        for v in e["servers"].values():
            busy = [r["reactor_busy_ns_per_io"] for r in v["runs"] if r["reactor_busy_ns_per_io"] is not None]
            v["median"] = {"iops": 1e6, "reactor_busy_ns_per_io": sorted(busy)[1] if busy else None}
        self.assertAlmostEqual(spdk_ratios(e)["reactor_busy_per_io"], 160 / 200)
        pr = paired_ratios(e)
        self.assertEqual([round(x, 3) for x in pr["busy_fp_spdk"]["rounds"]], [0.75, round(500 / 190, 3), 0.78])
        self.assertAlmostEqual(pr["busy_fp_spdk"]["median"], 160 / 205)
        self.assertAlmostEqual(pr["busy_floor_spdk"]["median"], 135 / 205)
        self.assertEqual(pr["c2c_ns"][1], {"flashpath": 400, "spdk": 150, "qsd": 150, "floor": 150})
        res, _ = _spdk_result()
        p = res["spdk"]["points"][0]
        p["servers"] = e["servers"]
        p["paired"] = pr
        p["floor_ratios"] = floor_ratios(p)
        text = "\n".join(spdk_markdown(res))
        self.assertIn("| null 4K randread QD1 poll | 2 | 400 / 150 / 150 | 2.63 |", text)
        self.assertIn("| null 4K randread QD1 poll | median | | **0.78** |", text)
        got = {}
        spdk_targets(res, lambda name, goal, measured, ok: got.__setitem__(name, measured))
        self.assertIn("round by round 0.78x (0.75, 2.63, 0.78), the floor 0.66x SPDK's",
                      got["SPDK peer, QD1 polled: reactor busy time per I/O <= 0.8x SPDK's"])

    def test_validate_takes_results_with_and_without_the_floor(self):
        res, sc = _spdk_result()
        self.assertEqual(validate_spdk(res, sc), [])
        old, _ = _spdk_result(floor=False)
        self.assertEqual(validate_spdk(old, sc), [])
        self.assertNotIn("floor", "\n".join(spdk_markdown(old)).split("| workload | IOPS fp/SPDK")[1])
        got = {}
        spdk_targets(old, lambda name, goal, measured, ok: got.__setitem__(name, measured))
        self.assertNotIn("floor", got["SPDK peer, QD1 polled: reactor busy time per I/O <= 0.8x SPDK's"])
        # A run that had the floor must have it at each polled null point, with its multiples.
        del res["spdk"]["points"][0]["servers"]["floor"]
        del res["spdk"]["points"][0]["floor_ratios"]
        problems = validate_spdk(res, sc)
        self.assertIn("spdk null randread 4K qd1 q1 poll floor: 0 runs, want 1", problems)
        self.assertIn("spdk null randread 4K qd1 q1 poll: no busy/IO ratio of flashpath to the floor", problems)
        self.assertIn("spdk null randread 4K qd1 q1 poll: no busy/IO ratio of flashpath to the guessing floor",
                      problems)
        del res["spdk"]["points"][0]["servers"]["floor_guess"]
        self.assertIn("spdk null randread 4K qd1 q1 poll floor_guess: 0 runs, want 1", validate_spdk(res, sc))


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

    def test_its_variants_serve_the_same_requests(self):
        # The lazy call decision and the guessed prefetches change no answer: every request
        # completes, a polled client and one that waits on its completion fd alike.
        for variant in (("--predict",), ("--lazy-calls",), ("--predict", "--lazy-calls")):
            self.floor.stop()
            self.floor = VhostFloor(self.floor.cmd[3], self.work, 0, BLOCKS, name="v" + "".join(variant),
                                    variant=variant)
            self.addCleanup(self.floor.stop)
            for pattern, qd, poll in (("randread", 1, True), ("randrw", 32, True), ("randrw", 1, False)):
                r, _ = self._run(pattern, qd, poll)
                self.assertEqual(r.get("kicks"), 0, f"{variant} {pattern} QD{qd}")

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
        # A memory table whose region runs past its file's end (it would fault when touched).
        fd = os.memfd_create("vfloor-test")
        os.ftruncate(fd, 4096)
        s = self._raw_client()
        socket.send_fds(s, [struct.pack("<3I2I4Q", 5, 1, 40, 1, 0, 0, 1 << 20, 0, 0)], [fd])
        os.close(fd)
        self.assertEqual(s.recv(1), b"")
        s.close()
        wait_for(lambda: self._dropped(3), 10, "the third drop", self.floor.proc)
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
