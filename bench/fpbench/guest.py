"""A Linux guest under QEMU (TCG) for the migration figures: the guest tests' kernel
(tests/guest/build-image.sh) with a small initramfs of the benchmark's own, a QMP client, and
QEMU started as a migration source or destination.

The guest tests' init (tests/guest/init) runs one scenario and powers off, and their initramfs
(86 MiB, fio and its libraries) needs 512 MiB of guest RAM to unpack; the benchmark needs a
guest that keeps a load running while it is migrated, with little RAM to move. Its initramfs
holds the image's static busybox and virtio_blk.ko, bench/guestload.c built statically (4 KiB
random writes, O_DIRECT, native AIO at QD32) and an init that loads the driver, idles or starts
guestload, and prints one `FPBENCH <uptime> <writes completed>` line a second from
/proc/diskstats, so the host sees the guest's I/O rate before, during and after the move.
"""

import json
import os
import re
import socket
import subprocess
import time

from fpbench.common import log, run
from fpbench.servers import spawn, stop

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

BENCH_INIT = r"""#!/bin/busybox sh
/bin/busybox mkdir -p /bin /sbin /usr/bin /usr/sbin /proc /sys /dev /tmp
/bin/busybox --install -s
export PATH=/bin:/sbin:/usr/bin:/usr/sbin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
MODE=idle
for a in $(cat /proc/cmdline); do case $a in fpbench.mode=*) MODE=${a#fpbench.mode=} ;; esac; done
insmod /lib/modules/virtio_blk.ko
i=0
while [ ! -b /dev/vda ]; do i=$((i + 1)); [ $i -gt 200 ] && echo "FPBENCH-FAIL no disk" && poweroff -f; sleep 0.05; done
dmesg -n 1
if [ "$MODE" = load ]; then
    /guestload /dev/vda 32 &
fi
echo "FPBENCH-READY $MODE"
while :; do
    echo "FPBENCH $(cut -d' ' -f1 /proc/uptime) $(awk '$3 == "vda" { print $8 }' /proc/diskstats)"
    sleep 1
done
"""


def boot_image():
    """(vmlinux, initramfs) of the guest tests' image, built or reused by build-image.sh."""
    out = run([os.path.join(ROOT, "tests", "guest", "build-image.sh")], 1800).stdout
    d = out.strip().splitlines()[-1].split("image: ", 1)[1].strip()
    return os.path.join(d, "vmlinux"), os.path.join(d, "initramfs.cpio")


def bench_initramfs(base, work):
    """The benchmark's initramfs (see the module docs), from the image's initramfs `base`; its
    path."""
    d = os.path.join(work, "initramfs")
    os.makedirs(d, exist_ok=True)
    with open(base, "rb") as f:
        subprocess.run(["cpio", "-idm", "--quiet", "bin/busybox", "lib/modules/virtio_blk.ko"], stdin=f,
                       cwd=d, check=True, capture_output=True, timeout=120)
    run(["cc", "-O2", "-static", "-o", os.path.join(d, "guestload"), os.path.join(ROOT, "bench", "guestload.c")], 120)
    with open(os.path.join(d, "init"), "w") as f:
        f.write(BENCH_INIT)
    os.chmod(os.path.join(d, "init"), 0o755)
    names = "init\nguestload\nbin\nbin/busybox\nlib\nlib/modules\nlib/modules/virtio_blk.ko\n"
    archive = subprocess.run(["cpio", "-o", "-H", "newc", "--quiet"], input=names.encode(), cwd=d, check=True,
                             capture_output=True, timeout=60).stdout
    path = os.path.join(work, "initramfs-bench.cpio")
    with open(path, "wb") as f:
        f.write(archive)
    return path


class Qmp:
    """A minimal QMP client on a Unix socket: capabilities, then one command at a time."""

    def __init__(self, path, timeout=30):
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.s = socket.socket(socket.AF_UNIX)
                self.s.connect(path)
                break
            except OSError:
                self.s.close()
                if time.monotonic() > deadline:
                    raise RuntimeError(f"QMP socket {path}: no connection after {timeout} s")
                time.sleep(0.05)
        self.s.settimeout(timeout)
        self.f = self.s.makefile("rwb")
        self._read()  # greeting
        self.cmd("qmp_capabilities")

    def _read(self):
        while True:
            line = self.f.readline()
            if not line:
                raise RuntimeError("QMP connection closed")
            msg = json.loads(line)
            if "event" not in msg:
                return msg

    def cmd(self, name, **args):
        self.f.write(json.dumps({"execute": name, "arguments": args}).encode() + b"\n")
        self.f.flush()
        r = self._read()
        if "error" in r:
            raise RuntimeError(f"QMP {name}: {r['error'].get('desc', r['error'])}")
        return r.get("return")

    def close(self):
        try:
            self.s.close()
        except OSError:
            pass


class Guest:
    """One QEMU (TCG, `cpus` vCPUs, `mem_mib` of memfd RAM shared with the back end) with one
    vhost-user-blk disk on `sock`, pinned to `cpu`; with `incoming` it waits for a migration
    (`-incoming defer`). Its serial console goes to `<dir>/<name>.console`."""

    def __init__(self, name, work, cpu, sock, kernel, initrd, mode, mem_mib, incoming=False, cpus=1):
        self.name = name
        self.dir = os.path.join(work, name)
        os.makedirs(self.dir, exist_ok=True)
        self.qmp_path = os.path.join(self.dir, "qmp.sock")
        self.console = os.path.join(self.dir, "console.log")
        cmd = ["taskset", "-c", str(cpu), "qemu-system-x86_64", "-accel", "tcg", "-cpu", "max",
               "-smp", str(cpus), "-m", f"{mem_mib}M",
               "-object", f"memory-backend-memfd,id=mem,size={mem_mib}M,share=on",
               "-machine", "memory-backend=mem",
               "-chardev", f"socket,id=disk0,path={sock}",
               "-device", "vhost-user-blk-pci,chardev=disk0,num-queues=1",
               "-display", "none", "-nodefaults", "-no-reboot",
               "-chardev", f"file,id=ser0,path={self.console}", "-serial", "chardev:ser0",
               "-qmp", f"unix:{self.qmp_path},server=on,wait=off",
               "-kernel", kernel, "-initrd", initrd,
               "-append", f"console=ttyS0 panic=-1 cryptomgr.notests initcall_blacklist=jent_mod_init "
                          f"fpbench.mode={mode}"]
        if incoming:
            cmd += ["-incoming", "defer"]
        self.proc = spawn(cmd, os.path.join(self.dir, "qemu.log"))
        self.qmp = Qmp(self.qmp_path)

    def lines(self):
        try:
            with open(self.console, errors="replace") as f:
                return f.read().splitlines()
        except FileNotFoundError:
            return []

    def wait_line(self, pattern, timeout):
        """The first console line matching `pattern` (a regex), waiting up to `timeout` s."""
        rx = re.compile(pattern)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in self.lines():
                if "FPBENCH-FAIL" in line:
                    raise RuntimeError(f"{self.name}: {line}")
                if rx.search(line):
                    return line
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name}: QEMU exited with status {self.proc.returncode}: "
                                   f"{open(self.proc.log_path, errors='replace').read()[-1500:]}")
            time.sleep(0.2)
        raise RuntimeError(f"{self.name}: no console line matching {pattern!r} after {timeout} s")

    def samples(self):
        """The guest's (uptime s, writes completed) lines, in order."""
        out = []
        for line in self.lines():
            m = re.match(r"FPBENCH ([0-9.]+) ([0-9]+)$", line.strip())
            if m:
                out.append((float(m.group(1)), int(m.group(2))))
        return out

    def stop(self):
        self.qmp.close()
        stop(self.proc, 10)


def guest_rate(samples):
    """Writes per second over the samples (first to last), or None with fewer than two."""
    if len(samples) < 2 or samples[-1][0] <= samples[0][0]:
        return None
    return (samples[-1][1] - samples[0][1]) / (samples[-1][0] - samples[0][0])


def migrate(src, dst, uri, params, timeout):
    """Migrates `src` to `dst` (started with -incoming defer) over `uri` with the migration
    parameters `params`; query-migrate's final answer, with `wall_s` (the host's view, from the
    migrate command to completion) added."""
    dst.qmp.cmd("migrate-incoming", uri=uri)
    if params:
        src.qmp.cmd("migrate-set-parameters", **params)
    t0 = time.monotonic()
    src.qmp.cmd("migrate", uri=uri)
    deadline = t0 + timeout
    while True:
        q = src.qmp.cmd("query-migrate")
        st = q.get("status")
        if st in ("completed", "failed", "cancelled"):
            q["wall_s"] = time.monotonic() - t0
            return q
        if time.monotonic() > deadline:
            try:
                src.qmp.cmd("migrate_cancel")
            except RuntimeError:
                pass
            q["status"] = f"timeout ({st} after {timeout} s)"
            q["wall_s"] = time.monotonic() - t0
            return q
        time.sleep(0.05)


def log_migration(kind, mode, q):
    log(f"migration {kind:<9} {mode:<5} {q.get('status')}: downtime {q.get('downtime', '-')} ms, "
        f"total {q.get('total-time', '-')} ms, setup {q.get('setup-time', '-')} ms"
        + (f" ({q.get('error-desc')})" if q.get("error-desc") else ""))
