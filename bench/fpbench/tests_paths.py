"""Unit tests of the paths section's pure parts: the gap finder on a timeline, a run's figures
against the bound, the summaries and the target lines (no servers)."""

import base64
import socket
import threading
import unittest
import zlib

from fpbench.relay import RelayProcess
from fpbench.report_paths import paths_targets, validate_paths
from fpbench.sections.paths import (connect_summary, dhchap_secret, disturbed, failover_bound_s, failover_summary,
                                    longest_gap, nearest_rank, run_figures)


def _tl(ios, step=0.05):
    return {"interval_s": step, "ios": ios}


class LongestGap(unittest.TestCase):
    def test_the_longest_run_of_empty_buckets(self):
        g = longest_gap(_tl([5, 0, 7, 0, 0, 0, 3, 0, 0, 4]))
        self.assertEqual(g["buckets"], 3)
        self.assertAlmostEqual(g["gap_s"], 0.15)
        self.assertAlmostEqual(g["start_s"], 0.15)
        self.assertAlmostEqual(g["end_s"], 0.30)

    def test_only_buckets_from_the_cut_count(self):
        # A longer empty stretch before the cut (a slow start) is not the failover's.
        ios = [0, 0, 0, 0, 9, 9, 0, 0, 9]
        self.assertEqual(longest_gap(_tl(ios), 0.0)["buckets"], 4)
        g = longest_gap(_tl(ios), 0.26)  # inside bucket 5
        self.assertEqual(g["buckets"], 2)
        self.assertAlmostEqual(g["start_s"], 0.30)

    def test_a_gap_running_to_the_end_counts(self):
        self.assertEqual(longest_gap(_tl([1, 1, 0, 0, 0]), 0.05)["buckets"], 3)

    def test_no_empty_bucket_is_no_gap(self):
        g = longest_gap(_tl([1, 2, 3]))
        self.assertEqual((g["buckets"], g["gap_s"], g["start_s"]), (0, 0.0, None))

    def test_the_first_of_equal_gaps(self):
        self.assertAlmostEqual(longest_gap(_tl([0, 0, 1, 0, 0]))["start_s"], 0.0)


class Bound(unittest.TestCase):
    def test_kato_plus_the_cqt_standin_when_the_controller_reports_none(self):
        self.assertAlmostEqual(failover_bound_s(1000), 2.0)
        self.assertAlmostEqual(failover_bound_s(2000, 0), 3.0)

    def test_kato_plus_a_reported_cqt(self):
        self.assertAlmostEqual(failover_bound_s(1000, 1500), 2.5)


def _res(ios, lat_max_ns, errors=0, mismatches=0, verified=100):
    return {"timeline": _tl(ios), "lat_max_ns": lat_max_ns, "errors": errors, "mismatches": mismatches,
            "verified": verified, "ios": sum(ios), "iops": 1.0}


class RunFigures(unittest.TestCase):
    def test_the_worse_of_gap_and_longest_request_against_the_bound(self):
        # 40 empty buckets (2 s) after the cut; one request waited 2.5 s.
        ios = [10] * 20 + [0] * 40 + [10] * 20
        r = run_figures(_res(ios, 2_500_000_000), 1.0, 2.0, 4096)
        self.assertAlmostEqual(r["gap_s"], 2.0)
        self.assertAlmostEqual(r["gap_ratio"], 1.0)
        self.assertAlmostEqual(r["lat_max_ratio"], 1.25)
        self.assertAlmostEqual(r["ratio"], 1.25)
        self.assertEqual(r["verified_bytes"], 100 * 4096)

    def test_active_active_keeps_completing_but_a_request_waited(self):
        r = run_figures(_res([10] * 80, 2_100_000_000), 1.0, 2.0, 4096)
        self.assertEqual(r["gap_s"], 0.0)
        self.assertAlmostEqual(r["ratio"], 1.05)

    def test_failed_and_mismatched_io_are_carried(self):
        r = run_figures(_res([1, 1], 1000, errors=3, mismatches=1, verified=None), 0.0, 2.0, 4096)
        self.assertEqual((r["errors"], r["mismatches"], r["verified_bytes"]), (3, 1, 0))


def _run(kind, policy, qd, ratio, gap=1.0, errors=0, mismatches=0, failback=0.5):
    return {"kind": kind, "policy": policy, "qd": qd, "bound_s": 2.0, "ratio": ratio, "gap_s": gap,
            "lat_max_s": ratio * 2.0, "detected_s": 0.1, "errors": errors, "mismatches": mismatches,
            "verified_bytes": 4096, "failback_s": failback}


class FailoverSummary(unittest.TestCase):
    def test_median_worst_and_sums_per_row(self):
        s = failover_summary([_run("cut", "active_passive", 1, 1.1), _run("cut", "active_passive", 1, 1.5, failback=None),
                              _run("cut", "active_passive", 1, 1.2), _run("stall", "active_passive", 1, 2.5)])
        rows = {(x["kind"], x["qd"]): x for x in s}
        cut = rows[("cut", 1)]
        self.assertEqual(cut["runs"], 3)
        self.assertAlmostEqual(cut["ratio_median"], 1.2)
        self.assertAlmostEqual(cut["ratio_worst"], 1.5)
        self.assertEqual(cut["verified_bytes"], 3 * 4096)
        self.assertEqual(cut["failback_seen"], 2)
        self.assertEqual(cut["held_runs"], 3)  # longest requests 2.2, 3.0 and 2.4 s against 2 s
        self.assertTrue(cut["met"])
        self.assertFalse(rows[("stall", 1)]["met"])

    def test_a_run_below_the_bound_held_nothing(self):
        s = failover_summary([_run("cut", "active_passive", 16, 0.05), _run("cut", "active_passive", 16, 1.0)])
        self.assertEqual(s[0]["held_runs"], 1)

    def test_a_failed_io_misses_whatever_the_time(self):
        s = failover_summary([_run("cut", "active_active", 16, 1.0, errors=1)])
        self.assertFalse(s[0]["met"])


class Disturbed(unittest.TestCase):
    def test_a_clean_run(self):
        r = {"cut_s": 4.05, "restore_s": 8.1, "paths": {"start": [{"generation": 2}, {"generation": 2}],
                                                       "end": [{"generation": 7}, {"generation": 2}]}}
        self.assertEqual(disturbed(r, 12.0), [])  # the broken path's own resets do not count

    def test_a_late_break_and_a_reset_survivor(self):
        r = {"cut_s": 7.1, "restore_s": 8.0, "paths": {"start": [{"generation": 2}, {"generation": 2}],
                                                      "end": [{"generation": 7}, {"generation": 3}]}}
        why = disturbed(r, 12.0)
        self.assertEqual(len(why), 2, why)
        self.assertTrue(why[0].startswith("break 3.10 s late"), why)
        self.assertIn("surviving path 1 reset", why[1])

    def test_the_summary_keeps_the_worst_of_the_clean_runs(self):
        rs = [dict(_run("cut", "active_passive", 1, 1.0)), dict(_run("cut", "active_passive", 1, 2.3), disturbed=["x"])]
        s = failover_summary(rs)[0]
        self.assertEqual((s["disturbed_runs"], s["ratio_worst"], s["ratio_worst_undisturbed"]), (1, 2.3, 1.0))
        self.assertFalse(s["met"])  # judged on every run


class ConnectSummary(unittest.TestCase):
    def test_added_cost_per_attach_and_per_queue(self):
        att = {"none": [1.0, 2.0, 3.0], "ffdhe2048": [4.0, 5.0, 6.0]}
        s = connect_summary(att, {"none": 0, "ffdhe2048": 2})
        self.assertEqual(s["none"]["median_ms"], 2.0)
        self.assertAlmostEqual(s["ffdhe2048"]["added_ms"], 3.0)
        self.assertEqual(s["ffdhe2048"]["queues"], 2)
        self.assertAlmostEqual(s["ffdhe2048"]["added_ms_per_queue"], 1.5)
        self.assertNotIn("added_ms", s["none"])

    def test_p90_by_nearest_rank(self):
        self.assertEqual(nearest_rank(list(range(1, 11)), 0.9), 9)
        self.assertEqual(nearest_rank([5.0, 1.0, 3.0], 0.9), 5.0)
        self.assertIsNone(nearest_rank([], 0.9))


class Secret(unittest.TestCase):
    def test_the_format_nvme_cli_writes(self):
        # The secret of crates/flashpath/tests/spdk_rpc.rs's "host1" (bytes 33..64, no transform).
        self.assertEqual(dhchap_secret(bytes(range(33, 65))), "DHHC-1:00:ISIjJCUmJygpKissLS4vMDEyMzQ1Njc4OTo7PD0+P0Dc1bqW:")
        key = bytes(32)
        body = base64.b64decode(dhchap_secret(key).split(":")[2])
        self.assertEqual(int.from_bytes(body[32:], "little"), zlib.crc32(key))


def _section(ratio_worst=1.2, errors=0, added=3.0):
    cfg = {"kinds": ["cut"], "policies": ["active_passive"], "qds": [16], "reps": 1, "attaches": 2}
    run = dict(_run("cut", "active_passive", 16, ratio_worst, errors=errors), rep=0, timeline=_tl([1, 0, 1]))
    return cfg, {"paths": {
        "config": cfg, "runs": [run], "failover": failover_summary([run]),
        "connect": {"summary": connect_summary({"none": [1.0, 1.0], "null": [2.0, 2.0], "ffdhe2048": [1.0 + added] * 2,
                                                "ffdhe4096": [9.0, 9.0]}, {})}}}


class Targets(unittest.TestCase):
    def lines(self, res):
        got = []
        paths_targets(res, lambda what, goal, measured, ok, note="": got.append((what, goal, measured, ok)))
        return got

    def test_met_within_twice_the_bound_and_no_failed_io(self):
        got = self.lines(_section()[1])
        self.assertEqual([g[3] for g in got], [True, None, True, None])  # cut, null and ffdhe4096 reported
        self.assertIn("worst 1.20x", got[0][2])
        self.assertIn("= +3.00 ms", got[2][2])
        self.assertIn("= +1.00 ms", got[1][2])  # the null group's row

    def test_missed_on_time_on_failed_io_and_on_the_auth_cost(self):
        self.assertFalse(self.lines(_section(ratio_worst=2.1)[1])[0][3])
        self.assertFalse(self.lines(_section(errors=1)[1])[0][3])
        self.assertFalse(self.lines(_section(added=5.5)[1])[2][3])

    def test_validate_accepts_a_whole_section_and_names_what_is_missing(self):
        cfg, res = _section()
        self.assertEqual(validate_paths(res, cfg), [])
        del res["paths"]["connect"]["summary"]["ffdhe4096"]
        res["paths"]["runs"][0]["verified_bytes"] = 0
        probs = validate_paths(res, dict(cfg, qds=[1, 16]))
        self.assertTrue(any("QD1: missing" in p for p in probs), probs)
        self.assertTrue(any("ffdhe4096: missing" in p for p in probs), probs)
        self.assertTrue(any("nothing verified" in p for p in probs), probs)


class Echo:
    """A loopback echo server on a thread: the relay's far end."""

    def __init__(self):
        self.lst = socket.create_server(("127.0.0.1", 0))
        self.lst.settimeout(5)
        self.port = self.lst.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                c, _ = self.lst.accept()
            except OSError:
                return
            threading.Thread(target=self._echo, args=(c,), daemon=True).start()

    @staticmethod
    def _echo(c):
        c.settimeout(5)
        try:
            while True:
                data = c.recv(4096)
                if not data:
                    return
                c.sendall(data)
        except OSError:
            return
        finally:
            c.close()


def _round_trip(port, data=b"ping", timeout=0.5):
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(data)
        return s.recv(4096)


class RelayBehaviour(unittest.TestCase):
    """The relay process against a real echo server (loopback, well under a second)."""

    def setUp(self):
        self.echo = Echo()
        self.relay = RelayProcess(self.echo.port)

    def tearDown(self):
        self.relay.stop()
        self.echo.lst.close()

    def test_cut_closes_and_refuses_restore_forwards_again(self):
        s = socket.create_connection(("127.0.0.1", self.relay.port), timeout=2)
        s.sendall(b"a")
        self.assertEqual(s.recv(16), b"a")
        self.relay.cut()
        self.assertEqual(s.recv(16), b"")  # the live connection is closed
        s.close()
        with self.assertRaises(ConnectionRefusedError):
            _round_trip(self.relay.port)
        self.relay.restore()
        self.assertEqual(_round_trip(self.relay.port, b"back"), b"back")

    def test_stall_keeps_the_connection_and_forwards_nothing_until_restored(self):
        s = socket.create_connection(("127.0.0.1", self.relay.port), timeout=2)
        self.relay.stall()
        s.sendall(b"held")
        s.settimeout(0.3)
        with self.assertRaises(socket.timeout):
            s.recv(16)
        # A new connection is accepted, and held too.
        with self.assertRaises(socket.timeout):
            _round_trip(self.relay.port, timeout=0.3)
        self.relay.restore()
        s.settimeout(2)
        self.assertEqual(s.recv(16), b"held")  # the stalled connection resumes where it stopped
        s.close()


if __name__ == "__main__":
    unittest.main()
