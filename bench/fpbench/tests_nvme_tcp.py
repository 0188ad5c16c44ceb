"""Unit tests of the NVMe/TCP initiator section's bound and target line (no servers)."""

import unittest

from fpbench.report_nvme_tcp import nvme_tcp_targets
from fpbench.sections.nvme_tcp import shared_cpu_bound


def _point(fp_iops, spdk_iops, bound):
    med = lambda iops, b: {"iops": iops, "shared_cpu_bound_iops": b}  # noqa: E731
    return {"pattern": "randread", "qd": 32, "client": "fd",
            "servers": {"flashpath": {"median": med(fp_iops, bound)}, "spdk": {"median": med(spdk_iops, None)}},
            "ratios": {"iops": fp_iops / spdk_iops}}


class SharedCpuBound(unittest.TestCase):
    def test_one_over_the_shared_cpus_work_per_io(self):
        # 2,000 ns of target work and 1,000 of client work per I/O on one CPU: 333 K IOPS at most.
        self.assertAlmostEqual(shared_cpu_bound(2000, 1000), 1e9 / 3000)

    def test_unknown_without_either_figure(self):
        self.assertIsNone(shared_cpu_bound(None, 1000))
        self.assertIsNone(shared_cpu_bound(2000, 0))


class InitiatorTarget(unittest.TestCase):
    def lines(self, point):
        got = []
        nvme_tcp_targets({"nvme_tcp": {"points": [point]}},
                         lambda what, goal, measured, ok, note="": got.append((goal, measured, ok, note)))
        return got

    def test_goal_is_1_3x_and_the_bound_is_named(self):
        [(goal, measured, ok, note)] = self.lines(_point(290e3, 250e3, 320e3))
        self.assertEqual(goal, ">= 1.30x")
        self.assertIn("1.16x", measured)
        self.assertFalse(ok)
        # 320 K / 250 K: a cost-free initiator could reach 1.28x SPDK's; flashpath at 0.91 of it.
        self.assertIn("1.28x SPDK's", note)
        self.assertIn("0.91x of that bound", note)

    def test_met_at_1_3x(self):
        [(_, _, ok, _)] = self.lines(_point(330e3, 250e3, 400e3))
        self.assertTrue(ok)


if __name__ == "__main__":
    unittest.main()
