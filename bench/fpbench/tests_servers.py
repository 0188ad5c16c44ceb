"""The bench's process handling: a server it started dies with it, even when the bench is
killed outright and runs no cleanup."""

import os
import signal
import subprocess
import sys
import tempfile
import time
import unittest

CHILD = """
import sys, time
sys.path.insert(0, {root!r})
from fpbench.servers import spawn
p = spawn(["sleep", "60"], {log!r})
print(p.pid, flush=True)
time.sleep(60)
"""


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(") ", 1)[1][0] != "Z"
    except FileNotFoundError:
        return False


class ServersDieWithTheBench(unittest.TestCase):
    def test_a_server_dies_when_the_bench_is_killed(self):
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        with tempfile.TemporaryDirectory() as d:
            code = CHILD.format(root=root, log=os.path.join(d, "sleep.log"))
            bench = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
            try:
                server = int(bench.stdout.readline())
                self.assertTrue(alive(server), "the server started")
                bench.send_signal(signal.SIGKILL)
                bench.wait(10)
                deadline = time.monotonic() + 10
                while alive(server) and time.monotonic() < deadline:
                    time.sleep(0.01)
                self.assertFalse(alive(server), "the server outlived the bench killed with SIGKILL")
            finally:
                bench.kill()
                bench.wait(10)


if __name__ == "__main__":
    unittest.main()
