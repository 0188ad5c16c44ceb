"""NVMe over TCP (issue 24, `--only nvmf`, or a whole run with `--spdk DIR`): flashpath's
NVMe/TCP target vs SPDK's nvmf_tgt, both on the server core, both configured with the same
SPDK nvmf_* calls on their RPC sockets, both driven by SPDK's spdk_nvme_perf on the client
core over 127.0.0.1, in interleaved rounds of one run (SPDK frozen outside its own runs: its
reactor polls its core whether or not there is work). The floor (fpbench/floor.py,
bench/tcp_floor.c) runs in the same rounds on the null disk's points: a responder with the
targets' PDUs and system calls and no NVMe logic, once with flashpath's system calls ("floor":
recv on every connection per round) and once with SPDK's ("floor-epoll": epoll_wait, then recv
on the ready ones); each target's distance from the floor of its own kind is reported. After
the rounds, one more run per target and point with the target's system calls counted
(syscalls.py). Never part of CI: it needs a built SPDK (its perf is the only client here; the
floor's own test, fpbench/tests_floor.py, drives it with flashpath's initiator).
"""

import os
import socket
import subprocess

from fpbench.common import GIB, MIB, log, median, ratio
from fpbench.floor import Floor, build_floor
from fpbench.load import point_key, point_label
from fpbench.nvme_perf import perf_path, perf_run
from fpbench.sections.spdk import HugePages
from fpbench.servers import Flashpath, Spdk, spawn, wait_for
from fpbench.syscalls import SyscallCounter
from fpbench.syscalls import method as syscall_method
from fpbench.vhost_floor import build_c2c, c2c_ns

# flashpath-uring: flashpath with `sock_set_default_impl uring` (its io_uring socket engine).
TARGETS = ("flashpath", "flashpath-uring", "spdk", "floor", "floor-epoll")
# The socket implementation each flashpath target is set to before its transport is made.
SOCK_IMPL = {"flashpath": "posix", "flashpath-uring": "uring"}
# Each floor's system call mode (fpbench/floor.py) and the target whose calls it copies: the
# target's distance is measured from that floor.
FLOORS = {"floor": "poll", "floor-epoll": "epoll"}
FLOOR_OF = {"flashpath": "floor", "flashpath-uring": "floor", "spdk": "floor-epoll"}
# The floor has no storage: it stands beside the null disk only.
FLOOR_BACKENDS = ("null",)
# What the section calls on both targets (SPDK v23.01's methods and parameters).
NVMF_METHODS = ("nvmf_create_transport", "nvmf_create_subsystem", "nvmf_subsystem_add_ns",
                "nvmf_subsystem_add_listener")
NQN = "nqn.2016-06.io.spdk:fpbench-{backend}"
# Per mode: seconds per perf run, interleaved rounds, seconds of the traced run, the disks, the
# points ((pattern, bs, qd, queues, poll) as the other sections write them: one queue, and perf
# polls its completions, so "poll"), the RAM disks' fill (perf sequential 128 KiB writes).
POINTS = [("randread", 4096, qd, 1, True) for qd in (1, 32)]
CONFIG = {
    "full": {"secs": 5, "reps": 5, "trace_secs": 3, "backends": ["null", "ram"],
             "sizes": {"null": GIB, "ram": 256 * MIB}, "points": POINTS},
    "quick": {"secs": 2, "reps": 3, "trace_secs": 2, "backends": ["null", "ram"],
              "sizes": {"null": GIB, "ram": 256 * MIB}, "points": POINTS},
    "smoke": {"secs": 1, "reps": 1, "trace_secs": 1, "backends": ["null"], "sizes": {"null": GIB},
              "points": POINTS},
}


def nvmf_config(mode):
    return CONFIG[mode]


def nvmf_missing(spdk_dir):
    """What the section needs from `spdk_dir` and lacks (nvmf_tgt and perf)."""
    if not spdk_dir:
        return ["--spdk DIR (a built SPDK v23.01.1: build/bin/nvmf_tgt, build/examples/perf)"]
    need = [os.path.join(spdk_dir, "build", "bin", "nvmf_tgt"), perf_path(spdk_dir)]
    return [p for p in need if not os.access(p, os.X_OK)]


def free_port():
    """A TCP port on 127.0.0.1 nobody listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class NvmfTgt(Spdk):
    """SPDK's nvmf_tgt with one reactor on `cpu` (the RPC helpers, pause and stop of the vhost
    target's class)."""
    kind = "spdk"

    def __init__(self, spdk_dir, work, cpu, name="spdk-nvmf"):
        self.name = name
        self.cpu = cpu
        self.dir = os.path.join(work, name)
        os.makedirs(self.dir, exist_ok=True)
        self.rpc_sock = os.path.join(self.dir, "rpc.sock")
        self.cmd = ["taskset", "-c", str(cpu), os.path.join(spdk_dir, "build", "bin", "nvmf_tgt"),
                    "-m", hex(1 << cpu), "-r", self.rpc_sock, "--disable-cpumask-locks"]
        self.proc = spawn(self.cmd, os.path.join(self.dir, "nvmf_tgt.log"))
        self.pid = self.proc.pid
        self.wrap = ()
        wait_for(self._answers, 60, "SPDK nvmf_tgt", self.proc)


class FlashpathNvmf(Flashpath):
    """flashpath serve with one reactor on `cpu`; its reactor counters read over the RPC socket
    directly (no CLI process started inside a measured window)."""

    def __init__(self, bin_dir, work, cpu, name):
        super().__init__(bin_dir, work, str(cpu), name=name)
        methods = Spdk.rpc(self, "rpc_get_methods")
        missing = [m for m in NVMF_METHODS if m not in methods]
        if missing:
            self.stop()
            raise RuntimeError(f"{self.bin} has no {', '.join(missing)}: this flashpath does not serve "
                               "NVMe/TCP (issue 24); `--nvmf-targets spdk` runs SPDK's side alone")

    def rpc(self, method, params=None):
        return Spdk.rpc(self, method, params)

    def reactors(self):
        r = self.rpc("framework_get_reactors")
        return {x["id"]: {"busy": x["busy"], "idle": x["idle"]} for x in r["reactors"]}


def serve_disk(server, backend, size, port):
    """The same SPDK calls on either target: a null or malloc bdev of `size` bytes, the TCP
    transport, a subsystem any host may use, the bdev as its namespace 1, a listener on
    127.0.0.1:`port`; the subsystem's NQN."""
    blocks = size // 512
    bdev = {"null": "Null0", "ram": "Malloc0"}[backend]
    create = {"null": "bdev_null_create", "ram": "bdev_malloc_create"}[backend]
    server.rpc(create, {"name": bdev, "num_blocks": blocks, "block_size": 512})
    server.rpc("nvmf_create_transport", {"trtype": "TCP"})
    nqn = NQN.format(backend=backend)
    server.rpc("nvmf_create_subsystem", {"nqn": nqn, "allow_any_host": True, "serial_number": "FPBENCH0001"})
    server.rpc("nvmf_subsystem_add_ns", {"nqn": nqn, "namespace": {"bdev_name": bdev}})
    server.rpc("nvmf_subsystem_add_listener", {"nqn": nqn, "listen_address": {
        "trtype": "TCP", "adrfam": "IPv4", "traddr": "127.0.0.1", "trsvcid": str(port)}})
    return nqn


def summarize_nvmf(runs):
    keys = ("iops", "mbps", "lat_mean_ns", "p50_ns", "p99_ns", "p999_ns", "server_cpu_ns_per_io",
            "server_cpu_sched_ns_per_io", "server_core_share", "server_wait_share", "reactor_busy_ns_per_io")
    out = {k: median([r.get(k) for r in runs]) for k in keys}
    xs = [r["iops"] for r in runs]
    out["iops_spread"] = (max(xs) - min(xs)) / out["iops"] if out["iops"] else None
    return out


def floor_distance(e):
    """Each target's distance from the floor of its kind at one point: IOPS as a ratio to the
    floor's, mean latency, p50 and server CPU per I/O as differences (ns) from the floor's."""
    s, out = e["servers"], {}
    for kind, floor in FLOOR_OF.items():
        if kind not in s or floor not in s:
            continue
        t, f = s[kind]["median"], s[floor]["median"]
        out[kind] = {"floor": floor, "iops_ratio": ratio(t.get("iops"), f.get("iops"))}
        for k in ("lat_mean_ns", "p50_ns", "server_cpu_ns_per_io"):
            out[kind][f"{k}_above"] = None if t.get(k) is None or f.get(k) is None else t[k] - f[k]
        out[kind]["lat_mean_ratio"] = ratio(t.get("lat_mean_ns"), f.get("lat_mean_ns"))
    return out


def paired_floor(e):
    """Each target's distance from the floor of its kind round by round: in round i the target
    and its floor ran within seconds, mostly at one of the host's two speeds of cross-core
    traffic, where the medians of a point may each come from another speed. Per target: the
    mean latency and the IOPS over the floor's, each round's value and their median, and each
    round's cache-line round trips (c2c ns, sampled before the target's run and the floor's)."""
    s, out = e["servers"], {}
    for kind, floor in FLOOR_OF.items():
        if kind not in s or floor not in s:
            continue
        a, b = s[kind]["runs"], s[floor]["runs"]
        n = min(len(a), len(b))
        lat = [ratio(a[i].get("lat_mean_ns"), b[i].get("lat_mean_ns")) for i in range(n)]
        iops = [ratio(a[i].get("iops"), b[i].get("iops")) for i in range(n)]
        out[kind] = {"floor": floor,
                     "lat_mean": {"rounds": lat, "median": median([x for x in lat if x is not None])},
                     "iops": {"rounds": iops, "median": median([x for x in iops if x is not None])},
                     "c2c_ns": [[a[i].get("c2c_ns"), b[i].get("c2c_ns")] for i in range(n)]}
    return out


def nvmf_ratios(e):
    """flashpath / SPDK of a point's medians (IOPS: higher is better; the rest lower)."""
    s = e["servers"]
    if "flashpath" not in s or "spdk" not in s:
        return {}
    f, p = s["flashpath"]["median"], s["spdk"]["median"]
    out = {k: ratio(f.get(m), p.get(m)) for k, m in
           (("iops", "iops"), ("lat_mean", "lat_mean_ns"), ("p50", "p50_ns"), ("p99", "p99_ns"),
            ("server_cpu_per_io", "server_cpu_ns_per_io"),
            ("reactor_busy_per_io", "reactor_busy_ns_per_io"))}
    out["syscalls_per_io"] = ratio(s["flashpath"].get("traced", {}).get("syscalls_per_io"),
                                   s["spdk"].get("traced", {}).get("syscalls_per_io"))
    return out


class NvmfSection:
    """Bench's methods for this section (mixed into bench.Bench)."""

    def run_nvmf(self):
        c = dict(nvmf_config(self.args.mode))
        # --time and --reps override the mode's, as they do for the matrix.
        c.update({k: v for k, v in (("secs", self.args.time), ("reps", self.args.reps)) if v})
        targets = tuple(t for t in TARGETS if t in (self.args.nvmf_targets or ",".join(TARGETS)).split(","))
        how, why = syscall_method()
        out = {"dir": self.args.spdk, "config": c, "targets": list(targets), "points": [],
               "client": f"{perf_path(self.args.spdk)} -L (spdk_nvme_perf)", "syscall_method": how,
               "syscall_note": why}
        self.results["nvmf"] = out
        out["backends"] = [b for b in c["backends"] if not self.args.backends or b in self.args.backends.split(",")]
        # The machine's load around the section: other work on the two CPUs shows in every figure.
        out["loadavg_before"] = os.getloadavg()
        # The host runs this VM's two vCPUs at two speeds of cross-core traffic
        # (docs/benchmarks.md): every run records a cache line's round trip just before it, and
        # each target is also compared with its floor round by round (`paired_floor`).
        self.nvmf_c2c = build_c2c(self.work)
        with HugePages():
            if any(t in FLOORS for t in targets):
                out["floor"] = {"binary": build_floor(self.work), "source": "bench/tcp_floor.c",
                                "modes": {t: FLOORS[t] for t in targets if t in FLOORS},
                                "of": {k: v for k, v in FLOOR_OF.items() if k in targets and v in targets}}
            for backend in out["backends"]:
                here = tuple(t for t in targets if t not in FLOORS or backend in FLOOR_BACKENDS)
                self.nvmf_backend(backend, c, here, how, out)
        out["loadavg_after"] = os.getloadavg()

    def nvmf_backend(self, backend, c, targets, how, out):
        size = c["sizes"][backend]
        servers, ports, nqns = {}, {}, {}
        try:
            for kind in targets:
                if kind in FLOORS:
                    servers[kind] = Floor(out["floor"]["binary"], self.work, self.server_cpu, size // 512,
                                          mode=FLOORS[kind], name=f"{kind}-{backend}")
                    ports[kind] = servers[kind].port
                    nqns[kind] = NQN.format(backend=backend)
                    continue
                if kind == "spdk":
                    servers[kind] = NvmfTgt(self.args.spdk, self.work, self.server_cpu, name=f"spdk-nvmf-{backend}")
                    out["version"] = servers[kind].version()
                else:
                    servers[kind] = FlashpathNvmf(self.args.bin_dir, self.work, self.server_cpu,
                                                  name=f"{kind}-nvmf-{backend}")
                    servers[kind].rpc("sock_set_default_impl", {"impl_name": SOCK_IMPL[kind]})
                ports[kind] = free_port()
                nqns[kind] = serve_disk(servers[kind], backend, size, ports[kind])
                if backend == "ram":
                    out.setdefault("fills", []).append(dict(self.nvmf_fill(servers[kind], ports[kind], nqns[kind], size),
                                                            target=kind))
                if kind == "spdk":
                    servers[kind].pause()
            for point in c["points"]:
                pk = point_key(backend, point)
                runs = {k: [] for k in targets}
                for rnd in range(c["reps"]):
                    # The order alternates round by round: neither target always runs first.
                    order = targets if rnd % 2 == 0 else targets[::-1]
                    for kind in order:
                        runs[kind].append(self.nvmf_measure(servers[kind], ports[kind], nqns[kind], point,
                                                            c["secs"]))
                e = dict(pk, servers={})
                for kind in targets:
                    e["servers"][kind] = {"runs": runs[kind], "median": summarize_nvmf(runs[kind])}
                    if how:
                        e["servers"][kind]["traced"] = self.nvmf_measure(servers[kind], ports[kind], nqns[kind],
                                                                         point, c["trace_secs"], how)
                e["ratios"] = nvmf_ratios(e)
                e["floor_distance"] = floor_distance(e)
                e["paired_floor"] = paired_floor(e)
                out["points"].append(e)
                log(f"{point_label(pk):<30} " + "  ".join(
                    f"{k} {e['servers'][k]['median']['iops']:>9.0f} IOPS p50 "
                    f"{e['servers'][k]['median']['p50_ns'] / 1000:.1f} us" for k in targets)
                    + (f"  fp/spdk IOPS {e['ratios']['iops']:.2f}x" if e["ratios"].get("iops") else ""))
        finally:
            for s in servers.values():
                s.stop()

    def nvmf_measure(self, server, port, nqn, point, secs, trace=None):
        """One perf run on `server` (SPDK thawed for it); `trace`: count its system calls."""
        pattern, bs, qd, _queues, _poll = point
        # Sampled before a frozen server resumes: SPDK's reactor would poll the CPU the
        # sample's thread is pinned to.
        line = c2c_ns(self.nvmf_c2c) if not trace else None
        if server.kind == "spdk":
            server.resume()
        try:
            counter = SyscallCounter(server.pid, trace, self.work) if trace else None
            r = perf_run(self.args.spdk, self.client_cpu, port, nqn, pattern, bs, qd, secs, server, counter)
            r["c2c_ns"] = line
            return r
        finally:
            if server.kind == "spdk":
                server.pause()

    def nvmf_fill(self, server, port, nqn, size):
        """Writes a RAM disk through once (sequential 128 KiB writes at QD8 for long enough at the
        rate a first short run shows), so that no read meets a page never written."""
        probe = self.nvmf_measure(server, port, nqn, ("write", 128 * 1024, 8, 1, True), 1)
        rate = probe["mbps"] * 1e6
        secs = max(1, int(size / rate * 1.5) + 1) if rate else 10
        r = self.nvmf_measure(server, port, nqn, ("write", 128 * 1024, 8, 1, True), secs)
        written = int(probe["mbps"] * 1e6 * 1 + r["mbps"] * 1e6 * secs)
        log(f"filled the {server.kind} RAM disk: ~{written // MIB} MiB written for {size // MIB} MiB")
        if written < size:
            raise RuntimeError(f"filling the {server.kind} RAM disk wrote ~{written} of {size} bytes")
        return {"bytes_written": written, "size": size, "secs": 1 + secs}
