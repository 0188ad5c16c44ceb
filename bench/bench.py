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
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from fpbench.common import MIB, log, proc_cpu, write_random_file
from fpbench.load import Loader
from fpbench.machine import (machine_info, migration_missing, nbd_missing, rbd_missing, wants_migration,
                              wants_rbd, wants_section)
from fpbench.modes import mode_config
from fpbench.report import write_outputs
from fpbench.sections.backup import BackupSection
from fpbench.sections.callgrind import CallgrindSection
from fpbench.sections.crypto import CryptoSection, crypto_missing
from fpbench.sections.density import DensitySection
from fpbench.sections.guest_notify import GuestNotifySection, guest_notify_config, guest_notify_missing
from fpbench.sections.iostat import IostatSection
from fpbench.sections.luks import LuksSection, luks_missing
from fpbench.sections.lvol import LvolSection
from fpbench.sections.migration import MigrationSection
from fpbench.sections.nbd import NbdSection
from fpbench.sections.nvme_tcp import NvmeTcpSection, nvme_tcp_missing
from fpbench.sections.nvmf import TARGETS as NVMF_TARGETS, NvmfSection, nvmf_missing
from fpbench.sections.null_ram_file import NullRamFileSection
from fpbench.sections.pathlen import PathlenSection, pathlen_missing
from fpbench.sections.paths import PathsSection
from fpbench.sections.tls import TlsSection
from fpbench.sections.ublk import UblkSection, ublk_missing
from fpbench.sections.qos import QosSection
from fpbench.sections.raid import RaidSection
from fpbench.sections.rbd import RbdSection
from fpbench.sections.spdk import SpdkSection
from fpbench.servers import CephCluster, kill_all_children
from fpbench.validate import validate


class Bench(NullRamFileSection, IostatSection, CallgrindSection, LvolSection, QosSection, RbdSection,
            NbdSection, MigrationSection, GuestNotifySection, SpdkSection, NvmfSection, NvmeTcpSection, RaidSection,
            CryptoSection, PathlenSection, DensitySection, PathsSection, TlsSection, BackupSection, UblkSection, LuksSection):
    """One benchmark run: the scratch directory, the load generator, the results; each section's
    methods come from its mixin in fpbench/sections/."""

    def __init__(self, args):
        self.args = args
        self.cfg = mode_config(args.mode)
        if args.time:
            self.cfg["time"] = args.time
        if args.reps:
            self.cfg["reps"] = args.reps
        self.with_rbd = wants_rbd(args)
        self.with_nbd = wants_section(args, "nbd")
        self.with_migration = wants_migration(args)
        # Not in smoke runs (a TCG guest boots); --only guest-notify in smoke mode takes quick's.
        self.with_guest_notify = args.only == "guest-notify" or (
            wants_section(args, "guest-notify") and guest_notify_config(args.mode) is not None)
        if args.backends:
            self.cfg["backends"] = [b for b in args.backends.split(",")
                                    if b not in ("rbd", "nbd", "migration", "guest-notify")]
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
            "migration": (f"live migration: the dirty log, downtime vs qsd, the mirror vs nbdcopy (servers "
                          f"CPU {self.server_cpu}, clients and QEMU CPU {self.client_cpu}, scratch {self.work})",
                          self.run_migration),
            "guest-notify": (f"notifications in a TCG guest running fio, flashpath vs qsd (servers CPU "
                             f"{self.server_cpu}, QEMU CPU {self.client_cpu}, scratch {self.work})",
                             self.run_guest_notify),
            "lvol": (f"logical volumes ({self.secs} s per run, server CPU {self.server_cpu}, "
                     f"client CPU {self.client_cpu})", self.run_lvol),
            "spdk": (f"SPDK as a peer ({self.args.spdk}; server CPU {self.server_cpu}, client CPU "
                     f"{self.client_cpu})", self.run_spdk),
            "nvmf": (f"NVMe/TCP, flashpath vs SPDK's nvmf_tgt, spdk_nvme_perf ({self.args.spdk}; server CPU "
                     f"{self.server_cpu}, client CPU {self.client_cpu})", self.run_nvmf),
            "nvme-tcp": (f"NVMe/TCP initiator, flashpath's bdev_nvme vs SPDK's vhost + bdev_nvme, one SPDK nvmf_tgt "
                         f"({self.args.spdk}; initiators CPU {self.server_cpu}, target and client CPU "
                         f"{self.client_cpu})", self.run_nvme_tcp),
            "raid": (f"raid1: a mirrored write's cost, partial and full rebuilds (server CPU {self.server_cpu}, "
                     f"client CPU {self.client_cpu}, scratch {self.work})", self.run_raid),
            "crypto": (f"AES-XTS: the cipher vs openssl speed, encrypted RAM disks vs plain and vs qsd's LUKS "
                       f"(server CPU {self.server_cpu}, client CPU {self.client_cpu}, scratch {self.work})",
                       self.run_crypto),
            "pathlen": (f"the path length of every export: instructions per I/O under callgrind (measured server "
                        f"CPU {self.server_cpu}, clients and peers CPU {self.client_cpu}, scratch {self.work})",
                        self.run_pathlen),
            "paths": (f"paths: NVMe/TCP failover through two relayed paths and the DH-HMAC-CHAP connect cost "
                      f"(initiator CPU {self.server_cpu}, target and client CPU {self.client_cpu}, scratch {self.work})",
                      self.run_paths),
            "tls": (f"TLS: NVMe/TCP with TLS 1.3 against plain NVMe/TCP (target CPU {self.server_cpu}, initiator "
                    f"and client CPU {self.client_cpu}, scratch {self.work})", self.run_tls),
            "backup": (f"backups: the dirty bitmap's cost, incrementals, throughput vs rclone, live restore (server "
                       f"CPU {self.server_cpu}, client and cluster CPU {self.client_cpu}, scratch {self.work})",
                       self.run_backup),
            "density": (f"density: many VMs on one server core, flashpath vs qsd{' vs SPDK' if self.args.spdk else ''} "
                        f"(server CPU {self.server_cpu}, client CPU {self.client_cpu})", self.run_density),
            "ublk": (f"ublk: a null disk in a TCG guest as /dev/ublkbN vs null_blk and the kernel's NBD client, "
                     f"recovery after kill -9 (QEMU on CPUs {self.server_cpu},{self.client_cpu}, scratch {self.work})",
                     self.run_ublk),
            "luks": (f"LUKS volumes: opening vs cryptsetup, re-encryption vs cryptsetup reencrypt, a guest's IOPS "
                     f"beside a limited job (server CPU {self.server_cpu}, client CPU {self.client_cpu}, scratch "
                     f"{self.work})", self.run_luks),
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
        if self.args.spdk:
            log(f"=== SPDK as a peer: flashpath, qsd and SPDK's vhost target ({self.args.spdk}), one client")
            self.run_spdk()
            log("=== NVMe/TCP: flashpath vs SPDK's nvmf_tgt, spdk_nvme_perf as the client")
            self.run_nvmf()
            log("=== NVMe/TCP initiator: flashpath's bdev_nvme vs SPDK's, both to one SPDK nvmf_tgt")
            self.run_nvme_tcp()
        else:
            log("=== NVMe/TCP vs SPDK's nvmf_tgt, NVMe/TCP initiator vs SPDK's: skipped (they need --spdk DIR, a "
                "built SPDK)")
        log("=== density: many VMs on one server core")
        self.run_density()
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
        if self.cfg.get("pathlen"):
            log("=== path length of every export: vhost-user, NBD, NVMe/TCP target and host under callgrind")
            self.run_pathlen()
        if self.with_rbd:
            log("=== Ceph RBD: qsd's rbd driver vs flashpath's rbd bdev, one server at a time")
            self.run_rbd()
        if self.with_nbd:
            log("=== NBD over a Unix socket: flashpath vs qsd vs nbdkit, fio's nbd engine")
            self.run_nbd()
        if self.with_migration:
            log("=== live migration: the dirty log, downtime vs qsd, the mirror vs nbdcopy")
            self.run_migration()
        if self.with_guest_notify:
            log("=== notifications in a TCG guest running fio: flashpath vs qsd")
            self.run_guest_notify()
        self.results["wall_s"] = time.monotonic() - self.started


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
    ap.add_argument("--backends", help="comma-separated subset of null,ram,file,rbd,nbd,migration,guest-notify "
                                       "(development only; rbd, nbd, migration, guest-notify: those sections; "
                                       "migration runs only when named here or with --only)")
    ap.add_argument("--spdk", metavar="DIR",
                    help="a built SPDK tree (build/bin/vhost): its vhost target runs beside flashpath and qsd "
                         "(sets up 1024 huge pages; root)")
    ap.add_argument("--only", choices=["iostat", "lvol", "qos", "rbd", "nbd", "migration", "guest-notify", "spdk",
                                       "nvmf", "nvme-tcp", "raid", "crypto", "pathlen", "density", "paths", "tls",
                                       "backup", "ublk", "luks"],
                    help="run only this section (development only)")
    ap.add_argument("--rbd-serve-args", default="", metavar="ARGS",
                    help="extra `flashpath serve` arguments for the RBD section, e.g. \"--idle-window-us 20\" "
                         "(development only; recorded in the results)")
    ap.add_argument("--guest-notify-serve-args", default="", metavar="ARGS",
                    help="extra `flashpath serve` arguments for the guest-notify section, e.g. \"--idle-window-us 0\" "
                         "(development only; recorded in the results)")
    ap.add_argument("--nvmf-targets", default=",".join(NVMF_TARGETS), metavar="LIST",
                    help=f"the NVMe/TCP section's targets, a subset of {','.join(NVMF_TARGETS)} (development "
                         "only: spdk alone checks the section without a flashpath that serves NVMe/TCP)")
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
    missing = migration_missing() if wants_migration(args) else []
    if missing:
        print(f"bench: the migration section needs {', '.join(missing)} (./run bench installs them)",
              file=sys.stderr)
        return 1
    missing = guest_notify_missing() if args.only == "guest-notify" else []
    if missing:
        print(f"bench: the guest-notify section needs {', '.join(missing)}", file=sys.stderr)
        return 1
    missing = ublk_missing(args.bin_dir) if args.only == "ublk" else []
    if missing:
        print(f"bench: the ublk section needs {', '.join(missing)} (./run bench installs them)", file=sys.stderr)
        return 1
    missing = luks_missing(args.bin_dir) if args.only == "luks" else []
    if missing:
        print(f"bench: the LUKS section needs {', '.join(missing)}", file=sys.stderr)
        return 1
    missing = crypto_missing(args.bin_dir) if args.only == "crypto" else []
    if missing:
        print(f"bench: the crypto section needs {', '.join(missing)}", file=sys.stderr)
        return 1
    wants_pathlen = args.only == "pathlen" or (not args.only and mode_config(args.mode).get("pathlen"))
    missing = pathlen_missing() if wants_pathlen else []
    if missing:
        print(f"bench: the path-length section needs {', '.join(missing)} (./run bench installs them)",
              file=sys.stderr)
        return 1
    if args.only == "spdk" and not args.spdk:
        print("bench: --only spdk needs --spdk DIR", file=sys.stderr)
        return 1
    missing = nvmf_missing(args.spdk) if args.only == "nvmf" or (args.spdk and not args.only) else []
    if missing:
        print(f"bench: the NVMe/TCP section needs {', '.join(missing)} (../shared/spdk-build.sh builds them)",
              file=sys.stderr)
        return 1
    missing = nvme_tcp_missing(args.spdk) if args.only == "nvme-tcp" or (args.spdk and not args.only) else []
    if missing:
        print(f"bench: the NVMe/TCP initiator section needs {', '.join(missing)} (../shared/spdk-build.sh builds "
              "them)", file=sys.stderr)
        return 1
    if args.spdk and args.only not in ("nvmf", "nvme-tcp") and not os.access(os.path.join(args.spdk, "build", "bin", "vhost"), os.X_OK):
        print(f"bench: --spdk {args.spdk}: no build/bin/vhost there (../shared/spdk-build.sh builds it)",
              file=sys.stderr)
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
    if args.spdk:
        cmd += f" --spdk {args.spdk}"
    if args.nvmf_targets != ",".join(NVMF_TARGETS):
        cmd += f" --nvmf-targets {args.nvmf_targets}"

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
        "migration": bench.with_migration,
        "guest_notify": bench.with_guest_notify,
        "spdk": args.spdk,
        "nvmf": bool(bench.results.get("nvmf")),
        "nvme_tcp": bool(bench.results.get("nvme_tcp")),
        "raid": bool(bench.results.get("raid")),
        "crypto": bool(bench.results.get("crypto")),
        "pathlen": bool(bench.results.get("pathlen")),
        "paths": bool(bench.results.get("paths")),
        "tls": bool(bench.results.get("tls")),
        "backup": bool(bench.results.get("backup")),
        "ublk": bool(bench.results.get("ublk")),
        "luks": bool(bench.results.get("luks")),
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