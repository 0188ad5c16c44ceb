"""The NVMe/TCP floor responder (bench/tcp_floor.c) against flashpath's own NVMe/TCP initiator:
it builds with the machine's C compiler, `bdev_nvme_attach_controller` attaches to it, and reads
of its namespace through a vhost-user-blk export of that bdev (fp-load, one second at QD1 and
QD32) all succeed, in both of its system call modes. Needs a built flashpath and fp-load:
`FLASHPATH_BIN_DIR` (default target/debug, which ./run test has built):
`cd bench && FLASHPATH_BIN_DIR=../target/debug python3 -m unittest fpbench.tests_floor` (seconds).
"""

import os
import shutil
import tempfile
import unittest

from fpbench.floor import MODES, Floor, build_floor
from fpbench.load import Loader
from fpbench.servers import Flashpath, kill_all_children

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN_DIR = os.environ.get("FLASHPATH_BIN_DIR") or os.path.join(ROOT, "target", "debug")
BLOCKS = 1 << 20  # 512 MiB of 512-byte blocks


class FloorTest(unittest.TestCase):
    def setUp(self):
        missing = [b for b in ("flashpath", "fp-load") if not os.access(os.path.join(BIN_DIR, b), os.X_OK)]
        if missing and os.environ.get("FLASHPATH_BIN_DIR"):
            self.fail(f"FLASHPATH_BIN_DIR={BIN_DIR} has no {', '.join(missing)}")
        if missing:
            self.skipTest(f"no built {', '.join(missing)} in {BIN_DIR} (set FLASHPATH_BIN_DIR)")
        self.work = tempfile.mkdtemp(prefix="fp-floor-")
        self.addCleanup(shutil.rmtree, self.work, True)
        self.addCleanup(kill_all_children)
        self.binary = build_floor(self.work)

    def test_flashpath_initiator_reads_from_the_floor(self):
        for mode in MODES:
            with self.subTest(mode=mode):
                floor = Floor(self.binary, self.work, 0, BLOCKS, mode=mode, name=f"floor-{mode}")
                self.addCleanup(floor.stop)
                fp = Flashpath(BIN_DIR, self.work, "0", name=f"flashpath-{mode}")
                self.addCleanup(fp.stop)
                bdevs = fp.rpc("bdev_nvme_attach_controller", {
                    "name": "Nvme0", "trtype": "TCP", "adrfam": "IPv4", "traddr": "127.0.0.1",
                    "trsvcid": str(floor.port), "subnqn": "nqn.2016-06.io.spdk:floor"})
                self.assertEqual(bdevs, ["Nvme0n1"])
                info = fp.rpc("bdev_get_bdevs", {"name": "Nvme0n1"})[0]
                # The namespace Identify Namespace described: its size and block size.
                self.assertEqual((info["num_blocks"], info["block_size"]), (BLOCKS, 512))
                sock = fp.export("vhost.floor", "Nvme0n1", queues=1)
                loader = Loader(BIN_DIR, 1, self.work)
                for qd in (1, 32):
                    r = loader.run(sock, "randread", 4096, qd, 1, True, 1)
                    self.assertEqual(r["errors"], 0, f"QD{qd}: {r.get('first_error')}")
                    self.assertGreater(r["ios"], 0, f"QD{qd}: no read completed")
                fp.stop()
                floor.stop()


if __name__ == "__main__":
    unittest.main()
