"""SPDK as a peer (`--spdk DIR`, issue 23): SPDK's vhost target in the same rounds as flashpath
and qsd, all three driven by one client (fp-load's own frontend over huge pages, the only one
of fp-load's clients SPDK 23.01 accepts), interleaved point by point; on the null disk's
points also the vhost-user floor (bench/vhost_floor.c), the least a back end does per request,
so that the servers' reactor busy time per I/O (polled clients) and CPU time and notifications
per I/O (completion-fd clients) read against it. Never part of CI.
"""

import os
import subprocess

from fpbench.common import log, median, ratio
from fpbench.load import measure, merge_hists, point_key, point_label, summarize
from fpbench.report_format import fmt_ratio
from fpbench.servers import Flashpath, Qsd, Spdk
from fpbench.syscalls import SyscallCounter
from fpbench.syscalls import method as syscall_method
from fpbench.vhost_floor import VhostFloor, build_c2c, build_vhost_floor, c2c_ns

SPDK_SERVERS = ("flashpath", "qsd", "spdk")
# The vhost-user floor: a fourth server on these backends' points (the floor is a null disk;
# with a polled client the busy time per I/O is the figure it is a floor for, with a completion-fd
# one the CPU time and notifications per I/O).
FLOOR = "floor"
# The floor that also guesses the next request's lines as flashpath does (`--predict`): the
# floor of a back end that hides those misses.
FLOOR_GUESS = "floor_guess"
FLOORS = {FLOOR: (), FLOOR_GUESS: ("--predict",)}
# The clients each floor runs with: the guessing floor only where the busy time per I/O is the
# figure (polled clients); the textbook one also where the servers are judged on CPU and
# notifications per I/O, to tell whether those points are bound below the servers.
FLOOR_CLIENTS = {FLOOR: ("poll", "fd"), FLOOR_GUESS: ("poll",)}
FLOOR_BACKENDS = ("null",)
HUGEPAGES = 1024  # 2 MiB each: SPDK's memory (DPDK) and one page per fp-load run
HUGE_MOUNT = "/dev/hugepages"
# The client of every run in this section: --hugetlb implies fp-load's own frontend.
CLIENT = ("--hugetlb",)


class HugePages:
    """`HUGEPAGES` huge pages and hugetlbfs on /dev/hugepages for the section, as found
    afterwards (root only)."""

    def __enter__(self):
        with open("/proc/sys/vm/nr_hugepages") as f:
            self.before = int(f.read())
        if self.before < HUGEPAGES:
            with open("/proc/sys/vm/nr_hugepages", "w") as f:
                f.write(str(HUGEPAGES))
        got = self._reserved()
        if got < HUGEPAGES:
            # Free memory in 2 MiB pieces may be scattered: compact it once and ask again.
            with open("/proc/sys/vm/compact_memory", "w") as f:
                f.write("1")
            with open("/proc/sys/vm/nr_hugepages", "w") as f:
                f.write(str(HUGEPAGES))
            got = self._reserved()
        self.mounted = False
        if subprocess.run(["mountpoint", "-q", HUGE_MOUNT]).returncode != 0:
            os.makedirs(HUGE_MOUNT, exist_ok=True)
            subprocess.run(["mount", "-t", "hugetlbfs", "nodev", HUGE_MOUNT], check=True)
            self.mounted = True
        if got < HUGEPAGES:
            self.__exit__()
            raise RuntimeError(f"--spdk: only {got} of {HUGEPAGES} huge pages could be reserved (memory held "
                               "by the page cache: `sync; echo 1 > /proc/sys/vm/drop_caches` frees it)")
        return self

    @staticmethod
    def _reserved():
        with open("/proc/sys/vm/nr_hugepages") as f:
            return int(f.read())

    def __exit__(self, *exc):
        if self.mounted:
            subprocess.run(["umount", HUGE_MOUNT])
        if self.before < HUGEPAGES:
            with open("/proc/sys/vm/nr_hugepages", "w") as f:
                f.write(str(self.before))


class SpdkSection:
    """Bench's methods for this section (mixed into bench.Bench)."""

    def run_spdk(self):
        sc = self.cfg["spdk"]
        secs, reps = sc["secs"], sc["reps"]
        out = {"dir": self.args.spdk, "config": sc, "client": "fp-load " + " ".join(CLIENT), "points": []}
        # The servers' system calls at the completion-fd points, with perf's counters only:
        # strace stops the server at every call and would change the point it measures.
        how, why = syscall_method()
        self.spdk_syscalls = how if how == "perf" else None
        out["syscall_method"] = self.spdk_syscalls
        out["syscall_note"] = why if how is None else (None if how == "perf" else f"{how} would slow the servers")
        self.results["spdk"] = out
        # --backends narrows this section too.
        out["backends"] = [b for b in sc["backends"] if not self.args.backends or b in self.cfg["backends"]]
        floor_bin = None
        # The host runs this VM's two vCPUs at two speeds of cross-core traffic (docs/benchmarks.md):
        # every run records a cache line's round trip just before it, and the rounds of a point
        # are also compared pairwise (`paired_ratios`).
        c2c = build_c2c(self.work)
        if any(b in FLOOR_BACKENDS for b in out["backends"]):
            floor_bin = build_vhost_floor(self.work)
            out["floor"] = {"source": "bench/vhost_floor.c", "backends": list(FLOOR_BACKENDS),
                            "clients": {k: list(v) for k, v in FLOOR_CLIENTS.items()},
                            "variants": {k: list(v) for k, v in FLOORS.items()}}
        with HugePages():
            for backend in out["backends"]:
                size = sc["sizes"][backend]
                path = self.backing_path(backend, size) if backend == "ram" else None
                fp = Flashpath(self.args.bin_dir, self.work, str(self.server_cpu), name=f"flashpath-spdk-{backend}")
                qsd = Qsd(self.work, self.server_cpu, backend, size, path, name="qsd-spdk")
                sp = Spdk(self.args.spdk, self.work, self.server_cpu, name=f"spdk-{backend}")
                floors = []
                try:
                    out["version"] = sp.version()
                    ctrlr = f"vhost.{backend}"
                    socks = {"flashpath": fp.add_disk(backend, size), "qsd": qsd.sock,
                             "spdk": sp.add_disk(backend, size)}
                    servers = {"flashpath": fp, "qsd": qsd, "spdk": sp}
                    if floor_bin and backend in FLOOR_BACKENDS:
                        for kind, variant in FLOORS.items():
                            floor = VhostFloor(floor_bin, self.work, self.server_cpu, size // 512,
                                               name=f"v{kind}-{backend}", variant=variant)
                            floors.append(floor)
                            # Polls its core while a client is connected: frozen outside its own runs too.
                            floor.pause()
                            servers[kind], socks[kind] = floor, floor.sock
                    if backend == "ram":
                        # Every disk written once, so that no read meets a page never touched.
                        for kind in ("flashpath", "spdk"):
                            log(f"filling the {kind} RAM disk")
                            self.loader.run(socks[kind], "write", 128 * 1024, 8, 1, True, 60.0,
                                            extra=CLIENT + ("--ios", str(size // (128 * 1024))))
                    # SPDK's reactor polls its core even when idle: frozen outside its own runs.
                    sp.pause()
                    for point in sc["points"]:
                        pk = point_key(backend, point)
                        want_hist = point[2] == 1
                        client = "poll" if point[4] else "fd"
                        kinds = SPDK_SERVERS + tuple(k for k in FLOORS if floors and client in FLOOR_CLIENTS[k])
                        runs = {k: [] for k in kinds}
                        for _ in range(reps):
                            for kind in kinds:
                                frozen = servers[kind] if kind == "spdk" or kind in FLOORS else None
                                # Sampled before a frozen server resumes: SPDK's reactor would poll
                                # the CPU the sample's thread is pinned to.
                                line = c2c_ns(c2c)
                                if frozen:
                                    frozen.resume()
                                runs[kind].append(self.spdk_measure(servers[kind], socks[kind], point, secs,
                                                                    want_hist, ctrlr))
                                runs[kind][-1]["c2c_ns"] = line
                                if frozen:
                                    frozen.pause()
                        e = dict(pk, servers={})
                        for kind in kinds:
                            x = {"runs": runs[kind], "median": summarize(runs[kind])}
                            if want_hist:
                                x["histogram"] = merge_hists(runs[kind])
                                for r in runs[kind]:
                                    r.pop("histogram", None)
                            e["servers"][kind] = x
                        e["ratios"] = spdk_ratios(e)
                        if FLOOR in e["servers"]:
                            e["floor_ratios"] = floor_ratios(e)
                            if not point[4]:
                                e["floor_fd_ratios"] = floor_fd_ratios(e)
                        e["paired"] = paired_ratios(e)
                        out["points"].append(e)
                        md = {k: e["servers"][k]["median"] for k in kinds}
                        log(f"{point_label(pk):<30} flashpath {md['flashpath']['iops']:>10.0f}  qsd "
                            f"{md['qsd']['iops']:>10.0f}  spdk {md['spdk']['iops']:>10.0f}  fp/spdk "
                            f"{fmt_ratio(e['ratios']['iops'])}"
                            + (f"  floor {md[FLOOR]['iops']:>10.0f}, busy/IO fp/floor "
                               f"{fmt_ratio(e['floor_ratios']['flashpath'])} spdk/floor "
                               f"{fmt_ratio(e['floor_ratios']['spdk'])}" if FLOOR in md and point[4] else "")
                            + (f"  floor {md[FLOOR]['iops']:>10.0f}, CPU/IO stat fp/floor "
                               f"{fmt_ratio(e['floor_fd_ratios']['cpu_stat_fp_floor'])} floor/spdk "
                               f"{fmt_ratio(e['floor_fd_ratios']['cpu_stat_floor_spdk'])}"
                               if FLOOR in md and not point[4] else ""))
                finally:
                    fp.stop()
                    qsd.stop()
                    sp.stop()
                    for floor in floors:
                        floor.stop()

    def spdk_measure(self, server, sock, point, secs, want_hist, ctrlr):
        """`measure` with this section's client; for flashpath also its controller's notification
        and kick counters over the run (the server's own count; SPDK keeps none)."""
        s0 = server.controller_stats(ctrlr) if server.kind == "flashpath" else None
        counter = None
        if self.spdk_syscalls and not point[4]:
            counter = SyscallCounter(server.pid, self.spdk_syscalls, self.work)
        if counter:
            counter.start()
        r = measure(server, self.loader, sock, point, secs, want_hist, extra=CLIENT)
        if counter:
            calls = counter.stop()
            # The window is the client's whole run (its connect and teardown too: a few calls).
            r["server_syscalls_per_io"] = calls["total"] / r["ios"] if r["ios"] else None
            r["server_writes_per_io"] = calls["calls"].get("write", 0) / r["ios"] if r["ios"] else None
        if s0 is not None:
            s1 = server.controller_stats(ctrlr)
            for k in ("notifications", "kicks"):
                if isinstance(s1.get(k), int):
                    r[f"server_{k}"] = s1[k] - s0.get(k, 0)
            n, kicks = r.get("server_notifications"), r.get("server_kicks")
            r["server_requests_per_notification"] = r["ios"] / n if n else None
            r["server_kicks_per_io"] = kicks / r["ios"] if kicks is not None and r["ios"] else None
        return r


def spdk_ratios(e):
    """flashpath / SPDK for a point's medians (higher is better for IOPS and completions per
    wake-up, lower for the rest)."""
    f, s = e["servers"]["flashpath"]["median"], e["servers"]["spdk"]["median"]
    keys = {"iops": "iops", "p50": "p50_ns", "p99": "p99_ns", "server_cpu_per_io": "server_cpu_ns_per_io",
            "reactor_busy_per_io": "reactor_busy_ns_per_io", "completions_per_wakeup": "completions_per_wakeup"}
    return {k: ratio(f.get(m), s.get(m)) for k, m in keys.items()}


def floor_ratios(e):
    """flashpath's and SPDK's reactor busy time per I/O as a multiple of the vhost-user floor's
    at a point that has the floor; with the guessing floor also flashpath's multiple of that."""
    busy = {k: v["median"].get("reactor_busy_ns_per_io") for k, v in e["servers"].items()}
    out = {k: ratio(busy[k], busy[FLOOR]) for k in ("flashpath", "spdk")}
    if FLOOR_GUESS in busy:
        out["flashpath_guess"] = ratio(busy["flashpath"], busy[FLOOR_GUESS])
    return out



def floor_fd_ratios(e):
    """At a completion-fd point that has the floor, the interrupt-driven figures against it:
    flashpath's and SPDK's server CPU per I/O (utime + stime) as multiples of the floor's, and the
    floor's CPU per I/O, IOPS and notifications per I/O over SPDK's. Where every server polls its
    core through the run, CPU per I/O is about 1 / IOPS: a floor at SPDK's figure says the point
    is bound below the servers (the client, the cross-core traffic)."""
    md = {k: v["median"] for k, v in e["servers"].items()}

    def of(a, b, m):
        return ratio(md[a].get(m), md[b].get(m))

    stat = "server_cpu_stat_ns_per_io"
    return {"cpu_stat_fp_floor": of("flashpath", FLOOR, stat), "cpu_stat_spdk_floor": of("spdk", FLOOR, stat),
            "cpu_stat_floor_spdk": of(FLOOR, "spdk", stat), "iops_floor_spdk": of(FLOOR, "spdk", "iops"),
            "notifications_floor_spdk": of(FLOOR, "spdk", "notifications_per_io")}


def paired_ratios(e):
    """The reactor busy time per I/O compared round by round: in round i flashpath, qsd, SPDK
    (and the floor) ran one after the other within seconds, mostly at one speed of the host's,
    where the medians of a point may each come from another speed. Each ratio's per-round values
    and their median; each round's cache-line round trips (c2c ns, one per server's run). Where
    the runs have the server CPU per I/O from /proc/PID/stat (completion-fd clients), that too:
    flashpath over SPDK, and with the floor flashpath over the floor and the floor over SPDK."""
    runs = {k: v["runs"] for k, v in e["servers"].items()}
    n = min(len(v) for v in runs.values())

    def per_round(a, b, m="reactor_busy_ns_per_io"):
        xs = [ratio(runs[a][i].get(m), runs[b][i].get(m)) for i in range(n)]
        return {"rounds": xs, "median": median([x for x in xs if x is not None])}

    out = {"busy_fp_spdk": per_round("flashpath", "spdk"),
           "c2c_ns": [{k: runs[k][i].get("c2c_ns") for k in runs} for i in range(n)]}
    if FLOOR_GUESS in runs:
        out["busy_fp_floor_guess"] = per_round("flashpath", FLOOR_GUESS)
    if FLOOR in runs:
        out["busy_fp_floor"] = per_round("flashpath", FLOOR)
        out["busy_spdk_floor"] = per_round("spdk", FLOOR)
        out["busy_floor_spdk"] = per_round(FLOOR, "spdk")
    if e.get("client") == "fd":
        stat = "server_cpu_stat_ns_per_io"
        out["cpu_stat_fp_spdk"] = per_round("flashpath", "spdk", stat)
        if FLOOR in runs:
            out["cpu_stat_fp_floor"] = per_round("flashpath", FLOOR, stat)
            out["cpu_stat_floor_spdk"] = per_round(FLOOR, "spdk", stat)
    return out
