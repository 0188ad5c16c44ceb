"""The NVMe/TCP floor: the section's figures from it (distance from the floor, its rows and
targets in results.md, --validate of them), without a daemon; and the responder
(bench/tcp_floor.c) against flashpath's own NVMe/TCP initiator: it builds with the machine's C
compiler, `bdev_nvme_attach_controller` attaches to it, and reads of its namespace through a
vhost-user-blk export of that bdev (fp-load, one second each at QD1 and QD32) and writes of
4 KiB (in the capsule) and 64 KiB (after an R2T) all succeed, in both of its system call modes.
Needs a built flashpath and fp-load in `FLASHPATH_BIN_DIR` (default target/debug):
`cd bench && FLASHPATH_BIN_DIR=../target/debug python3 -m unittest fpbench.tests_floor` (seconds).
"""

import os
import shutil
import tempfile
import unittest

from fpbench.floor import MODES, Floor, build_floor
from fpbench.load import Loader, point_key
from fpbench.report_nvmf import nvmf_markdown, nvmf_targets, validate_nvmf
from fpbench.sections.nvmf import FLOOR_OF, FLOORS, POINTS, floor_distance, nvmf_ratios, paired_floor
from fpbench.servers import Flashpath, kill_all_children

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN_DIR = os.environ.get("FLASHPATH_BIN_DIR") or os.path.join(ROOT, "target", "debug")
BLOCKS = 1 << 20  # 512 MiB of 512-byte blocks


def _server(iops, mean_ns, cpu_ns, reactor=True):
    md = {"iops": iops, "lat_mean_ns": mean_ns, "p50_ns": mean_ns - 500, "p99_ns": 2 * mean_ns,
          "server_cpu_ns_per_io": cpu_ns, "iops_spread": 0.05}
    if reactor:
        md["reactor_busy_ns_per_io"] = cpu_ns / 2
    return {"runs": [dict(md)], "median": md}


def _result():
    """A smoke run's NVMe/TCP section on the null disk, all four servers (SPDK 0.5x flashpath's
    IOPS; flashpath at 0.8x its floor's IOPS and 2 µs above its mean latency)."""
    points = []
    for pt in POINTS:
        qd = pt[2]
        scale = 20 if qd == 32 else 1
        e = dict(point_key("null", pt), servers={
            "flashpath": _server(80_000 * scale, 12_000, 3_000),
            "spdk": _server(40_000 * scale, 15_000, 6_000),
            "floor": _server(100_000 * scale, 10_000, 2_000, reactor=False),
            "floor-epoll": _server(50_000 * scale, 11_000, 2_500, reactor=False)})
        e["ratios"] = nvmf_ratios(e)
        e["floor_distance"] = floor_distance(e)
        # A second round at the host's slow speed: flashpath 1.5x its floor's mean there.
        slow = {"flashpath": 15_000, "spdk": 16_500, "floor": 10_000, "floor-epoll": 11_000}
        for kind, x in e["servers"].items():
            x["runs"][0]["c2c_ns"] = 70.0
            x["runs"].append(dict(x["runs"][0], lat_mean_ns=slow[kind], c2c_ns=340.0))
        e["paired_floor"] = paired_floor(e)
        points.append(e)
    config = {"secs": 1, "reps": 2, "trace_secs": 1, "backends": ["null"], "points": POINTS,
              "sizes": {"null": 1 << 30}}
    targets = ["flashpath", "spdk", "floor", "floor-epoll"]
    nvmf = {"config": config, "targets": targets, "backends": ["null"],
            "points": points, "syscall_method": None, "syscall_note": "not counted here",
            "floor": {"modes": dict(FLOORS), "of": {k: v for k, v in FLOOR_OF.items() if k in targets}}}
    return {"nvmf": nvmf, "meta": {"server_cpu": 0, "client_cpu": 1, "machine": {"cpus": 2}}}


class FloorReportTest(unittest.TestCase):
    def test_distance_is_from_the_floor_of_the_targets_kind(self):
        d = _result()["nvmf"]["points"][0]["floor_distance"]
        self.assertEqual(d["flashpath"]["floor"], "floor")
        self.assertEqual(d["spdk"]["floor"], "floor-epoll")
        self.assertAlmostEqual(d["flashpath"]["iops_ratio"], 0.8)
        self.assertAlmostEqual(d["spdk"]["iops_ratio"], 0.8)
        self.assertEqual(d["flashpath"]["lat_mean_ns_above"], 2_000)
        self.assertEqual(d["spdk"]["server_cpu_ns_per_io_above"], 3_500)

    def test_paired_distance_is_per_round_with_its_cache_line_samples(self):
        d = _result()["nvmf"]["points"][0]["paired_floor"]
        self.assertEqual(d["flashpath"]["floor"], "floor")
        self.assertEqual(d["spdk"]["floor"], "floor-epoll")
        self.assertEqual([round(x, 2) for x in d["flashpath"]["lat_mean"]["rounds"]], [1.2, 1.5])
        self.assertAlmostEqual(d["flashpath"]["lat_mean"]["median"], 1.35)
        self.assertEqual([round(x, 2) for x in d["spdk"]["iops"]["rounds"]], [0.8, 0.8])
        self.assertEqual(d["flashpath"]["c2c_ns"], [[70.0, 70.0], [340.0, 340.0]])

    def test_results_md_has_the_floor_rows_and_targets(self):
        res = _result()
        text = "\n".join(nvmf_markdown(res))
        self.assertIn("| null 4K randread QD1 | floor | 100.0 K |", text)
        self.assertIn("| null 4K randread QD32 | flashpath | floor | **0.80** | 1.20 | +2.00 | +2.00 | +1000 |", text)
        got = {}
        nvmf_targets(res, lambda name, goal, measured, ok: got.__setitem__(name, ok))
        self.assertIs(got["NVMe/TCP null QD32 4K randread: IOPS within 10 % of the floor's (floor)"], False)
        self.assertIs(got["NVMe/TCP null QD1 4K randread: mean latency within 10 % of the floor's (floor)"], False)
        self.assertIs(got["NVMe/TCP null QD1 4K randread: mean latency <= 0.85x SPDK nvmf_tgt's"], True)
        self.assertIn("| null 4K randread QD1 | flashpath | 2 | 340 / 340 | 1.50 | 0.80 |", text)
        self.assertIn("| null 4K randread QD1 | flashpath | median | | **1.35** | **0.80** |", text)
        measured = {}
        nvmf_targets(res, lambda name, goal, m, ok: measured.__setitem__(name, m))
        self.assertEqual(measured["NVMe/TCP null QD1 4K randread: mean latency within 10 % of the floor's (floor)"],
                         "1.20x the floor's; round by round 1.20, 1.50 (median 1.35)")

    def test_validate_wants_each_distance_but_no_reactor_counters_of_a_floor(self):
        res = _result()
        self.assertEqual(validate_nvmf(res, res["nvmf"]["config"]), [])
        del res["nvmf"]["points"][1]["floor_distance"]["spdk"]
        self.assertEqual(validate_nvmf(res, res["nvmf"]["config"]),
                         ["nvmf null randread 4K qd32 q1 poll: no distance of spdk from floor-epoll"])


class FloorTest(unittest.TestCase):
    def setUp(self):
        missing = [b for b in ("flashpath", "fp-load") if not os.access(os.path.join(BIN_DIR, b), os.X_OK)]
        if missing and os.environ.get("FLASHPATH_BIN_DIR"):
            self.fail(f"FLASHPATH_BIN_DIR={BIN_DIR} has no {', '.join(missing)}")
        if missing:
            self.skipTest(f"no built {', '.join(missing)} in {BIN_DIR} (set FLASHPATH_BIN_DIR)")
        self.work = tempfile.mkdtemp(prefix="fp-floor-")
        self.addCleanup(shutil.rmtree, self.work, True)
        self.addCleanup(kill_all_children)
        self.binary = build_floor(self.work)

    def test_flashpath_initiator_reads_from_the_floor(self):
        for mode in MODES:
            with self.subTest(mode=mode):
                floor = Floor(self.binary, self.work, 0, BLOCKS, mode=mode, name=f"floor-{mode}")
                self.addCleanup(floor.stop)
                fp = Flashpath(BIN_DIR, self.work, "0", name=f"flashpath-{mode}")
                self.addCleanup(fp.stop)
                bdevs = fp.rpc("bdev_nvme_attach_controller", {
                    "name": "Nvme0", "trtype": "TCP", "adrfam": "IPv4", "traddr": "127.0.0.1",
                    "trsvcid": str(floor.port), "subnqn": "nqn.2016-06.io.spdk:floor"})
                self.assertEqual(bdevs, ["Nvme0n1"])
                info = fp.rpc("bdev_get_bdevs", {"name": "Nvme0n1"})[0]
                # The namespace Identify Namespace described: its size and block size.
                self.assertEqual((info["num_blocks"], info["block_size"]), (BLOCKS, 512))
                sock = fp.export("vhost.floor", "Nvme0n1", queues=1)
                loader = Loader(BIN_DIR, 1, self.work)
                # Reads at both depths; writes with their data in the capsule (4 KiB, the
                # floor's in-capsule size) and after an R2T (64 KiB: H2CData PDUs).
                for pattern, bs, qd in (("randread", 4096, 1), ("randread", 4096, 32), ("randwrite", 4096, 8),
                                        ("randwrite", 65536, 8)):
                    r = loader.run(sock, pattern, bs, qd, 1, True, 1)
                    what = f"{pattern} {bs} QD{qd}"
                    self.assertEqual(r["errors"], 0, f"{what}: {r.get('first_error')}")
                    self.assertGreater(r["ios"], 0, f"{what}: nothing completed")
                fp.stop()
                floor.stop()


if __name__ == "__main__":
    unittest.main()
