"""The LUKS section's own checks: its summaries and ratios, the slot's KDF taken from luksDump,
the targets' verdicts, the Markdown and the output check (`python3 -m unittest
fpbench.tests_luks`)."""

import unittest

from fpbench.report_luks import HEADING, datapath_figures, datapath_lines, luks_markdown, luks_targets, validate_luks
from fpbench.sections.luks import (CONFIG, KDFS, POINTS, iops_summary, open_summary, reenc_summary, slot_kdf,
                                   stats)

MIB = 1 << 20


def result(open_fp=(1.0, 1.1, 0.9), open_cs=(1.0, 1.0, 1.0), reenc_fp=(1.0, 2.0), reenc_cs=(1.0, 1.0),
           alone=(100_000, 120_000), beside=(90_000, 100_000)):
    """A results.json of the section with the given runs (one config: quick's, reps and opens set
    to the runs given)."""
    c = dict(CONFIG["quick"], opens=len(open_fp), reenc_reps=len(reenc_fp), reps=len(alone))
    opens = {kdf: dict(open_summary(list(open_fp), list(open_cs), list(open_fp), list(open_cs)), kdf=kdf, slot=0,
                       slot_kdf={"type": kdf, "hash": "sha256", "iterations": 1000} if kdf == "pbkdf2" else
                       {"type": kdf, "time": 4, "memory": 1048576, "cpus": 2})
             for kdf in KDFS}
    reenc = dict(reenc_summary(256 * MIB, list(reenc_fp), 240 * MIB, list(reenc_cs)), size=256 * MIB,
                 flashpath_data_bytes=256 * MIB, cryptsetup_data_bytes=240 * MIB)
    points = []
    for pattern, bs, qd, queues, poll in POINTS:
        p = dict(pattern=pattern, bs=bs, qd=qd, queues=queues, job=[{"mib_s": 63.0} for _ in alone],
                 job_mib_s=stats([63.0 for _ in alone]))
        p.update(iops_summary(list(alone), list(beside)))
        points.append(p)
    return {"luks": {"config": c, "cpu": 0, "client_cpu": 1, "open": opens, "reencrypt": reenc, "points": points,
                     "loadavg": [{"when": "start", "loadavg": [0.5, 0.6, 0.7]}],
                     "cryptsetup_version": "cryptsetup 2.6.1"}}


def verdicts(res):
    out = []
    luks_targets(res, lambda name, goal, measured, met, note="": out.append((name, met)))
    return out


class Summaries(unittest.TestCase):
    def test_stats_median_and_spread(self):
        s = stats([1.0, 3.0, 2.0, None])
        self.assertEqual((s["n"], s["median"], s["min"], s["max"]), (3, 2.0, 1.0, 3.0))
        self.assertAlmostEqual(s["spread"], 1.0)
        self.assertEqual(stats([])["median"], None)

    def test_open_ratio_is_flashpath_over_cryptsetup(self):
        r = open_summary([1.2, 1.0, 1.1], [1.0, 1.0, 0.9], [2.0, 2.0, 2.0], [1.0, 1.0, 1.0])
        self.assertAlmostEqual(r["ratio"], 1.1)
        self.assertAlmostEqual(r["cpu_ratio"], 2.0)
        self.assertAlmostEqual(r["flashpath_s"]["spread"], 0.2 / 1.1)

    def test_reencryption_speed_over_each_tools_data(self):
        # flashpath rewrote 256 MiB in 2 s and 1 s, cryptsetup 240 MiB in 2 s twice.
        r = reenc_summary(256 * MIB, [2.0, 1.0], 240 * MIB, [2.0, 2.0])
        self.assertAlmostEqual(r["flashpath_mib_s"]["median"], (128 + 256) / 2)
        self.assertAlmostEqual(r["cryptsetup_mib_s"]["median"], 120)
        self.assertAlmostEqual(r["ratio"], 192 / 120)
        self.assertEqual(reenc_summary(MIB, [], MIB, [1.0])["ratio"], None)

    def test_iops_ratio_of_medians_and_per_round(self):
        r = iops_summary([100, 200], [80, 100])
        self.assertAlmostEqual(r["ratio"], 90 / 150)
        self.assertEqual(r["rep_ratios"], [0.8, 0.5])

    def test_slot_kdf_keeps_the_cost_not_the_salt(self):
        dump = {"keyslots": {"0": {"kdf": {"type": "argon2id", "time": 4, "memory": 1048576, "cpus": 2,
                                           "salt": "c2FsdA=="}}}}
        self.assertEqual(slot_kdf(dump, 0), {"type": "argon2id", "time": 4, "memory": 1048576, "cpus": 2})
        self.assertIn("salt", dump["keyslots"]["0"]["kdf"])


class Targets(unittest.TestCase):
    def test_met(self):
        v = verdicts(result())
        self.assertEqual(len(v), len(KDFS) + 1 + len(POINTS))
        self.assertTrue(all(met for _, met in v), v)

    def test_open_over_the_bar_is_missed(self):
        v = dict(verdicts(result(open_fp=(1.2, 1.2, 1.2))))
        self.assertEqual([met for name, met in v.items() if "opening" in name], [False] * len(KDFS))

    def test_open_at_the_bar_is_met(self):
        v = dict(verdicts(result(open_fp=(1.1, 1.1, 1.1))))
        self.assertTrue(all(met for name, met in v.items() if "opening" in name))

    def test_slow_reencryption_is_missed(self):
        # 256 MiB in 4 s = 64 MiB/s vs 240 MiB/s.
        v = dict(verdicts(result(reenc_fp=(4.0, 4.0))))
        self.assertEqual([met for name, met in v.items() if "re-encryption of" in name], [False])

    def test_open_on_every_cpu_is_judged_when_measured(self):
        res = result()
        res["luks"]["open"]["argon2id-all-cpus"] = open_summary([1.7, 1.8], [1.1, 1.2])
        v = dict(verdicts(res))
        self.assertEqual([met for name, met in v.items() if "on every CPU" in name], [False])
        self.assertIn("argon2id-all-cpus (reported: cryptsetup on every CPU)", "\n".join(luks_markdown(res)))

    def test_iops_under_the_bar_is_missed(self):
        v = dict(verdicts(result(beside=(60_000, 70_000))))
        self.assertEqual([met for name, met in v.items() if "beside" in name], [False] * len(POINTS))


class Outputs(unittest.TestCase):
    def test_markdown_has_heading_and_figures(self):
        text = "\n".join(luks_markdown(result(beside=(80_000, 60_000))))
        self.assertIn(HEADING, text)
        self.assertIn("argon2id, time 4, memory 1,048,576 KiB, 2 lanes", text)
        self.assertIn("pbkdf2-sha256, 1,000 iterations", text)
        self.assertIn("**0.64**", text)  # 70 K beside vs 110 K alone

    def test_validate_accepts_a_whole_run(self):
        res = result()
        self.assertEqual(validate_luks(res, res["luks"]["config"]), [])

    def test_validate_names_what_is_missing(self):
        res = result()
        del res["luks"]["open"]["pbkdf2"]
        res["luks"]["points"].pop()
        res["luks"]["points"][0]["job"][0]["mib_s"] = 0.0
        probs = validate_luks(res, res["luks"]["config"])
        self.assertIn("luks open pbkdf2: missing", probs)
        self.assertIn("luks iops randwrite: missing", probs)
        self.assertIn("luks iops randread: the job did not move during a run beside it", probs)
        self.assertEqual(len(probs), 3)


def crypto_run(iops):
    med = {d: {"iops": iops, "iops_spread": 0.05, "server_cpu_ns_per_io": 1e9 / iops}
           for d in ("fp-plain", "fp-crypto", "fp-crypto-512", "qsd-raw")}
    return {"crypto": {"points": [{"pattern": "randread", "median": med}], "loadavg_before": [1.0, 1.0, 1.0],
                       "loadavg_after": [2.0, 2.0, 2.0]}}


def pathlen_run(irs):
    return {"pathlen": {"points": [{"export": "vhost-user", "runs": [{"ir_per_io": x} for x in irs]}]}}


class Datapath(unittest.TestCase):
    def test_figures_take_medians_and_the_flashpath_disks(self):
        f = datapath_figures(crypto_run(200_000), pathlen_run([660, 650, 700]))
        self.assertEqual(set(f["crypto"]["randread"]), {"fp-plain", "fp-crypto", "fp-crypto-512"})
        self.assertEqual(f["crypto"]["randread"]["fp-crypto"]["cpu_ns_per_io"], 5000)
        self.assertEqual(f["pathlen"]["vhost-user"], {"ir_per_io": 660, "min": 650, "max": 700, "reps": 3})

    def test_lines_compare_new_with_main(self):
        dp = {"new": datapath_figures(crypto_run(180_000), pathlen_run([700])),
              "main": datapath_figures(crypto_run(200_000), pathlen_run([650]))}
        text = "\n".join(datapath_lines(dp))
        self.assertIn("| crypto randread fp-crypto IOPS | 180.0 K (5 %) | 200.0 K (5 %) | 0.90 |", text)
        self.assertIn("| path length vhost-user instructions/IO | 700 (700–700) | 650 (650–650) | 1.08 |", text)
        self.assertEqual(datapath_lines({"new": dp["new"]}), [])


if __name__ == "__main__":
    unittest.main()
