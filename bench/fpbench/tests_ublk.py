"""The ublk section's own checks: its console-line and ldd parsers, the summaries and their
ratios, the targets' verdicts, the Markdown and the output check (`python3 -m unittest
fpbench.tests_ublk`)."""

import unittest

from fpbench.report_ublk import HEADING, ublk_markdown, ublk_targets, validate_ublk
from fpbench.sections.ublk import (CONFIG, DEVICES, parse_fields, parse_ldd, recovery_summary, recovery_times,
                                   ublk_summary)

LDD = """\tlinux-vdso.so.1 (0x00007ffd5e7f2000)
\tlibgnutls.so.30 => /lib/x86_64-linux-gnu/libgnutls.so.30 (0x00007f4cd6600000)
\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f4cd63fb000)
\tlibmissing.so.1 => not found
\t/lib64/ld-linux-x86-64.so.2 (0x00007f4cd6853000)
\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f4cd63fb000)
"""


def run(device, rep, iops):
    return {"device": device, "dev": device, "rep": rep, "iops": iops, "clat_mean_us": 1e6 * 32 / iops}


def recovery(rep, start, rpc, io, kill=None, held="yes", kept="yes", fio_err=0, writes_after=500, probe_rc=0):
    f = {"kill": start - 0.5 if kill is None else kill, "start": start, "rpc": rpc, "io": io, "probe_rc": probe_rc,
         "held": held, "kept": kept, "fio_err": fio_err, "writes_after": writes_after, "log_recovered": 0.2}
    return dict(f, rep=rep, **recovery_times(f))


class Parsers(unittest.TestCase):
    def test_result_line_numbers_and_strings(self):
        line = ("FPBENCH-RESULT ublk-2 rc=0 kib=160000 iops=40000 ms=4000 clat_mean_us=795.25 fio_errors=0 "
                "log_recovered=")
        rid, f = parse_fields("[   12.5] " + line, "FPBENCH-RESULT")
        self.assertEqual(rid, "ublk-2")
        self.assertEqual(f["iops"], 40000)
        self.assertIsInstance(f["iops"], int)
        self.assertEqual(f["clat_mean_us"], 795.25)
        self.assertIsNone(f["log_recovered"])

    def test_recovery_line(self):
        rid, f = parse_fields("FPBENCH-RECOVERY rec-0 kill=40.12 start=40.45 rpc=40.61 io=40.70 probe_rc=0 "
                              "held=yes kept=yes", "FPBENCH-RECOVERY")
        self.assertEqual(rid, "rec-0")
        self.assertEqual(f["held"], "yes")
        t = recovery_times(f)
        self.assertAlmostEqual(t["from_start_s"], 0.25)
        self.assertAlmostEqual(t["from_rpc_s"], 0.09)
        self.assertAlmostEqual(t["from_kill_s"], 0.58)
        self.assertIsNone(t["log_recovered_s"])

    def test_other_lines_are_not_results(self):
        self.assertIsNone(parse_fields("FPBENCH-RESULTS x y=1", "FPBENCH-RESULT"))
        self.assertIsNone(parse_fields("fio: something", "FPBENCH-RESULT"))

    def test_missing_times_give_none(self):
        self.assertIsNone(recovery_times({"start": 1.0, "io": None})["from_start_s"])

    def test_ldd(self):
        self.assertEqual(parse_ldd(LDD), ["/lib/x86_64-linux-gnu/libgnutls.so.30", "/lib/x86_64-linux-gnu/libc.so.6",
                                          "/lib64/ld-linux-x86-64.so.2"])


class Summary(unittest.TestCase):
    def runs(self):
        rs = []
        for rep, (n, u, b) in enumerate([(50_000, 42_000, 20_000), (60_000, 45_000, 30_000), (40_000, 20_000, 10_000)]):
            rs += [run("null_blk", rep, n), run("ublk", rep, u), run("nbd", rep, b)]
        return rs

    def test_medians_and_ratios(self):
        s = ublk_summary(self.runs())
        self.assertEqual(s["devices"]["ublk"]["iops"], 42_000)
        self.assertEqual(s["devices"]["null_blk"]["iops"], 50_000)
        self.assertEqual((s["devices"]["ublk"]["min"], s["devices"]["ublk"]["max"]), (20_000, 45_000))
        self.assertAlmostEqual(s["ratios"]["null_blk"], 0.84)
        self.assertAlmostEqual(s["ratios"]["nbd"], 2.1)
        self.assertEqual([round(x, 2) for x in s["rep_ratios"]["null_blk"]], [0.84, 0.75, 0.5])
        self.assertEqual([round(x, 2) for x in s["rep_ratios"]["nbd"]], [2.1, 1.5, 2.0])

    def test_a_failed_run_is_left_out_and_named(self):
        rs = self.runs()
        rs[4] = {"device": "ublk", "dev": "ublkb7", "rep": 1, "error": "fio exited 1: boom"}
        s = ublk_summary(rs)
        self.assertEqual(s["devices"]["ublk"]["runs"], 2)
        self.assertEqual(s["devices"]["ublk"]["errors"], ["fio exited 1: boom"])
        self.assertEqual(len(s["rep_ratios"]["null_blk"]), 2)

    def test_no_runs(self):
        s = ublk_summary([])
        self.assertIsNone(s["ratios"]["null_blk"])
        self.assertEqual(s["devices"]["nbd"]["runs"], 0)

    def test_recovery(self):
        recs = [recovery(0, 10.0, 10.2, 10.3), recovery(1, 20.0, 20.3, 20.6), recovery(2, 30.0, 30.1, 30.2, held="no")]
        s = recovery_summary(recs)
        self.assertEqual(s["runs"], 3)
        self.assertAlmostEqual(s["from_start_s"]["median"], 0.3)
        self.assertAlmostEqual(s["from_start_s"]["max"], 0.6)
        self.assertAlmostEqual(s["from_rpc_s"]["max"], 0.3)
        self.assertEqual((s["held"], s["kept"], s["fio_clean"], s["probe_ok"]), (2, 3, 3, 3))


def results(runs, recs, c=None):
    return {"ublk": {"config": c or CONFIG["quick"], "null_blk_params": "irqmode=0", "runs": runs, "recoveries": recs,
                     "notes": [], "guest": {"vcpus": 2, "qemu_cpus": "0,1", "kernel": "k", "pin": "vcpu1"},
                     "summary": ublk_summary(runs), "recovery": recovery_summary(recs)}}


class Report(unittest.TestCase):
    def targets(self, res):
        out = []
        ublk_targets(res, lambda name, goal, measured, met, note="": out.append((name, goal, measured, met)))
        return out

    def test_targets(self):
        runs = [run(d, rep, {"null_blk": 50_000, "ublk": 41_000, "nbd": 45_000}[d]) for rep in range(3) for d in DEVICES]
        recs = [recovery(i, 10.0 * i, 10.0 * i + 0.2, 10.0 * i + 0.4) for i in range(3)]
        t = self.targets(results(runs, recs))
        self.assertEqual(len(t), 3)
        self.assertTrue(t[0][3])  # 0.82 >= 0.8
        self.assertFalse(t[1][3])  # 0.91 < 1.0 against NBD
        self.assertTrue(t[2][3])
        recs[1] = recovery(1, 10.0, 10.5, 11.2)
        self.assertFalse(self.targets(results(runs, recs))[2][3])

    def test_a_failed_recovery_is_no_verdict(self):
        runs = [run(d, 0, 1000) for d in DEVICES]
        recs = [recovery(0, 1.0, 1.1, 1.2), dict(recovery(1, 2.0, 2.1, 2.2), error="the probe read failed")]
        self.assertIsNone(self.targets(results(runs, recs))[2][3])

    def test_validate_and_markdown(self):
        c = dict(CONFIG["quick"], reps=2, recovery_reps=2)
        runs = [run(d, rep, 1000 + rep) for rep in range(2) for d in DEVICES]
        recs = [recovery(i, 1.0, 1.1, 1.2) for i in range(2)]
        res = results(runs, recs, c)
        self.assertEqual(validate_ublk(res, c), [])
        md = "\n".join(ublk_markdown(res))
        self.assertIn(HEADING, md)
        self.assertIn("| flashpath through ublk (/dev/ublkb7) | 2 |", md)
        bad = results(runs[:-1], [dict(recs[0], kept="no")], c)
        problems = validate_ublk(bad, c)
        self.assertIn("ublk nbd: 1 runs, want 2", problems)
        self.assertIn("ublk recovery: 1 completed, want 2", problems)
        self.assertIn("ublk recovery: kept in 0 of 2", problems)

    def test_not_run_is_valid(self):
        res = {"ublk": {"config": CONFIG["quick"], "runs": [], "recoveries": [], "notes": ["not run: no qemu"]}}
        self.assertEqual(validate_ublk(res, CONFIG["quick"]), [])
        self.assertEqual(self.targets(res), [])


if __name__ == "__main__":
    unittest.main()
