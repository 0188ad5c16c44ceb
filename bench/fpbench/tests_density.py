"""Checks of the density section's round-by-round table and its --validate, without a daemon:
`cd bench && python3 -m unittest fpbench.tests_density`."""

import unittest

from fpbench.report_density import HEADING, density_markdown, validate_density
from fpbench.sections.density import density_rounds, summarize_runs

SERVERS = ["flashpath", "qsd", "spdk"]


def a_run(iops, c2c, vms=2):
    return {"total_iops": iops, "mean_p99_ns": 20_000.0, "max_p99_ns": 30_000.0, "min_max_iops": 0.99,
            "client_wakeups_per_io": 0.1, "client_calls_per_io": 0.1, "client_kicks_per_io": 0.02,
            "notifications_per_io": 0.12, "server_cpu_stat_ns_per_io": 150.0, "server_wakeups_per_io": 0.01,
            "server_cores": 1.0, "client_cores": 0.8, "vm_iops": [iops / vms] * vms,
            "vm_p99_ns": [20_000.0] * vms, "c2c_ns": c2c}


def result(runs, vms=2, qd=8):
    servers = {k: dict(zip(("median", "spread"), summarize_runs(rs)), runs=rs) for k, rs in runs.items()}
    point = {"vms": vms, "qd": qd, "servers": servers, "rounds": density_rounds(runs, SERVERS),
             "ratios": {k: {"total_iops": 1.0, "mean_p99_ns": 1.0, "max_p99_ns": 1.0, "min_max_iops": 1.0,
                            "server_cpu_stat_ns_per_io": 1.0, "notifications_per_io": 1.0} for k in SERVERS[1:]}}
    return {"density": {"config": {"ns": [vms], "qds": [qd], "secs": 1.0, "reps": len(runs["flashpath"])},
                        "servers": SERVERS, "client": "fp-load --frontend", "points": [point]},
            "meta": {"server_cpu": 0, "client_cpu": 1}}


class Rounds(unittest.TestCase):
    def setUp(self):
        # Round 1 in the host's fast speed (60 ns), round 2 in its slow one (180 ns).
        self.runs = {"flashpath": [a_run(10e6, 60.0), a_run(4e6, 180.0)],
                     "qsd": [a_run(1e6, 61.0), a_run(0.8e6, 179.0)],
                     "spdk": [a_run(5e6, 62.0), a_run(5e6, 181.0)]}

    def test_each_round_pairs_its_samples_and_ratios(self):
        rounds = density_rounds(self.runs, SERVERS)
        self.assertEqual([r["c2c_ns"]["spdk"] for r in rounds], [62.0, 181.0])
        self.assertEqual([r["iops_ratio"]["spdk"] for r in rounds], [2.0, 0.8])
        self.assertEqual([r["iops_ratio"]["qsd"] for r in rounds], [10.0, 5.0])

    def test_the_report_has_a_row_per_round(self):
        md = "\n".join(density_markdown(result(self.runs)))
        self.assertIn(HEADING, md)
        self.assertIn("| 2 × 8 | 1 | 60 / 61 / 62 | 10.00 | 2.00 |", md)
        self.assertIn("| 2 × 8 | 2 | 180 / 179 / 181 | 5.00 | 0.80 |", md)

    def test_validate_wants_a_sample_before_every_run(self):
        res = result(self.runs)
        self.assertEqual(validate_density(res, res["density"]["config"]), [])
        self.runs["qsd"][1]["c2c_ns"] = None
        res = result(self.runs)
        problems = validate_density(res, res["density"]["config"])
        self.assertEqual(len(problems), 1, problems)
        self.assertIn("qsd round 1: no cache-line sample", problems[0])


if __name__ == "__main__":
    unittest.main()
