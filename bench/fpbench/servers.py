"""The servers under test and their helpers: flashpath, qemu-storage-daemon (vhost-user-blk and
NBD), nbdkit, and the throwaway Ceph cluster of the RBD section. Every process started here
is recorded in CHILDREN and killed on exit.
"""

import ctypes
import json
import os
import signal
import socket
import subprocess

from fpbench.common import GIB, MIB, proc_cpu, run, wait_for
from fpbench.s3 import parse_rgw_start


CHILDREN = []  # every Popen we start, killed on exit

# The RBD section's pool and image (tests/ceph/cluster.sh creates the pool), and the Ceph options
# flashpath's cluster gets: librbd's cache off, as QEMU sets it for cache.direct=on.
RBD_POOL = "rbd"
RBD_IMAGE = "bench"
RBD_CONFIG_PARAM = {"rbd_cache": "false"}


PR_SET_PDEATHSIG = 1  # prctl(2)


def die_with_the_bench():
    """In a child before it execs: SIGKILL when the bench's process ends, however it ends. A
    bench killed with SIGKILL (or a driver's timeout) runs no cleanup, and its servers, each in
    its own session, spun on: four polling flashpaths once took a core from later runs. Only
    the main thread starts servers (the signal follows the thread that forked)."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def spawn(cmd, log_path):
    logf = open(log_path, "wb")
    p = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                         start_new_session=True, preexec_fn=die_with_the_bench)
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


def jsonrpc(path, method, params=None, who="flashpath"):
    """One JSON-RPC 2.0 call on the Unix socket `path` (SPDK's and flashpath's); its result.
    Cheaper than a CLI process: the bench polls with it while it times something."""
    req = {"jsonrpc": "2.0", "method": method, "id": 1}
    if params is not None:
        req["params"] = params
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(30)
        s.connect(path)
        s.sendall(json.dumps(req).encode())
        buf = b""
        dec = json.JSONDecoder()
        while True:
            chunk = s.recv(65536)
            if not chunk:
                raise RuntimeError(f"{who} {method}: the connection closed before a reply")
            buf += chunk
            try:
                resp, _ = dec.raw_decode(buf.decode())
                break
            except ValueError:
                continue
    if "error" in resp:
        raise RuntimeError(f"{who} {method}: {resp['error']}")
    return resp["result"]


class Flashpath:
    kind = "flashpath"

    def __init__(self, bin_dir, work, cpus, name="flashpath", wrap=(), extra=(), control_cpus=None):
        self.bin = os.path.join(bin_dir, "flashpath")
        self.name = name
        self.dir = os.path.join(work, name)
        os.makedirs(self.dir, exist_ok=True)
        self.rpc_sock = os.path.join(self.dir, "rpc.sock")
        self.vhost_dir = os.path.join(self.dir, "vhost")
        self.cpus = cpus
        self.wrap = wrap
        # taskset keeps the control-plane threads on the server cores too (or on `control_cpus`);
        # the reactors pin themselves to the --cpus list. `wrap` (valgrind) goes between taskset
        # and the server.
        self.proc = spawn(["taskset", "-c", control_cpus or cpus, *wrap, self.bin, "serve", "--cpus", cpus,
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

    def null_disks(self, n, size):
        """`n` null bdevs of `size` bytes, each exported as a one-queue vhost-user-blk controller
        (`vhost.d0`, ...) on the server's reactors; their sockets. Over the RPC socket directly:
        a CLI process per call would take minutes for a hundred disks."""
        socks = []
        for i in range(n):
            jsonrpc(self.rpc_sock, "bdev_null_create", {"name": f"Null{i}", "num_blocks": size // 512,
                                                        "block_size": 512})
            jsonrpc(self.rpc_sock, "vhost_create_blk_controller", {"ctrlr": f"vhost.d{i}", "dev_name": f"Null{i}",
                                                                   "num_queues": 1})
            socks.append(os.path.join(self.vhost_dir, f"vhost.d{i}"))
        wait_for(lambda: all(os.path.exists(s) for s in socks), 20, f"{n} flashpath sockets", self.proc)
        return socks

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

    def controller_stats(self, ctrlr):
        """Controller `ctrlr`'s counters (vhost_get_controllers' "stats")."""
        return self.rpc("vhost_get_controllers", {"name": ctrlr})[0].get("stats", {})

    def stop(self):
        stop(self.proc, server_timeout(self.wrap))


class Spdk:
    """SPDK's vhost target (`build/bin/vhost` of a built SPDK tree, `spdk_dir`) with one reactor on
    `cpu` (`-m` its mask; taskset keeps DPDK's other threads there too), spoken to over its
    JSON-RPC socket directly (the same methods scripts/rpc.py sends). Needs huge pages
    (`hugepages`)."""
    kind = "spdk"

    def __init__(self, spdk_dir, work, cpu, name="spdk", iobuf=None):
        """`iobuf`: `iobuf_set_options` parameters (its buffer pools' sizes), set before the
        subsystems start (`--wait-for-rpc`); None: SPDK's defaults."""
        self.name = name
        self.cpu = cpu
        self.dir = os.path.join(work, name)
        self.vhost_dir = os.path.join(self.dir, "vhost")
        os.makedirs(self.vhost_dir, exist_ok=True)
        self.rpc_sock = os.path.join(self.dir, "rpc.sock")
        self.cmd = ["taskset", "-c", str(cpu), os.path.join(spdk_dir, "build", "bin", "vhost"),
                    "-S", self.vhost_dir, "-m", hex(1 << cpu), "-r", self.rpc_sock, "--disable-cpumask-locks"]
        if iobuf:
            self.cmd.append("--wait-for-rpc")
        self.proc = spawn(self.cmd, os.path.join(self.dir, "vhost.log"))
        self.pid = self.proc.pid
        self.wrap = ()
        wait_for(self._answers, 60, "SPDK vhost", self.proc)
        if iobuf:
            self.rpc("iobuf_set_options", iobuf)
            self.rpc("framework_start_init")
            self.rpc("framework_wait_init")
        self.tick_rate = None

    def _answers(self):
        try:
            self.rpc("spdk_get_version")
            return True
        except (OSError, ValueError, RuntimeError):
            return False

    def rpc(self, method, params=None):
        """One JSON-RPC 2.0 call on the server's socket; its result."""
        return jsonrpc(self.rpc_sock, method, params, "SPDK")

    def version(self):
        return self.rpc("spdk_get_version").get("version")

    def add_disk(self, backend, size):
        """A null or malloc bdev of `size` bytes in 512-byte blocks, exported as a vhost-user-blk
        controller on the server's core; its socket."""
        blocks = size // 512
        if backend == "null":
            bdev = self.rpc("bdev_null_create", {"name": "Null0", "num_blocks": blocks, "block_size": 512})
        elif backend == "ram":
            bdev = self.rpc("bdev_malloc_create", {"name": "Malloc0", "num_blocks": blocks, "block_size": 512})
        else:
            raise ValueError(backend)
        ctrlr = f"vhost.{backend}"
        self.rpc("vhost_create_blk_controller", {"ctrlr": ctrlr, "dev_name": bdev, "cpumask": hex(1 << self.cpu)})
        sock = os.path.join(self.vhost_dir, ctrlr)
        wait_for(lambda: os.path.exists(sock), 10, f"SPDK socket {sock}", self.proc)
        return sock

    def null_disks(self, n, size):
        """`n` null bdevs of `size` bytes, each exported as a vhost-user-blk controller
        (`vhost.d0`, ...) on the server's core; their sockets."""
        socks = []
        for i in range(n):
            bdev = self.rpc("bdev_null_create", {"name": f"Null{i}", "num_blocks": size // 512, "block_size": 512})
            self.rpc("vhost_create_blk_controller", {"ctrlr": f"vhost.d{i}", "dev_name": bdev,
                                                     "cpumask": hex(1 << self.cpu)})
            socks.append(os.path.join(self.vhost_dir, f"vhost.d{i}"))
        wait_for(lambda: all(os.path.exists(s) for s in socks), 20, f"{n} SPDK sockets", self.proc)
        return socks

    def reactors(self):
        """Each reactor's busy and idle time in ns, from framework_get_reactors' ticks."""
        r = self.rpc("framework_get_reactors")
        rate = r["tick_rate"]
        return {x["lcore"]: {"busy": x["busy"] * 1e9 / rate, "idle": x["idle"] * 1e9 / rate, "sleeps": 0}
                for x in r["reactors"]}

    def pause(self):
        """Freezes the server (SIGSTOP): its reactor polls a whole core even with nothing to do,
        which would take the core from the other servers' runs."""
        os.kill(self.pid, signal.SIGSTOP)

    def resume(self):
        os.kill(self.pid, signal.SIGCONT)

    def stop(self):
        if self.proc.poll() is None:
            self.resume()  # a stopped process would not act on SIGTERM
        stop(self.proc, 30)


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


def free_port(lo, hi):
    """A TCP port in [lo, hi) that nothing listens on now on 127.0.0.1 (below Linux's ephemeral
    range, where a connection's local port could take it at any time)."""
    for port in range(lo, hi):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
                return port
            except OSError:
                continue
    raise RuntimeError(f"no free port in [{lo}, {hi}) on 127.0.0.1")


class CephCluster:
    """A throwaway single-node Ceph cluster (tests/ceph/cluster.sh: one monitor, one memstore OSD,
    the pool `rbd`) in `dir`, its daemons pinned to `cpu` (all threads, taskset -a)."""

    # fpbench/ is in bench/, which is in the repository's root.
    SCRIPT = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                          "tests", "ceph", "cluster.sh")

    def __init__(self, dir, cpu):
        self.dir = dir
        self.cpu_list = cpu
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

    def start_rgw(self, port=None):
        """Adds the cluster's RADOS Gateway (tests/ceph/cluster.sh rgw: radosgw on
        127.0.0.1:`port`, a user with fixed test keys; about 1.2 s), pinned with the other
        daemons; returns its s3.S3Endpoint. The backup section writes to it, through rclone
        (s3.write_rclone_config) for the peer. Stopped with the cluster."""
        port = port or free_port(32000, 32400)
        try:
            out = run([self.SCRIPT, "rgw", self.dir, str(port)], 120).stdout
        except subprocess.CalledProcessError as e:
            raise RuntimeError(f"tests/ceph/cluster.sh rgw {self.dir} {port} failed: {e.stderr.strip()[-2000:]}")
        endpoint = parse_rgw_start(out)
        with open(os.path.join(self.dir, "client.rgw.a.pid")) as fh:
            self.pids["client.rgw.a"] = int(fh.read().strip())
        run(["taskset", "-a", "-p", "-c", str(self.cpu_list), str(self.pids["client.rgw.a"])], 20)
        return endpoint

    def rbd(self, *args, timeout=120):
        """The rbd CLI on this cluster; its stdout."""
        return run(["rbd", "-c", self.conf, *args], timeout).stdout

    def cpu(self):
        """Each daemon's CPU time (proc_cpu)."""
        return {k: proc_cpu(pid) for k, pid in self.pids.items()}
