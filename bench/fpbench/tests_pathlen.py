"""Checks of the path-length method (long minus short), the path-length section's report and its
--validate, without a daemon: `cd bench && python3 -m unittest fpbench.tests_pathlen`."""

import os
import tempfile
import unittest

from fpbench.modes import pathlen_config
from fpbench.report_pathlen import HEADING, pathlen_markdown, validate_pathlen
from fpbench.sections.callgrind import CallgrindSection, ir_summary, long_minus_short
from fpbench.sections.pathlen import EXPORTS, MEASURED, CLIENT


def life_of(fixed_ir, ir_per_io, iops):
    """A fake server life: `fixed_ir` instructions of start-up and exit, `ir_per_io` per I/O."""
    def life(secs):
        ios = int(iops * secs)
        return {"seconds": secs, "ios": ios, "ir": fixed_ir + ir_per_io * ios}
    return life


def run(ir, short_ios=1000, long_ios=4000):
    return {"short": {"ios": short_ios, "ir": 10 ** 6 + ir * short_ios},
            "long": {"ios": long_ios, "ir": 10 ** 6 + ir * long_ios}, "ir_per_io": ir}


def result(c, exports=EXPORTS, ir=2000.0):
    points = [dict({"export": x, "backend": "null", "pattern": "randread", "bs": 4096, "qd": qd,
                    "client": CLIENT[x], "runs": [run(ir)] * c["reps"]}, **ir_summary([run(ir)] * c["reps"]))
              for qd in c["qds"] for x in exports]
    return {"pathlen": {"config": c, "exports": list(exports), "clients": CLIENT, "measured": MEASURED,
                        "points": points, "loadavg_before": [1.0, 1.0, 1.0], "loadavg_after": [2.0, 1.5, 1.0]},
            "meta": {"server_cpu": 0, "client_cpu": 1, "machine": {"valgrind_version": "valgrind-3.19.0"}}}


class LongMinusShort(unittest.TestCase):
    def test_fixed_costs_cancel(self):
        r = long_minus_short(life_of(5_000_000, 1234, 40_000), 1.0, 4.0, "fake")
        self.assertEqual(r["ir_per_io"], 1234)
        self.assertEqual((r["short"]["ios"], r["long"]["ios"]), (40_000, 160_000))

    def test_a_long_run_without_more_ios_is_an_error(self):
        with self.assertRaisesRegex(RuntimeError, "fake under callgrind: the long run did 10 I/Os"):
            long_minus_short(lambda secs: {"ios": 10, "ir": 100}, 1.0, 4.0, "fake")

    def test_summary_is_median_range_and_spread(self):
        s = ir_summary([run(1900.0), run(2000.0), run(2100.0)])
        self.assertEqual(s["ir_per_io"], 2000.0)
        self.assertEqual(s["range"], [1900.0, 2100.0])
        self.assertAlmostEqual(s["spread"], 0.1)


class UnderCallgrind(unittest.TestCase):
    def fake(self, profiles):
        """A bench whose lives write the callgrind profiles `profiles` in turn."""
        b = CallgrindSection()
        b.work = tempfile.mkdtemp()
        b.callgrind_n = 0
        lives = []

        def life(wrap, name):
            out = next(a.split("=", 1)[1] for a in wrap if a.startswith("--callgrind-out-file="))
            with open(out, "w") as f:
                f.write(profiles[len(lives)])
            lives.append(name)
            return {"ios": 7}
        return b, life, lives

    def test_reads_the_total_of_the_profile(self):
        b, life, lives = self.fake(["events: Ir\nsummary: 123456\n"])
        self.assertEqual(b.under_callgrind("x", life), {"ios": 7, "ir": 123456})
        self.assertEqual(lives, ["callgrind-1"])

    def test_a_profile_cut_short_is_measured_once_more_then_fails(self):
        cut = "events: Ir\nfn=main\n"  # no totals line: the server was killed while writing
        b, life, lives = self.fake([cut, "totals: 99\n"])
        self.assertEqual(b.under_callgrind("x", life)["ir"], 99)
        self.assertEqual(lives, ["callgrind-1", "callgrind-2"])
        b, life, lives = self.fake([cut, cut])
        with self.assertRaisesRegex(RuntimeError, "no totals line"):
            b.under_callgrind("x", life)
        self.assertEqual(len(lives), 2)


class Report(unittest.TestCase):
    def test_every_mode_validates_and_reports_every_export(self):
        for mode in ("full", "quick", "smoke"):
            c = pathlen_config(mode)
            res = result(c)
            self.assertEqual(validate_pathlen(res, c), [])
            md = "\n".join(pathlen_markdown(res))
            self.assertIn(HEADING, md)
            rows = [ln for ln in md.splitlines() if ln.startswith("| ") and "2,000" in ln]
            self.assertEqual(len(rows), len(EXPORTS) * len(c["qds"]))
            self.assertIn("| NVMe/TCP host | null randread 4K, QD32 | fd |", md)

    def test_validate_names_what_is_missing_or_wrong(self):
        c = pathlen_config("quick")
        self.assertEqual(validate_pathlen({}, c), ["results.json has no 'pathlen'"])
        res = result(c, exports=[x for x in EXPORTS if x != "nbd"])
        self.assertEqual(validate_pathlen(res, c), ["pathlen: no nbd QD32"])
        res = result(c)
        res["pathlen"]["points"][0]["ir_per_io"] = float("nan")
        res["pathlen"]["points"][1]["runs"] = res["pathlen"]["points"][1]["runs"][:1]
        res["pathlen"]["points"][2]["runs"] = [run(2000.0, short_ios=5000, long_ios=4000)] * c["reps"]
        probs = validate_pathlen(res, c)
        self.assertEqual(len(probs), 2 + c["reps"], probs)
        self.assertIn("pathlen vhost-user QD32: instructions/IO = nan", probs)
        self.assertIn("pathlen nbd QD32: 1 runs, want 3", probs)
        self.assertTrue(any(p.startswith("pathlen nvmf-target QD32: short 5000 I/Os") for p in probs))


if __name__ == "__main__":
    unittest.main()
