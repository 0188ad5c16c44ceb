"""The TLS section's own checks: the PSK interchange format, the summary and its ratios, the
target's verdict and the output check (`python3 -m unittest fpbench.tests_tls`)."""

import base64
import unittest
import zlib

from fpbench.report_tls import tls_targets, validate_tls
from fpbench.sections.tls import cipher_floor, floor_bound, summarize_tls, tls_psk_interchange


def run(variant, point, iops, busy, rep=0):
    return {"variant": variant, "point": list(point), "rep": rep, "iops": iops, "p50_ns": 1000, "p99_ns": 2000,
            "target_busy_ns_per_io": busy, "target_cpu_ns_per_io": 2 * busy, "initiator_busy_ns_per_io": 3 * busy}


class Interchange(unittest.TestCase):
    def test_key_and_crc_round_trip(self):
        key = bytes(range(32))
        text = tls_psk_interchange(key)
        self.assertTrue(text.startswith("NVMeTLSkey-1:01:") and text.endswith(":"))
        raw = base64.b64decode(text.split(":")[2])
        self.assertEqual(raw[:32], key)
        self.assertEqual(int.from_bytes(raw[32:], "little"), zlib.crc32(key))

    def test_the_length_follows_the_hash(self):
        self.assertTrue(tls_psk_interchange(bytes(48), 2).startswith("NVMeTLSkey-1:02:"))
        with self.assertRaises(ValueError):
            tls_psk_interchange(bytes(48), 1)


class Summary(unittest.TestCase):
    P32, P1 = ("randread", 4096, 32), ("randread", 4096, 1)

    def runs(self):
        rs = []
        for rep, (plain, tls) in enumerate([(100_000, 85_000), (110_000, 90_000), (90_000, 80_000)]):
            rs += [run("plain", self.P32, plain, 5000, rep), run("tls", self.P32, tls, 6000, rep)]
        rs += [run("plain", self.P1, 20_000, 9000), run("tls", self.P1, 18_000, 9900)]
        return rs

    def test_medians_and_ratios(self):
        s = summarize_tls(self.runs(), [self.P32, self.P1])
        self.assertEqual(s[0]["plain"]["iops"], 100_000)
        self.assertEqual(s[0]["tls"]["iops"], 85_000)
        self.assertAlmostEqual(s[0]["ratio"]["iops"], 0.85)
        self.assertAlmostEqual(s[0]["ratio"]["target_busy_ns_per_io"], 1.2)
        self.assertAlmostEqual(s[0]["ratio"]["initiator_busy_ns_per_io"], 1.2)
        self.assertEqual(s[0]["tls"]["runs"], 3)
        self.assertAlmostEqual(s[1]["ratio"]["iops"], 0.9)

    def test_the_target_is_judged_on_qd32_only(self):
        got = []
        res = {"tls": {"summary": summarize_tls(self.runs(), [self.P32, self.P1])}}
        tls_targets(res, lambda *a: got.append(a))
        self.assertEqual(len(got), 1)
        self.assertIn("QD32", got[0][0])
        self.assertIs(got[0][3], True)
        low = [run("plain", self.P32, 100_000, 5000), run("tls", self.P32, 70_000, 7000)]
        got.clear()
        tls_targets({"tls": {"summary": summarize_tls(low, [self.P32])}}, lambda *a: got.append(a))
        self.assertIs(got[0][3], False)

    def test_the_floor_is_plain_plus_the_cipher(self):
        ns = cipher_floor([{"bytes_per_sec": 4096e9 / 5000}, {"bytes_per_sec": 4096e9 / 5000},
                           {"bytes_per_sec": 1.0}])
        self.assertAlmostEqual(ns, 5000)
        self.assertAlmostEqual(floor_bound(5000, 5000), 0.5)
        self.assertIsNone(floor_bound(None, 5000))
        s = summarize_tls(self.runs(), [self.P32], ns)
        f = s[0]["floor"]
        self.assertEqual(f["target_busy_ns_per_io"], 10_000)
        self.assertAlmostEqual(f["bound"], 0.5)
        # TLS target busy 6000 ns over a floor of 10000: below it means the cipher ran faster in
        # the runs than in openssl's (the floor is a bound, not a forecast).
        self.assertAlmostEqual(f["over"], 0.6)

    def test_validate_names_what_is_missing(self):
        c = {"points": [list(self.P32), list(self.P1)], "reps": 3}
        res = {"tls": {"summary": summarize_tls(self.runs(), [self.P32])}}
        probs = validate_tls(res, c)
        self.assertTrue(any("QD1: missing" in p for p in probs), probs)
        self.assertFalse(any("QD32" in p for p in probs), probs)
        self.assertEqual(validate_tls({}, c), ["results.json has no 'tls'"])


if __name__ == "__main__":
    unittest.main()
