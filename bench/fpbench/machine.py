"""Which sections a run has, which tools they lack, and the machine description each run records.
"""

import os
import platform
import shutil
import socket
import subprocess

from fpbench.common import MIB, run


def wants_rbd(args):
    """Whether this run has the RBD section (see wants_section)."""
    return wants_section(args, "rbd")


def wants_section(args, name):
    """Whether this run has the section `name` (rbd, nbd): `--only name`, or a whole run whose
    `--backends` (if given) names it; neither is a matrix backend."""
    return args.only == name or (not args.only and (not args.backends or name in args.backends.split(",")))


def wants_migration(args):
    """Whether this run has the migration section: `--only migration`, or `--backends` naming
    it. Unlike the NBD and RBD sections it is not in a run by default: it boots guests under
    QEMU and starts four daemons, minutes the matrix runs do without."""
    return args.only == "migration" or (not args.only and "migration" in (args.backends or "").split(","))


def migration_missing():
    """What the migration section needs and this machine lacks: QEMU (qemu-system-x86),
    nbdcopy (libnbd-bin), nbdkit, a C compiler for the guest's load (build-essential) and cpio,
    and the static busybox build-image.sh puts in the guest (busybox-static)."""
    tools = {"qemu-system-x86_64": "qemu-system-x86", "nbdcopy": "libnbd-bin", "nbdkit": "nbdkit",
             "cc": "build-essential", "cpio": "cpio", "busybox": "busybox-static"}
    return [f"{t} ({pkg})" for t, pkg in tools.items() if shutil.which(t) is None]


def nbd_missing():
    """What the NBD section needs and this machine lacks: nbdkit (Debian nbdkit, whose memory
    plugin is built in) and fio's nbd engine (fio built with libnbd, as Debian's fio 3.33 is)."""
    missing = ["nbdkit"] if shutil.which("nbdkit") is None else []
    return missing + fio_nbd_missing()


def fio_nbd_missing():
    """fio's nbd engine, if this machine's fio lacks it."""
    engines = subprocess.run(["fio", "--enghelp"], capture_output=True, text=True, timeout=20).stdout
    return [] if "nbd" in engines.split() else ["fio's nbd engine (fio built with libnbd)"]


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
