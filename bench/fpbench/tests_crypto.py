"""Checks of the AES-XTS section's parsing, arithmetic and report, without a daemon:
`cd bench && python3 -m unittest fpbench.tests_crypto` (well under a second)."""

import json
import unittest

from fpbench.report_crypto import crypto_markdown, crypto_targets, validate_crypto
from fpbench.sections.crypto import (CONFIG, KEY_BITS, OPS, PATTERN_OP, SIZES, VARIANTS, CryptoSection,
                                     cipher_run, parse_openssl_mr, parse_xts_speed, xts_run)

# `openssl speed -elapsed -mr -seconds 1 -bytes 4096 -evp aes-256-xts` as OpenSSL 3.0 prints it.
OPENSSL_MR = """compiler: gcc -fPIC -pthread -m64
CPUINFO: OPENSSL_ia32cap=0xfffa3203078bffff:0x405fc6f1bf07ab
+DT:AES-256-XTS:1:4096
+R:1334889:AES-256-XTS:0.890000
+H:4096
+F:25:AES-256-XTS:6143489150.56
"""


class Parse(unittest.TestCase):
    def test_openssl_bytes_per_second_from_its_count_and_time(self):
        r = parse_openssl_mr(OPENSSL_MR, 4096)
        self.assertEqual(r["buffers"], 1334889)
        self.assertAlmostEqual(r["bytes_per_sec"], 1334889 * 4096 / 0.89)
        # openssl's own figure agrees with the one computed from its count.
        self.assertAlmostEqual(r["bytes_per_sec"] / r["reported_bytes_per_sec"], 1.0, places=6)

    def test_openssl_output_without_a_result_is_an_error(self):
        with self.assertRaisesRegex(RuntimeError, r"no \+R line"):
            parse_openssl_mr("speed: Unknown cipher aes-999-xts\n", 4096)

    def test_xts_speed_lines(self):
        lines = [json.dumps({"op": op, "bytes": n, "unit": min(n, 4096), "key_bits": 512,
                             "bytes_per_sec": 1e9, "ns_per_buffer": n}) for n in SIZES for op in OPS]
        rows = parse_xts_speed("\n".join(lines) + "\n", len(SIZES))
        self.assertEqual([(r["bytes"], r["op"]) for r in rows], [(n, op) for n in SIZES for op in OPS])
        with self.assertRaisesRegex(RuntimeError, "result lines"):
            parse_xts_speed("\n".join(lines[:3]), len(SIZES))

    def test_xts_speed_per_cpu_second_figure_wins_over_the_process_share(self):
        row = {"engine": "openssl", "op": "decrypt", "bytes": 4096, "unit": 4096, "key_bits": 512,
               "bytes_per_sec": 3e9, "ns_per_buffer": 1365.3, "bytes_per_cpu_sec": 6e9}
        r = xts_run(row, "flashpath", 512, 4096, 0, 0.4)
        self.assertEqual((r["bytes_per_cpu_sec"], r["engine"], r["cpu_figure"], r["op"]),
                         (6e9, "openssl", "xts_speed", "decrypt"))
        # An xts_speed without its own CPU figure (before the engines): the process's share.
        del row["bytes_per_cpu_sec"], row["engine"]
        r = xts_run(row, "flashpath", 512, 4096, 0, 0.5)
        self.assertEqual((r["bytes_per_cpu_sec"], r["engine"], r["cpu_figure"]), (6e9, "xts-mode", "process share"))

    def test_a_run_that_had_half_the_core_counts_twice_per_cpu_second(self):
        r = cipher_run({"bytes_per_sec": 1e9}, "openssl", 512, 4096, "encrypt", 0, 0.5)
        self.assertEqual(r["bytes_per_cpu_sec"], 2e9)
        self.assertEqual((r["tool"], r["bits"], r["bytes"], r["op"]), ("openssl", 512, 4096, "encrypt"))


def synthetic(reps=2, cipher_reps=2):
    """A results dict shaped as run_crypto writes it: openssl at 4 GB/s, flashpath at 1 GB/s per CPU
    second (3 and 0.9 by the wall clock); every
    disk at a made-up IOPS, fp-crypto at 400 K."""
    runs, rows = [], []
    for bits in KEY_BITS:
        for n in SIZES:
            for op in OPS:
                rows.append({"bits": bits, "cipher": f"aes-{bits // 2}-xts", "bytes": n, "op": op,
                             "openssl_bytes_per_sec": 3e9, "flashpath_bytes_per_sec": 0.9e9,
                             "openssl_bytes_per_cpu_sec": 4e9, "flashpath_bytes_per_cpu_sec": 1e9,
                             "fallback_bytes_per_sec": 0.5e9, "fallback_bytes_per_cpu_sec": 0.6e9,
                             "openssl_runs": cipher_reps, "flashpath_runs": cipher_reps, "fallback_runs": cipher_reps,
                             "min_cpu_share": 0.75, "ratio": 0.25, "ratio_wall": 0.3, "fallback_ratio": 0.15,
                             "flashpath_engine": "openssl",
                             "flashpath_ns_per_buffer": n})
    bench = CryptoSection()
    runs.append({"tool": "flashpath", "engine": "openssl"})
    bench.results = {"crypto": {"cipher": {"runs": runs, "rows": rows}}}
    iops = {"fp-plain": 900e3, "fp-crypto": 400e3, "fp-crypto-512": 300e3, "qsd-raw": 200e3, "qsd-luks": 100e3}
    points = []
    for pattern in PATTERN_OP:
        per = {v: [{"iops": iops[v], "mbps": iops[v] * 4096 / 1e6, "p50_ns": 50e3, "p99_ns": 90e3, "p999_ns": 1e5,
                    "lat_mean_ns": 6e4, "server_cpu_ns_per_io": 1e9 / iops[v], "server_wait_share": 0.01,
                    **({"reactor_busy_ns_per_io": 1e9 / iops[v]} if v.startswith("fp") else {})}
                   for _ in range(reps)] for v in VARIANTS}
        points.append(bench.crypto_point((pattern, 4096, 32, 1, True), per))
    e = bench.results["crypto"]
    e.update({"points": points, "loadavg_before": [0.5, 0, 0], "loadavg_after": [0.6, 0, 0], "cpu": 0,
              "config": dict(CONFIG["quick"], reps=reps, cipher_reps=cipher_reps)})
    return {"crypto": e, "meta": {"server_cpu": 0, "client_cpu": 1}}


class Report(unittest.TestCase):
    def test_bound_and_ratios(self):
        res = synthetic()
        p = res["crypto"]["points"][0]
        # openssl's 4 GB/s (per CPU second, not the wall clock's 3) of 4096-byte buffers: 976,562.5
        # blocks/s; 400 K IOPS is 0.41x that.
        self.assertAlmostEqual(p["openssl_bound_iops"], 4e9 / 4096)
        self.assertAlmostEqual(p["median"]["fp-crypto"]["vs_openssl_bound"], 400e3 / (4e9 / 4096))
        # 2,500 ns of server CPU per I/O: 400 K I/Os per CPU second, the same ratio.
        self.assertAlmostEqual(p["median"]["fp-crypto"]["iops_per_cpu_sec"], 400e3)
        self.assertAlmostEqual(p["median"]["fp-crypto"]["vs_openssl_bound_cpu"], 400e3 / (4e9 / 4096))
        self.assertAlmostEqual(p["ratios"]["qsd_luks_vs_raw_iops"], 0.5)
        self.assertAlmostEqual(p["cost"]["fp_crypto_busy_ns_per_io"], 1e9 / 400e3 - 1e9 / 900e3)
        self.assertEqual(p["cost"]["xts_speed_ns_per_4k"], 4096)
        # 1 GB/s per CPU second: 4,096 ns of CPU per 4 KiB buffer.
        self.assertAlmostEqual(p["cost"]["xts_speed_cpu_ns_per_4k"], 4096)
        self.assertAlmostEqual(p["cost"]["qsd_luks_cpu_ns_per_io"], 1e9 / 100e3 - 1e9 / 200e3)
        # 0.8x of 976,562.5 blocks/s: 1,280 ns per I/O allowed, fp-plain's 1,111 ns leave 169 ns;
        # openssl's own 1,024 ns per buffer.
        self.assertAlmostEqual(p["budget"]["target_cpu_ns_per_io"], 1280)
        self.assertAlmostEqual(p["budget"]["left_for_cipher_ns"], 1280 - 1e9 / 900e3)
        self.assertAlmostEqual(p["budget"]["openssl_cpu_ns_per_4k"], 1024)

    def test_targets_judge_the_512_bit_key_and_the_4k_crypto_disk(self):
        res = synthetic()
        out = []
        crypto_targets(res, lambda name, goal, measured, met, note="": out.append((name, met)))
        # Six cipher rows (aes-256-xts: three sizes, two operations) and the two data-path points.
        self.assertEqual(len(out), len(SIZES) * len(OPS) + len(PATTERN_OP))
        self.assertTrue(all(met is False for _, met in out))
        self.assertTrue(all("aes-128" not in name for name, _ in out))

    def test_markdown_has_every_row(self):
        md = "\n".join(crypto_markdown(synthetic()))
        self.assertIn("## AES-XTS", md)
        self.assertEqual(md.count("| aes-256-xts |"), len(SIZES) * len(OPS))
        self.assertEqual(md.count("| qsd-luks |"), len(PATTERN_OP))

    def test_validation_passes_a_whole_run_and_names_what_is_missing(self):
        res = synthetic()
        c = res["crypto"]["config"]
        self.assertEqual(validate_crypto(res, c), [])
        res["crypto"]["cipher"]["rows"][0]["fallback_runs"] = 1
        res["crypto"]["cipher"]["rows"].pop()
        res["crypto"]["points"][1]["runs"]["qsd-luks"].pop()
        res["crypto"]["points"][0]["median"]["fp-crypto"]["reactor_busy_ns_per_io"] = None
        probs = validate_crypto(res, c)
        self.assertEqual(len(probs), 4, probs)
        self.assertIn("1 fallback runs, want 2", probs[0])
        self.assertIn("no row for 256-bit 16384 bytes decrypt", probs[1])
        self.assertTrue(any("qsd-luks: 1 runs, want 2" in p for p in probs))
        self.assertTrue(any("fp-crypto: reactor_busy_ns_per_io = None" in p for p in probs))


if __name__ == "__main__":
    unittest.main()
