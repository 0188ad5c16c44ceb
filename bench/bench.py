#!/usr/bin/python3
"""flashpath vs qemu-storage-daemon, side by side, in one run.

Starts flashpath and qemu-storage-daemon (qsd) pinned to the same core, serves the same backend
kind from both (null, RAM, a file through io_uring with O_DIRECT), drives each with the same
libblkio load generator (fp-load) pinned to another core, and writes results.json,
results.md and PNG plots. Every point runs --reps times with the servers interleaved
(A B A B ...); medians and flashpath/qsd ratios are reported. fio (io_uring, direct=1) on the
same file is the host baseline for the file backend.

Run it through `./run bench [--quick|--smoke]`, which installs what it needs and builds the
binaries; docs/benchmarks.md describes every choice. Needs matplotlib (Debian
python3-matplotlib), so run it with /usr/bin/python3.
"""

import argparse
import datetime
import json
import math
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

GIB = 1 << 30
MIB = 1 << 20

# ---------------------------------------------------------------------------------------------
# Modes


def mode_config(mode):
    """What a mode measures. `points` lists (pattern, bs, qd, queues, poll) per backend;
    `callgrind` gives the path-length runs (null backend): the short and long run's seconds,
    the repetitions and the points."""
    full_points = []
    for pattern in ("randread", "randwrite"):
        for queues in (1, 2):
            for qd in (1, 8, 32, 128):
                for poll in (True, False):
                    full_points.append((pattern, 4096, qd, queues, poll))
    for qd in (1, 32):
        for poll in (True, False):
            full_points.append(("read", 65536, qd, 1, poll))
    cg_points = [("randread", 4096, 32, 1, poll) for poll in (True, False)]
    rbd_points = [(pattern, 4096, qd, 1, False) for pattern in ("randread", "randwrite") for qd in (1, 32)]
    # NBD (issue 14): (pattern, bs, qd) through fio's nbd engine, one connection.
    nbd_points = [("randread", 4096, 1), ("randread", 4096, 32), ("read", MIB, 8), ("write", MIB, 8)]
    full = {
        "time": 2.0,
        "reps": 3,
        "idle_time": 5.0,
        "backends": ["null", "ram", "file"],
        "points": full_points,
        "scaling_points": [(qd, poll) for qd in (32, 128) for poll in (True, False)],
        # (qd, poll): fp-load --packed vs split rings on the null disk, interleaved.
        "packed_points": [(1, True), (32, True)],
        # The disk layer's cost (null, 4K randread, QD32, 1 polled queue): counters off
        # (serve --no-iostat), counters on, counters and histograms on, interleaved; reps.
        "iostat_reps": 5,
        # ... and each variant's path length under callgrind (the callgrind section's lengths).
        "iostat_callgrind": True,
        "ceiling_reps": 3,
        "sizes": {"null": GIB, "ram": 512 * MIB, "file": GIB},
        "callgrind": {"short_s": 2.0, "long_s": 8.0, "reps": 3, "points": cg_points},
        # Logical volumes (`--only lvol`): raw malloc vs a thick volume on the same size of
        # malloc, `pairs` runs of each point; first-write and copy-on-write latency on `fw_reps`
        # fresh thin volumes; instructions per I/O with the callgrind settings above.
        # fw_clusters: the cluster sizes of the first-write runs (SPDK's default is 4 MiB).
        "lvol": {"size": 256 * MIB, "cluster": MIB, "pairs": 5, "fw_reps": 3, "callgrind": True,
                 "fw_clusters": [MIB, 4 * MIB],
                 "points": [("randread", 4096, 32, 1, True), ("randwrite", 4096, 32, 1, True),
                            ("randread", 4096, 1, 1, True), ("randwrite", 4096, 1, 1, True)],
                 "cg_size": 64 * MIB},
        # Quality of service (`--only qos`, issue 12). Accuracy: each limit flooded for
        # `acc_secs` with a `window`-second timeline, with 1, 2 and 4 queues on two reactors;
        # bw_limits are (MiB/s, block size). The other parts: see run_qos.
        "qos": {"acc_secs": 10.0, "window": 1.0, "ceiling_secs": 3.0, "queues": [1, 2, 4],
                "iops_limits": [1000, 10_000, 100_000, 1_000_000], "iops_qd": 32,
                "bw_limits": [(1, 4096), (16, 16384), (256, 65536), (2048, 131072)], "bw_qd": 16,
                "burst": {"avg": 5000, "max": 20_000, "length": 3, "secs": 8.0, "window": 1.0, "qd": 32},
                "shares": {"limit": 10_000, "weights": [3, 1], "secs": 10.0, "window": 1.0, "qd": 32},
                "noisy": {"disks": 16, "flood_qd": 128, "qd1_rate": 1000, "qd1_limit": 2000,
                          "flood_limit": 20_000, "group_limit": 40_000, "secs": 10.0, "reps": 3,
                          "scenarios": ["none", "limits", "group"]},
                "overhead": {"reps": 5, "secs": 2.0, "limit": 10_000_000, "limit_mib": 1_000_000}},
        # Ceph RBD (issue 13): one image on a single-node cluster, served by one server at a
        # time (qsd's rbd driver, flashpath's rbd bdev); `rounds` rounds of every point on each
        # server, the order alternating; `secs` per run; `warmup` seconds of writes after each
        # start. Completion-fd client only: a polled client would take the CPU the cluster
        # shares with it. See run_rbd.
        "rbd": {"size_mib": 1024, "secs": 5.0, "rounds": 3, "warmup": 0.5, "points": rbd_points},
        # NBD (issue 14): a RAM disk exported over a Unix socket by flashpath, qsd and nbdkit, all
        # three running, one loaded at a time; `reps` runs of every point on each, interleaved
        # (the order rotating); `secs` per run. See run_nbd.
        "nbd": {"size_mib": 1024, "secs": 5.0, "reps": 3, "points": nbd_points},
    }
    if mode == "full":
        return full
    if mode == "quick":
        pts = [p for p in full_points if p[0] != "read" and p[2] in (1, 32) and p[3] == 1]
        pts.append(("randread", 4096, 32, 2, True))
        pts.append(("read", 65536, 32, 1, True))
        return dict(full, time=1.0, points=pts, scaling_points=[(32, True)], ceiling_reps=1,
                    sizes={"null": GIB, "ram": 256 * MIB, "file": 256 * MIB},
                    callgrind=dict(full["callgrind"], short_s=1.0, long_s=4.0),
                    lvol=dict(full["lvol"], pairs=3, fw_reps=2),
                    qos=dict(full["qos"], acc_secs=2.0, ceiling_secs=1.0,
                             burst=dict(full["qos"]["burst"], avg=2000, max=8000, length=2, secs=4.0),
                             shares=dict(full["qos"]["shares"], secs=4.0),
                             noisy=dict(full["qos"]["noisy"], secs=3.0, reps=1),
                             overhead=dict(full["qos"]["overhead"], reps=3, secs=1.0)),
                    rbd=dict(full["rbd"], secs=1.0),
                    nbd=dict(full["nbd"], size_mib=256, secs=1.0, reps=2))
    if mode == "smoke":
        # Null backend, A/B, one repetition; one small file point exercises the fio baseline.
        pts = [
            ("randread", 4096, 1, 1, True),
            ("randread", 4096, 1, 1, False),
            ("randread", 4096, 32, 1, True),
            ("randread", 4096, 32, 1, False),
            ("randread", 4096, 32, 2, True),
        ]
        return {
            "time": 1.0,
            "reps": 1,
            "idle_time": 1.0,
            "backends": ["null", "file"],
            "points": pts,
            "file_points": [("randread", 4096, 1, 1, False)],
            "scaling_points": [(32, True)],
            "packed_points": [],
            "iostat_reps": 1,
            "iostat_callgrind": False,  # six more debug servers under valgrind: too slow for CI
            "ceiling_reps": 1,
            "sizes": {"null": GIB, "file": 64 * MIB},
            "callgrind": {"short_s": 0.5, "long_s": 1.5, "reps": 1, "points": cg_points[:1]},
            "lvol": {"size": 32 * MIB, "cluster": MIB, "pairs": 1, "fw_reps": 1, "callgrind": False,
                     "fw_clusters": [MIB],
                     "points": [("randread", 4096, 32, 1, True), ("randwrite", 4096, 32, 1, True)],
                     "cg_size": 32 * MIB},
            # One point of each QoS part, to check the pipeline.
            "qos": {"acc_secs": 1.0, "window": 0.5, "ceiling_secs": 0.5, "queues": [2],
                    "iops_limits": [10_000], "iops_qd": 8, "bw_limits": [(16, 16384)], "bw_qd": 8,
                    "burst": {"avg": 2000, "max": 8000, "length": 1, "secs": 2.0, "window": 0.5, "qd": 8},
                    "shares": {"limit": 10_000, "weights": [3, 1], "secs": 1.5, "window": 0.5, "qd": 8},
                    "noisy": {"disks": 4, "flood_qd": 32, "qd1_rate": 1000, "qd1_limit": 2000,
                              "flood_limit": 20_000, "group_limit": 40_000, "secs": 1.0, "reps": 1,
                              "scenarios": ["none", "limits"]},
                    "overhead": {"reps": 1, "secs": 0.5, "limit": 10_000_000, "limit_mib": 1_000_000}},
            # Every RBD point once per server, 1 s each, on a small image (filled in ~0.3 s).
            "rbd": {"size_mib": 64, "secs": 1.0, "rounds": 1, "warmup": 0.2, "points": rbd_points},
            # Every NBD point once per server, 1 s each, on a 64 MiB disk.
            "nbd": {"size_mib": 64, "secs": 1.0, "reps": 1, "points": nbd_points},
        }
    raise ValueError(mode)


# ---------------------------------------------------------------------------------------------
# Small helpers


def log(msg):
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def run(cmd, timeout, **kw):
    return subprocess.run(cmd, timeout=timeout, check=True, text=True, capture_output=True, **kw)


CLK_TCK = os.sysconf("SC_CLK_TCK")


def proc_cpu(pid):
    """CPU time of every thread of `pid`, in ns, two ways.

    `sched_ns`: the sum over /proc/PID/task/*/schedstat (nanosecond resolution; threads that
    exited between two samples are lost, which neither server does during a run).
    `stat_ns`: utime + stime of /proc/PID/stat (all threads, exited ones included, in clock
    ticks of 1/CLK_TCK s)."""
    sched = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                sched += int(f.read().split()[0])
        except (FileNotFoundError, ProcessLookupError):
            pass
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)
    return {"sched_ns": sched, "stat_ns": ticks * 1_000_000_000 // CLK_TCK}


def thread_cpu(pid):
    """CPU time (ns, schedstat) of each thread of `pid`, summed by thread name with its digits
    dropped (`msgr-worker-0` and `msgr-worker-1` count together): where a server's cycles go."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                name = "".join(ch for ch in f.read().strip() if not ch.isdigit()).strip("-_") or "?"
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                ns = int(f.read().split()[0])
        except (FileNotFoundError, ProcessLookupError):
            continue
        out[name] = out.get(name, 0) + ns
    return out


def machine_busy_ns():
    """CPU time all CPUs spent outside idle and iowait since boot (/proc/stat), in ns."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:9]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = v
    return (user + nice + system + irq + softirq + steal) * 1_000_000_000 // CLK_TCK


def steal_ticks():
    """Each CPU's steal time since boot (/proc/stat, clock ticks): time the hypervisor ran
    something else while this virtual CPU wanted to run."""
    out = {}
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith("cpu") and line[3].isdigit():
                v = line.split()
                out[v[0]] = int(v[8])
    return out


def steal_share(t0, t1, secs):
    """The largest share of one CPU stolen between two `steal_ticks` samples `secs` apart."""
    return max((t1[k] - t0[k]) / CLK_TCK / secs for k in t1) if secs else None


def own_cpu_ns():
    """CPU time of this process and its waited-for children (fp-load, fio, the RPC CLI)."""
    t = os.times()
    return int((t.user + t.system + t.children_user + t.children_system) * 1e9)


def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def ratio(a, b):
    if a is None or b is None or b == 0:
        return None
    return a / b


def wait_for(pred, timeout, what, proc=None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what}: the process exited with status {proc.returncode}")
        time.sleep(0.05)
    raise RuntimeError(f"{what}: not ready after {timeout} s")


def write_random_file(path, size):
    """A fully written (not sparse) file of random data, flushed to the device."""
    chunk = os.urandom(4 * MIB)
    with open(path, "wb") as f:
        left = size
        while left > 0:
            n = min(left, len(chunk))
            f.write(chunk[:n])
            # Vary the data a little so the blocks are not all one pattern.
            chunk = chunk[1:] + chunk[:1]
            left -= n
        f.flush()
        os.fsync(f.fileno())


# ---------------------------------------------------------------------------------------------
# Servers

CHILDREN = []  # every Popen we start, killed on exit

# The RBD section's pool and image (tests/ceph/cluster.sh creates the pool), and the Ceph options
# flashpath's cluster gets: librbd's cache off, as QEMU sets it for cache.direct=on.
RBD_POOL = "rbd"
RBD_IMAGE = "bench"
RBD_CONFIG_PARAM = {"rbd_cache": "false"}


def spawn(cmd, log_path):
    logf = open(log_path, "wb")
    p = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                         start_new_session=True)
    p.log_path = log_path
    CHILDREN.append(p)
    return p


def stop(p, timeout=10):
    if p is None or p.poll() is not None:
        return
    p.send_signal(signal.SIGTERM)
    try:
        p.wait(timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait(5)


def kill_all_children():
    for p in CHILDREN:
        try:
            if p.poll() is None:
                p.kill()
                p.wait(5)
        except Exception:
            pass


def server_timeout(wrap):
    """Seconds a server has to start, and to exit after SIGTERM: valgrind makes both slow (and
    callgrind writes its profile on the way out)."""
    return 120 if wrap else 20


class Flashpath:
    kind = "flashpath"

    def __init__(self, bin_dir, work, cpus, name="flashpath", wrap=(), extra=()):
        self.bin = os.path.join(bin_dir, "flashpath")
        self.name = name
        self.dir = os.path.join(work, name)
        os.makedirs(self.dir, exist_ok=True)
        self.rpc_sock = os.path.join(self.dir, "rpc.sock")
        self.vhost_dir = os.path.join(self.dir, "vhost")
        self.cpus = cpus
        self.wrap = wrap
        # taskset keeps the control-plane threads on the server cores too; the reactors pin
        # themselves to the --cpus list. `wrap` (valgrind) goes between taskset and the server.
        self.proc = spawn(["taskset", "-c", cpus, *wrap, self.bin, "serve", "--cpus", cpus,
                           "--rpc", self.rpc_sock, "--vhost-dir", self.vhost_dir, *extra],
                          os.path.join(self.dir, "serve.log"))
        self.pid = self.proc.pid
        wait_for(lambda: self._answers(), server_timeout(wrap), "flashpath serve", self.proc)

    def _answers(self):
        try:
            self.rpc("spdk_get_version")
            return True
        except Exception:
            return False

    def rpc(self, method, params=None):
        cmd = [self.bin, "--rpc", self.rpc_sock, "rpc", method]
        if params is not None:
            cmd.append(json.dumps(params))
        out = run(cmd, 30).stdout
        return json.loads(out) if out.strip() else None

    def add_disk(self, backend, size, path=None, queues=2):
        blocks = size // 512
        if backend == "null":
            self.rpc("bdev_null_create", {"name": "Null0", "num_blocks": blocks, "block_size": 512})
            bdev = "Null0"
        elif backend == "ram":
            self.rpc("bdev_malloc_create", {"name": "Malloc0", "num_blocks": blocks, "block_size": 512})
            bdev = "Malloc0"
        elif backend == "file":
            self.rpc("bdev_uring_create", {"name": "Uring0", "filename": path, "block_size": 512,
                                           "direct": True})
            bdev = "Uring0"
        else:
            raise ValueError(backend)
        return self.export(f"vhost.{backend}", bdev, queues)

    def export(self, ctrlr, bdev, queues=2):
        """A vhost-user-blk controller `ctrlr` for bdev `bdev` (a name or alias); its socket."""
        self.rpc("vhost_create_blk_controller", {"ctrlr": ctrlr, "dev_name": bdev, "num_queues": queues})
        sock = os.path.join(self.vhost_dir, ctrlr)
        wait_for(lambda: os.path.exists(sock), 10, f"flashpath socket {sock}", self.proc)
        return sock

    def rbd_disk(self, conf, queues=2):
        """The cluster of `conf` registered as rbd0 (librbd's cache off, as qsd's cache.direct=on
        sets it), the bdev Ceph0 on the bench image, exported; its socket."""
        self.rpc("bdev_rbd_register_cluster", {"name": "rbd0", "config_file": conf,
                                               "config_param": RBD_CONFIG_PARAM})
        bdev = self.rpc("bdev_rbd_create", {"name": "Ceph0", "pool_name": RBD_POOL, "rbd_name": RBD_IMAGE,
                                            "block_size": 512, "cluster_name": "rbd0"})
        return self.export("vhost.rbd", bdev, queues)

    def lvol_disk(self, base_size, cluster, vol_size=None, thin=False):
        """Malloc0 of `base_size` bytes, the lvstore lvs0 on it with `cluster`-byte clusters and
        the volume lvs0/vol0 of `vol_size` bytes (default: every free cluster); (the volume's
        bdev name, its size, the store as bdev_lvol_get_lvstores lists it)."""
        self.rpc("bdev_malloc_create", {"name": "Malloc0", "num_blocks": base_size // 512, "block_size": 512})
        self.rpc("bdev_lvol_create_lvstore", {"bdev_name": "Malloc0", "lvs_name": "lvs0", "cluster_sz": cluster})
        lvs = self.rpc("bdev_lvol_get_lvstores", {"lvs_name": "lvs0"})[0]
        if vol_size is None:
            vol_size = lvs["free_clusters"] * cluster
        vol = self.rpc("bdev_lvol_create", {"lvol_name": "vol0", "size_in_mib": vol_size // MIB,
                                            "thin_provision": thin, "lvs_name": "lvs0"})
        return vol, vol_size, lvs

    def reactors(self):
        r = self.rpc("framework_get_reactors")
        return {x["id"]: {"busy": x["busy"], "idle": x["idle"], "sleeps": x.get("sleeps", 0)}
                for x in r["reactors"]}

    def stop(self):
        stop(self.proc, server_timeout(self.wrap))


class Qsd:
    kind = "qsd"

    def __init__(self, work, cpu, backend, size, path, queues=2, name="qsd", wrap=()):
        self.name = name
        self.dir = os.path.join(work, name + "-" + backend)
        os.makedirs(self.dir, exist_ok=True)
        self.sock = os.path.join(self.dir, f"vhost.{backend}")
        self.wrap = wrap
        if backend == "null":
            blockdev = f"driver=null-co,node-name=disk0,size={size},read-zeroes=off"
        elif backend == "ram":
            # qsd has no RAM driver: a fully written file on tmpfs through the page cache
            # (tmpfs has no O_DIRECT) with io_uring, its fastest path to data held in RAM.
            blockdev = f"driver=file,node-name=disk0,filename={path},aio=io_uring,cache.direct=off"
        elif backend == "file":
            blockdev = f"driver=file,node-name=disk0,filename={path},aio=io_uring,cache.direct=on"
        elif backend == "rbd":
            # `path` is the cluster's ceph.conf. cache.direct=on makes QEMU set rbd_cache=false
            # (without it QEMU turns librbd's cache on); flashpath's cluster gets the same.
            blockdev = (f"driver=rbd,node-name=disk0,pool={RBD_POOL},image={RBD_IMAGE},conf={path},"
                        "cache.direct=on")
        else:
            raise ValueError(backend)
        self.cmd = ["taskset", "-c", str(cpu), *wrap, "qemu-storage-daemon",
                    "--object", "iothread,id=iot0",
                    "--blockdev", blockdev,
                    "--export", "type=vhost-user-blk,id=e0,node-name=disk0,addr.type=unix,"
                                f"addr.path={self.sock},writable=on,iothread=iot0,num-queues={queues}"]
        self.proc = spawn(self.cmd, os.path.join(self.dir, "qsd.log"))
        self.pid = self.proc.pid
        wait_for(lambda: os.path.exists(self.sock), server_timeout(wrap), "qemu-storage-daemon socket",
                 self.proc)

    def stop(self):
        stop(self.proc, server_timeout(self.wrap))


class FlashpathNbd(Flashpath):
    """flashpath serving a RAM disk (bdev_malloc_create) over NBD on a Unix socket
    (nbd_start_disk with the socket's path: the export is named after the bdev)."""

    def __init__(self, bin_dir, work, cpus, size):
        super().__init__(bin_dir, work, cpus, name="flashpath-nbd")
        self.sock = os.path.join(self.dir, "nbd.sock")
        self.rpc("bdev_malloc_create", {"name": "Malloc0", "num_blocks": size // 512, "block_size": 512})
        self.rpc("nbd_start_disk", {"bdev_name": "Malloc0", "nbd_device": self.sock})
        wait_for(lambda: os.path.exists(self.sock), 10, f"flashpath NBD socket {self.sock}", self.proc)
        self.uri = f"nbd+unix:///Malloc0?socket={self.sock}"


class NbdProcess:
    """A server started as one command (`argv`, given the socket's path) that listens on a Unix
    socket in its own directory, pinned to `cpu`; `uri` (given the socket) is what fio connects to."""

    def __init__(self, work, cpu, name, argv, uri):
        self.name = name
        self.dir = os.path.join(work, name)
        os.makedirs(self.dir, exist_ok=True)
        self.sock = os.path.join(self.dir, "nbd.sock")
        self.cmd = ["taskset", "-c", str(cpu), *argv(self.sock)]
        self.proc = spawn(self.cmd, os.path.join(self.dir, "server.log"))
        self.pid = self.proc.pid
        wait_for(lambda: os.path.exists(self.sock), server_timeout(()), f"{name} socket", self.proc)
        self.uri = uri(self.sock)

    def stop(self):
        stop(self.proc, server_timeout(()))


class QsdNbd(NbdProcess):
    """qemu-storage-daemon exporting a file on tmpfs over NBD on a Unix socket, on an iothread
    as its vhost-user-blk exports are: the file (`path`, sparse) is RAM, reached through the page
    cache with io_uring, qsd's path to data held in RAM (it has no RAM driver; null-co would
    copy no data at all)."""
    kind = "qsd"

    def __init__(self, work, cpu, path):
        super().__init__(work, cpu, "qsd-nbd", lambda sock: [
            "qemu-storage-daemon", "--object", "iothread,id=iot0",
            "--blockdev", f"driver=file,node-name=disk0,filename={path},aio=io_uring,cache.direct=off",
            "--nbd-server", f"addr.type=unix,addr.path={sock}",
            "--export", "type=nbd,id=e0,node-name=disk0,name=disk0,writable=on,iothread=iot0"],
            lambda sock: f"nbd+unix:///disk0?socket={sock}")


class Nbdkit(NbdProcess):
    """nbdkit's memory plugin on a Unix socket, in the foreground (so its pid is the server's),
    with `allocator=malloc`: one flat array, as flashpath's RAM disk is (the default sparse
    allocator adds a page directory and its lock). Its worker threads (16 by default) share the
    server's core."""
    kind = "nbdkit"

    def __init__(self, work, cpu, size):
        super().__init__(work, cpu, "nbdkit", lambda sock: [
            "nbdkit", "-f", "-U", sock, "memory", str(size), "allocator=malloc"],
            lambda sock: f"nbd+unix:///?socket={sock}")


NBD_SERVERS = ("flashpath", "qsd", "nbdkit")


class QsdMulti:
    """One qemu-storage-daemon with `ndisks` null disks, each exported on its own socket with
    one queue, all on one iothread pinned to `cpu` (the noisy-neighbour runs). `scenario`:
    none; limits (a throttle group of its own per disk: the first disk `flood_limit` IOPS, the
    others `qd1_limit`); group (one throttle group of `group_limit` IOPS for all)."""
    kind = "qsd"

    def __init__(self, work, cpu, ndisks, name, scenario, n):
        self.name = name
        self.dir = os.path.join(work, name)
        os.makedirs(self.dir, exist_ok=True)
        cmd = ["taskset", "-c", str(cpu), "qemu-storage-daemon", "--object", "iothread,id=iot0"]
        if scenario == "group":
            cmd += ["--object", f"throttle-group,id=tg,x-iops-total={n['group_limit']}"]
        self.socks = []
        for i in range(ndisks):
            cmd += ["--blockdev", f"driver=null-co,node-name=null{i},size={GIB},read-zeroes=off"]
            node = f"null{i}"
            if scenario in ("limits", "group"):
                tg = "tg"
                if scenario == "limits":
                    tg = f"tg{i}"
                    iops = n["flood_limit"] if i == 0 else n["qd1_limit"]
                    cmd += ["--object", f"throttle-group,id={tg},x-iops-total={iops}"]
                cmd += ["--blockdev", f"driver=throttle,node-name=thr{i},throttle-group={tg},file=null{i}"]
                node = f"thr{i}"
            sock = os.path.join(self.dir, f"vhost.{i}")
            cmd += ["--export", f"type=vhost-user-blk,id=e{i},node-name={node},addr.type=unix,addr.path={sock},"
                                "writable=on,iothread=iot0,num-queues=1"]
            self.socks.append(sock)
        self.cmd = cmd
        self.proc = spawn(cmd, os.path.join(self.dir, "qsd.log"))
        self.pid = self.proc.pid
        wait_for(lambda: all(os.path.exists(s) for s in self.socks), 20, "qemu-storage-daemon sockets", self.proc)

    def stop(self):
        stop(self.proc, 20)


class CephCluster:
    """A throwaway single-node Ceph cluster (tests/ceph/cluster.sh: one monitor, one memstore OSD,
    the pool `rbd`) in `dir`, its daemons pinned to `cpu` (all threads, taskset -a)."""

    SCRIPT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "ceph",
                          "cluster.sh")

    def __init__(self, dir, cpu):
        self.dir = dir
        self.conf = None
        try:
            self.conf = run([self.SCRIPT, "start", dir], 120).stdout.strip().splitlines()[-1]
        except subprocess.CalledProcessError as e:
            self.stop()
            raise RuntimeError(f"tests/ceph/cluster.sh start {dir} failed: {e.stderr.strip()[-2000:]}")
        # The daemons' pid files: mon.a.pid, osd.0.pid.
        self.pids = {}
        for f in sorted(os.listdir(dir)):
            if f.endswith(".pid"):
                with open(os.path.join(dir, f)) as fh:
                    self.pids[f[:-4]] = int(fh.read().strip())
        if not any(k.startswith("mon.") for k in self.pids) or not any(k.startswith("osd.") for k in self.pids):
            self.stop()
            raise RuntimeError(f"no monitor or OSD pid file in {dir}: {sorted(self.pids)}")
        for pid in self.pids.values():
            run(["taskset", "-a", "-p", "-c", str(cpu), str(pid)], 20)

    def stop(self):
        subprocess.run([self.SCRIPT, "stop", self.dir], timeout=60, capture_output=True)

    def rbd(self, *args, timeout=120):
        """The rbd CLI on this cluster; its stdout."""
        return run(["rbd", "-c", self.conf, *args], timeout).stdout

    def cpu(self):
        """Each daemon's CPU time (proc_cpu)."""
        return {k: proc_cpu(pid) for k, pid in self.pids.items()}


def qos_delta(s0, s1):
    """What the daemon's QoS counters did between two bdev_get_iostat samples (None where the
    daemon has no such field)."""
    out = {}
    for k in ("qos_queued_total", "qos_wait_ticks", "qos_throttled_ticks", "num_read_ops"):
        a, b = s0.get(k), s1.get(k)
        out[k] = b - a if isinstance(a, int) and isinstance(b, int) else None
    rate = s1.get("tick_rate")
    for k in ("qos_wait_ticks", "qos_throttled_ticks"):
        out[k.replace("_ticks", "_s")] = out[k] / rate if out[k] is not None and rate else None
    out["qos_queued_after"] = s1.get("qos_queued")
    return out


def hist_percentile(h, pct):
    """fp-load's percentile over a merged histogram: the upper bound of the bucket that holds
    rank ceil(pct/100 · count)."""
    total = h["count"]
    if not total:
        return None
    rank = max(1, min(total, math.ceil(pct / 100 * total)))
    seen = 0
    for _lo, hi, c in h["buckets"]:
        seen += c
        if seen >= rank:
            return hi
    return h["buckets"][-1][1]


def fmt_limit(kind, lim):
    return fmt_iops(lim) + " IOPS" if kind == "iops" else f"{lim} MiB/s"


def fmt_units(kind, v):
    if v is None:
        return "-"
    return f"{v:,.0f} IOPS" if kind == "iops" else f"{v / MIB:,.1f} MiB/s"


# ---------------------------------------------------------------------------------------------
# Load


class Loader:
    def __init__(self, bin_dir, client_cpu, work):
        self.bin = os.path.join(bin_dir, "fp-load")
        self.cpu = client_cpu
        self.work = work
        self.n = 0

    def run(self, sock, pattern, bs, qd, queues, poll, secs, hist=False, client_busy=False,
            packed=False, extra=()):
        cmd = [self.bin, "--socket", sock, "--pattern", pattern, "--bs", str(bs), "--qd", str(qd),
               "--queues", str(queues), "--time", f"{secs}s", "--cpu", str(self.cpu), "--json", *extra]
        if poll:
            cmd.append("--poll")
        if packed:
            cmd.append("--packed")
        if client_busy:
            cmd.append("--client-busy")
        hist_path = None
        if hist:
            self.n += 1
            hist_path = os.path.join(self.work, f"hist-{self.n}.json")
            cmd += ["--hist-out", hist_path]
        out = run(cmd, secs + 90).stdout
        res = json.loads(out)
        if hist_path:
            with open(hist_path) as f:
                res["histogram"] = json.load(f)
            os.unlink(hist_path)
        return res

    def hold(self, sock, queues, secs):
        cmd = [self.bin, "--socket", sock, "--idle", "--queues", str(queues), "--time", f"{secs}s",
               "--cpu", str(self.cpu), "--json"]
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        CHILDREN.append(p)
        return p


def measure(server, loader, sock, point, secs, want_hist, client_busy=False, packed=False):
    """One fp-load run against `server`, with the server's CPU and reactor deltas."""
    pattern, bs, qd, queues, poll = point
    react0 = server.reactors() if server.kind == "flashpath" else None
    cpu0 = proc_cpu(server.pid)
    m0, o0 = machine_busy_ns(), own_cpu_ns()
    res = loader.run(sock, pattern, bs, qd, queues, poll, secs, hist=want_hist, client_busy=client_busy,
                     packed=packed)
    m1, o1 = machine_busy_ns(), own_cpu_ns()
    cpu1 = proc_cpu(server.pid)
    react1 = server.reactors() if server.kind == "flashpath" else None
    if res["errors"]:
        raise RuntimeError(f"{server.name} {point}: {res['errors']} requests failed "
                           f"(first {res['first_error']})")
    ios = res["ios"]
    el = res["elapsed_s"]
    r = {
        "iops": res["iops"],
        "mbps": res["mbps"],
        "ios": ios,
        "elapsed_s": el,
        "lat_mean_ns": res["lat_mean_ns"],
        "p50_ns": res["p50_ns"],
        "p99_ns": res["p99_ns"],
        "p999_ns": res["p999_ns"],
        "lat_max_ns": res["lat_max_ns"],
        "server_cpu_ns": cpu1["sched_ns"] - cpu0["sched_ns"],
        "server_cpu_stat_ns": cpu1["stat_ns"] - cpu0["stat_ns"],
    }
    # CPU time used by anything else on the machine during the run (other processes, the idle
    # peer server, kernel threads), as a share of one core: a check that nothing disturbed it.
    # Resolution: one clock tick per CPU.
    other = (m1 - m0) - (o1 - o0) - r["server_cpu_ns"]
    r["other_cpu_cores"] = max(0.0, other / 1e9 / el) if el else None
    r["server_cpu_ns_per_io"] = r["server_cpu_ns"] / ios if ios else None
    r["server_cpu_stat_ns_per_io"] = r["server_cpu_stat_ns"] / ios if ios else None
    # Share of one core, over the fp-load process's life (a little longer than `elapsed`).
    r["server_cores"] = r["server_cpu_ns"] / 1e9 / el if el else None
    if react0 is not None:
        busy = {k: react1[k]["busy"] - react0[k]["busy"] for k in react1}
        tot_busy = sum(busy.values())
        r["reactor_busy_ns"] = tot_busy
        r["reactor_busy_ns_per_io"] = tot_busy / ios if ios else None
        # Busy share of the measured interval. (busy + idle) is no use as the denominator
        # here: a reactor credits a whole sleep when it wakes, so the first wake-up of a run
        # brings in the time it slept through the previous server's run.
        r["reactor_busy_frac"] = {str(k): busy[k] / 1e9 / el if el else None for k in busy}
    if client_busy:
        r["client_busy_ns"] = res["client_busy_ns"]
        r["client_busy_ns_per_io"] = res["client_busy_ns"] / ios if ios else None
        r["client_busy_frac"] = res["client_busy_ns"] / 1e9 / el if el else None
    if want_hist:
        r["histogram"] = res["histogram"]
    return r


def fio_run(path, size, point, secs, cpu):
    pattern, bs, qd, _queues, _poll = point
    cmd = ["taskset", "-c", str(cpu), "fio", "--name=baseline", f"--filename={path}",
           "--ioengine=io_uring", "--direct=1", f"--rw={pattern}", f"--bs={bs}",
           f"--iodepth={qd}", "--numjobs=1", f"--size={size}", "--time_based",
           f"--runtime={secs}s", f"--cpus_allowed={cpu}", "--norandommap", "--randrepeat=0",
           "--percentile_list=50:99:99.9", "--output-format=json"]
    out = run(cmd, secs + 90).stdout
    job = json.loads(out[out.index("{"):])["jobs"][0]
    side = job["write"] if "write" in pattern else job["read"]
    pct = side["clat_ns"].get("percentile", {})

    def p(key):
        for k, v in pct.items():
            if abs(float(k) - key) < 1e-6:
                return v
        return None

    return {
        "iops": side["iops"],
        "mbps": side["bw_bytes"] / 1e6,
        "lat_mean_ns": side["lat_ns"]["mean"],
        "p50_ns": p(50.0),
        "p99_ns": p(99.0),
        "p999_ns": p(99.9),
        "elapsed_s": job["job_runtime"] / 1000.0,
    }


def fio_nbd(uri, pattern, bs, qd, cpu, secs=None):
    """One fio job (the nbd engine: libnbd, one connection) on `uri`, pinned to `cpu`: for
    `secs` seconds, or once over the whole disk without `secs` (the fill). Latency is fio's
    total (lat_ns: submission to completion), percentiles from its histogram."""
    cmd = ["taskset", "-c", str(cpu), "fio", "--name=nbd", "--ioengine=nbd", f"--uri={uri}",
           f"--rw={pattern}", f"--bs={bs}", f"--iodepth={qd}", "--numjobs=1", "--norandommap",
           "--randrepeat=0", "--lat_percentiles=1", "--percentile_list=50:99:99.9", "--output-format=json"]
    if secs:
        cmd += ["--time_based", f"--runtime={secs}s"]
    out = run(cmd, (secs or 600) + 90).stdout
    job = json.loads(out[out.index("{"):])["jobs"][0]
    side = job["write"] if "write" in pattern else job["read"]
    pct = side["lat_ns"].get("percentile", {})

    def p(key):
        return next((v for k, v in pct.items() if abs(float(k) - key) < 1e-6), None)

    return {"iops": side["iops"], "mbps": side["bw_bytes"] / 1e6, "ios": side["total_ios"],
            "bytes": side["io_bytes"], "errors": job.get("error", 0),
            "lat_mean_ns": side["lat_ns"]["mean"], "p50_ns": p(50.0), "p99_ns": p(99.0),
            "p999_ns": p(99.9), "elapsed_s": job["job_runtime"] / 1000.0}


# Path length: each server under callgrind (all threads, no cache simulation; --dump-line=no
# only shortens the profile it writes at exit). Callgrind counts every iteration of a
# rep-prefixed string instruction as one instruction, and on CPUs with ERMS glibc's memset and
# memcpy switch to `rep stosb` / `rep movsb` from 2 to 4 KiB up: qsd's three 16 KiB memsets per
# request would read as ~46,000 instructions. The tunables keep glibc on its vector loops at every size, which
# callgrind counts as a CPU executes them; both servers run with them.
CALLGRIND = ["env", "GLIBC_TUNABLES=glibc.cpu.x86_rep_stosb_threshold=1000000000:"
                    "glibc.cpu.x86_rep_movsb_threshold=1000000000",
             "valgrind", "--tool=callgrind", "--cache-sim=no", "--dump-line=no"]


def callgrind_total(path):
    """The total instruction count (Ir) of a callgrind profile, all threads."""
    with open(path) as f:
        for line in f:
            if line.startswith(("summary:", "totals:")):
                return int(line.split()[1])
    raise RuntimeError(f"{path}: no totals line")


def lvol_spdk_note():
    """Why this run has no SPDK lvol figures."""
    d = os.environ.get("SPDK_DIR")
    if not d:
        return "SPDK_DIR is not set: no SPDK lvol figures in this run."
    return (f"SPDK_DIR={d} is set, but the bench has no client that drives SPDK's vhost: fp-load "
            "goes through libblkio, whose vhost-user driver (virtio-driver 0.6) requires the CONFIGURE_MEM_SLOTS protocol "
            "feature that SPDK 23.01's rte_vhost does not offer; no SPDK lvol figures in this run.")


# ---------------------------------------------------------------------------------------------
# Summaries

METRICS = ["iops", "mbps", "lat_mean_ns", "p50_ns", "p99_ns", "p999_ns", "server_cpu_ns_per_io",
           "server_cpu_stat_ns_per_io", "server_cores", "reactor_busy_ns_per_io",
           "client_busy_ns_per_io", "client_busy_frac"]


def summarize(runs):
    med = {}
    for m in METRICS:
        vals = [r.get(m) for r in runs]
        if any(v is not None for v in vals):
            med[m] = median(vals)
    fr = [r["reactor_busy_frac"] for r in runs if "reactor_busy_frac" in r]
    if fr:
        med["reactor_busy_frac"] = {k: median([f[k] for f in fr]) for k in fr[0]}
    return med


def merge_hists(runs):
    buckets = {}
    count = 0
    for r in runs:
        h = r.get("histogram")
        if not h:
            continue
        count += h["count"]
        for low, high, c in h["buckets"]:
            buckets[(low, high)] = buckets.get((low, high), 0) + c
    return {"unit": "ns", "count": count,
            "buckets": [[lo, hi, c] for (lo, hi), c in sorted(buckets.items())]}


def point_key(backend, point):
    pattern, bs, qd, queues, poll = point
    return {"backend": backend, "pattern": pattern, "bs": bs, "qd": qd, "queues": queues,
            "client": "poll" if poll else "fd"}


def point_label(p):
    return f"{p['backend']} {p['pattern']} {p['bs'] // 1024}K qd{p['qd']} q{p['queues']} {p['client']}"


def point_id(p):
    """A measured point's identity, server included, for set comparisons."""
    return (p["server"], p["backend"], p["pattern"], p["bs"], p["qd"], p["queues"], p["client"])


# ---------------------------------------------------------------------------------------------
# The benchmark


class Bench:
    def __init__(self, args):
        self.args = args
        self.cfg = mode_config(args.mode)
        if args.time:
            self.cfg["time"] = args.time
        if args.reps:
            self.cfg["reps"] = args.reps
        self.with_rbd = wants_rbd(args)
        self.with_nbd = wants_section(args, "nbd")
        if args.backends:
            self.cfg["backends"] = [b for b in args.backends.split(",") if b not in ("rbd", "nbd")]
        self.secs = self.cfg["time"]
        self.reps = self.cfg["reps"]
        self.server_cpu = args.server_cpu
        self.client_cpu = args.client_cpu
        self.work = tempfile.mkdtemp(prefix="fp-bench.", dir=args.work_dir)
        self.loader = Loader(args.bin_dir, self.client_cpu, self.work)
        self.results = {"points": [], "fio": [], "idle": [], "scaling": [], "packed": [], "iostat": [], "client_ceiling": None,
                        "fills": [], "callgrind": []}
        self.callgrind_n = 0  # servers started under callgrind, for their directory names
        self.started = time.monotonic()

    def cleanup(self):
        kill_all_children()
        if getattr(self, "ceph_dir", None) and os.path.isdir(self.ceph_dir):
            # Also when the run was interrupted while the cluster started: its daemons are not
            # our children.
            subprocess.run([CephCluster.SCRIPT, "stop", self.ceph_dir], timeout=60, capture_output=True)
        shutil.rmtree(self.work, ignore_errors=True)
        if getattr(self, "shm_dir", None):
            shutil.rmtree(self.shm_dir, ignore_errors=True)

    # -- setup ------------------------------------------------------------------------------

    def backing_path(self, backend, size):
        if backend == "file":
            path = os.path.join(self.work, "disk.img")
            if not os.path.exists(path):
                log(f"writing a {size // MIB} MiB file of random data: {path}")
                write_random_file(path, size)
            return path
        if backend == "ram":
            self.shm_dir = tempfile.mkdtemp(prefix="fp-bench.", dir="/dev/shm")
            path = os.path.join(self.shm_dir, "ram.img")
            log(f"writing a {size // MIB} MiB file of random data on tmpfs for qsd: {path}")
            write_random_file(path, size)
            return path
        return None

    def fill_ram(self, sock, size):
        """Writes the whole flashpath RAM disk once so reads do not hit the zero page."""
        done = 0
        for _ in range(10):
            r = self.loader.run(sock, "write", 128 * 1024, 8, 1, True, 1.0)
            done += r["bytes"]
            if done >= size:
                break
        self.results["fills"].append({"bytes_written": done, "size": size})
        if done < size:
            raise RuntimeError(f"filling the RAM disk wrote only {done} of {size} bytes")

    def idle(self, backend, servers):
        """Each server's CPU use over idle_time seconds with a client attached and no I/O."""
        t = self.cfg["idle_time"]
        holds = []
        for s, sock in servers:
            holds.append((s, self.loader.hold(sock, 2, t + 1.5)))
        time.sleep(0.75)  # connected and queues started
        before = [(s, proc_cpu(s.pid), s.reactors() if s.kind == "flashpath" else None)
                  for s, _ in servers]
        time.sleep(t)
        for s, c0, r0 in before:
            c1 = proc_cpu(s.pid)
            e = {"backend": backend, "server": s.kind, "seconds": t,
                 "cpu_ns": c1["sched_ns"] - c0["sched_ns"],
                 "cpu_stat_ns": c1["stat_ns"] - c0["stat_ns"]}
            e["core_percent"] = 100.0 * e["cpu_ns"] / (t * 1e9)
            if r0 is not None:
                r1 = s.reactors()
                e["reactor_sleeps"] = sum(r1[k]["sleeps"] - r0[k]["sleeps"] for k in r1)
            self.results["idle"].append(e)
            log(f"idle {backend} {s.kind}: {e['core_percent']:.3f} % of a core")
        for s, p in holds:
            out, err = p.communicate(timeout=t + 60)
            if p.returncode != 0:
                raise RuntimeError(f"idle client on {s.name} failed: {err.strip()}")

    # -- matrix -----------------------------------------------------------------------------

    def run_backend(self, backend):
        size = self.cfg["sizes"][backend]
        path = self.backing_path(backend, size)
        fp = Flashpath(self.args.bin_dir, self.work, str(self.server_cpu))
        qsd = Qsd(self.work, self.server_cpu, backend, size, path)
        try:
            fp_sock = fp.add_disk(backend, size, path)
            if backend == "ram":
                log("filling the flashpath RAM disk")
                self.fill_ram(fp_sock, size)
            self.idle(backend, [(fp, fp_sock), (qsd, qsd.sock)])
            points = self.cfg.get(f"{backend}_points", self.cfg["points"])
            for point in points:
                pk = point_key(backend, point)
                want_hist = point[2] == 1
                with_fio = backend == "file" and point[3] == 1 and point[4] is False
                runs = {"flashpath": [], "qsd": [], "fio": []}
                for rep in range(self.reps):
                    runs["flashpath"].append(measure(fp, self.loader, fp_sock, point, self.secs, want_hist))
                    runs["qsd"].append(measure(qsd, self.loader, qsd.sock, point, self.secs, want_hist))
                    if with_fio:
                        runs["fio"].append(fio_run(path, size, point, self.secs, self.client_cpu))
                for server in ("flashpath", "qsd"):
                    e = dict(pk, server=server, runs=runs[server], median=summarize(runs[server]))
                    if want_hist:
                        e["histogram"] = merge_hists(runs[server])
                        for r in runs[server]:
                            r.pop("histogram", None)
                    self.results["points"].append(e)
                if with_fio:
                    fk = dict(pk)
                    fk.pop("client")
                    self.results["fio"].append(dict(fk, runs=runs["fio"], median=summarize(runs["fio"])))
                mf = median([r["iops"] for r in runs["flashpath"]])
                mq = median([r["iops"] for r in runs["qsd"]])
                extra = ""
                if with_fio:
                    extra = f"  fio {median([r['iops'] for r in runs['fio']]):>10.0f}"
                log(f"{point_label(pk):<36} flashpath {mf:>10.0f}  qsd {mq:>10.0f}  "
                    f"ratio {mf / mq:5.2f}{extra}")
        finally:
            fp.stop()
            qsd.stop()

    def run_ceiling(self):
        """The client's own ceiling: fp-load with --client-busy on the null QD32 polled point."""
        n = self.cfg["ceiling_reps"]
        if not n:
            return
        fp = Flashpath(self.args.bin_dir, self.work, str(self.server_cpu), name="flashpath-ceiling")
        try:
            sock = fp.add_disk("null", GIB)
            point = ("randread", 4096, 32, 1, True)
            runs = [measure(fp, self.loader, sock, point, self.secs, False, client_busy=True)
                    for _ in range(n)]
            med = summarize(runs)
            self.results["client_ceiling"] = dict(point_key("null", point), runs=runs, median=med)
            log(f"client ceiling: client busy {med['client_busy_ns_per_io']:.1f} ns/IO "
                f"({100 * med['client_busy_frac']:.0f} % of its core), reactor busy "
                f"{med['reactor_busy_ns_per_io']:.1f} ns/IO, {med['iops']:.0f} IOPS")
        finally:
            fp.stop()

    def run_scaling(self):
        """flashpath with reactors on both cores: 1 queue (one reactor) vs 2 queues (two)."""
        if not self.cfg["scaling_points"]:
            return
        cpus = f"{self.server_cpu},{self.client_cpu}"
        fp = Flashpath(self.args.bin_dir, self.work, cpus, name="flashpath-2reactors")
        try:
            sock = fp.add_disk("null", GIB)
            for qd, poll in self.cfg["scaling_points"]:
                for queues in (1, 2):
                    point = ("randread", 4096, qd, queues, poll)
                    runs = [measure(fp, self.loader, sock, point, self.secs, False)
                            for _ in range(self.reps)]
                    e = dict(point_key("null", point), server="flashpath", reactors=2, cpus=cpus,
                             runs=runs, median=summarize(runs))
                    self.results["scaling"].append(e)
                    log(f"2 reactors: {point_label(e):<30} {e['median']['iops']:>10.0f} IOPS")
        finally:
            fp.stop()

    def run_packed(self):
        """fp-load over packed rings (--packed, virtio-driver) vs split rings (libblkio) on one
        flashpath null disk, the two interleaved in each repetition."""
        if not self.cfg["packed_points"]:
            return
        fp = Flashpath(self.args.bin_dir, self.work, str(self.server_cpu), name="flashpath-packed")
        try:
            sock = fp.add_disk("null", GIB)
            for qd, poll in self.cfg["packed_points"]:
                point = ("randread", 4096, qd, 1, poll)
                runs = {"split": [], "packed": []}
                for _ in range(self.reps):
                    for ring in ("split", "packed"):
                        runs[ring].append(measure(fp, self.loader, sock, point, self.secs, False,
                                                  packed=ring == "packed"))
                e = dict(point_key("null", point), server="flashpath",
                         split=dict(runs=runs["split"], median=summarize(runs["split"])),
                         packed=dict(runs=runs["packed"], median=summarize(runs["packed"])))
                e["ratio"] = ratio(e["packed"]["median"]["iops"], e["split"]["median"]["iops"])
                self.results["packed"].append(e)
                log(f"{point_label(e):<36} split {e['split']['median']['iops']:>10.0f}  packed "
                    f"{e['packed']['median']['iops']:>10.0f}  ratio {fmt_ratio(e['ratio'])}")
        finally:
            fp.stop()

    def run_iostat(self):
        """What the disk layer's accounting costs: null QD32 polled IOPS on a daemon with
        statistics off (`serve --no-iostat`) and on one with them on, without and with latency
        histograms (`bdev_enable_histogram`), the three interleaved in every repetition. Both
        daemons are pinned to the server CPU; the one not measured sleeps (no client I/O)."""
        reps = self.cfg.get("iostat_reps", 0)
        if not reps:
            return
        cpu = str(self.server_cpu)
        off = Flashpath(self.args.bin_dir, self.work, cpu, name="flashpath-iostat-off", extra=["--no-iostat"])
        on = Flashpath(self.args.bin_dir, self.work, cpu, name="flashpath-iostat-on")
        try:
            socks = {"off": off.add_disk("null", GIB), "on": on.add_disk("null", GIB)}
            point = ("randread", 4096, 32, 1, True)
            runs = {"off": [], "counters": [], "histograms": []}
            for _ in range(reps):
                runs["off"].append(measure(off, self.loader, socks["off"], point, self.secs, False))
                runs["counters"].append(measure(on, self.loader, socks["on"], point, self.secs, False))
                on.rpc("bdev_enable_histogram", {"name": "Null0", "enable": True})
                runs["histograms"].append(measure(on, self.loader, socks["on"], point, self.secs, False))
                on.rpc("bdev_enable_histogram", {"name": "Null0", "enable": False})
            # The daemon counted what the client did: a check that the layer was really on.
            stat = on.rpc("bdev_get_iostat", {"name": "Null0"})["bdevs"][0]
            client_ios = sum(r["ios"] for r in runs["counters"] + runs["histograms"])
            e = dict(point_key("null", point), server="flashpath",
                     variants={k: dict(runs=v, median=summarize(v)) for k, v in runs.items()},
                     daemon_read_ops=stat["num_read_ops"], client_ios=client_ios)
            base = e["variants"]["off"]["median"]["iops"]
            e["ratios"] = {k: ratio(e["variants"][k]["median"]["iops"], base) for k in ("counters", "histograms")}
            self.results["iostat"].append(e)
            cg = self.cfg.get("callgrind")
            if cg and self.cfg.get("iostat_callgrind"):
                # Path length of each variant (the callgrind section's method: a long run's
                # instructions less a short run's, over the difference in I/Os).
                e["ir_per_io"] = {}
                for k in runs:
                    short = self.callgrind_run("flashpath", point, cg["short_s"], variant=k)
                    long_ = self.callgrind_run("flashpath", point, cg["long_s"], variant=k)
                    e["ir_per_io"][k] = (long_["ir"] - short["ir"]) / max(1, long_["ios"] - short["ios"])
                log("iostat path length (instructions/IO): " +
                    ", ".join(f"{k} {v:.0f}" for k, v in e["ir_per_io"].items()))
            log(f"iostat cost: off {base:>10.0f}  counters {e['variants']['counters']['median']['iops']:>10.0f} "
                f"({fmt_ratio(e['ratios']['counters'])})  +histograms "
                f"{e['variants']['histograms']['median']['iops']:>10.0f} ({fmt_ratio(e['ratios']['histograms'])}); "
                f"daemon counted {stat['num_read_ops']} reads, the client {client_ios} (plus warm-up)")
        finally:
            off.stop()
            on.stop()

    def callgrind_run(self, kind, point, secs, variant="counters", disk=None):
        """A fresh server of `kind` under callgrind with a null disk and one fp-load run against
        it; the server's instructions from start to exit and the run's I/Os. `variant` picks
        flashpath's disk-layer accounting: "off" (--no-iostat), "counters" (the default) or
        "histograms" (enabled before the run). `disk(server)`, for flashpath, sets up another
        disk instead of the null one and returns its socket."""
        self.callgrind_n += 1
        name = f"callgrind-{self.callgrind_n}"
        out = os.path.join(self.work, f"{name}.out")
        wrap = CALLGRIND + [f"--callgrind-out-file={out}"]
        if kind == "flashpath":
            extra = ["--no-iostat"] if variant == "off" else []
            server = Flashpath(self.args.bin_dir, self.work, str(self.server_cpu), name=name, wrap=wrap,
                               extra=extra)
        else:
            server = Qsd(self.work, self.server_cpu, "null", GIB, None, name=name, wrap=wrap)
        try:
            if kind != "flashpath":
                sock = server.sock
            elif disk is not None:
                sock = disk(server)
            else:
                sock = server.add_disk("null", GIB)
            if kind == "flashpath" and variant == "histograms":
                server.rpc("bdev_enable_histogram", {"name": "Null0", "enable": True})
            res = self.loader.run(sock, *point, secs)
        finally:
            server.stop()
        if res["errors"]:
            raise RuntimeError(f"{kind} under callgrind: {res['errors']} requests failed "
                               f"(first {res['first_error']})")
        return {"seconds": secs, "ios": res["ios"], "iops": res["iops"], "ir": callgrind_total(out)}

    def run_callgrind(self):
        """Instructions per I/O: (Ir of a long run - Ir of a short run) / (I/Os of the long run -
        I/Os of the short run), each run a whole server life, so start-up, set-up, connection and
        exit cancel. Servers and run lengths interleaved: flashpath short, long, qsd short, long."""
        cg = self.cfg.get("callgrind")
        if not cg:
            return
        for point in cg["points"]:
            runs = {"flashpath": [], "qsd": []}
            for _ in range(cg["reps"]):
                for kind, rs in runs.items():
                    short = self.callgrind_run(kind, point, cg["short_s"])
                    long_ = self.callgrind_run(kind, point, cg["long_s"])
                    if long_["ios"] <= short["ios"]:
                        raise RuntimeError(f"{kind} under callgrind: the long run did {long_['ios']} "
                                           f"I/Os, the short one {short['ios']}")
                    rs.append({"short": short, "long": long_,
                               "ir_per_io": (long_["ir"] - short["ir"]) / (long_["ios"] - short["ios"])})
            for kind, rs in runs.items():
                xs = [r["ir_per_io"] for r in rs]
                med = median(xs)
                e = dict(point_key("null", point), server=kind, short_s=cg["short_s"],
                         long_s=cg["long_s"], runs=rs, ir_per_io=med,
                         spread=(max(xs) - min(xs)) / med)
                self.results["callgrind"].append(e)
                log(f"callgrind: {point_label(e):<30} {kind:<9} {med:>9.0f} instructions/IO "
                    f"(spread {100 * e['spread']:.1f} %, {len(xs)} repetitions)")

    # -- logical volumes (issue 11) -----------------------------------------------------------

    def run_lvol(self):
        """Logical volumes against their base: IOPS of a thick volume vs the raw malloc bdev,
        first-write and copy-on-write latency, instructions per I/O. docs/benchmarks.md,
        "Logical volumes", describes every step."""
        c = self.cfg["lvol"]
        e = {"size": c["size"], "cluster_size": c["cluster"], "pairs": c["pairs"], "points": [],
             "first_write": [], "callgrind": []}
        self.results["lvol"] = e
        self.lvol_iops(c, e)
        for cl in c["fw_clusters"]:
            self.lvol_first_write(c, cl, e)
        if c.get("callgrind") and self.cfg.get("callgrind"):
            self.lvol_callgrind(c, e)
        e["spdk"] = lvol_spdk_note()
        log(f"SPDK: {e['spdk']}")

    def lvol_iops(self, c, e):
        """Two flashpath daemons on the server CPU: one exports a malloc bdev raw, the other a
        THICK volume filling an lvstore on a malloc bdev of the same size; both disks fully
        written first. Each point runs `pairs` times on each, the order alternating (raw, lvol,
        lvol, raw, ...) so drift in the machine falls on both alike."""
        size, cl = c["size"], c["cluster"]
        cpu = str(self.server_cpu)
        raw = Flashpath(self.args.bin_dir, self.work, cpu, name="flashpath-lvol-raw")
        lv = Flashpath(self.args.bin_dir, self.work, cpu, name="flashpath-lvol-thick")
        try:
            socks = {"raw": raw.add_disk("ram", size)}
            vol, vol_size, lvs = lv.lvol_disk(size, cl)
            socks["lvol"] = lv.export("vhost.lvol", vol)
            e["thick_volume_size"] = vol_size
            e["lvstore"] = lvs
            log(f"filling the raw disk ({size // MIB} MiB) and the thick volume ({vol_size // MIB} MiB)")
            self.fill_ram(socks["raw"], size)
            self.fill_ram(socks["lvol"], vol_size)
            servers = {"raw": raw, "lvol": lv}
            for point in c["points"]:
                runs = {"raw": [], "lvol": []}
                for i in range(c["pairs"]):
                    for k in (("raw", "lvol") if i % 2 == 0 else ("lvol", "raw")):
                        runs[k].append(measure(servers[k], self.loader, socks[k], point, self.secs, False))
                p = dict(point_key("ram", point), runs=runs,
                         median={k: summarize(v) for k, v in runs.items()})
                iops = {k: [r["iops"] for r in v] for k, v in runs.items()}
                p["spread"] = {k: (max(v) - min(v)) / median(v) for k, v in iops.items()}
                p["ratio"] = ratio(p["median"]["lvol"]["iops"], p["median"]["raw"]["iops"])
                # Each pair's own ratio: how far single comparisons scatter.
                p["pair_ratios"] = [ratio(a, b) for a, b in zip(iops["lvol"], iops["raw"])]
                e["points"].append(p)
                log(f"lvol {point_label(p):<32} raw {p['median']['raw']['iops']:>10.0f}  lvol "
                    f"{p['median']['lvol']['iops']:>10.0f}  lvol/raw {fmt_ratio(p['ratio'])} (pairs "
                    f"{min(p['pair_ratios']):.2f}-{max(p['pair_ratios']):.2f})")
        finally:
            raw.stop()
            lv.stop()

    def lvol_first_write(self, c, cl, e):
        """QD1 4 KiB writes, one per cluster (fp-load --stride CLUSTER --ios N), on a fresh
        daemon per repetition, in this order on one malloc bdev (written in full first,
        as a RAM disk in use is):
        raw: the malloc bdev itself, exported raw (the baseline);
        allocate: a fresh THIN volume, so every write allocates (zeroes) its cluster;
        cow: the volume written in full, snapshotted, so every write copies its cluster;
        overwrite: the same writes again, to clusters the volume now owns.
        `cl`: the cluster size."""
        size = c["size"]
        n = size // cl
        base_size = 2 * size + 16 * cl  # the volume, its copies after the snapshot, metadata
        fw_args = ["--stride", str(cl), "--ios", str(n), "--size", str(size)]
        runs = {"raw": [], "allocate": [], "cow": [], "overwrite": []}
        for rep in range(c["fw_reps"]):
            fp = Flashpath(self.args.bin_dir, self.work, str(self.server_cpu),
                           name=f"flashpath-lvol-fw{cl // MIB}m-{rep}")
            try:
                fp.rpc("bdev_malloc_create", {"name": "Malloc0", "num_blocks": base_size // 512, "block_size": 512})
                sock = fp.export("vhost.base", "Malloc0")
                self.fill_ram(sock, base_size)
                runs["raw"].append(self.lvol_writes(fp, sock, n, fw_args))
                fp.rpc("vhost_delete_controller", {"ctrlr": "vhost.base"})
                fp.rpc("bdev_lvol_create_lvstore", {"bdev_name": "Malloc0", "lvs_name": "lvs0", "cluster_sz": cl})
                vol = fp.rpc("bdev_lvol_create", {"lvol_name": "vol0", "size_in_mib": size // MIB,
                                                  "thin_provision": True, "lvs_name": "lvs0"})
                sock = fp.export("vhost.lvol", vol)
                runs["allocate"].append(self.lvol_writes(fp, sock, n, fw_args))
                self.fill_ram(sock, size)
                fp.rpc("bdev_lvol_snapshot", {"lvol_name": "lvs0/vol0", "snapshot_name": "snap0"})
                free0 = fp.rpc("bdev_lvol_get_lvstores", {"lvs_name": "lvs0"})[0]["free_clusters"]
                runs["cow"].append(self.lvol_writes(fp, sock, n, fw_args))
                free1 = fp.rpc("bdev_lvol_get_lvstores", {"lvs_name": "lvs0"})[0]["free_clusters"]
                # Every write of the COW run took a cluster of its own: it really copied.
                if free0 - free1 != n:
                    raise RuntimeError(f"the COW run allocated {free0 - free1} clusters, not {n}")
                runs["overwrite"].append(self.lvol_writes(fp, sock, n, fw_args))
            finally:
                fp.stop()
        for kind, rs in runs.items():
            f = {"kind": kind, "writes": n, "cluster_size": cl, "runs": rs,
                 "histogram": merge_hists(rs)}
            for r in rs:
                r.pop("histogram", None)
            for m in ("p50_ns", "p99_ns", "lat_mean_ns", "lat_max_ns"):
                f[m] = median([r[m] for r in rs])
            e["first_write"].append(f)
            log(f"lvol QD1 4K write per {cl // MIB} MiB cluster, {kind:<9}: p50 {f['p50_ns'] / 1000:8.2f} µs  p99 "
                f"{f['p99_ns'] / 1000:8.2f} µs  mean {f['lat_mean_ns'] / 1000:8.2f} µs ({len(rs)} runs of {n})")

    def lvol_writes(self, server, sock, n, fw_args):
        """One run of `n` QD1 4 KiB writes a cluster apart; all must complete."""
        res = self.loader.run(sock, "write", 4096, 1, 1, True, 60.0, hist=True, extra=fw_args)
        if res["errors"] or res["ios"] != n:
            raise RuntimeError(f"{server.name}: {res['ios']} of {n} writes done, {res['errors']} failed")
        return {k: res[k] for k in ("ios", "elapsed_s", "lat_mean_ns", "p50_ns", "p99_ns", "lat_max_ns",
                                    "histogram")}

    def lvol_callgrind(self, c, e):
        """Instructions per I/O of the raw malloc bdev and of a thick volume on a malloc bdev of
        the same size (`cg_size`), as run_callgrind measures them: a long run's instructions
        less a short run's over the difference in I/Os, raw and lvol interleaved."""
        cg = self.cfg["callgrind"]
        size, cl = c["cg_size"], c["cluster"]

        def raw_disk(server):
            return server.add_disk("ram", size)

        def lvol_disk(server):
            vol, _, _ = server.lvol_disk(size, cl)
            return server.export("vhost.lvol", vol)

        disks = {"raw": raw_disk, "lvol": lvol_disk}
        for point in [p for p in c["points"] if p[2] == 32]:
            runs = {"raw": [], "lvol": []}
            for _ in range(cg["reps"]):
                for kind, disk in disks.items():
                    short = self.callgrind_run("flashpath", point, cg["short_s"], disk=disk)
                    long_ = self.callgrind_run("flashpath", point, cg["long_s"], disk=disk)
                    if long_["ios"] <= short["ios"]:
                        raise RuntimeError(f"lvol callgrind {kind}: the long run did {long_['ios']} I/Os, "
                                           f"the short one {short['ios']}")
                    runs[kind].append({"short": short, "long": long_,
                                       "ir_per_io": (long_["ir"] - short["ir"]) / (long_["ios"] - short["ios"])})
            x = dict(point_key("ram", point), short_s=cg["short_s"], long_s=cg["long_s"], size=size, runs=runs)
            x["ir_per_io"] = {k: median([r["ir_per_io"] for r in v]) for k, v in runs.items()}
            x["range"] = {k: [min(r["ir_per_io"] for r in v), max(r["ir_per_io"] for r in v)]
                          for k, v in runs.items()}
            e["callgrind"].append(x)
            log(f"lvol callgrind {point_label(x):<30} raw {x['ir_per_io']['raw']:>7.0f}  lvol "
                f"{x['ir_per_io']['lvol']:>7.0f} instructions/IO")

    # -- quality of service (issue 12) -------------------------------------------------------

    def run_qos(self):
        """Issue 12's accuracy and cost figures: delivered rate against per-disk limits over
        1 s windows and the whole run, a burst group's timeline, weighted shares in a group,
        the noisy-neighbour latency on flashpath and on qsd with throttle groups, and the cost
        of QoS configured but not limiting. docs/benchmarks.md, "Quality of service (issue 12)",
        describes every step."""
        c = self.cfg["qos"]
        e = {"config": dict(c), "accuracy": [], "ceilings": [], "burst": None,
             "shares": None, "noisy": None, "overhead": None}
        self.results["qos"] = e
        log("--- qos: accuracy of per-disk limits (two reactors)")
        self.qos_accuracy(c, e)
        log("--- qos: a burst group")
        self.qos_burst(c, e)
        log("--- qos: weighted shares in a group")
        self.qos_shares(c, e)
        log("--- qos: noisy neighbour (flashpath and qsd)")
        self.qos_noisy(c, e)
        log("--- qos: the cost of QoS configured but not limiting")
        self.qos_overhead(c, e)

    def qos_daemon(self, name, two_reactors=True):
        """A flashpath daemon for the QoS runs: reactors on the server and the client CPU (the
        client shares the second core, as in the scaling section), or on the server CPU only."""
        cpus = f"{self.server_cpu},{self.client_cpu}" if two_reactors else str(self.server_cpu)
        return Flashpath(self.args.bin_dir, self.work, cpus, name=name)

    def qos_null(self, fp, name, ctrlr, queues):
        fp.rpc("bdev_null_create", {"name": name, "num_blocks": GIB // 512, "block_size": 512})
        return fp.export(ctrlr, name, queues)

    def qos_run(self, sock, bs, qd, queues, secs, window):
        """One fp-load run (completion fds, the client on its CPU) with a per-`window` timeline."""
        r = self.loader.run(sock, "randread", bs, qd, queues, False, secs, extra=["--timeline", f"{window}s"])
        if r["errors"]:
            raise RuntimeError(f"{sock}: {r['errors']} requests failed (first {r['first_error']})")
        return r

    def qos_multi(self, disks, secs, window=None, hist=False, poll=False, thread_per_disk=True):
        """One fp-load process driving several disks (`--disk` values) from the client CPU, one
        thread per disk or one for all; the parsed JSON (with per-disk histograms when `hist`)."""
        cmd = [self.loader.bin, "--time", f"{secs}s", "--cpu", str(self.client_cpu), "--json"]
        if thread_per_disk:
            cmd.append("--thread-per-disk")
        if poll:
            cmd.append("--poll")
        if window:
            cmd += ["--timeline", f"{window}s"]
        for d in disks:
            cmd += ["--disk", d]
        hist_path = None
        if hist:
            self.loader.n += 1
            hist_path = os.path.join(self.work, f"hist-{self.loader.n}.json")
            cmd += ["--hist-out", hist_path]
        res = json.loads(run(cmd, secs + 90).stdout)
        if res["total"]["errors"]:
            raise RuntimeError(f"{res['total']['errors']} requests failed (first {res['total']['first_error']})")
        if hist_path:
            with open(hist_path) as f:
                h = json.load(f)
            os.unlink(hist_path)
            for d, dh in zip(res["disks"], h["disks"]):
                d["histogram"] = dh
        return res

    def qos_iostat(self, fp, bdev):
        """The daemon's QoS counters for `bdev` (absent fields are None)."""
        io = fp.rpc("bdev_get_iostat", {"name": bdev})
        b = io["bdevs"][0]
        out = {k: b.get(k) for k in ("qos_queued", "qos_queued_total", "qos_wait_ticks", "qos_throttled_ticks",
                                     "num_read_ops")}
        out["tick_rate"] = io.get("tick_rate")
        return out

    def qos_accuracy(self, c, e):
        """Per-disk limits on one null disk of a daemon with two reactors: for each limit and
        number of queues (queue i on reactor i mod 2) one flooding run of `acc_secs` with a
        timeline of `window` s. Delivered is what the client completed; the error of a window
        is (delivered rate - limit) / limit. The highest limit of each kind also gets an
        unlimited run per number of queues: its ceiling here."""
        secs, window = c["acc_secs"], c["window"]
        fp = self.qos_daemon("flashpath-qos-accuracy")
        try:
            sock = self.qos_null(fp, "Null0", "vhost.qos", max(c["queues"]))
            points = [("iops", lim, 4096, c["iops_qd"]) for lim in c["iops_limits"]]
            points += [("bw", mib, bs, c["bw_qd"]) for mib, bs in c["bw_limits"]]
            tops = {"iops": max(c["iops_limits"]), "bw": max(m for m, _ in c["bw_limits"])}
            for kind, lim, bs, qd in points:
                for queues in c["queues"]:
                    ceiling = None
                    if lim == tops[kind]:
                        fp.rpc("bdev_set_qos_limit", {"name": "Null0", "rw_ios_per_sec": 0, "rw_mbytes_per_sec": 0})
                        r = self.qos_run(sock, bs, qd, queues, c["ceiling_secs"], window)
                        ceiling = r["iops"] if kind == "iops" else r["bytes"] / r["elapsed_s"]
                        e["ceilings"].append({"kind": kind, "bs": bs, "qd": qd, "queues": queues,
                                              "secs": c["ceiling_secs"], "units_per_s": ceiling,
                                              "iops": r["iops"]})
                    if kind == "iops":
                        fp.rpc("bdev_set_qos_limit", {"name": "Null0", "rw_ios_per_sec": lim, "rw_mbytes_per_sec": 0})
                        want = float(lim)
                    else:
                        fp.rpc("bdev_set_qos_limit", {"name": "Null0", "rw_ios_per_sec": 0, "rw_mbytes_per_sec": lim})
                        want = float(lim * MIB)
                    s0, st0 = self.qos_iostat(fp, "Null0"), steal_ticks()
                    c0, m0, o0 = proc_cpu(fp.pid), machine_busy_ns(), own_cpu_ns()
                    r = self.qos_run(sock, bs, qd, queues, secs, window)
                    m1, o1, c1 = machine_busy_ns(), own_cpu_ns(), proc_cpu(fp.pid)
                    s1, st1 = self.qos_iostat(fp, "Null0"), steal_ticks()
                    # CPU time anything but this daemon and the client used meanwhile, in cores.
                    other = (m1 - m0) - (o1 - o0) - (c1["sched_ns"] - c0["sched_ns"])
                    unit = 1 if kind == "iops" else bs
                    tl = r["timeline"]
                    win = [n * unit / tl["interval_s"] for n in tl["ios"]]
                    whole = r["ios"] * unit / r["elapsed_s"]
                    p = {"kind": kind, "limit": lim, "limit_units_per_s": want, "bs": bs, "qd": qd,
                         "queues": queues, "secs": secs, "window_s": tl["interval_s"],
                         "ios": r["ios"], "elapsed_s": r["elapsed_s"], "delivered": whole,
                         "error": whole / want - 1, "windows": win,
                         "window_errors": [w / want - 1 for w in win],
                         "p50_ns": r["p50_ns"], "p99_ns": r["p99_ns"], "ceiling": ceiling,
                         "qos_counters": qos_delta(s0, s1), "steal": steal_share(st0, st1, r["elapsed_s"]),
                         "other_cpu_cores": max(0.0, other / 1e9 / r["elapsed_s"])}
                    p["worst_window_error"] = max(p["window_errors"], key=abs)
                    e["accuracy"].append(p)
                    log(f"qos {kind} limit {fmt_limit(kind, lim)} q{queues} bs {bs // 1024}K: delivered "
                        f"{fmt_units(kind, whole)} ({100 * p['error']:+.2f} %), 1 s windows worst "
                        f"{100 * p['worst_window_error']:+.2f} %"
                        + (f", unlimited {fmt_units(kind, ceiling)}" if ceiling is not None else ""))
            fp.rpc("bdev_set_qos_limit", {"name": "Null0", "rw_ios_per_sec": 0, "rw_mbytes_per_sec": 0})
        finally:
            fp.stop()

    def qos_burst(self, c, e):
        """A fresh group with iops_total avg, iops_total_max and iops_total_max_length and one
        null disk in it, idle since the group was made, flooded for `secs` with a timeline: the
        ceiling for `length` s, then the average."""
        b = c["burst"]
        fp = self.qos_daemon("flashpath-qos-burst")
        try:
            sock = self.qos_null(fp, "Null0", "vhost.burst", 2)
            fp.rpc("bdev_qos_group_create", {"name": "burst", "iops_total": b["avg"], "iops_total_max": b["max"],
                                             "iops_total_max_length": b["length"]})
            fp.rpc("bdev_qos_group_add_bdev", {"name": "burst", "bdev_name": "Null0"})
            group = fp.rpc("bdev_qos_get_groups", {"name": "burst"})
            r = self.qos_run(sock, 4096, b["qd"], 2, b["secs"], b["window"])
            tl = r["timeline"]
            step = tl["interval_s"]
            win = [n / step for n in tl["ios"]]
            # Window i covers [i·step, (i+1)·step): the ceiling while it ends by `length`, the
            # average once it starts at or after it (none straddles with whole-second steps).
            phase = ["max" if (i + 1) * step <= b["length"] + 1e-9 else
                     "avg" if i * step >= b["length"] - 1e-9 else "edge" for i in range(len(win))]
            want = {"max": b["max"], "avg": b["avg"]}
            x = {"avg": b["avg"], "max": b["max"], "length_s": b["length"], "secs": b["secs"], "qd": b["qd"],
                 "queues": 2, "window_s": step, "windows": win, "phase": phase, "group": group,
                 "ios": r["ios"], "elapsed_s": r["elapsed_s"]}
            for ph in ("max", "avg"):
                xs = [w for w, p in zip(win, phase) if p == ph]
                # The last window holds the run's tail (a batch past the end): leave it out of
                # the average phase only if there are others.
                if ph == "avg" and len(xs) > 1:
                    xs = xs[:-1]
                x[f"{ph}_mean"] = statistics.mean(xs) if xs else None
                x[f"{ph}_error"] = (x[f"{ph}_mean"] / want[ph] - 1) if xs else None
                x[f"{ph}_worst_window_error"] = max((w / want[ph] - 1 for w in xs), key=abs) if xs else None
            e["burst"] = x
            log(f"qos burst avg {b['avg']} max {b['max']} for {b['length']} s: per {step:g} s "
                + " ".join(f"{w:.0f}" for w in win))
        finally:
            fp.stop()

    def qos_shares(self, c, e):
        """Group of `limit` IOPS, disk A weight 3 and B weight 1, each flooding from its own
        client thread: delivered shares against limit·w/Σw. Then a second run where B stops
        after about a third of the time (a request count) and A floods on: A's rate once B is
        idle."""
        s = c["shares"]
        fp = self.qos_daemon("flashpath-qos-shares")
        try:
            socks = {}
            for disk in ("A", "B"):
                socks[disk] = self.qos_null(fp, f"Null{disk}", f"vhost.{disk}", 2)
            fp.rpc("bdev_qos_group_create", {"name": "fair", "iops_total": s["limit"]})
            weights = {"A": s["weights"][0], "B": s["weights"][1]}
            for disk, w in weights.items():
                fp.rpc("bdev_qos_group_add_bdev", {"name": "fair", "bdev_name": f"Null{disk}", "weight": w})
            total_w = sum(weights.values())
            want = {d: s["limit"] * w / total_w for d, w in weights.items()}
            disk_arg = {d: f"socket={socks[d]},qd={s['qd']},queues=2,label={d}" for d in socks}
            r = self.qos_multi([disk_arg["A"], disk_arg["B"]], s["secs"], window=s["window"])
            group = fp.rpc("bdev_qos_get_groups", {"name": "fair"})
            x = {"limit": s["limit"], "weights": weights, "want": want, "secs": s["secs"], "qd": s["qd"],
                 "queues": 2, "window_s": s["window"], "group_after": group, "both": {}, "b_idle": {}}
            for d, dr in zip(("A", "B"), r["disks"]):
                win = [n / dr["timeline"]["interval_s"] for n in dr["timeline"]["ios"]]
                rate = dr["ios"] / dr["elapsed_s"]
                x["both"][d] = {"rate": rate, "error": rate / want[d] - 1, "windows": win,
                                "worst_window_error": max((w / want[d] - 1 for w in win), key=abs)}
            # B stops after a third of the run at its share; A alone from then on.
            b_ios = max(1, int(want["B"] * s["secs"] / 3))
            r2 = self.qos_multi([disk_arg["A"], disk_arg["B"] + f",ios={b_ios}"], s["secs"], window=s["window"])
            a, bd = r2["disks"]
            step = a["timeline"]["interval_s"]
            b_last = max([i for i, n in enumerate(bd["timeline"]["ios"]) if n], default=-1)
            a_win = [n / step for n in a["timeline"]["ios"]]
            # Whole windows after B's last completion, the run's last (its tail) left out when
            # others remain.
            after = a_win[b_last + 1:]
            if len(after) > 1:
                after = after[:-1]
            x["b_idle"] = {"b_ios": b_ios, "b_elapsed_s": bd["elapsed_s"], "b_last_window": b_last,
                           "a_windows": a_win, "b_windows": [n / step for n in bd["timeline"]["ios"]],
                           "a_alone": statistics.mean(after) if after else None, "want": float(s["limit"])}
            if after:
                x["b_idle"]["error"] = x["b_idle"]["a_alone"] / s["limit"] - 1
                x["b_idle"]["worst_window_error"] = max((w / s["limit"] - 1 for w in after), key=abs)
            e["shares"] = x
            log(f"qos shares: A {x['both']['A']['rate']:.0f} (want {want['A']:.0f}), B {x['both']['B']['rate']:.0f} "
                f"(want {want['B']:.0f}); B idle: A {x['b_idle']['a_alone'] or 0:.0f} (want {s['limit']})")
        finally:
            fp.stop()

    def qos_noisy(self, c, e):
        """16 null disks on one reactor (flashpath --cpus SERVER, or one qsd iothread), each
        its own controller with one queue; one fp-load process on the
        client CPU, one polled thread for all. Disk 0 floods at QD128; disks 1..15 run QD1 paced at
        `qd1_rate` each (below their limit, so a limit never delays them: their latency is the
        neighbour's doing). Scenarios: none (no QoS); limits (flooder `flood_limit` IOPS, each
        QD1 disk `qd1_limit`); group (all 16 in one group of `group_limit` IOPS, weight 1 each;
        on qsd one throttle group, whose members take turns). `reps` rounds, scenarios
        interleaved; the QD1 disks' latency merged over their histograms."""
        n = c["noisy"]
        e["noisy"] = x = {"config": n, "runs": []}
        for rep in range(n["reps"]):
            for server in ("flashpath", "qsd"):
                for scen in n["scenarios"]:
                    r = self.noisy_run(n, server, scen, rep)
                    x["runs"].append(r)
                    log(f"qos noisy {server:<9} {scen:<6} rep {rep}: flooder {r['flood_iops']:>9.0f} IOPS, QD1 "
                        f"disks {r['qd1_iops']:>7.0f} IOPS, p50 {r['qd1_p50_ns'] / 1000:.1f} µs, p99 "
                        f"{r['qd1_p99_ns'] / 1000:.1f} µs, p99.9 {r['qd1_p999_ns'] / 1000:.1f} µs")
        x["summary"] = []
        for server in ("flashpath", "qsd"):
            for scen in n["scenarios"]:
                rs = [r for r in x["runs"] if r["server"] == server and r["scenario"] == scen]
                x["summary"].append({"server": server, "scenario": scen, "reps": len(rs),
                                     **{k: median([r[k] for r in rs]) for k in
                                        ("flood_iops", "qd1_iops", "qd1_p50_ns", "qd1_p99_ns", "qd1_p999_ns",
                                         "qd1_worst_disk_p99_ns")}})

    def noisy_run(self, n, server, scen, rep):
        ndisks = n["disks"]
        secs = n["secs"]
        name = f"{server}-noisy-{scen}-{rep}"
        if server == "flashpath":
            srv = self.qos_daemon(name, two_reactors=False)
            try:
                socks = [self.qos_null(srv, f"Null{i}", f"vhost.{i}", 1) for i in range(ndisks)]
                if scen == "limits":
                    srv.rpc("bdev_set_qos_limit", {"name": "Null0", "rw_ios_per_sec": n["flood_limit"]})
                    for i in range(1, ndisks):
                        srv.rpc("bdev_set_qos_limit", {"name": f"Null{i}", "rw_ios_per_sec": n["qd1_limit"]})
                elif scen == "group":
                    srv.rpc("bdev_qos_group_create", {"name": "all", "iops_total": n["group_limit"]})
                    for i in range(ndisks):
                        srv.rpc("bdev_qos_group_add_bdev", {"name": "all", "bdev_name": f"Null{i}"})
                res = self.noisy_load(n, srv, socks, secs)
            finally:
                srv.stop()
        else:
            srv = QsdMulti(self.work, self.server_cpu, ndisks, name, scen, n)
            try:
                res = self.noisy_load(n, srv, srv.socks, secs)
            finally:
                srv.stop()
        flood, quiet = res["disks"][0], res["disks"][1:]
        h = merge_hists([{"histogram": d["histogram"]} for d in quiet])
        return {"server": server, "scenario": scen, "rep": rep, "secs": secs,
                "flood_iops": flood["iops"], "flood_p99_ns": flood["p99_ns"],
                "qd1_iops": sum(d["iops"] for d in quiet),
                "qd1_p50_ns": hist_percentile(h, 50), "qd1_p99_ns": hist_percentile(h, 99),
                "qd1_p999_ns": hist_percentile(h, 99.9),
                "qd1_worst_disk_p99_ns": max(d["p99_ns"] for d in quiet),
                "qd1_disk_p99_ns": [d["p99_ns"] for d in quiet], "qd1_histogram": h,
                "other_cpu_cores": res["other_cpu_cores"], "steal": res["steal"]}

    def noisy_load(self, n, srv, socks, secs):
        """The noisy-neighbour load on `socks` of server `srv`, with the CPU time anything else
        used meanwhile (as `measure` records it)."""
        disks = [f"socket={socks[0]},qd={n['flood_qd']},label=flood"]
        disks += [f"socket={s},qd=1,rate={n['qd1_rate']},label=quiet{i}" for i, s in enumerate(socks[1:], 1)]
        cpu0, m0, o0, st0 = proc_cpu(srv.pid), machine_busy_ns(), own_cpu_ns(), steal_ticks()
        res = self.qos_multi(disks, secs, hist=True, poll=True, thread_per_disk=False)
        m1, o1, cpu1, st1 = machine_busy_ns(), own_cpu_ns(), proc_cpu(srv.pid), steal_ticks()
        res["steal"] = steal_share(st0, st1, secs)
        other = (m1 - m0) - (o1 - o0) - (cpu1["sched_ns"] - cpu0["sched_ns"])
        res["other_cpu_cores"] = max(0.0, other / 1e9 / secs)
        return res

    def qos_overhead(self, c, e):
        """Null QD32 IOPS, one polled queue (the main matrix's point), on one daemon pinned to
        the server CPU whose disk is switched between three states before each run: no QoS;
        a per-disk limit far above what is reached (`limit` IOPS and `limit_mib` MiB/s); a
        member of a group whose iops_total is `limit`. One disk and one daemon, so the three
        differ only in QoS (separate daemons differ by more than 3 % among themselves on this
        machine); the order reverses every repetition so drift falls on all alike."""
        o = c["overhead"]
        fp = Flashpath(self.args.bin_dir, self.work, str(self.server_cpu), name="flashpath-qos-overhead")
        try:
            sock = fp.add_disk("null", GIB, queues=1)
            fp.rpc("bdev_qos_group_create", {"name": "roomy", "iops_total": o["limit"]})
            on = {"off": lambda: None,
                  "limit": lambda: fp.rpc("bdev_set_qos_limit", {"name": "Null0", "rw_ios_per_sec": o["limit"],
                                                                 "rw_mbytes_per_sec": o["limit_mib"]}),
                  "group": lambda: fp.rpc("bdev_qos_group_add_bdev", {"name": "roomy", "bdev_name": "Null0"})}
            off = {"off": lambda: None,
                   "limit": lambda: fp.rpc("bdev_set_qos_limit", {"name": "Null0", "rw_ios_per_sec": 0,
                                                                  "rw_mbytes_per_sec": 0}),
                   "group": lambda: fp.rpc("bdev_qos_group_remove_bdev", {"name": "roomy", "bdev_name": "Null0"})}
            point = ("randread", 4096, 32, 1, True)
            runs = {k: [] for k in on}
            counters = {}
            for rep in range(o["reps"]):
                for k in (list(on) if rep % 2 == 0 else list(reversed(on))):
                    on[k]()
                    s0 = self.qos_iostat(fp, "Null0")
                    runs[k].append(measure(fp, self.loader, sock, point, o["secs"], False))
                    # Nothing waited: the limit did not limit.
                    d = qos_delta(s0, self.qos_iostat(fp, "Null0"))
                    counters.setdefault(k, []).append(d["qos_queued_total"])
                    off[k]()
            x = dict(point_key("null", point), limit=o["limit"], limit_mib=o["limit_mib"], reps=o["reps"],
                     secs=o["secs"], variants={k: dict(runs=v, median=summarize(v)) for k, v in runs.items()},
                     qos_counters=counters)
            base = x["variants"]["off"]["median"]["iops"]
            x["ratios"] = {k: ratio(x["variants"][k]["median"]["iops"], base) for k in ("limit", "group")}
            x["spread"] = {k: (max(r["iops"] for r in v) - min(r["iops"] for r in v)) / median([r["iops"] for r in v])
                           for k, v in runs.items()}
            e["overhead"] = x
            log(f"qos overhead: off {base:>10.0f}  limit {x['variants']['limit']['median']['iops']:>10.0f} "
                f"({fmt_ratio(x['ratios']['limit'])})  group {x['variants']['group']['median']['iops']:>10.0f} "
                f"({fmt_ratio(x['ratios']['group'])}); queued by QoS: {counters}")
        finally:
            fp.stop()

    # -- Ceph RBD (issue 13) -----------------------------------------------------------------

    def run_rbd(self):
        """qsd's rbd driver against flashpath's rbd bdev on one image of a single-node cluster,
        one server at a time: `rounds` rounds, each starting one server, running every point
        and stopping it, the order alternating (flashpath, qsd, qsd, flashpath, ...). The
        cluster's daemons run on the client CPU. docs/benchmarks.md, "Ceph RBD (issue 13)",
        describes every step."""
        c = self.cfg["rbd"]
        size = c["size_mib"] * MIB
        image = f"{RBD_POOL}/{RBD_IMAGE}"
        e = {"config": {k: v for k, v in c.items() if k != "points"}, "image": image, "size": size,
             "cluster_cpu": self.client_cpu, "config_param": RBD_CONFIG_PARAM,
             "serve_args": self.args.rbd_serve_args, "points": [], "rounds": []}
        self.results["rbd"] = e
        self.ceph_dir = os.path.join(self.work, "ceph")
        t0 = time.monotonic()
        cl = CephCluster(self.ceph_dir, self.client_cpu)
        try:
            e["cluster_start_s"] = time.monotonic() - t0
            e["cluster_daemons"] = sorted(cl.pids)
            log(f"cluster up in {e['cluster_start_s']:.1f} s ({', '.join(sorted(cl.pids))} on CPU "
                f"{self.client_cpu}); {cl.conf}")
            cl.rbd("create", "--size", str(c["size_mib"]), image)
            # A thin image answers reads of unwritten objects without data: write it all once,
            # with the rbd CLI, so neither server's figures include the fill.
            t0 = time.monotonic()
            cl.rbd("bench", "--io-type", "write", "--io-pattern", "seq", "--io-size", str(4 * MIB),
                   "--io-threads", "4", "--io-total", str(size), image)
            du = json.loads(cl.rbd("du", "--format", "json", image))["images"][0]
            e["fill"] = {"seconds": time.monotonic() - t0, "used_size": du["used_size"], "size": size}
            if du["used_size"] < size:
                raise RuntimeError(f"filling {image} left {size - du['used_size']} bytes unwritten")
            log(f"{image}: {size // MIB} MiB written in {e['fill']['seconds']:.1f} s")
            runs = {point: {"flashpath": [], "qsd": []} for point in c["points"]}
            for rnd in range(c["rounds"]):
                for kind in (("flashpath", "qsd") if rnd % 2 == 0 else ("qsd", "flashpath")):
                    e["rounds"].append(self.rbd_round(kind, rnd, cl, c, size, runs))
            for point in c["points"]:
                e["points"].append(self.rbd_point(point, runs[point]))
        finally:
            cl.stop()

    def rbd_round(self, kind, rnd, cl, c, size, runs):
        """One server of `kind` on the image: started, warmed up, every point measured once
        (appended to `runs`), stopped; the round's record."""
        t0 = time.monotonic()
        name = f"{kind}-rbd-{rnd}"
        if kind == "flashpath":
            server = Flashpath(self.args.bin_dir, self.work, str(self.server_cpu), name=name,
                               extra=self.args.rbd_serve_args.split())
        else:
            server = Qsd(self.work, self.server_cpu, "rbd", size, cl.conf, name=name)
        try:
            sock = server.rbd_disk(cl.conf) if kind == "flashpath" else server.sock
            ready = time.monotonic() - t0
            if c["warmup"]:
                # The first write takes the image's exclusive lock (and the first reads load
                # its object map): not part of any measured run.
                w = self.loader.run(sock, "randwrite", 4096, 1, 1, False, c["warmup"])
                if w["errors"]:
                    raise RuntimeError(f"{name}: warm-up writes failed (first {w['first_error']})")
            for point in c["points"]:
                r = self.rbd_measure(server, sock, point, c["secs"], cl)
                runs[point][kind].append(r)
                log(f"round {rnd} {kind:<9} {point_label(point_key('rbd', point)):<28} "
                    f"{r['iops']:>9.0f} IOPS  p50 {r['p50_ns'] / 1000:8.1f} µs  server "
                    f"{r['server_cpu_ns_per_io'] / 1000:6.1f} µs/IO  cluster "
                    f"{sum(r['cluster_cpu_ns_per_io'].values()) / 1000:6.1f} µs/IO")
        finally:
            server.stop()
        return {"round": rnd, "server": kind, "ready_s": ready, "seconds": time.monotonic() - t0,
                "locks_left": self.rbd_locks_left(cl, name)}

    def rbd_locks_left(self, cl, name):
        """The image's locks after a server's exit, broken if any: a server that exits without
        closing the image leaves its exclusive lock, and the next server's first write would
        wait for it. Normally none."""
        image = f"{RBD_POOL}/{RBD_IMAGE}"
        locks = json.loads(cl.rbd("lock", "ls", "--format", "json", image) or "[]")
        for lk in locks:
            log(f"WARNING: {name} left a lock on {image} ({lk}); breaking it")
            cl.rbd("lock", "rm", image, lk["id"], lk["locker"])
        return locks

    def rbd_measure(self, server, sock, point, secs, cl):
        """measure() with the cluster daemons' CPU time over the run (each daemon, ns per I/O);
        other_cpu_cores then excludes the cluster."""
        k0, t0 = cl.cpu(), thread_cpu(server.pid)
        r = measure(server, self.loader, sock, point, secs, point[2] == 1)
        k1, t1 = cl.cpu(), thread_cpu(server.pid)
        ios, el = r["ios"], r["elapsed_s"]
        # The server's CPU per I/O by thread name (its reactor or iothread, librbd's threads).
        r["server_threads_ns_per_io"] = {n: (v - t0.get(n, 0)) / ios for n, v in t1.items() if ios}
        r["cluster_cpu_ns"] = {d: k1[d]["sched_ns"] - k0[d]["sched_ns"] for d in k1}
        r["cluster_cpu_ns_per_io"] = {d: v / ios if ios else None for d, v in r["cluster_cpu_ns"].items()}
        tot = sum(r["cluster_cpu_ns"].values())
        r["cluster_cores"] = tot / 1e9 / el if el else None
        if r["other_cpu_cores"] is not None and el:
            r["other_cpu_cores"] = max(0.0, r["other_cpu_cores"] - tot / 1e9 / el)
        return r

    def rbd_point(self, point, runs):
        """A point's entry: each server's runs, medians (cluster CPU per daemon too), the QD1
        histograms merged; the flashpath/qsd ratios of the medians."""
        p = dict(point_key("rbd", point), servers={})
        for kind, rs in runs.items():
            x = {"runs": rs, "median": summarize(rs)}
            daemons = rs[0]["cluster_cpu_ns_per_io"].keys() if rs else []
            x["median"]["cluster_cpu_ns_per_io"] = {d: median([r["cluster_cpu_ns_per_io"][d] for r in rs])
                                                    for d in daemons}
            x["median"]["cluster_cores"] = median([r["cluster_cores"] for r in rs])
            names = {n for r in rs for n in r["server_threads_ns_per_io"]}
            x["median"]["server_threads_ns_per_io"] = {
                n: median([r["server_threads_ns_per_io"].get(n, 0) for r in rs]) for n in sorted(names)}
            x["median"]["other_cpu_cores"] = median([r["other_cpu_cores"] for r in rs])
            iops = [r["iops"] for r in rs]
            x["spread"] = (max(iops) - min(iops)) / median(iops) if iops and median(iops) else None
            if point[2] == 1:
                x["histogram"] = merge_hists(rs)
                for r in rs:
                    r.pop("histogram", None)
            p["servers"][kind] = x
        f, q = p["servers"]["flashpath"]["median"], p["servers"]["qsd"]["median"]
        p["ratios"] = {"iops": ratio(f.get("iops"), q.get("iops")),
                       "server_cpu_per_io": ratio(f.get("server_cpu_ns_per_io"), q.get("server_cpu_ns_per_io")),
                       "p50": ratio(f.get("p50_ns"), q.get("p50_ns")),
                       "p99": ratio(f.get("p99_ns"), q.get("p99_ns"))}
        log(f"{point_label(p):<28} flashpath {fmt_iops(f.get('iops'))} IOPS, qsd {fmt_iops(q.get('iops'))}: "
            f"IOPS ratio {fmt_ratio(p['ratios']['iops'])}, server CPU/IO ratio "
            f"{fmt_ratio(p['ratios']['server_cpu_per_io'])}")
        return p

    # -- NBD (issue 14) ------------------------------------------------------------------------

    def run_nbd(self):
        """flashpath, qsd and nbdkit each exporting a RAM disk over NBD on a Unix socket, all
        three running on the server CPU; fio's nbd engine on the client CPU drives one at a time,
        `reps` runs of every point on each, the order rotating run by run. docs/benchmarks.md,
        "NBD (issue 14)", describes every step."""
        c = self.cfg["nbd"]
        size = c["size_mib"] * MIB
        e = {"config": {k: v for k, v in c.items() if k != "points"}, "size": size, "fills": {},
             "points": [], "versions": {"nbdkit": nbd_version("nbdkit")}}
        self.results["nbd"] = e
        if not getattr(self, "shm_dir", None):
            self.shm_dir = tempfile.mkdtemp(prefix="fp-bench.", dir="/dev/shm")
        path = os.path.join(self.shm_dir, "nbd.img")
        with open(path, "wb") as f:
            f.truncate(size)  # written in full through qsd below, like the other two disks
        servers = {}
        try:
            servers["flashpath"] = FlashpathNbd(self.args.bin_dir, self.work, str(self.server_cpu), size)
            servers["qsd"] = QsdNbd(self.work, self.server_cpu, path)
            servers["nbdkit"] = Nbdkit(self.work, self.server_cpu, size)
            e["uris"] = {k: s.uri for k, s in servers.items()}
            # Every disk starts empty: RAM never written reads as the zero page (flashpath,
            # nbdkit) or as a hole (qsd's sparse file). One sequential pass writes them all.
            for kind, s in servers.items():
                f = fio_nbd(s.uri, "write", MIB, 8, self.client_cpu)
                e["fills"][kind] = {"bytes": f["bytes"], "seconds": f["elapsed_s"]}
                if f["bytes"] < size:
                    raise RuntimeError(f"filling {kind}'s NBD disk wrote only {f['bytes']} of {size} bytes")
            log(f"{size // MIB} MiB written to each server's disk: " +
                ", ".join(f"{k} {v['seconds']:.1f} s" for k, v in e["fills"].items()))
            for point in c["points"]:
                runs = {kind: [] for kind in NBD_SERVERS}
                for rep in range(c["reps"]):
                    # Rotate who goes first, so drift within a point falls on all three alike.
                    order = NBD_SERVERS[rep % 3:] + NBD_SERVERS[:rep % 3]
                    for kind in order:
                        runs[kind].append(self.nbd_measure(servers[kind], point, c["secs"]))
                e["points"].append(self.nbd_point(point, runs))
        finally:
            for s in servers.values():
                s.stop()

    def nbd_measure(self, server, point, secs):
        """One fio run against `server`, with the server's CPU time (schedstat and utime+stime)
        and, for flashpath, its reactor's busy time over the run."""
        pattern, bs, qd = point
        react0 = server.reactors() if server.kind == "flashpath" else None
        cpu0 = proc_cpu(server.pid)
        m0, o0 = machine_busy_ns(), own_cpu_ns()
        r = fio_nbd(server.uri, pattern, bs, qd, self.client_cpu, secs)
        m1, o1 = machine_busy_ns(), own_cpu_ns()
        cpu1 = proc_cpu(server.pid)
        if r["errors"]:
            raise RuntimeError(f"{server.name} {point}: fio reported error {r['errors']}")
        ios, el = r["ios"], r["elapsed_s"]
        # utime + stime of /proc/PID/stat, not schedstat: a server may serve a connection on
        # threads of its own (nbdkit starts its workers per connection), which are gone when
        # fio has disconnected, and /proc/PID/stat keeps the time of exited threads.
        r["server_cpu_ns"] = cpu1["stat_ns"] - cpu0["stat_ns"]
        r["server_cpu_sched_ns"] = cpu1["sched_ns"] - cpu0["sched_ns"]
        r["server_cpu_ns_per_io"] = r["server_cpu_ns"] / ios if ios else None
        r["server_cores"] = r["server_cpu_ns"] / 1e9 / el if el else None
        other = (m1 - m0) - (o1 - o0) - r["server_cpu_ns"]
        r["other_cpu_cores"] = max(0.0, other / 1e9 / el) if el else None
        if react0 is not None:
            react1 = server.reactors()
            busy = sum(react1[k]["busy"] - react0[k]["busy"] for k in react1)
            r["reactor_busy_ns_per_io"] = busy / ios if ios else None
        log(f"nbd {server.kind:<9} {nbd_label(point):<22} {r['iops']:>9.0f} IOPS {r['mbps']:>8.1f} MB/s  "
            f"p50 {r['p50_ns'] / 1000:8.1f} µs  server {r['server_cpu_ns_per_io'] / 1000:6.1f} µs/IO")
        return r

    def nbd_point(self, point, runs):
        """A point's entry: each server's runs and medians, and flashpath's ratios to qsd and to
        nbdkit (IOPS, server CPU per I/O, p50, p99)."""
        pattern, bs, qd = point
        p = {"pattern": pattern, "bs": bs, "qd": qd, "servers": {}, "ratios": {}}
        for kind, rs in runs.items():
            md = summarize(rs)
            md["other_cpu_cores"] = median([r["other_cpu_cores"] for r in rs])
            iops = [r["iops"] for r in rs]
            sp = (max(iops) - min(iops)) / median(iops) if iops and median(iops) else None
            p["servers"][kind] = {"runs": rs, "median": md, "spread": sp}
        f = p["servers"]["flashpath"]["median"]
        for other in ("qsd", "nbdkit"):
            o = p["servers"][other]["median"]
            p["ratios"][other] = {"iops": ratio(f.get("iops"), o.get("iops")),
                                  "server_cpu_per_io": ratio(f.get("server_cpu_ns_per_io"),
                                                             o.get("server_cpu_ns_per_io")),
                                  "p50": ratio(f.get("p50_ns"), o.get("p50_ns")),
                                  "p99": ratio(f.get("p99_ns"), o.get("p99_ns"))}
        log(f"nbd {nbd_label(point):<22} flashpath {fmt_iops(f.get('iops'))} IOPS: "
            + ", ".join(f"vs {o} IOPS {fmt_ratio(p['ratios'][o]['iops'])}x, CPU/IO "
                        f"{fmt_ratio(p['ratios'][o]['server_cpu_per_io'])}x" for o in ("qsd", "nbdkit")))
        return p

    def go(self):
        # --only: one section alone, (what the log calls it, the section).
        only = {
            "rbd": (f"Ceph RBD, qsd's rbd driver vs flashpath's rbd bdev (server CPU {self.server_cpu}, "
                    f"client and cluster CPU {self.client_cpu}, scratch {self.work})", self.run_rbd),
            "nbd": (f"NBD over a Unix socket, flashpath vs qsd vs nbdkit (server CPU {self.server_cpu}, "
                    f"fio on CPU {self.client_cpu}, scratch {self.work})", self.run_nbd),
            "qos": (f"quality of service (server CPU {self.server_cpu}, client CPU {self.client_cpu}, "
                    f"scratch {self.work})", self.run_qos),
            "iostat": ("the disk layer's cost", self.run_iostat),
            "lvol": (f"logical volumes ({self.secs} s per run, server CPU {self.server_cpu}, "
                     f"client CPU {self.client_cpu})", self.run_lvol),
        }
        if self.args.only:
            what, section = only[self.args.only]
            log(f"=== only: {what}")
            section()
            self.results["wall_s"] = time.monotonic() - self.started
            return
        log(f"mode {self.args.mode}: {self.secs} s per run, {self.reps} repetitions, server CPU "
            f"{self.server_cpu}, client CPU {self.client_cpu}, scratch {self.work}")
        for backend in self.cfg["backends"]:
            log(f"=== backend {backend}")
            self.run_backend(backend)
        log("=== flashpath with two reactors (scaling)")
        self.run_scaling()
        if self.cfg["packed_points"]:
            log("=== packed vs split rings")
            self.run_packed()
        log("=== the disk layer's cost (I/O statistics off / on / with histograms)")
        self.run_iostat()
        log("=== the client's own ceiling")
        self.run_ceiling()
        log("=== path length: instructions per I/O under callgrind")
        self.run_callgrind()
        if self.with_rbd:
            log("=== Ceph RBD: qsd's rbd driver vs flashpath's rbd bdev, one server at a time")
            self.run_rbd()
        if self.with_nbd:
            log("=== NBD over a Unix socket: flashpath vs qsd vs nbdkit, fio's nbd engine")
            self.run_nbd()
        self.results["wall_s"] = time.monotonic() - self.started


# ---------------------------------------------------------------------------------------------
# Machine description


def wants_rbd(args):
    """Whether this run has the RBD section (see wants_section)."""
    return wants_section(args, "rbd")


def wants_section(args, name):
    """Whether this run has the section `name` (rbd, nbd): `--only name`, or a whole run whose
    `--backends` (if given) names it; neither is a matrix backend."""
    return args.only == name or (not args.only and (not args.backends or name in args.backends.split(",")))


def nbd_missing():
    """What the NBD section needs and this machine lacks: nbdkit (Debian nbdkit, whose memory
    plugin is built in) and fio's nbd engine (fio built with libnbd, as Debian's fio 3.33 is)."""
    missing = ["nbdkit"] if shutil.which("nbdkit") is None else []
    engines = subprocess.run(["fio", "--enghelp"], capture_output=True, text=True, timeout=20).stdout
    if "nbd" not in engines.split():
        missing.append("fio's nbd engine (fio built with libnbd)")
    return missing


def nbd_version(tool):
    try:
        return run([tool, "--version"], 20).stdout.strip().splitlines()[0]
    except Exception:
        return None


def nbd_label(point):
    pattern, bs, qd = point
    size = f"{bs // MIB}M" if bs >= MIB else f"{bs // 1024}K"
    return f"{pattern} {size} QD{qd}"


def rbd_missing():
    """What the RBD section needs and this machine lacks: the cluster's tools (Debian ceph-mon,
    ceph-osd, ceph-common, uuid-runtime) and qsd's rbd driver (qemu-block-extra)."""
    missing = [t for t in ("ceph-mon", "ceph-osd", "ceph", "rbd", "ceph-authtool", "monmaptool", "uuidgen")
               if shutil.which(t) is None]
    if not any(os.path.exists(os.path.join(d, "block-rbd.so")) for d in
               ("/usr/lib/x86_64-linux-gnu/qemu", "/usr/lib/aarch64-linux-gnu/qemu", "/usr/lib64/qemu",
                "/usr/lib/qemu")):
        missing.append("qemu-storage-daemon's rbd driver (block-rbd.so, Debian qemu-block-extra)")
    return missing


def machine_info(args):
    def sh(cmd):
        try:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=20).stdout.strip()
        except Exception:
            return None

    model = None
    flags = ""
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name") and model is None:
                model = line.split(":", 1)[1].strip()
            if line.startswith("flags") and not flags:
                flags = line
    mem_kb = None
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal"):
                mem_kb = int(line.split()[1])
    os_name = None
    try:
        with open("/etc/os-release") as f:
            for line in f:
                if line.startswith("PRETTY_NAME="):
                    os_name = line.split("=", 1)[1].strip().strip('"')
    except FileNotFoundError:
        pass
    return {
        "cpu_model": model,
        "cpus": os.cpu_count(),
        "hypervisor_guest": " hypervisor" in flags,
        "kvm": os.path.exists("/dev/kvm"),
        "mem_gib": round(mem_kb / (1 << 20), 1) if mem_kb else None,
        "kernel": platform.release(),
        "os": os_name,
        "clocksource": sh(["cat", "/sys/devices/system/clocksource/clocksource0/current_clocksource"]),
        "qsd_version": (sh(["qemu-storage-daemon", "--version"]) or "").splitlines()[0:1],
        "fio_version": sh(["fio", "--version"]),
        "valgrind_version": sh(["valgrind", "--version"]),
        "ceph_version": sh(["ceph", "--version"]) if shutil.which("ceph") else None,
        "flashpath_commit": sh(["git", "-C", os.path.dirname(os.path.abspath(__file__)), "rev-parse",
                                "--short", "HEAD"]),
        "rustc": sh(["rustc", "--version"]),
        "disk_fs": sh(["findmnt", "-n", "-o", "SOURCE,FSTYPE", "-T", args.work_dir]),
        "hostname": socket.gethostname(),
    }


# ---------------------------------------------------------------------------------------------
# Targets, Markdown, plots


def find(points, server, **kw):
    for p in points:
        if p["server"] == server and all(p[k] == v for k, v in kw.items()):
            return p["median"]
    return None


def targets(res):
    """The issue's targets, evaluated on the medians of this run."""
    pts = res["points"]
    out = []

    def add(name, goal, measured, met, note=""):
        out.append({"target": name, "goal": goal, "measured": measured,
                    "status": None if met is None else ("MET" if met else "MISSED"), "note": note})

    q32 = dict(backend="null", pattern="randread", bs=4096, qd=32, queues=1, client="poll")
    f, q = find(pts, "flashpath", **q32), find(pts, "qsd", **q32)
    if f and q:
        r = f["iops"] / q["iops"]
        add("QD32, 1 queue, polled client: IOPS >= 10x qsd's", ">= 10.0x",
            f"{f['iops'] / 1e6:.2f} M vs {q['iops'] / 1e6:.2f} M IOPS = {r:.2f}x", r >= 10)
        b = f.get("reactor_busy_ns_per_io")
        if b is not None:
            add("QD32 polled: reactor busy time per I/O", "<= 300 ns", f"{b:.0f} ns "
                f"(reactor {100 * f['reactor_busy_frac'].get('0', 0):.0f} % busy)", b <= 300)
    q1 = dict(backend="null", pattern="randread", bs=4096, qd=1, queues=1)
    f = find(pts, "flashpath", client="poll", **q1)
    if f:
        add("QD1 polled: p50", "<= 0.75 us", f"{f['p50_ns'] / 1000:.2f} us", f["p50_ns"] <= 750)
        add("QD1 polled: p99.9", "<= 3 us", f"{f['p999_ns'] / 1000:.2f} us", f["p999_ns"] <= 3000)
    f, q = find(pts, "flashpath", client="fd", **q1), find(pts, "qsd", client="fd", **q1)
    if f and q:
        r = f["p50_ns"] / q["p50_ns"]
        add("QD1 completion-fd client: p50 <= 0.5x qsd's", "<= 0.50x",
            f"{f['p50_ns'] / 1000:.2f} us vs {q['p50_ns'] / 1000:.2f} us = {r:.2f}x", r <= 0.5)
    sc = {(e["queues"], e["client"], e["qd"]): e["median"] for e in res["scaling"]}
    for client in ("poll", "fd"):
        one, two = sc.get((1, client, 32)), sc.get((2, client, 32))
        if one and two:
            r = two["iops"] / one["iops"]
            add(f"2 queues on 2 reactors vs 1 ({client} client, QD32 per queue)", ">= 1.8x",
                f"{two['iops'] / 1e6:.2f} M vs {one['iops'] / 1e6:.2f} M = {r:.2f}x", r >= 1.8,
                "the client shares core 1 with the second reactor; see docs/benchmarks.md")
    for e in res["fio"]:
        if e["pattern"] != "randread" or e["qd"] not in (1, 32) or e["bs"] != 4096:
            continue
        for client in ("fd", "poll"):
            f = find(pts, "flashpath", backend="file", pattern="randread", bs=4096, qd=e["qd"],
                     queues=1, client=client)
            if f:
                r = f["iops"] / e["median"]["iops"]
                add(f"uring file QD{e['qd']} randread ({client} client) vs fio io_uring", ">= 0.97x",
                    f"{f['iops'] / 1e3:.1f} K vs fio {e['median']['iops'] / 1e3:.1f} K = {r:.2f}x",
                    r >= 0.97)
    for e in res["idle"]:
        if e["server"] == "flashpath":
            add(f"idle CPU, {e['backend']} disk attached", "<= 1 % of a core",
                f"{e['core_percent']:.3f} %", e["core_percent"] <= 1.0)
    lv = res.get("lvol")
    for p in (lv or {}).get("points", []):
        if p["qd"] != 32:
            continue
        raw, vol = p["median"]["raw"]["iops"], p["median"]["lvol"]["iops"]
        add(f"thick volume vs its raw malloc base, QD32 4K {p['pattern']} ({p['client']} client)",
            ">= 0.95x", f"{fmt_iops(vol)} vs {fmt_iops(raw)} IOPS = {p['ratio']:.2f}x (single pairs "
            f"{min(p['pair_ratios']):.2f}-{max(p['pair_ratios']):.2f})", p["ratio"] >= 0.95)
    for f in (lv or {}).get("first_write", []):
        if f["kind"] in ("allocate", "cow"):
            add(f"QD1 4K {'first write (allocating)' if f['kind'] == 'allocate' else 'copy-on-write'} "
                f"latency, {f['cluster_size'] // 1024} KiB clusters", "reported",
                f"p50 {f['p50_ns'] / 1000:.1f} µs, p99 {f['p99_ns'] / 1000:.1f} µs", None)
    if lv:
        add("the same points for SPDK's lvol on malloc", "reported", lv["spdk"], None)
    if res.get("qos"):
        qos_targets(res["qos"], add)
    for p in (res.get("rbd") or {}).get("points", []):
        f, q = p["servers"]["flashpath"]["median"], p["servers"]["qsd"]["median"]
        w = f"RBD 4K {p['pattern']} QD{p['qd']} ({p['client']} client)"
        r = p["ratios"]["iops"]
        add(f"{w}: IOPS vs qsd's rbd driver", ">= 0.95x",
            f"{fmt_iops(f.get('iops'))} vs {fmt_iops(q.get('iops'))} = {fmt_ratio(r)}x", None if r is None else r >= 0.95)
        r = p["ratios"]["server_cpu_per_io"]
        add(f"{w}: server CPU per I/O vs qsd's", "<= 0.50x",
            f"{fmt_us1(f.get('server_cpu_ns_per_io'))} vs {fmt_us1(q.get('server_cpu_ns_per_io'))} µs = "
            f"{fmt_ratio(r)}x", None if r is None else r <= 0.5,
            f"cluster {fmt_us1(sum(f.get('cluster_cpu_ns_per_io', {}).values()))} / "
            f"{fmt_us1(sum(q.get('cluster_cpu_ns_per_io', {}).values()))} µs per I/O")
    for p in (res.get("nbd") or {}).get("points", []):
        f = p["servers"]["flashpath"]["median"]
        w = f"NBD {nbd_label((p['pattern'], p['bs'], p['qd']))}"
        for other in ("qsd", "nbdkit"):
            o = p["servers"][other]["median"]
            r = p["ratios"][other]
            # Issue 14: at least 1.5x qsd's NBD export, "and against nbdkit's memory plugin",
            # read here as the same bar for both.
            ok = None if r["iops"] is None else r["iops"] >= 1.5
            add(f"{w}: IOPS vs {other} (server CPU per I/O reported)", ">= 1.5x IOPS",
                f"{fmt_iops(f.get('iops'))} vs {fmt_iops(o.get('iops'))} IOPS = {fmt_ratio(r['iops'])}x; "
                f"{fmt_us1(f.get('server_cpu_ns_per_io'))} vs {fmt_us1(o.get('server_cpu_ns_per_io'))} µs/IO = "
                f"{fmt_ratio(r['server_cpu_per_io'])}x", ok)
    return out


def fmt_iops(v):
    if v is None:
        return "-"
    if v >= 1e6:
        return f"{v / 1e6:.2f} M"
    return f"{v / 1e3:.1f} K"


def fmt_us(ns):
    return "-" if ns is None else f"{ns / 1000:.2f}"


def fmt_ns(ns):
    return "-" if ns is None else f"{ns:.0f}"


def fmt_ratio(r):
    return "-" if r is None else f"{r:.2f}"


def spread(res, r, server):
    """(max - min) / median of a point's IOPS over its repetitions, in %."""
    for p in res["points"]:
        if p["server"] == server and all(p[k] == r[k] for k in ("backend", "pattern", "bs", "qd",
                                                                  "queues", "client")):
            xs = [x["iops"] for x in p["runs"]]
            med = statistics.median(xs)
            return f"{100 * (max(xs) - min(xs)) / med:.0f} %" if med else "-"
    return "-"


MAIN_POINTS = [  # (pattern, bs, qd, queues, client)
    ("randread", 4096, 1, 1, "poll"),
    ("randread", 4096, 1, 1, "fd"),
    ("randread", 4096, 32, 1, "poll"),
    ("randread", 4096, 32, 1, "fd"),
    ("randread", 4096, 128, 1, "poll"),
    ("randread", 4096, 32, 2, "poll"),
    ("randwrite", 4096, 32, 1, "poll"),
    ("read", 65536, 32, 1, "poll"),
]


def main_table(res):
    """The condensed side-by-side table (the README's)."""
    lines = ["| backend | workload | QD × queues | client | flashpath IOPS | qsd IOPS | fp/qsd | "
             "fp p50 µs | qsd p50 µs | fp p99.9 µs | qsd p99.9 µs | fp CPU/IO ns | qsd CPU/IO ns | "
             "fp busy/IO ns |",
             "|" + "---|" * 14]
    for r in res["ratios"]:
        if (r["pattern"], r["bs"], r["qd"], r["queues"], r["client"]) not in MAIN_POINTS:
            continue
        f, q = r["flashpath"], r["qsd"]
        lines.append(
            f"| {r['backend']} | {r['pattern']} {r['bs'] // 1024}K | {r['qd']} × {r['queues']} | "
            f"{r['client']} | {fmt_iops(f['iops'])} | {fmt_iops(q['iops'])} | "
            f"**{fmt_ratio(r['iops_ratio'])}** | {fmt_us(f['p50_ns'])} | {fmt_us(q['p50_ns'])} | "
            f"{fmt_us(f['p999_ns'])} | {fmt_us(q['p999_ns'])} | "
            f"{fmt_ns(f.get('server_cpu_ns_per_io'))} | {fmt_ns(q.get('server_cpu_ns_per_io'))} | "
            f"{fmt_ns(f.get('reactor_busy_ns_per_io'))} |")
    return lines


def other_cpu_note(res):
    xs = [(r.get("other_cpu_cores"), p) for p in res["points"] for r in p["runs"]]
    xs = [(x, p) for x, p in xs if x is not None]
    if not xs:
        return ""
    worst, p = max(xs, key=lambda t: t[0])
    return (f"Other CPU use during the runs (anything but the server under test and the client, "
            f"from /proc/stat): median {100 * statistics.median(x for x, _ in xs):.1f} %, "
            f"at most {100 * worst:.1f} % of a core ({point_label(p)}, {p['server']} run).")


def machine_line(m):
    mi = m["machine"]
    return (f"Machine: {mi['cpu_model']}, {mi['cpus']} CPUs"
            f"{' (virtual machine' if mi['hypervisor_guest'] else ' ('}"
            f"{', no KVM' if not mi['kvm'] else ''}), {mi['mem_gib']} GiB, {mi['os']}, Linux "
            f"{mi['kernel']}, clocksource {mi['clocksource']}. flashpath {mi['flashpath_commit']} "
            f"({m.get('build', 'release')} build).")


def markdown(res):
    m = res["meta"]
    mi = m["machine"]
    if m.get("only") == "lvol":
        # No qsd and no matrix: the volume section and its targets only.
        lines = [f"# flashpath: logical volumes vs their base ({m['mode']} run, {m['date']})", "",
                 machine_line(m), "",
                 f"Command: `{m['command']}`. Wall time {res['wall_s'] / 60:.1f} min. {lvol_other_cpu(res)}"]
        lines += lvol_markdown(res)
        return "\n".join(lines + targets_table(res))
    # Sections run alone that compare with qsd: (title, the section's Markdown).
    alone = {"rbd": ("flashpath vs qemu-storage-daemon on Ceph RBD", rbd_markdown),
             "nbd": ("flashpath vs qemu-storage-daemon and nbdkit over NBD", nbd_markdown),
             "qos": ("flashpath: quality of service", qos_markdown)}
    if m.get("only") in alone:
        title, section = alone[m["only"]]
        lines = [f"# {title} ({m['mode']} run, {m['date']})", "",
                 machine_line(m) + f" {' '.join(mi['qsd_version'])}.", "",
                 f"Command: `{m['command']}`. Wall time {res['wall_s'] / 60:.1f} min."]
        lines += section(res)
        return "\n".join(lines + targets_table(res))
    lines = [f"# flashpath vs qemu-storage-daemon ({m['mode']} run, {m['date']})", ""]
    lines += [
        f"Machine: {mi['cpu_model']}, {mi['cpus']} CPUs"
        f"{' (virtual machine' if mi['hypervisor_guest'] else ' ('}"
        f"{', no KVM' if not mi['kvm'] else ''}), {mi['mem_gib']} GiB, {mi['os']}, Linux "
        f"{mi['kernel']}, clocksource {mi['clocksource']}. "
        f"{' '.join(mi['qsd_version'])}; {mi['fio_version']}; flashpath {mi['flashpath_commit']} "
        f"({m.get('build', 'release')} build).",
        "",
        f"Servers on CPU {m['server_cpu']}, fp-load (libblkio) on CPU {m['client_cpu']}; "
        f"{m['time_s']} s per run, {m['reps']} runs per point and server, interleaved "
        f"(flashpath, qsd, flashpath, qsd, ...); figures are medians. QD is per queue. "
        f"CPU/IO: the server's CPU time (all threads, /proc/PID/task/*/schedstat) per I/O; "
        f"busy/IO: flashpath's reactor busy time (polls that did work) per I/O. "
        f"spread: (max - min) / median of the IOPS over the repetitions. "
        f"Command: `{m['command']}`. Wall time {res['wall_s'] / 60:.1f} min. "
        f"{other_cpu_note(res)}",
        "",
        "## Main points",
        "",
    ]
    lines += main_table(res)
    lines += [
        "",
        "## Side by side (every point)",
        "",
        "| backend | workload | QD | queues | client | flashpath IOPS | qsd IOPS | fp/qsd | "
        "fp spread | qsd spread | fp MB/s | qsd MB/s | fp mean µs | qsd mean µs | fp p50 µs | "
        "qsd p50 µs | fp p99 µs | qsd p99 µs | fp p99.9 µs | qsd p99.9 µs | fp CPU/IO ns | "
        "qsd CPU/IO ns | fp busy/IO ns |",
        "|" + "---|" * 23,
    ]
    for r in res["ratios"]:
        f, q = r["flashpath"], r["qsd"]
        lines.append(
            f"| {r['backend']} | {r['pattern']} {r['bs'] // 1024}K | {r['qd']} | {r['queues']} | "
            f"{r['client']} | {fmt_iops(f['iops'])} | {fmt_iops(q['iops'])} | "
            f"**{fmt_ratio(r['iops_ratio'])}** | {spread(res, r, 'flashpath')} | "
            f"{spread(res, r, 'qsd')} | {f['mbps']:.0f} | {q['mbps']:.0f} | "
            f"{fmt_us(f['lat_mean_ns'])} | {fmt_us(q['lat_mean_ns'])} | {fmt_us(f['p50_ns'])} | "
            f"{fmt_us(q['p50_ns'])} | {fmt_us(f['p99_ns'])} | {fmt_us(q['p99_ns'])} | "
            f"{fmt_us(f['p999_ns'])} | {fmt_us(q['p999_ns'])} | "
            f"{fmt_ns(f.get('server_cpu_ns_per_io'))} | {fmt_ns(q.get('server_cpu_ns_per_io'))} | "
            f"{fmt_ns(f.get('reactor_busy_ns_per_io'))} |")
    if res["fio"]:
        lines += ["", "## File backend vs the host baseline (fio, io_uring, direct=1, same file)", "",
                  "fio runs on the client's CPU, interleaved with the two servers' runs.", "",
                  "| workload | QD | fio IOPS | fio p50 µs | flashpath fd / fio | flashpath poll / fio | "
                  "qsd fd / fio | qsd poll / fio |",
                  "|---|---|---|---|---|---|---|---|"]
        for e in res["fio"]:
            cells = []
            for server in ("flashpath", "qsd"):
                for client in ("fd", "poll"):
                    s = find(res["points"], server, backend="file", pattern=e["pattern"], bs=e["bs"],
                             qd=e["qd"], queues=1, client=client)
                    cells.append(fmt_ratio(ratio(s and s["iops"], e["median"]["iops"])))
            lines.append(f"| {e['pattern']} {e['bs'] // 1024}K | {e['qd']} | "
                         f"{fmt_iops(e['median']['iops'])} | {fmt_us(e['median']['p50_ns'])} | "
                         + " | ".join(cells) + " |")
    lines += ["", "## Idle CPU (disk attached, a connected client, no I/O)", "",
              "| backend | server | seconds | % of a core |", "|---|---|---|---|"]
    for e in res["idle"]:
        lines.append(f"| {e['backend']} | {e['server']} | {e['seconds']:.0f} | {e['core_percent']:.3f} |")
    if res["scaling"]:
        lines += ["", "## flashpath on two reactors (null, 4K randread; the client shares CPU "
                  f"{m['client_cpu']} with the second reactor)", "",
                  "| QD | client | queues | IOPS | busy/IO ns (all reactors) | reactor busy % |",
                  "|---|---|---|---|---|---|"]
        for e in res["scaling"]:
            md = e["median"]
            fr = ", ".join(f"r{k} {100 * v:.0f}" for k, v in sorted(md.get("reactor_busy_frac", {}).items()))
            lines.append(f"| {e['qd']} | {e['client']} | {e['queues']} | {fmt_iops(md['iops'])} | "
                         f"{fmt_ns(md.get('reactor_busy_ns_per_io'))} | {fr} |")
    if res.get("packed"):
        lines += ["", "## Packed vs split rings (flashpath, null, 4K randread, 1 queue)", "",
                  "fp-load `--packed` (virtio-driver, `VIRTIO_F_RING_PACKED`) vs the default split "
                  "rings (libblkio), interleaved run by run; medians.", "",
                  "| QD | client | split IOPS | packed IOPS | packed vs split | split p50 µs | "
                  "packed p50 µs | split busy/IO ns | packed busy/IO ns |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for e in res["packed"]:
            sp, pk = e["split"]["median"], e["packed"]["median"]
            lines.append(f"| {e['qd']} | {e['client']} | {fmt_iops(sp['iops'])} | {fmt_iops(pk['iops'])} | "
                         f"{fmt_ratio(e['ratio'])} | {fmt_us(sp['p50_ns'])} | {fmt_us(pk['p50_ns'])} | "
                         f"{fmt_ns(sp.get('reactor_busy_ns_per_io'))} | "
                         f"{fmt_ns(pk.get('reactor_busy_ns_per_io'))} |")
    if res.get("iostat"):
        lines += ["", "## The disk layer's cost (flashpath, null, 4K randread, 1 polled queue)", "",
                  "Statistics off (`serve --no-iostat`), counters on, counters and latency histograms "
                  "on, interleaved run by run; medians.", "",
                  "| QD | variant | IOPS | vs off | p50 µs | p99 µs | busy/IO ns | instructions/IO |",
                  "|---|---|---|---|---|---|---|---|"]
        for e in res["iostat"]:
            for k in ("off", "counters", "histograms"):
                md = e["variants"][k]["median"]
                r = "1.00" if k == "off" else fmt_ratio(e["ratios"][k])
                ir = e.get("ir_per_io", {}).get(k)
                lines.append(f"| {e['qd']} | {k} | {fmt_iops(md['iops'])} | {r} | {fmt_us(md['p50_ns'])} | "
                             f"{fmt_us(md['p99_ns'])} | {fmt_ns(md.get('reactor_busy_ns_per_io'))} | "
                             f"{'-' if ir is None else f'{ir:.0f}'} |")
    c = res.get("client_ceiling")
    if c:
        md = c["median"]
        lines += ["", "## The client's own ceiling", "",
                  f"fp-load `--client-busy` on null, 4K randread, QD32, 1 polled queue, flashpath: "
                  f"{fmt_iops(md['iops'])} IOPS; client busy {md['client_busy_ns_per_io']:.0f} ns per I/O "
                  f"({100 * md['client_busy_frac']:.0f} % of its core in passes that completed "
                  f"something), ceiling ≈ {fmt_iops(1e9 / md['client_busy_ns_per_io'])} IOPS; reactor "
                  f"busy {md['reactor_busy_ns_per_io']:.0f} ns per I/O."]
    if res.get("callgrind"):
        lines += ["", "## Path length (instructions per I/O under callgrind)", "",
                  f"Each figure: (instructions of a {res['callgrind'][0]['long_s']:g} s run − those of "
                  f"a {res['callgrind'][0]['short_s']:g} s run) / (I/Os of the long run − I/Os of the "
                  "short run), all the server's threads, each run a fresh server under "
                  f"{mi.get('valgrind_version') or 'valgrind'} (callgrind) on CPU {m['server_cpu']} and "
                  f"fp-load natively on CPU {m['client_cpu']}; the median over the repetitions. "
                  "spread: (max − min) / median. See docs/benchmarks.md.", "",
                  "| workload | client | server | instructions/IO | repetitions | spread |",
                  "|---|---|---|---|---|---|"]
        for e in res["callgrind"]:
            lines.append(f"| {e['backend']} {e['pattern']} {e['bs'] // 1024}K, QD{e['qd']} × "
                         f"{e['queues']} | {e['client']} | {e['server']} | {e['ir_per_io']:,.0f} | "
                         f"{len(e['runs'])} | {100 * e['spread']:.1f} % |")
    if res.get("lvol"):
        lines += lvol_markdown(res)
    if res.get("rbd"):
        lines += rbd_markdown(res)
    if res.get("nbd"):
        lines += nbd_markdown(res)
    return "\n".join(lines + targets_table(res))


def fmt_us1(ns):
    return "-" if ns is None else f"{ns / 1000:,.1f}"


def rbd_markdown(res):
    """The Ceph RBD section (issue 13)."""
    e = res["rbd"]
    m = res["meta"]
    c = e["config"]
    daemons = e.get("cluster_daemons", [])
    lines = ["", "## Ceph RBD: qsd's rbd driver vs flashpath's rbd bdev", "",
             f"One {e['size'] // MIB} MiB image (`{e['image']}`) on a single-node cluster (tests/ceph/cluster.sh: "
             f"{', '.join(daemons)}, memstore; {m['machine'].get('ceph_version') or 'ceph'}), written in full "
             f"first ({e.get('fill', {}).get('seconds', 0):.1f} s). One server at a time on CPU {m['server_cpu']} "
             f"(qsd `driver=rbd,cache.direct=on`; flashpath "
             f"`serve{' ' + e['serve_args'] if e.get('serve_args') else ''}`, `bdev_rbd_register_cluster` with "
             f"config_param {json.dumps(e['config_param'])}, `bdev_rbd_create`), both with librbd's cache off; fp-load with "
             f"completion-fd queues and the cluster's daemons on CPU {e['cluster_cpu']}. {c['rounds']} round(s) of "
             f"{c['secs']:g} s per point and server, each round a fresh server, the order alternating "
             "(flashpath, qsd, qsd, flashpath, ...); medians. CPU/IO: CPU time per I/O of the server (all its "
             "threads, librbd's included), of each cluster daemon (/proc/PID/task/*/schedstat); busy/IO: "
             "flashpath's reactor busy time per I/O. cluster: the daemons' CPU over the run. "
             "other: CPU used by anything but the server, the client and the cluster.", "",
             "| workload | QD | server | IOPS | spread | p50 µs | p99 µs | p99.9 µs | server CPU/IO µs | "
             "reactor busy/IO µs | " + " | ".join(f"{d} CPU/IO µs" for d in daemons) +
             " | cluster, % of a core | other, % of a core |",
             "|" + "---|" * (12 + len(daemons))]
    for p in e["points"]:
        for kind in ("flashpath", "qsd"):
            x = p["servers"][kind]
            md = x["median"]
            cl = md.get("cluster_cpu_ns_per_io", {})
            sp = "-" if x["spread"] is None else f"{100 * x['spread']:.0f} %"
            lines.append(
                f"| {p['pattern']} {p['bs'] // 1024}K | {p['qd']} | {kind} | {fmt_iops(md.get('iops'))} | {sp} | "
                f"{fmt_us1(md.get('p50_ns'))} | {fmt_us1(md.get('p99_ns'))} | {fmt_us1(md.get('p999_ns'))} | "
                f"{fmt_us1(md.get('server_cpu_ns_per_io'))} | {fmt_us1(md.get('reactor_busy_ns_per_io'))} | "
                + " | ".join(fmt_us1(cl.get(d)) for d in daemons) +
                f" | {fmt_share(md.get('cluster_cores'))} | {fmt_share(md.get('other_cpu_cores'))} |")
    lines += ["", "| workload | QD | IOPS flashpath/qsd (target ≥ 0.95) | server CPU/IO flashpath/qsd "
              "(target ≤ 0.5) | p50 flashpath/qsd | p99 flashpath/qsd |", "|---|---|---|---|---|---|"]
    for p in e["points"]:
        r = p["ratios"]
        lines.append(f"| {p['pattern']} {p['bs'] // 1024}K | {p['qd']} | **{fmt_ratio(r['iops'])}** | "
                     f"**{fmt_ratio(r['server_cpu_per_io'])}** | {fmt_ratio(r['p50'])} | {fmt_ratio(r['p99'])} |")
    lines += ["", "Where each server's CPU time per I/O goes, by thread (names with their digits dropped, "
              "largest first, those of at least 2 % of the server's total; µs per I/O, medians):", "",
              "| workload | QD | server | threads |", "|---|---|---|---|"]
    for p in e["points"]:
        for kind in ("flashpath", "qsd"):
            th = p["servers"][kind]["median"].get("server_threads_ns_per_io", {})
            tot = sum(th.values()) or 1
            top = sorted(((v, n) for n, v in th.items() if v >= 0.02 * tot), reverse=True)
            lines.append(f"| {p['pattern']} {p['bs'] // 1024}K | {p['qd']} | {kind} | "
                         + ", ".join(f"{n} {fmt_us1(v)}" for v, n in top) + " |")
    left = [x for x in e["rounds"] if x["locks_left"]]
    lines += ["", "Server start to exported disk: " + ", ".join(
        f"{kind} {median([x['ready_s'] for x in e['rounds'] if x['server'] == kind]):.2f} s"
        for kind in ("flashpath", "qsd")) + " (medians). " +
        ("Locks left on the image after a server's exit (broken before the next round): " +
         "; ".join(f"round {x['round']} {x['server']}" for x in left) if left else
         "No server left a lock on the image.")]
    return lines


def nbd_markdown(res):
    """The NBD section (issue 14)."""
    e = res["nbd"]
    m = res["meta"]
    c = e["config"]
    mi = m["machine"]
    lines = ["", "## NBD over a Unix socket: flashpath vs qsd vs nbdkit", "",
             f"A {e['size'] // MIB} MiB RAM disk exported over NBD on a Unix socket by each server, all three "
             f"running on CPU {m['server_cpu']} (taskset): flashpath `bdev_malloc_create` + `nbd_start_disk`; "
             f"{' '.join(mi['qsd_version'])} `--nbd-server addr.type=unix` + `--export type=nbd,iothread=iot0` of a "
             f"file on /dev/shm (`driver=file,aio=io_uring,cache.direct=off`); "
             f"{e['versions'].get('nbdkit') or 'nbdkit'} `memory {e['size']} allocator=malloc`. Each disk written in "
             "full through NBD first. The client: fio's nbd engine (libnbd, one connection; "
             f"{mi['fio_version']}) on CPU {m['client_cpu']}, the same for all three. {c['reps']} run(s) of "
             f"{c['secs']:g} s per point and server, interleaved (the first server rotating); medians. "
             "Latency: fio's total (submission to completion). CPU/IO: the server's CPU time per I/O, all "
             "threads, those that exited included (utime + stime of /proc/PID/stat, in clock ticks: nbdkit's "
             "workers live as long as their connection); busy/IO: flashpath's reactor busy time per I/O. "
             "other: CPU used by anything but the server under test and fio.", "",
             "| workload | server | IOPS | MB/s | spread | mean µs | p50 µs | p99 µs | p99.9 µs | server CPU/IO µs | "
             "reactor busy/IO µs | other, % of a core |",
             "|" + "---|" * 12]
    for p in e["points"]:
        for kind in NBD_SERVERS:
            x = p["servers"][kind]
            md = x["median"]
            sp = "-" if x["spread"] is None else f"{100 * x['spread']:.0f} %"
            lines.append(
                f"| {nbd_label((p['pattern'], p['bs'], p['qd']))} | {kind} | {fmt_iops(md.get('iops'))} | "
                f"{md.get('mbps', 0):,.0f} | {sp} | {fmt_us1(md.get('lat_mean_ns'))} | {fmt_us1(md.get('p50_ns'))} | "
                f"{fmt_us1(md.get('p99_ns'))} | {fmt_us1(md.get('p999_ns'))} | "
                f"{fmt_us1(md.get('server_cpu_ns_per_io'))} | {fmt_us1(md.get('reactor_busy_ns_per_io'))} | "
                f"{fmt_share(md.get('other_cpu_cores'))} |")
    lines += ["", "| workload | IOPS fp/qsd | IOPS fp/nbdkit | server CPU/IO fp/qsd | server CPU/IO fp/nbdkit | "
              "p50 fp/qsd | p50 fp/nbdkit | p99 fp/qsd | p99 fp/nbdkit |", "|" + "---|" * 9]
    for p in e["points"]:
        q, k = p["ratios"]["qsd"], p["ratios"]["nbdkit"]
        lines.append(f"| {nbd_label((p['pattern'], p['bs'], p['qd']))} | **{fmt_ratio(q['iops'])}** | "
                     f"**{fmt_ratio(k['iops'])}** | **{fmt_ratio(q['server_cpu_per_io'])}** | "
                     f"**{fmt_ratio(k['server_cpu_per_io'])}** | {fmt_ratio(q['p50'])} | {fmt_ratio(k['p50'])} | "
                     f"{fmt_ratio(q['p99'])} | {fmt_ratio(k['p99'])} |")
    lines += ["", "Fill (one sequential 1 MiB QD8 pass): " + ", ".join(
        f"{k} {v['seconds']:.1f} s" for k, v in e["fills"].items()) + "."]
    return lines


def targets_table(res):
    """The targets section every results.md ends with."""
    lines = ["", "## Targets (from the issue; results, not assertions)", "",
             "| target | goal | measured | status |", "|---|---|---|---|"]
    for t in res["targets"]:
        note = f" ({t['note']})" if t["note"] else ""
        lines.append(f"| {t['target']} | {t['goal']} | {t['measured']}{note} | {t['status'] or '-'} |")
    lines.append("")
    return lines


def lvol_other_cpu(res):
    xs = [r["other_cpu_cores"] for p in res["lvol"]["points"] for rs in p["runs"].values() for r in rs
          if r.get("other_cpu_cores") is not None]
    if not xs:
        return ""
    return (f"Other CPU use during the IOPS runs (anything but the server under test and the client, "
            f"from /proc/stat): median {100 * statistics.median(xs):.0f} %, at most {100 * max(xs):.0f} % "
            "of a core.")


def lvol_markdown(res):
    """The logical-volume section (`--only lvol`)."""
    lv, m = res["lvol"], res["meta"]
    lines = ["", "## Logical volumes (issue 11)", "",
             f"Two flashpath daemons on CPU {m['server_cpu']}, fp-load on CPU {m['client_cpu']}: **raw** "
             f"exports a {lv['size'] // MIB} MiB malloc bdev, **lvol** a THICK volume of "
             f"{lv.get('thick_volume_size', 0) // MIB} MiB (every data cluster of an lvstore with "
             f"{lv['cluster_size'] // 1024} KiB clusters on a {lv['size'] // MIB} MiB malloc bdev); both "
             f"written in full first. {lv['pairs']} runs of {m['time_s']} s per point and disk, the order "
             "alternating (raw, lvol, lvol, raw, ...); medians. spread: (max − min) / median of the IOPS; "
             "pairs: the lowest and highest lvol/raw of single consecutive pairs.", "",
             "| workload | QD | client | raw IOPS | lvol IOPS | lvol/raw | pairs | raw spread | lvol spread | "
             "raw p50 µs | lvol p50 µs | raw p99 µs | lvol p99 µs | raw busy/IO ns | lvol busy/IO ns |",
             "|" + "---|" * 15]
    for p in lv["points"]:
        r, v = p["median"]["raw"], p["median"]["lvol"]
        lines.append(f"| {p['pattern']} {p['bs'] // 1024}K | {p['qd']} | {p['client']} | {fmt_iops(r['iops'])} | "
                     f"{fmt_iops(v['iops'])} | **{fmt_ratio(p['ratio'])}** | {min(p['pair_ratios']):.2f}–"
                     f"{max(p['pair_ratios']):.2f} | {100 * p['spread']['raw']:.0f} % | "
                     f"{100 * p['spread']['lvol']:.0f} % | {fmt_us(r['p50_ns'])} | {fmt_us(v['p50_ns'])} | "
                     f"{fmt_us(r['p99_ns'])} | {fmt_us(v['p99_ns'])} | {fmt_ns(r.get('reactor_busy_ns_per_io'))} | "
                     f"{fmt_ns(v.get('reactor_busy_ns_per_io'))} |")
    fw = lv.get("first_write", [])
    for cl in sorted({f["cluster_size"] for f in fw}):
        fs = [f for f in fw if f["cluster_size"] == cl]
        f0 = fs[0]
        lines += ["", f"### One 4 KiB write per cluster, QD1 ({cl // 1024} KiB clusters)", "",
                  f"fp-load `--pattern write --bs 4k --qd 1 --poll --stride {cl} --ios "
                  f"{f0['writes']}`: {f0['writes']} writes, each to the next cluster of a "
                  f"{lv['size'] // MIB} MiB volume, on a malloc bdev written in full first. raw: that bdev "
                  "exported raw; allocate: a fresh thin volume (each write allocates and zeroes its "
                  "cluster); cow: the same volume written in full and snapshotted (each write copies its "
                  "cluster from the snapshot); overwrite: the same writes again (clusters owned). A fresh "
                  "daemon per repetition; medians of the repetitions' figures. The copy cost scales with "
                  "the cluster size.", "",
                  "| kind | p50 µs | p99 µs | mean µs | max µs | repetitions |", "|---|---|---|---|---|---|"]
        for f in fs:
            lines.append(f"| {f['kind']} | {fmt_us(f['p50_ns'])} | {fmt_us(f['p99_ns'])} | "
                         f"{fmt_us(f['lat_mean_ns'])} | {fmt_us(f['lat_max_ns'])} | {len(f['runs'])} |")
    cg = lv.get("callgrind", [])
    if cg:
        lines += ["", "### Instructions per I/O (callgrind)", "",
                  f"As in the path-length section of a full run (docs/benchmarks.md), but each server with a {cg[0]['size'] // MIB} MiB malloc bdev "
                  "exported raw, or a thick volume filling an lvstore on such a bdev; a long run's "
                  f"({cg[0]['long_s']:g} s) instructions less a short run's ({cg[0]['short_s']:g} s) over "
                  "the difference in I/Os; median (range) of the repetitions.", "",
                  "| workload | client | raw | lvol | lvol − raw |", "|---|---|---|---|---|"]
        for x in cg:
            ir, rg = x["ir_per_io"], x["range"]
            lines.append(f"| {x['pattern']} {x['bs'] // 1024}K, QD{x['qd']} | {x['client']} | "
                         f"{ir['raw']:,.0f} ({rg['raw'][0]:,.0f}–{rg['raw'][1]:,.0f}) | "
                         f"{ir['lvol']:,.0f} ({rg['lvol'][0]:,.0f}–{rg['lvol'][1]:,.0f}) | "
                         f"{ir['lvol'] - ir['raw']:+,.0f} |")
    lines += ["", f"SPDK: {lv['spdk']}"]
    return lines


def qos_other_cpu(res):
    xs = [r["other_cpu_cores"] for v in (res["qos"].get("overhead") or {}).get("variants", {}).values()
          for r in v["runs"] if r.get("other_cpu_cores") is not None]
    if not xs:
        return ""
    return (f"Other CPU use during the overhead runs (anything but the server under test and the client, "
            f"from /proc/stat): median {100 * statistics.median(xs):.0f} %, at most {100 * max(xs):.0f} % of a core.")


def noisy_other_cpu(nz):
    xs = [r["other_cpu_cores"] for r in nz["runs"]]
    if not xs:
        return ""
    st = [r["steal"] for r in nz["runs"] if r.get("steal") is not None]
    return (f"Other CPU use during these runs (from /proc/stat, less the server and the client): median "
            f"{100 * statistics.median(xs):.0f} %, at most {100 * max(xs):.0f} % of a core. Steal (the largest share "
            f"of a CPU the hypervisor took): median {fmt_share(median(st))}, at most {fmt_share(max(st, default=None))}.")


def fmt_share(x):
    return "-" if x is None else f"{100 * x:.0f} %"


def pct(x, signed=True):
    return "-" if x is None else (f"{100 * x:+.2f} %" if signed else f"{100 * x:.2f} %")


def qos_reachable(p):
    """A limit the disk can be pushed past: no ceiling was measured (a limit far below the top
    one), or the unlimited run beat the limit by more than the tolerance."""
    return p["ceiling"] is None or p["ceiling"] > 1.03 * p["limit_units_per_s"]


def qos_markdown(res):
    """The quality-of-service section (`--only qos`)."""
    q, m = res["qos"], res["meta"]
    c = q["config"]
    two = f"{m['server_cpu']},{m['client_cpu']}"
    lines = ["", "## Quality of service (issue 12)", ""]
    acc = q.get("accuracy", [])
    if acc:
        secs = acc[0]["secs"]
        lines += [f"Per-disk limits (`bdev_set_qos_limit`) on one null disk of a daemon with two reactors "
                  f"(`--cpus {two}`; queue i runs on reactor i mod 2), fp-load on CPU {m['client_cpu']} "
                  f"with completion fds, 4 KiB randread at QD{c['iops_qd']} per queue for IOPS limits and "
                  f"QD{c['bw_qd']} per queue for bandwidth limits (the block size in the table). One run of "
                  f"{secs:g} s per point, flooding; delivered is what the client completed, over the whole run "
                  f"and over each {acc[0]['window_s']:g} s window of fp-load's timeline; error = delivered / "
                  "limit − 1. *unlimited*: the same load with no limit (measured for the highest limit of each "
                  "kind); a limit above it cannot be reached, and its row says so instead of an error. "
                  "queued: requests the daemon held for QoS during the run (its `qos_queued_total`). steal: the "
                  "largest share of a CPU the hypervisor took from this virtual machine during the run "
                  "(/proc/stat): a reactor that does not run cannot release a request on time, and a limiter "
                  "cannot give back time that has passed. other: CPU time used by anything but this daemon and the "
                  "client during the run (/proc/stat), in cores: another process on the machine.", ""]
        for kind, title in (("iops", "IOPS limits"), ("bw", "Bandwidth limits (rw_mbytes_per_sec, MiB = 2^20 B)")):
            ps = [p for p in acc if p["kind"] == kind]
            if not ps:
                continue
            lines += [f"### {title}", "",
                      f"| limit | bs | queues | delivered | error, whole run ({secs:g} s) | {acc[0]['window_s']:g} s windows: "
                      f"worst error | {acc[0]['window_s']:g} s windows: range | unlimited | queued | steal | other | status (±3 %) |",
                      "|" + "---|" * 12]
            for p in ps:
                lo, hi = min(p["window_errors"]), max(p["window_errors"])
                ok = qos_reachable(p)
                met = abs(p["error"]) <= 0.03 and abs(p["worst_window_error"]) <= 0.03
                status = ("met" if met else "**missed**") if ok else "not reachable here"
                lines.append(f"| {fmt_limit(kind, p['limit'])} | {p['bs'] // 1024} K | {p['queues']} | "
                             f"{fmt_units(kind, p['delivered'])} | {pct(p['error'])} | {pct(p['worst_window_error'])} | "
                             f"{pct(lo)} … {pct(hi)} | {fmt_units(kind, p['ceiling'])} | "
                             f"{p['qos_counters'].get('qos_queued_total') if p['qos_counters'].get('qos_queued_total') is not None else '-'} | "
                             f"{fmt_share(p.get('steal'))} | {fmt_share(p.get('other_cpu_cores'))} | {status} |")
            lines.append("")
    b = q.get("burst")
    if b:
        lines += ["### Burst", "",
                  f"A fresh group (`bdev_qos_group_create` iops_total {b['avg']}, iops_total_max {b['max']}, "
                  f"iops_total_max_length {b['length_s']}) with one null disk, 2 queues at QD{b['qd']} on the "
                  f"two reactors, flooded for {b['secs']:g} s from idle. Delivered IOPS per {b['window_s']:g} s "
                  "(the last window holds the run's tail and is left out of the average phase's figures):", "",
                  "| window | " + " | ".join(f"{i * b['window_s']:g}–{(i + 1) * b['window_s']:g} s"
                                            for i in range(len(b["windows"]))) + " |",
                  "|---|" + "---|" * len(b["windows"]),
                  "| IOPS | " + " | ".join(f"{w:,.0f}" for w in b["windows"]) + " |",
                  "| phase | " + " | ".join(b["phase"]) + " |", "",
                  f"Ceiling phase: mean {b['max_mean'] or 0:,.0f} IOPS ({pct(b['max_error'])} of {b['max']:,}), worst "
                  f"window {pct(b['max_worst_window_error'])}. Average phase: mean {b['avg_mean'] or 0:,.0f} "
                  f"({pct(b['avg_error'])} of {b['avg']:,}), worst window {pct(b['avg_worst_window_error'])}.", ""]
    s = q.get("shares")
    if s:
        bi = s["b_idle"]
        lines += ["### Weighted shares", "",
                  f"A group of {s['limit']:,} IOPS (`iops_total`); disk A weight {s['weights']['A']}, B weight "
                  f"{s['weights']['B']}; each disk 2 queues at QD{s['qd']} from its own client thread (fp-load "
                  f"`--thread-per-disk`), {s['secs']:g} s. Then the same with B stopping after {bi['b_ios']:,} "
                  f"requests (about a third of the run): A's rate over the whole windows after B's last completion.",
                  "", f"| run | disk | target | delivered | error | {s['window_s']:g} s windows: worst error | per-window IOPS |",
                  "|---|---|---|---|---|---|---|"]
        for d in ("A", "B"):
            x = s["both"][d]
            lines.append(f"| both flooding | {d} | {s['want'][d]:,.0f} | {x['rate']:,.0f} | {pct(x['error'])} | "
                         f"{pct(x['worst_window_error'])} | {' '.join(f'{w:.0f}' for w in x['windows'])} |")
        lines.append(f"| B idle after window {bi['b_last_window']} | A | {bi['want']:,.0f} | "
                     f"{bi['a_alone'] or 0:,.0f} | {pct(bi.get('error'))} | {pct(bi.get('worst_window_error'))} | "
                     f"A: {' '.join(f'{w:.0f}' for w in bi['a_windows'])}; B: "
                     f"{' '.join(f'{w:.0f}' for w in bi['b_windows'])} |")
        lines.append("")
    nz = q.get("noisy")
    if nz:
        n = nz["config"]
        lines += ["### Noisy neighbour", "",
                  f"{n['disks']} null disks on one reactor (flashpath `--cpus {m['server_cpu']}`; qsd: one iothread "
                  f"on CPU {m['server_cpu']}), each its own vhost-user-blk export with one queue. One fp-load "
                  f"process on CPU {m['client_cpu']}, one polled client thread for all disks (with a thread per "
                  "disk the quiet disks' threads wait for the scheduler behind the flooder's, milliseconds that "
                  f"would be the latency measured): disk 0 floods at "
                  f"QD{n['flood_qd']}; disks 1–{n['disks'] - 1} run QD1 paced at {n['qd1_rate']:,} IOPS each. "
                  f"Scenarios: **none** (no QoS); **limits**: the flooder {n['flood_limit']:,} IOPS, each QD1 disk "
                  f"{n['qd1_limit']:,} IOPS (above its pace, so its own limit never delays it; flashpath "
                  "`bdev_set_qos_limit`, qsd a throttle group per disk, `x-iops-total`); **group**: all "
                  f"{n['disks']} disks in one group of {n['group_limit']:,} IOPS (flashpath: weight 1 each, "
                  "weighted fair sharing; qsd: one throttle group, whose members take turns). "
                  f"{n['secs']:g} s per run, {n['reps']} round(s), the scenarios interleaved; medians. QD1 "
                  f"latency: the quiet disks' histograms merged. {noisy_other_cpu(nz)}", "",
                  "| server | scenario | flooder IOPS | QD1 disks IOPS (sum) | QD1 p50 µs | QD1 p99 µs | QD1 p99.9 µs | "
                  "worst QD1 disk p99 µs |", "|---|---|---|---|---|---|---|---|"]
        for r in nz["summary"]:
            lines.append(f"| {r['server']} | {r['scenario']} | {r['flood_iops']:,.0f} | {r['qd1_iops']:,.0f} | "
                         f"{fmt_us(r['qd1_p50_ns'])} | {fmt_us(r['qd1_p99_ns'])} | {fmt_us(r['qd1_p999_ns'])} | "
                         f"{fmt_us(r['qd1_worst_disk_p99_ns'])} |")
        lines.append("")
    o = q.get("overhead")
    if o:
        v = o["variants"]
        lines += ["### Cost of QoS that does not limit", "",
                  f"Null 4 KiB randread, QD32, one polled queue (the main matrix's point), one daemon pinned to "
                  f"CPU {m['server_cpu']} whose disk is switched before each run: **off** (no QoS), **limit** "
                  f"(`rw_ios_per_sec` {o['limit']:,} and `rw_mbytes_per_sec` {o['limit_mib']:,}), **group** (a "
                  f"member of a group with iops_total {o['limit']:,}). {o['reps']} runs of {o['secs']:g} s each, "
                  "interleaved, the order reversed every repetition; medians. Requests the daemon queued for QoS "
                  "in the runs (`qos_queued_total`): " + ", ".join(f"{k} {v}" for k, v in o["qos_counters"].items())
                  + f". {qos_other_cpu(res)}", "",
                  "| variant | IOPS | vs off | spread | p50 µs | busy/IO ns |", "|---|---|---|---|---|---|"]
        for k in ("off", "limit", "group"):
            md = v[k]["median"]
            lines.append(f"| {k} | {fmt_iops(md['iops'])} | {fmt_ratio(o['ratios'].get(k, 1.0))} | "
                         f"{100 * o['spread'][k]:.0f} % | {fmt_us(md['p50_ns'])} | "
                         f"{fmt_ns(md.get('reactor_busy_ns_per_io'))} |")
        lines.append("")
    return lines


def qos_targets(q, add):
    """Issue 12's targets from a QoS run."""
    acc = q.get("accuracy", [])
    for kind in ("iops", "bw"):
        for lim in sorted({p["limit"] for p in acc if p["kind"] == kind}):
            ps = [p for p in acc if p["kind"] == kind and p["limit"] == lim]
            reach = [p for p in ps if qos_reachable(p)]
            qs = ", ".join(str(p["queues"]) for p in ps)
            name = (f"{fmt_limit(kind, lim)} limit delivered within ±3 % (whole run and every {ps[0]['window_s']:g} s "
                    f"window; {qs} queues)")
            if not reach:
                add(name, "±3 %", "not reachable on this machine: unlimited " +
                    ", ".join(f"{fmt_units(kind, p['ceiling'])} ({p['queues']} q)" for p in ps) + "; delivered " +
                    ", ".join(f"{fmt_units(kind, p['delivered'])}" for p in ps), None)
                continue
            worst = max((p for p in reach), key=lambda p: max(abs(p["error"]), abs(p["worst_window_error"])))
            met = all(abs(p["error"]) <= 0.03 and abs(p["worst_window_error"]) <= 0.03 for p in reach)
            notes = []
            if len(reach) < len(ps):
                notes.append("not reachable with " + ", ".join(f"{p['queues']} queue(s)" for p in ps if p not in reach))
            steal = [p["steal"] for p in ps if p.get("steal") is not None]
            other = [p["other_cpu_cores"] for p in ps if p.get("other_cpu_cores") is not None]
            if steal and other:
                notes.append(f"during these runs steal up to {fmt_share(max(steal))} of a CPU, other processes up to "
                             f"{fmt_share(max(other))} of a core")
            note = "; ".join(notes)
            add(name, "±3 %", "whole run " + ", ".join(pct(p["error"]) for p in reach) +
                f"; worst window {pct(worst['worst_window_error'])} ({worst['queues']} q)", met, note)
    b = q.get("burst")
    if b and b.get("max_worst_window_error") is not None and b.get("avg_worst_window_error") is not None:
        add(f"burst: {b['max']:,} IOPS for {b['length_s']} s, then {b['avg']:,} (every {b['window_s']:g} s window)", "±3 %",
            f"ceiling windows mean {b['max_mean']:,.0f} (worst {pct(b['max_worst_window_error'])}), average windows "
            f"mean {b['avg_mean']:,.0f} (worst {pct(b['avg_worst_window_error'])})",
            abs(b["max_worst_window_error"]) <= 0.03 and abs(b["avg_worst_window_error"]) <= 0.03)
    s = q.get("shares")
    if s:
        a, bb = s["both"]["A"], s["both"]["B"]
        add(f"weighted shares, {s['limit']:,} IOPS, weights {s['weights']['A']}:{s['weights']['B']}, both flooding",
            "±5 % of each target", f"A {a['rate']:,.0f} ({pct(a['error'])}), B {bb['rate']:,.0f} ({pct(bb['error'])})",
            abs(a["error"]) <= 0.05 and abs(bb["error"]) <= 0.05)
        bi = s["b_idle"]
        if bi.get("error") is not None:
            add("B idle: A takes the whole group", "±5 %", f"A {bi['a_alone']:,.0f} of {bi['want']:,.0f} "
                f"({pct(bi['error'])}; worst window {pct(bi['worst_window_error'])})", abs(bi["error"]) <= 0.05)
        else:
            add("B idle: A takes the whole group", "±5 %", "no whole window after B stopped", False)
    nz = q.get("noisy")
    if nz:
        by = {(r["server"], r["scenario"]): r for r in nz["summary"]}
        add("noisy neighbour: QD1 disks' p99 without and with QoS, flashpath and qsd", "reported",
            "; ".join(f"{sv} " + ", ".join(f"{sc} {fmt_us(by[(sv, sc)]['qd1_p99_ns'])} µs"
                                          for sc in nz["config"]["scenarios"] if (sv, sc) in by)
                      for sv in ("flashpath", "qsd")), None)
    o = q.get("overhead")
    if o:
        for k in ("limit", "group"):
            r = o["ratios"][k]
            # The reactor's busy time per I/O depends less on the client than IOPS do: a second view.
            busy = {v: o["variants"][v]["median"].get("reactor_busy_ns_per_io") for v in ("off", k)}
            note = ""
            if None not in busy.values():
                note = (f"reactor busy per I/O {busy[k]:.0f} vs {busy['off']:.0f} ns = "
                        f"{fmt_ratio(ratio(busy[k], busy['off']))}x")
            add(f"QoS configured but not limiting ({k}): null QD32 IOPS vs no QoS", ">= 0.97x",
                f"{fmt_iops(o['variants'][k]['median']['iops'])} vs {fmt_iops(o['variants']['off']['median']['iops'])} "
                f"= {fmt_ratio(r)}x (spreads {100 * o['spread'][k]:.0f} % / {100 * o['spread']['off']:.0f} %)",
                r is not None and r >= 0.97, note)


SERVER_STYLE = {"flashpath": "tab:blue", "qsd": "tab:red"}


def plots(res, out_dir):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    files = []
    backends = sorted({p["backend"] for p in res["points"]},
                      key=lambda b: ["null", "ram", "file"].index(b))
    for backend in backends:
        pats = [pat for pat in ("randread", "randwrite")
                if any(p["backend"] == backend and p["pattern"] == pat and p["bs"] == 4096
                       for p in res["points"])]
        if not pats:
            continue
        fig, axes = plt.subplots(1, len(pats), figsize=(6.5 * len(pats), 4.8), squeeze=False)
        for ax, pat in zip(axes[0], pats):
            for server in ("flashpath", "qsd"):
                for client, marker in (("poll", "o"), ("fd", "s")):
                    for queues, ls in ((1, "-"), (2, "--")):
                        pts = sorted((p["qd"], p["median"]["iops"]) for p in res["points"]
                                     if p["backend"] == backend and p["pattern"] == pat
                                     and p["bs"] == 4096 and p["server"] == server
                                     and p["client"] == client and p["queues"] == queues)
                        if not pts:
                            continue
                        ax.plot([x for x, _ in pts], [y / 1e6 for _, y in pts], ls, marker=marker,
                                color=SERVER_STYLE[server], alpha=1.0 if client == "poll" else 0.55,
                                label=f"{server}, {client} client, {queues} queue{'s' * (queues > 1)}")
            if backend == "file":
                pts = sorted((e["qd"], e["median"]["iops"]) for e in res["fio"]
                             if e["pattern"] == pat and e["bs"] == 4096)
                if pts:
                    ax.plot([x for x, _ in pts], [y / 1e6 for _, y in pts], ":", marker="^",
                            color="black", label="fio io_uring (host, no server)")
            ax.set_xscale("log", base=2)
            qds = sorted({p["qd"] for p in res["points"] if p["backend"] == backend})
            ax.set_xticks(qds)
            ax.set_xticklabels([str(q) for q in qds])
            ax.set_xlabel("queue depth (per queue)")
            ax.set_ylabel("M IOPS")
            ax.set_title(f"{backend}: 4 KiB {pat}")
            ax.grid(True, which="both", alpha=0.3)
            ax.set_ylim(bottom=0)
            ax.legend(fontsize=7)
        fig.suptitle(f"IOPS vs queue depth, {backend} backend, server on 1 core "
                     f"(CPU {res['meta']['server_cpu']}), libblkio client on CPU {res['meta']['client_cpu']}",
                     fontsize=10)
        fig.tight_layout()
        path = os.path.join(out_dir, f"iops_vs_qd_{backend}.png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        files.append(path)

    cdf_backends = [b for b in backends if any(p["backend"] == b and p["qd"] == 1 and "histogram" in p
                                               and p["pattern"] == "randread" for p in res["points"])]
    fig, axes = plt.subplots(1, len(cdf_backends), figsize=(5.5 * len(cdf_backends), 4.5), squeeze=False)
    for ax, backend in zip(axes[0], cdf_backends):
        for p in res["points"]:
            if not (p["backend"] == backend and p["qd"] == 1 and p["pattern"] == "randread"
                    and p["queues"] == 1 and p["bs"] == 4096 and "histogram" in p):
                continue
            h = p["histogram"]
            total = h["count"]
            if not total:
                continue
            xs, ys, acc = [], [], 0
            for lo, hi, c in h["buckets"]:
                acc += c
                xs.append(hi / 1000.0)
                ys.append(acc / total)
            ax.step(xs, ys, where="post", color=SERVER_STYLE[p["server"]],
                    ls="-" if p["client"] == "poll" else "--",
                    label=f"{p['server']}, {p['client']} client (p50 {p['median']['p50_ns'] / 1000:.2f} µs)")
        ax.set_xscale("log")
        ax.set_xlabel("completion latency (µs, log)")
        ax.set_ylabel("fraction of requests")
        ax.set_title(f"{backend}: 4 KiB randread, QD1")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
    fig.suptitle("QD1 latency CDF (all repetitions merged)", fontsize=10)
    fig.tight_layout()
    path = os.path.join(out_dir, "qd1_latency_cdf.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    files.append(path)
    return files


def build_ratios(res):
    out = []
    seen = set()
    for p in res["points"]:
        key = (p["backend"], p["pattern"], p["bs"], p["qd"], p["queues"], p["client"])
        if key in seen:
            continue
        seen.add(key)
        kw = dict(zip(("backend", "pattern", "bs", "qd", "queues", "client"), key))
        f, q = find(res["points"], "flashpath", **kw), find(res["points"], "qsd", **kw)
        if not (f and q):
            continue
        out.append(dict(kw, flashpath=f, qsd=q, iops_ratio=ratio(f["iops"], q["iops"]),
                        p50_ratio=ratio(f["p50_ns"], q["p50_ns"]),
                        p999_ratio=ratio(f["p999_ns"], q["p999_ns"]),
                        cpu_per_io_ratio=ratio(f.get("server_cpu_ns_per_io"),
                                               q.get("server_cpu_ns_per_io"))))
    return out


def write_outputs(res, out_dir):
    res["ratios"] = build_ratios(res)
    res["targets"] = targets(res)
    with open(os.path.join(out_dir, "results.json"), "w") as f:
        json.dump(res, f, indent=1)
    with open(os.path.join(out_dir, "results.md"), "w") as f:
        f.write(markdown(res))
    if not res["points"]:
        return []  # --only: no matrix to plot
    return plots(res, out_dir)


# ---------------------------------------------------------------------------------------------
# Validation (CI smoke)


def validate_rbd(res, rc):
    """The RBD section: every point on both servers, each run with positive IOPS, latency and
    CPU per I/O (the server's and each cluster daemon's), the QD1 histograms, the ratios."""
    problems = []
    e = res.get("rbd")
    if not e:
        return ["results.json has no 'rbd'"]
    got = {(p["pattern"], p["bs"], p["qd"], p["queues"], p["client"]): p for p in e.get("points", [])}
    for pt in rc["points"]:
        pk = point_key("rbd", pt)
        p = got.get((pk["pattern"], pk["bs"], pk["qd"], pk["queues"], pk["client"]))
        if p is None:
            problems.append(f"rbd: missing point {point_label(pk)}")
            continue
        for kind in ("flashpath", "qsd"):
            x = p["servers"].get(kind)
            if not x or len(x["runs"]) != rc["rounds"]:
                problems.append(f"rbd {point_label(pk)} {kind}: {len(x['runs']) if x else 0} runs, want {rc['rounds']}")
                continue
            for m in ("iops", "p50_ns", "p99_ns", "server_cpu_ns_per_io"):
                v = x["median"].get(m)
                if not isinstance(v, (int, float)) or v <= 0:
                    problems.append(f"rbd {point_label(pk)} {kind}: {m} = {v!r}")
            cl = x["median"].get("cluster_cpu_ns_per_io", {})
            if not any(d.startswith("osd.") for d in cl) or not all(isinstance(v, (int, float)) and v >= 0
                                                                    for v in cl.values()):
                problems.append(f"rbd {point_label(pk)} {kind}: cluster CPU per I/O = {cl!r}")
            if kind == "flashpath" and not isinstance(x["median"].get("reactor_busy_ns_per_io"), (int, float)):
                problems.append(f"rbd {point_label(pk)}: no reactor busy time")
            if pt[2] == 1 and not x.get("histogram", {}).get("buckets"):
                problems.append(f"rbd {point_label(pk)} {kind}: no histogram")
        if not isinstance(p["ratios"].get("iops"), (int, float)):
            problems.append(f"rbd {point_label(pk)}: no IOPS ratio")
    if e.get("fill", {}).get("used_size", 0) < e.get("size", 1):
        problems.append("rbd: the image was not written in full")
    return problems


def validate_nbd(res, nc):
    """The NBD section: every point on the three servers with its runs, a positive IOPS, MB/s,
    p50, p99 and server CPU per I/O, flashpath's reactor busy time, both ratios, full fills."""
    problems = []
    e = res.get("nbd")
    if not e:
        return ["results.json has no 'nbd'"]
    got = {(p["pattern"], p["bs"], p["qd"]): p for p in e.get("points", [])}
    for pt in nc["points"]:
        p = got.get(tuple(pt))
        if p is None:
            problems.append(f"nbd: missing point {nbd_label(pt)}")
            continue
        for kind in NBD_SERVERS:
            x = p["servers"].get(kind)
            if not x or len(x["runs"]) != nc["reps"]:
                problems.append(f"nbd {nbd_label(pt)} {kind}: {len(x['runs']) if x else 0} runs, want {nc['reps']}")
                continue
            for m in ("iops", "mbps", "p50_ns", "p99_ns", "server_cpu_ns_per_io"):
                v = x["median"].get(m)
                if not isinstance(v, (int, float)) or v <= 0:
                    problems.append(f"nbd {nbd_label(pt)} {kind}: {m} = {v!r}")
            if kind == "flashpath" and not isinstance(x["median"].get("reactor_busy_ns_per_io"), (int, float)):
                problems.append(f"nbd {nbd_label(pt)}: no reactor busy time")
        for other in ("qsd", "nbdkit"):
            if not isinstance(p["ratios"].get(other, {}).get("iops"), (int, float)):
                problems.append(f"nbd {nbd_label(pt)}: no IOPS ratio to {other}")
    for kind in NBD_SERVERS:
        if e.get("fills", {}).get(kind, {}).get("bytes", 0) < e.get("size", 1):
            problems.append(f"nbd: {kind}'s disk was not written in full")
    return problems


def validate(out_dir, mode):
    """Checks the outputs are well formed; asserts no absolute number."""
    problems = []
    with open(os.path.join(out_dir, "results.json")) as f:
        res = json.load(f)
    for k in ("meta", "points", "ratios", "idle", "fio", "scaling", "targets", "wall_s"):
        if k not in res:
            problems.append(f"results.json has no '{k}'")
    cfg = mode_config(mode)
    want = set()
    for b in cfg["backends"]:
        for pt in cfg.get(f"{b}_points", cfg["points"]):
            pk = point_key(b, pt)
            for s in ("flashpath", "qsd"):
                want.add(point_id(dict(pk, server=s)))
    got = set()
    for p in res.get("points", []):
        got.add(point_id(p))
        if len(p["runs"]) != res["meta"]["reps"]:
            problems.append(f"{point_label(p)} {p['server']}: {len(p['runs'])} runs")
        for m in ("iops", "mbps", "lat_mean_ns", "p50_ns", "p99_ns", "p999_ns", "server_cpu_ns_per_io"):
            v = p["median"].get(m)
            if not isinstance(v, (int, float)) or v <= 0:
                problems.append(f"{point_label(p)} {p['server']}: {m} = {v!r}")
        if p["server"] == "flashpath" and not isinstance(p["median"].get("reactor_busy_ns_per_io"), (int, float)):
            problems.append(f"{point_label(p)}: no reactor busy time")
        if p["qd"] == 1 and p["pattern"] == "randread" and not p.get("histogram", {}).get("buckets"):
            problems.append(f"{point_label(p)} {p['server']}: no histogram")
    if want - got:
        problems.append(f"missing points: {sorted(want - got)}")
    if len(res.get("ratios", [])) * 2 != len(got):
        problems.append("ratios do not pair every point")
    if len(res.get("idle", [])) != 2 * len(cfg["backends"]):
        problems.append(f"{len(res.get('idle', []))} idle measurements")
    if "file" in cfg["backends"] and not res.get("fio"):
        problems.append("no fio baseline")
    cg = cfg.get("callgrind")
    if cg:
        want_cg = {point_id(dict(point_key("null", pt), server=s)) for pt in cg["points"]
                   for s in ("flashpath", "qsd")}
        got_cg = set()
        for e in res.get("callgrind", []):
            got_cg.add(point_id(e))
            v = e.get("ir_per_io")
            if not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                problems.append(f"callgrind {point_label(e)} {e['server']}: instructions/IO = {v!r}")
            if len(e["runs"]) != cg["reps"]:
                problems.append(f"callgrind {point_label(e)} {e['server']}: {len(e['runs'])} runs")
        if want_cg - got_cg:
            problems.append(f"missing callgrind figures: {sorted(want_cg - got_cg)}")
    with open(os.path.join(out_dir, "results.md")) as f:
        md = f.read()
    rows = [ln for ln in md.splitlines() if ln.startswith("| ") and not ln.startswith("| backend")]
    if len(rows) < len(res.get("ratios", [])):
        problems.append(f"results.md has {len(rows)} table rows")
    sections = ["## Main points", "## Side by side", "## Idle CPU", "## Targets"]
    if cg:
        sections.append("## Path length")
    for needed in sections:
        if needed not in md:
            problems.append(f"results.md has no '{needed}'")
    pngs = [f"iops_vs_qd_{b}.png" for b in cfg["backends"]] + ["qd1_latency_cdf.png"]
    for name in pngs:
        path = os.path.join(out_dir, name)
        if not os.path.exists(path):
            problems.append(f"{name} missing")
            continue
        with open(path, "rb") as f:
            head = f.read(8)
        if head != b"\x89PNG\r\n\x1a\n":
            problems.append(f"{name} is not a PNG")
        if os.path.getsize(path) <= 1024:
            problems.append(f"{name} is only {os.path.getsize(path)} bytes")
    rc = cfg.get("rbd")
    if rc and res.get("meta", {}).get("rbd", True):
        problems += validate_rbd(res, rc)
        if "## Ceph RBD" not in md:
            problems.append("results.md has no '## Ceph RBD'")
    nc = cfg.get("nbd")
    if nc and res.get("meta", {}).get("nbd", True):
        problems += validate_nbd(res, nc)
        if "## NBD" not in md:
            problems.append("results.md has no '## NBD'")
    if cfg.get("iostat_reps"):
        ios = res.get("iostat", [])
        if len(ios) != 1:
            problems.append(f"{len(ios)} disk-layer cost entries")
        for e in ios:
            for k in ("off", "counters", "histograms"):
                v = e["variants"][k]["median"].get("iops")
                if not isinstance(v, (int, float)) or v <= 0:
                    problems.append(f"disk-layer cost {k}: iops = {v!r}")
            # Counters on: the daemon saw at least every I/O the client completed.
            if e["daemon_read_ops"] < e["client_ios"]:
                problems.append(f"the daemon counted {e['daemon_read_ops']} reads, the client did {e['client_ios']}")
    return problems


# ---------------------------------------------------------------------------------------------


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", choices=["full", "quick", "smoke"], default="full")
    ap.add_argument("--bin-dir", required=True, help="directory with flashpath and fp-load (release)")
    ap.add_argument("--out", help="output directory (default bench/results/<timestamp>)")
    ap.add_argument("--work-dir", default="/var/tmp",
                    help="parent of the scratch directory (sockets, the file backend): not a tmpfs")
    ap.add_argument("--server-cpu", type=int, default=0)
    ap.add_argument("--client-cpu", type=int, default=1)
    ap.add_argument("--time", type=float, help="seconds per run (overrides the mode)")
    ap.add_argument("--reps", type=int, help="runs per point and server (overrides the mode)")
    ap.add_argument("--backends", help="comma-separated subset of null,ram,file,rbd,nbd (development only; "
                                       "rbd, nbd: the RBD and NBD sections)")
    ap.add_argument("--only", choices=["iostat", "lvol", "qos", "rbd", "nbd"],
                    help="run only this section (development only)")
    ap.add_argument("--rbd-serve-args", default="", metavar="ARGS",
                    help="extra `flashpath serve` arguments for the RBD section, e.g. \"--idle-window-us 20\" "
                         "(development only; recorded in the results)")
    ap.add_argument("--validate", metavar="DIR", help="only check the outputs in DIR and exit")
    ap.add_argument("--replot", metavar="DIR", help="only rewrite results.md and the plots from DIR/results.json")
    args = ap.parse_args()

    if args.validate:
        probs = validate(args.validate, args.mode)
        for p in probs:
            print(f"bench output problem: {p}", file=sys.stderr)
        print(f"bench outputs in {args.validate}: {'OK' if not probs else f'{len(probs)} problems'}")
        return 1 if probs else 0
    if args.replot:
        with open(os.path.join(args.replot, "results.json")) as f:
            res = json.load(f)
        for p in write_outputs(res, args.replot):
            log(f"wrote {p}")
        return 0

    for tool in ("qemu-storage-daemon", "fio", "taskset", "valgrind"):
        if shutil.which(tool) is None:
            print(f"bench: {tool} is not installed (./run bench installs it)", file=sys.stderr)
            return 1
    missing = rbd_missing() if wants_rbd(args) else []
    if missing:
        print(f"bench: the RBD section needs {', '.join(missing)} (./run bench installs them; "
              "--backends without rbd leaves the section out)", file=sys.stderr)
        return 1
    missing = nbd_missing() if wants_section(args, "nbd") else []
    if missing:
        print(f"bench: the NBD section needs {', '.join(missing)} (./run bench installs them; "
              "--backends without nbd leaves the section out)", file=sys.stderr)
        return 1
    ncpu = os.cpu_count() or 1
    if max(args.server_cpu, args.client_cpu) >= ncpu or args.server_cpu == args.client_cpu:
        print(f"bench: needs two distinct CPUs (server {args.server_cpu}, client {args.client_cpu}, "
              f"{ncpu} present)", file=sys.stderr)
        return 1

    root = os.path.dirname(os.path.abspath(__file__))
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    out_dir = args.out or os.path.join(root, "results", f"{stamp}-{args.mode}")
    os.makedirs(out_dir, exist_ok=True)

    bench = Bench(args)
    # Before the run: the commit is the one the binaries were just built from.
    machine = machine_info(args)

    def on_signal(signum, _frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        bench.go()
    finally:
        bench.cleanup()
    cmd = {"full": "./run bench", "quick": "./run bench --quick", "smoke": "./run bench --smoke"}[args.mode]
    if args.only:
        cmd = f"bench/bench.py --mode {args.mode} --only {args.only} --bin-dir target/release"

    res = bench.results
    res["meta"] = {
        "mode": args.mode,
        "date": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"),
        "time_s": bench.secs,
        "reps": bench.reps,
        "server_cpu": args.server_cpu,
        "client_cpu": args.client_cpu,
        "idle_s": bench.cfg["idle_time"],
        "command": cmd,
        "only": args.only,
        "rbd": bench.with_rbd,
        "nbd": bench.with_nbd,
        "build": os.path.basename(os.path.normpath(args.bin_dir)),
        "machine": machine,
        "qsd_command_example": "taskset -c 0 qemu-storage-daemon --object iothread,id=iot0 --blockdev "
                               "driver=null-co,node-name=disk0,size=1073741824,read-zeroes=off --export "
                               "type=vhost-user-blk,id=e0,node-name=disk0,addr.type=unix,addr.path=SOCK,"
                               "writable=on,iothread=iot0,num-queues=2",
    }
    files = write_outputs(res, out_dir)
    log(f"wrote {out_dir}/results.json, results.md, " + ", ".join(os.path.basename(f) for f in files))
    log(f"wall time {res['wall_s'] / 60:.1f} min")
    for t in res["targets"]:
        log(f"target: {t['target']}: {t['measured']} -> {t['status'] or 'reported'}")
    print(out_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
