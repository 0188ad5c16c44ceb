"""Density: many VMs on one server core. N vhost-user-blk controllers, each on its own null disk,
all on one server core, driven by N interrupt-driven clients (queues that sleep on their
completion fds, as a VM's do) at a queue depth of QD each, for N and QD of the mode; flashpath,
qemu-storage-daemon and (with --spdk) SPDK's vhost target in the same run, interleaved. The
clients are one fp-load process driving every disk from one thread on the client core
(docs/benchmarks.md says why). Per run: the total IOPS, each VM's IOPS and p99, and the
server-side figures of an interrupt-driven client (`interrupt_figures`), sampled over the
measured interval alone (fp-load --mark-phases), not over the connects around it.
"""

import contextlib
import json
import os
import select
import statistics
import subprocess
import time

from fpbench.common import GIB, log, ratio
from fpbench.load import interrupt_figures, server_sample
from fpbench.report_format import fmt_ratio
from fpbench.servers import CHILDREN, Flashpath, QsdMulti, Spdk
from fpbench.sections.spdk import HugePages
from fpbench.vhost_floor import build_c2c, c2c_ns

# ns: the numbers of VMs; qds: each VM's queue depth; secs per run; reps interleaved rounds.
# Smoke: the pipeline on a few VMs, flashpath and qsd (CI has no SPDK); two rounds so that the
# spread is a real figure.
DENSITY = {
    "full": {"ns": [16, 64, 128], "qds": [1, 8], "secs": 3.0, "reps": 3, "size": GIB},
    "quick": {"ns": [16, 64, 128], "qds": [1, 8], "secs": 2.0, "reps": 3, "size": GIB},
    "smoke": {"ns": [4], "qds": [1, 8], "secs": 0.5, "reps": 2, "size": GIB},
}
# fp-load's own frontend for every server: it counts its kicks, and with --hugetlb it is the
# client SPDK accepts; the same client for every server of a run.
CLIENT = ("--frontend",)
SPDK_CLIENT = ("--hugetlb",)
PHASE_MEASURING = "fp-load: measuring"
PHASE_MEASURED = "fp-load: measured"
# Each run's figures summarised over the rounds (median and spread).
RUN_FIGURES = ["total_iops", "mean_p99_ns", "max_p99_ns", "min_max_iops", "server_cpu_stat_ns_per_io",
               "server_wakeups_per_io", "client_wakeups_per_io", "client_calls_per_io", "client_kicks_per_io",
               "notifications_per_io", "client_cores", "server_cores"]


# SPDK 23.01 gives every vhost-blk session an iobuf channel that takes a cache of 128 small and
# 16 large buffers from the global pools at its start (lib/bdev/bdev.c BUF_*_CACHE_SIZE); the
# default pools (8192 and 1024) serve 63 sessions, and the 64th fails to start ("Failed to
# populate iobuf small buffer cache"). Its pools are sized for the run's N (and a few threads
# of its own) instead: SPDK's own remedy, memory only.
SPDK_SMALL_CACHE, SPDK_LARGE_CACHE, SPDK_SPARE_THREADS = 128, 16, 8


def spdk_iobuf(n):
    return {"small_pool_count": max(8192, SPDK_SMALL_CACHE * (n + SPDK_SPARE_THREADS)),
            "large_pool_count": max(1024, SPDK_LARGE_CACHE * (n + SPDK_SPARE_THREADS))}


def density_config(mode):
    return DENSITY[mode]


def density_servers(with_spdk):
    return ("flashpath", "qsd", "spdk") if with_spdk else ("flashpath", "qsd")


def per_vm(disks):
    """A run's per-VM figures from fp-load's per-disk results."""
    iops = [d["iops"] for d in disks]
    p99 = [d["p99_ns"] for d in disks]
    return {"total_iops": sum(iops), "mean_p99_ns": statistics.mean(p99), "max_p99_ns": max(p99),
            "min_max_iops": min(iops) / max(iops) if max(iops) else None,
            "vm_iops": iops, "vm_p99_ns": p99}


def summarize_runs(runs):
    """The median of each of RUN_FIGURES over the rounds and its spread ((max - min) / median)."""
    med, spread = {}, {}
    for k in RUN_FIGURES:
        xs = [r[k] for r in runs if r.get(k) is not None]
        if xs:
            m = statistics.median(xs)
            med[k] = m
            spread[k] = (max(xs) - min(xs)) / m if m else None
    return med, spread


def density_ratios(e, servers):
    """flashpath's medians over SPDK's and qsd's (higher is better for IOPS and min/max, lower
    for the rest)."""
    f = e["servers"]["flashpath"]["median"]
    out = {}
    for peer in servers[1:]:
        p = e["servers"][peer]["median"]
        out[peer] = {k: ratio(f.get(k), p.get(k)) for k in
                     ("total_iops", "mean_p99_ns", "max_p99_ns", "min_max_iops", "server_cpu_stat_ns_per_io",
                      "notifications_per_io", "server_wakeups_per_io")}
    return out


def density_rounds(runs, servers):
    """Round by round: each server's cache-line sample (c2c ns, taken before its run) and
    flashpath's total IOPS over each peer's in that round; the host's speed can change between
    rounds, and a median over rounds of both speeds reads neither."""
    n = min(len(runs[k]) for k in servers)
    return [{"c2c_ns": {k: runs[k][i].get("c2c_ns") for k in servers},
             "iops_ratio": {k: ratio(runs["flashpath"][i].get("total_iops"), runs[k][i].get("total_iops"))
                            for k in servers[1:]}}
            for i in range(n)]


class DensitySection:
    """Bench's methods for this section (mixed into bench.Bench)."""

    def run_density(self):
        c = dict(density_config(self.args.mode))
        if self.args.time:
            c["secs"] = self.args.time
        if self.args.reps:
            c["reps"] = self.args.reps
        servers = density_servers(bool(self.args.spdk))
        client = CLIENT + (SPDK_CLIENT if self.args.spdk else ())
        out = {"config": c, "servers": list(servers), "client": "fp-load " + " ".join(client), "points": [],
               "loadavg_before": list(os.getloadavg())}
        self.results["density"] = out
        # The host runs this VM's two vCPUs at two speeds of cross-core traffic, as in the SPDK
        # section: every run records a cache line's round trip just before it.
        self.density_c2c = build_c2c(self.work)
        with HugePages() if self.args.spdk else contextlib.nullcontext():
            for n in c["ns"]:
                self.density_n(c, n, servers, client, out)
        out["loadavg_after"] = list(os.getloadavg())

    def density_n(self, c, n, servers, client, out):
        """Every QD of the mode on `n` VMs: each server started with `n` controllers."""
        started = {}
        try:
            fp = started["flashpath"] = Flashpath(self.args.bin_dir, self.work, str(self.server_cpu),
                                                  name=f"flashpath-density-{n}")
            socks = {"flashpath": fp.null_disks(n, c["size"])}
            qsd = started["qsd"] = QsdMulti(self.work, self.server_cpu, n, f"qsd-density-{n}", "none", None)
            socks["qsd"] = qsd.socks
            if "spdk" in servers:
                sp = started["spdk"] = Spdk(self.args.spdk, self.work, self.server_cpu, name=f"spdk-density-{n}",
                                            iobuf=spdk_iobuf(n))
                out.setdefault("spdk_iobuf", {})[str(n)] = spdk_iobuf(n)
                out["spdk_version"] = sp.version()
                socks["spdk"] = sp.null_disks(n, c["size"])
                # Its reactor polls the core even when idle: frozen outside its own runs.
                sp.pause()
            for qd in c["qds"]:
                runs = {k: [] for k in servers}
                for rep in range(c["reps"]):
                    for kind in servers:
                        s = started[kind]
                        # Sampled before SPDK resumes: its reactor would poll the CPU the
                        # sample's thread is pinned to.
                        line = c2c_ns(self.density_c2c)
                        if kind == "spdk":
                            s.resume()
                        try:
                            runs[kind].append(self.density_run(s, socks[kind], qd, c["secs"], client, f"{n}-{qd}-{rep}"))
                        finally:
                            if kind == "spdk":
                                s.pause()
                        runs[kind][-1]["c2c_ns"] = line
                e = {"vms": n, "qd": qd, "servers": {}, "rounds": density_rounds(runs, servers)}
                for kind in servers:
                    med, spread = summarize_runs(runs[kind])
                    e["servers"][kind] = {"runs": runs[kind], "median": med, "spread": spread}
                e["ratios"] = density_ratios(e, servers)
                out["points"].append(e)
                md = {k: e["servers"][k]["median"] for k in servers}
                log(f"density {n:>3} VMs QD{qd}: " + "  ".join(
                    f"{k} {md[k]['total_iops']:>9.0f} IOPS p99 {md[k]['mean_p99_ns'] / 1000:>7.1f} us "
                    f"min/max {md[k]['min_max_iops']:.2f}" for k in servers) +
                    "  fp/" + "  fp/".join(f"{k} {fmt_ratio(e['ratios'][k]['total_iops'])}" for k in servers[1:]))
        finally:
            for s in started.values():
                s.stop()

    def density_run(self, server, socks, qd, secs, client, tag):
        """One run of every VM at `qd` against `server`: fp-load driving `socks` from one thread,
        the server and the client sampled when the measured interval starts and ends."""
        job = os.path.join(self.work, f"density-{tag}.job")
        with open(job, "w") as f:
            f.writelines(f"socket={s},label=vm{i}\n" for i, s in enumerate(socks))
        cmd = [self.loader.bin, "--job", job, "--pattern", "randread", "--bs", "4096", "--qd", str(qd),
               "--time", f"{secs}s", "--cpu", str(self.client_cpu), "--json", "--mark-phases", *client]
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        CHILDREN.append(p)
        samples = {}
        err_lines = []
        # Read unbuffered from the descriptor: a buffered reader could hold the second mark
        # while select() waits for more.
        fd, buf = p.stderr.fileno(), b""
        # Connecting a hundred disks takes a while; the run itself `secs`.
        deadline = time.monotonic() + secs + 120
        while len(samples) < 2:
            left = deadline - time.monotonic()
            if left <= 0:
                p.kill()
                raise RuntimeError(f"{server.name}: fp-load {tag} did not finish its measured interval")
            ready, _, _ = select.select([fd], [], [], min(left, 1.0))
            if not ready:
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                break  # fp-load exited: its status and stderr say why
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                line = line.decode(errors="replace")
                if line == PHASE_MEASURING:
                    samples["start"] = (server_sample(server.pid), server_sample(p.pid))
                elif line == PHASE_MEASURED:
                    samples["end"] = (server_sample(server.pid), server_sample(p.pid))
                else:
                    err_lines.append(line)
        stdout, rest = p.communicate(timeout=60)
        os.unlink(job)
        if p.returncode != 0 or len(samples) < 2:
            raise RuntimeError(f"{server.name}: fp-load {tag}: exit {p.returncode}: "
                               f"{' '.join(err_lines + [rest.strip()])[-2000:]}")
        res = json.loads(stdout)
        tot = res["total"]
        if tot["errors"]:
            raise RuntimeError(f"{server.name} density {tag}: {tot['errors']} requests failed "
                               f"(first {tot['first_error']})")
        (s0, c0), (s1, c1) = samples["start"], samples["end"]
        r = per_vm(res["disks"])
        r.update(interrupt_figures(s0, s1, tot))
        wall = s1["t"] - s0["t"]
        r["interval_s"] = wall
        r["elapsed_s"] = tot["elapsed_s"]
        r["ios"] = tot["ios"]
        # Shares of a core over the measured interval (utime + stime: clock ticks).
        r["server_cores"] = (s1["stat_ns"] - s0["stat_ns"]) / 1e9 / wall if wall else None
        r["client_cores"] = (c1["stat_ns"] - c0["stat_ns"]) / 1e9 / wall if wall else None
        return r
