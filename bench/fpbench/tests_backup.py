"""The backup section's own checks: the bitmap summary and its cost, the two definitions of
"1 % changed" and what they touch, the chunk size that would meet the incremental goal, the job
and restore parsers, the NBD request encoding, the targets' verdicts and the output check
(`python3 -m unittest fpbench.tests_backup`)."""

import random
import struct
import unittest

from fpbench.common import MIB
from fpbench.report_backup import backup_markdown, backup_targets, validate_backup
from fpbench.sections.backup import (NBD_CMD_WRITE, NBD_REPLY_MAGIC, NBD_REQUEST_MAGIC, chunk_rewrites,
                                     chunk_size_for, chunks_touched, expected_touched, job_finished, job_id_of,
                                     job_progress, nbd_parse_reply, nbd_request, parse_curl_time, progress_bytes,
                                     restore_state, scattered_writes, summarize_bitmap, summarize_boots, upload_verdict,
                                     variant_order)

GIB = 1 << 30
W32, R32 = ("randwrite", 4096, 32), ("randread", 4096, 32)


def run(variant, point, iops, rep=0, backend="null", count=None):
    r = {"backend": backend, "variant": variant, "point": list(point), "rep": rep, "iops": iops, "p50_ns": 1000,
         "p99_ns": 2000, "server_cpu_ns_per_io": 3000, "reactor_busy_ns_per_io": 1e9 / iops}
    if variant == "on":
        r["bitmap_count"] = count if count is not None else 64 * MIB
    return r


def config(reps=2):
    return {"bitmap": {"backends": ["null"], "points": [list(W32), list(R32)], "reps": reps, "secs": 1.0,
                       "granularity": 65536, "size_mib": 1024},
            "stores": ["file", "rgw"], "disk_mib": 1024, "chunk_size": MIB, "changed_frac": 0.01,
            "rclone_flags": [], "guest_point": list(R32), "speed": 50 * MIB, "restore_hold_speed": MIB,
            "boot": {"root_mib": 256, "reps": 2, "held_speed": MIB, "mem_mib": 256, "timeout_s": 600}}


def boot_runs():
    walls = {"local": (20.0, 22.0), "restore": (21.0, 23.0), "restore-held": (30.0, 34.0)}
    rs = []
    for v, ws in walls.items():
        for rep, w in enumerate(ws):
            r = {"variant": v, "rep": rep, "wall_s": w, "uptime_s": w - 1, "read_kib": 96 * 1024, "root_at_s": 9.0}
            if v != "local":
                r.update(chunks_restored_after=100, chunks=256)
            rs.append(r)
    return rs


def bitmap_runs():
    rs = []
    for rep, (off, on) in enumerate([(1_000_000, 980_000), (1_100_000, 1_060_000)]):
        for p in (W32, R32):
            rs += [run("off", p, off, rep), run("on", p, on, rep)]
    return rs


def result(rs, **extra):
    b = {"config": config(), "loadavg_before": [0.5], "loadavg_after": [0.6], "notes": [],
         "bitmap": {"runs": rs, "summary": summarize_bitmap(rs, ["null"], [W32, R32])}, "rpcs_missing": []}
    b.update(extra)
    return {"backup": b, "meta": {"server_cpu": 0, "client_cpu": 1, "machine": {"cpus": 2}}}


class Bitmap(unittest.TestCase):
    def test_the_order_alternates(self):
        self.assertEqual(variant_order(0), ("off", "on"))
        self.assertEqual(variant_order(1), ("on", "off"))

    def test_medians_cost_and_counts(self):
        s = summarize_bitmap(bitmap_runs(), ["null"], [W32, R32])
        w = s[0]
        self.assertEqual(w["off"]["iops"], 1_050_000)
        self.assertEqual(w["on"]["iops"], 1_020_000)
        self.assertEqual(w["paired_ratios"], [0.98, 1_060_000 / 1_100_000])
        self.assertAlmostEqual(w["cost"], 1 - (0.98 + 1_060_000 / 1_100_000) / 2)
        self.assertAlmostEqual(w["ratio_of_medians"], 1_020_000 / 1_050_000)
        self.assertEqual(w["on"]["runs"], 2)
        self.assertEqual(w["bitmap_counts"], [64 * MIB, 64 * MIB])
        self.assertEqual(w["off"]["iops_all"], [1_000_000, 1_100_000])

    def test_the_cost_is_judged_on_pairs_not_on_drifting_medians(self):
        # The machine's load changes between repetitions; each pair still shows 1 %.
        rs = []
        for rep, (off, on) in enumerate([(1.0e6, 0.99e6), (3.0e6, 2.97e6), (2.0e6, 2.5e6)]):
            rs += [run("off", W32, off, rep), run("on", W32, on, rep)]
        w = summarize_bitmap(rs, ["null"], [W32])[0]
        self.assertAlmostEqual(w["ratio"], 0.99)
        self.assertAlmostEqual(w["ratio_of_medians"], 1.25)

    def test_the_verdict_is_on_randwrite_qd32_only(self):
        got = []
        backup_targets(result(bitmap_runs()), lambda *a: got.append(a))
        self.assertEqual(len(got), 1)
        self.assertIn("randwrite 4 KiB QD32", got[0][0])
        self.assertIs(got[0][3], True)  # 2.9 %
        rs = [run("off", W32, 1_000_000), run("on", W32, 960_000)]
        got.clear()
        b = result(rs)
        b["backup"]["bitmap"]["summary"] = summarize_bitmap(rs, ["null"], [W32])
        backup_targets(b, lambda *a: got.append(a))
        self.assertIs(got[0][3], False)  # 4 %

    def test_missing_rpcs_are_reported_not_judged(self):
        got = []
        backup_targets(result(bitmap_runs(), rpcs_missing=["bdev_backup_start"]), lambda *a: got.append(a))
        self.assertIn("not measured", got[-1][2])
        self.assertIsNone(got[-1][3])


class Changes(unittest.TestCase):
    def test_chunk_rewrites_are_whole_distinct_chunks(self):
        w = chunk_rewrites(4 * GIB, MIB, 0.01, random.Random(1))
        self.assertEqual(len(w), 41)  # 1 % of 4096 chunks
        self.assertTrue(all(off % MIB == 0 and n == MIB for off, n in w))
        self.assertEqual(len(chunks_touched(w, MIB)), 41)

    def test_scattered_writes_touch_far_more_chunks(self):
        w = scattered_writes(4 * GIB, 0.01, random.Random(1))
        self.assertEqual(len(w), 10486)  # 1 % of the 4 KiB blocks
        self.assertEqual(len({off for off, _ in w}), len(w))
        touched = len(chunks_touched(w, MIB))
        # About 92 % of the 4096 chunks: 4096 (1 - e^(-10486/4096)).
        self.assertAlmostEqual(touched, expected_touched(4 * GIB, MIB, 10486), delta=60)
        self.assertGreater(touched, 3700)

    def test_a_write_across_a_boundary_touches_both_chunks(self):
        self.assertEqual(chunks_touched([(MIB - 4096, 8192)], MIB), {0, 1})

    def test_the_chunk_size_that_would_meet_the_goal(self):
        # 10486 random 4 KiB writes: even 64 KiB chunks upload ~16x; only 4 KiB chunks stay
        # within 1.2x, below fp_backup's 64 KiB minimum.
        self.assertEqual(chunk_size_for(4 * GIB, 10486, 4096, 1.2), ("below", 4096))
        # Few writes on a big disk: large chunks do.
        self.assertEqual(chunk_size_for(4 * GIB, 1, 4096, 300.0), 1 << 20)

    def test_upload_verdict(self):
        self.assertEqual(upload_verdict(12, 10), (1.2, True))
        self.assertEqual(upload_verdict(13, 10)[1], False)
        self.assertEqual(upload_verdict(None, 10), (None, None))


class Parsers(unittest.TestCase):
    def test_jobs(self):
        jobs = [{"job_id": "a", "state": "running", "progress": {"bytes_uploaded": 5}},
                {"job_id": "b", "state": "completed", "bytes_uploaded": 7}]
        self.assertEqual(progress_bytes(job_progress(jobs, "a"), "bytes_uploaded"), 5)
        self.assertEqual(progress_bytes(job_progress({"jobs": jobs}, "b"), "bytes_uploaded"), 7)
        self.assertIsNone(job_progress(jobs, "c"))
        self.assertEqual(job_finished(jobs[0]), (False, None))
        self.assertEqual(job_finished(jobs[1]), (True, None))
        self.assertEqual(job_finished({"state": "failed", "error": "EIO"}), (True, "EIO"))
        self.assertEqual(job_id_of("x"), "x")
        self.assertEqual(job_id_of({"job_id": "y"}), "y")

    def test_restore_state(self):
        self.assertEqual(restore_state({"driver_specific": {"backup_restore": {"chunks_total": 8,
                                                                                 "chunks_present": 3}}}), (3, 8))
        self.assertEqual(restore_state({"driver_specific": {"backup_restore": {"chunks": 8, "state": "done"}}}),
                         (8, 8))
        self.assertEqual(restore_state({}), (None, None))

    def test_boots_are_judged_on_median_wall_times_against_the_local_disk(self):
        s = summarize_boots(boot_runs())
        self.assertEqual(s["median_wall_s"]["local"], 21.0)
        self.assertAlmostEqual(s["ratio"]["restore"], 22.0 / 21.0)
        self.assertAlmostEqual(s["ratio"]["restore-held"], 32.0 / 21.0)
        self.assertEqual(s["median_uptime_s"]["restore-held"], 31.0)
        self.assertIsNone(summarize_boots([r for r in boot_runs() if r["variant"] != "local"])["ratio"]["restore"])

    def test_curl(self):
        self.assertEqual(parse_curl_time("200 1048629 0.004211\n"), (200, 1048629, 0.004211))

    def test_nbd_request_and_reply(self):
        h = nbd_request(NBD_CMD_WRITE, 7, 4096, 512)
        self.assertEqual(len(h), 28)
        self.assertEqual(struct.unpack(">IHHQQI", h), (NBD_REQUEST_MAGIC, 0, NBD_CMD_WRITE, 7, 4096, 512))
        self.assertEqual(nbd_parse_reply(struct.pack(">IIQ", NBD_REPLY_MAGIC, 0, 7)), (0, 7))
        with self.assertRaises(ValueError):
            nbd_parse_reply(struct.pack(">IIQ", 1, 0, 7))


class Report(unittest.TestCase):
    def test_markdown_without_jobs(self):
        text = "\n".join(backup_markdown(result(bitmap_runs(), rpcs_missing=["bdev_backup_start"],
                                                notes=["(B)-(D) not measured"])))
        self.assertIn("### (A)", text)
        self.assertIn("| null | randwrite 4 KiB QD32 |", text)
        self.assertIn("Not measured in this run", text)

    def test_validate_names_what_is_missing(self):
        rs = [r for r in bitmap_runs() if tuple(r["point"]) == W32]
        res = result(rs)
        res["backup"]["bitmap"]["summary"] = summarize_bitmap(rs, ["null"], [W32])
        probs = validate_backup(res, config())
        self.assertTrue(any("randread 4 KiB QD32: missing" in p for p in probs), probs)
        self.assertTrue(any("incremental file: missing" in p for p in probs), probs)
        self.assertEqual(validate_backup({}, config()), ["results.json has no 'backup'"])

    def test_validate_wants_a_bitmap_that_marked(self):
        rs = bitmap_runs()
        rs[1]["bitmap_count"] = 0
        probs = validate_backup(result(rs, rpcs_missing=["bdev_backup_start"]), config())
        self.assertEqual(len(probs), 1, probs)
        self.assertIn("did not mark", probs[0])

    def test_validate_without_the_restore_wants_b_and_c_only(self):
        res = result(bitmap_runs(), rpcs_missing=["bdev_backup_restore_create"])
        probs = validate_backup(res, config())
        self.assertIn("backup throughput: no ratio", probs)
        self.assertFalse(any("restore" in p for p in probs), probs)
        got = []
        backup_targets(res, lambda *a: got.append(a))
        self.assertIn("(D)", got[-1][0])
        self.assertIn("not measured", got[-1][2])

    def test_boot_rows_verdicts_and_check(self):
        boot = dict(root_mib=256, files_bytes=94 * MIB, backup_uploaded=90 * MIB, runs=boot_runs(),
                    **summarize_boots(boot_runs()))
        first = {"p50_ns": 3_000_000, "p99_ns": 9_000_000, "ios": 100, "chunks": 1024}
        res = result(bitmap_runs(), restore={"boot": boot, "get_s": 0.002, "get": [{}] * 9, "first_read": first,
                                             "first_read_ratio": 1.5, "restore_secs": 5.0, "restore_mbps": 200.0,
                                             "first_read_pinned": dict(first, p50_ns=6_000_000),
                                             "first_read_pinned_ratio": 3.0})
        text = "\n".join(backup_markdown(res))
        self.assertIn("p50 3000 µs, p99 9000 µs over 100 reads = 1.50x one GET", text)
        self.assertIn("every thread on the server CPU", text)
        self.assertIn("| restore-held | 32.0 s | 31.0 s | 1.52x |", text)
        got = []
        backup_targets(res, lambda *a: got.append(a))
        verdicts = {a[0]: a[3] for a in got if "boot" in a[0]}
        self.assertEqual(sorted(verdicts.values()), [False, True], verdicts)
        first = [a for a in got if "first 4 KiB read" in a[0]]
        self.assertEqual(first[0][3], True)
        self.assertTrue(any("every thread of the daemon" in a[0] and a[3] is None for a in got), got)
        probs = validate_backup(res, config())
        self.assertFalse(any("boot" in p for p in probs), probs)
        res["backup"]["restore"]["boot"]["runs"] = boot_runs()[1:]
        self.assertIn("backup boot local: 1 boots, want 2", validate_backup(res, config()))

    def test_validate_without_the_rpcs_checks_a_alone(self):
        self.assertEqual(validate_backup(result(bitmap_runs(), rpcs_missing=["bdev_backup_start"]), config()), [])


if __name__ == "__main__":
    unittest.main()
