"""Checks of the raid1 section's own arithmetic and report, without a daemon:
`cd bench && python3 -m unittest fpbench.tests_raid` (a second or so)."""

import os
import tempfile
import unittest

from fpbench.common import MIB
from fpbench.report_raid import raid_markdown, raid_targets, validate_raid
from fpbench.sections.raid import BLOCK, CONFIG, RaidSection, differing_blocks, find_key, splitmix64, window_rate, written_blocks


class FindKey(unittest.TestCase):
    def test_finds_a_key_nested_in_dicts_and_lists(self):
        e = {"name": "Raid0", "base_bdevs_list": [{"name": "a"}], "flashpath": {"counters": {"rebuilds_completed": 2}}}
        self.assertEqual(find_key(e, "rebuilds_completed"), 2)
        self.assertEqual(find_key(e, "name"), "Raid0")
        self.assertIsNone(find_key(e, "absent"))
        self.assertEqual(find_key([{"x": {"y": 0}}, {"y": 1}], "y"), 0)


class Compare(unittest.TestCase):
    def test_counts_differing_blocks_and_their_chunks(self):
        with tempfile.TemporaryDirectory() as d:
            a, b = os.path.join(d, "a"), os.path.join(d, "b")
            data = bytearray(os.urandom(9 * MIB))
            with open(a, "wb") as f:
                f.write(data)
            # Blocks 0 and 1 (one 64 KiB chunk), block 300 (another), and a block inside the
            # region's first MiB, which the comparison skips.
            offset = MIB
            for blk in (0, 1, 300):
                at = offset + blk * BLOCK
                data[at] ^= 0xFF
            data[100] ^= 0xFF
            with open(b, "wb") as f:
                f.write(data)
            self.assertEqual(differing_blocks(a, b, offset, 8 * MIB, chunk=64 * 1024), (3, 2))
            self.assertEqual(differing_blocks(a, b, offset, 8 * MIB), (3, 0))
            self.assertEqual(differing_blocks(a, a, 0, 9 * MIB), (0, 0))


class Replay(unittest.TestCase):
    def test_replays_splitmix64_and_counts_distinct_blocks(self):
        # SplitMix64's published first outputs from seed 0.
        rng = splitmix64(0)
        self.assertEqual([next(rng) for _ in range(2)], [0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4])
        self.assertEqual(written_blocks(0, 1 << 64, 1, 0), (1, 1, 0))
        # 1000 draws over 10 blocks hit all 10; the chunks of 2 blocks: 5.
        self.assertEqual(written_blocks(26, 10, 1000, 32, 2 * BLOCK), (10, 10, 5))
        # One block: every draw is block 0.
        self.assertEqual(written_blocks(7, 1, 50, 32), (1, 1, 0))
        lo, hi, _ = written_blocks(26, 1 << 20, 100, 32)
        self.assertTrue(lo <= 100 and lo <= hi <= 132)


class Window(unittest.TestCase):
    def test_only_buckets_wholly_inside_count(self):
        tl = {"interval_s": 0.1, "ios": [100, 200, 300, 400, 500]}
        # The run started at 10.0: buckets [10.0, 10.1) ... [10.4, 10.5).
        rate, n = window_rate(tl, 10.0, 10.1, 10.35)
        self.assertEqual(n, 2)
        self.assertAlmostEqual(rate, (200 + 300) / 0.2)
        self.assertEqual(window_rate(tl, 10.0, 10.15, 10.2), (None, 0))


class Predicates(unittest.TestCase):
    def test_rebuilt_waits_for_the_counter_when_there_is_one(self):
        before = {"flashpath": {"rebuilds_completed": 1}}
        pred = RaidSection.raid_rebuilt(before)
        self.assertFalse(pred({"flashpath": {"rebuilds_completed": 1}}))
        self.assertFalse(pred({"flashpath": {"rebuilds_completed": 2}, "process": {"type": "rebuild"}}))
        self.assertTrue(pred({"flashpath": {"rebuilds_completed": 2}}))
        self.assertFalse(pred({"flashpath": {"rebuilds_completed": 2, "slots": ["active", "rebuilding"]}}))
        self.assertTrue(pred({"flashpath": {"rebuilds_completed": 2, "slots": ["active", "active"]}}))

    def test_rebuilt_without_the_counter_reads_spdk_fields(self):
        pred = RaidSection.raid_rebuilt({})
        both = [{"is_configured": True}, {"is_configured": True}]
        self.assertTrue(pred({"num_base_bdevs": 2, "num_base_bdevs_operational": 2, "base_bdevs_list": both}))
        self.assertFalse(pred({"num_base_bdevs": 2, "num_base_bdevs_operational": 2, "base_bdevs_list": both,
                               "process": {"type": "rebuild"}}))
        self.assertFalse(pred({"num_base_bdevs": 2, "num_base_bdevs_operational": 1, "base_bdevs_list": both}))

    def test_degraded(self):
        self.assertTrue(RaidSection.raid_degraded({"num_base_bdevs": 2, "num_base_bdevs_operational": 1}))
        self.assertTrue(RaidSection.raid_degraded({"num_base_bdevs": 2, "num_base_bdevs_operational": 2,
                                                   "base_bdevs_list": [{"is_configured": False}]}))
        self.assertFalse(RaidSection.raid_degraded({"num_base_bdevs": 2, "num_base_bdevs_operational": 2,
                                                    "base_bdevs_list": [{"is_configured": True}]}))


def _result():
    """A smoke-shaped result with round figures, to run the report and its check over."""
    c = dict(CONFIG["smoke"])
    pts = []
    for pattern, bs, qd, queues, poll in c["points"]:
        md = {v: {"iops": 1000.0 * (2 if v == "single" else 1), "p50_ns": 900, "p99_ns": 2000,
                  "reactor_busy_ns_per_io": 500.0, "work_ns_per_io": 600.0 * (1 if v == "single" else 1.2),
                  "other_threads_ns_per_io": 100.0, "server_cpu_ns_per_io": 700.0, "iops_spread": 0.1}
              for v in c["variants"]}
        pts.append({"backend": "ram", "pattern": pattern, "bs": bs, "qd": qd, "queues": queues,
                    "client": "poll" if poll else "fd", "runs": {v: [{"iops": 1000.0, "work_ns_per_io": 600.0, "server_wait_share": 0.01}] * c["reps"]
                             for v in c["variants"]},
                    "median": md,
                    "ratios": {v: {"iops": 0.5, "work_ns_per_io": 1.2} for v in c["variants"] if v != "single"}})

    def copy(kind, loaded):
        r = {"kind": kind, "loaded": loaded, "seconds": 1.0, "bytes": 64 * MIB, "mb_per_s": 67.1, "server_cpu_s": 0.5,
             "server_wait_share": 0.01, "loadavg": 0.5}
        if loaded:
            r.update(guest_before_iops=1000.0, guest_during_iops=800.0, covered=kind == "copy")
        return r

    full = {"base_size": 72 * MIB, "guest": {"pattern": "randread", "qd": 32, "client": "fd"},
            "copies": [copy("copy", ld) for ld in (False, True)],
            "rebuilds": [copy("rebuild", ld) for ld in (False, True)],
            "rebuilds_at_target": [dict(copy("rebuild", True), mb_per_s=33.55, guest_during_iops=600.0, covered=True)],
            "guest_runs": {"degraded": [{"iops": 1000.0}], "healthy": [{"iops": 1500.0}]}}
    RaidSection.raid_full_summary(full)
    partial = {"base_size": 72 * MIB, "dir": "tmpfs", "write_secs": 1.0, "data_bytes": 64 * MIB,
               "writes": {"bytes": 32 * MIB, "ios": 8192, "iops": 8192.0}, "unique_bytes": 20 * MIB,
               "dirty_chunk_bytes": 21 * MIB, "bitmap_chunk": 65536, "bytes_copied": 21 * MIB,
               "copied_per_unique": 1.05, "copied_per_written": 21 / 32, "rebuild_s": 0.1,
               "process_types": ["rebuild"], "blocks_differing_after": 0, "degraded_bytes_written": 32 * MIB,
               "seed": 26, "kind": "file", "replay_agrees": True}
    ram = dict(partial, kind="ram", blocks_differing_after=None, replay_agrees=None, copied_per_unique=1.2)
    return {"meta": {"server_cpu": 0, "client_cpu": 1},
            "raid": {"config": {k: v for k, v in c.items() if k != "points"}, "points": pts,
                     "loadavg_before": [0.5, 0, 0], "loadavg_after": [0.7, 0, 0], "partial": partial, "partial_ram": ram, "full": full}}


class Report(unittest.TestCase):
    def test_markdown_targets_and_check(self):
        res = _result()
        md = "\n".join(raid_markdown(res))
        self.assertIn("## raid1", md)
        self.assertIn("**1.05**", md)
        self.assertIn("| randwrite 4K QD1 poll | raid1 | 1 | 1,000 | 600 |", md)
        got = []
        raid_targets(res, lambda *a, **k: got.append(a))
        # Two writes and two reads, two partial rebuilds, the rebuild's speed, the guest's share
        # and the guest beside the rebuild held at the target's speed.
        self.assertEqual(len(got), 9)
        met = {a[0].split(":")[0]: a[3] for a in got}
        self.assertTrue(met["partial rebuild (file bases) after 1 s of QD32 4K randwrite on a 64.0 MiB raid1"])
        self.assertFalse(met["partial rebuild (ram bases) after 1 s of QD32 4K randwrite on a 64.0 MiB raid1"])
        self.assertEqual(full_summary(res)["guest_during_vs_degraded"], 0.8)
        self.assertEqual(full_summary(res)["rebuild_loaded_vs_copy_alone"], 1.0)
        # The rebuild outlived its guest load: counted and flagged, the copy that did not is not.
        self.assertEqual((full_summary(res)["loaded_runs"], full_summary(res)["loaded_runs_uncovered"]), (3, 1))
        self.assertEqual(full_summary(res)["at_target_vs_rebuild_alone"], 0.5)
        self.assertEqual(full_summary(res)["guest_during_at_target_vs_before"], 0.6)
        self.assertIn("Held at the share target's speed", md)
        self.assertIn("⚑ 1 of 3 copies under load outlived the guest's load", md)
        self.assertEqual(validate_raid(res, dict(CONFIG["smoke"])), [])
        res["raid"]["partial"]["blocks_differing_after"] = 3
        res["raid"]["full"]["rebuilds"].pop()
        self.assertEqual(validate_raid(res, dict(CONFIG["smoke"])),
                         ["raid partial: 3 blocks differ after the rebuild", "raid full: 1 rebuilds"])


def full_summary(res):
    return res["raid"]["full"]["summary"]


if __name__ == "__main__":
    unittest.main()
