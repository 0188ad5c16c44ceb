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

The notification counts (sections/guest_notify.py) need fio in the guest: ConsoleGuest boots
the guest tests' own initramfs with an init of the benchmark's appended (NOTIFY_INIT) and takes
its commands on the serial console.
"""

import json
import os
import re
import shutil
import socket
import subprocess
import threading
import time

from fpbench.common import log, run
from fpbench.servers import spawn, stop

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# The start of both inits: busybox, /proc, /sys, /dev.
INIT_PROLOGUE = r"""#!/bin/busybox sh
/bin/busybox mkdir -p /bin /sbin /usr/bin /usr/sbin /proc /sys /dev /tmp
/bin/busybox --install -s
export PATH=/bin:/sbin:/usr/bin:/usr/sbin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
"""

BENCH_INIT = INIT_PROLOGUE + r"""MODE=idle
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


def guest_boot_files(initramfs, work):
    """(vmlinux, initramfs) of a section's guest: the image's kernel, and `initramfs(base, work)`
    made from the image's own initramfs `base`."""
    kernel, base = boot_image()
    return kernel, initramfs(base, work)


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


# -- a guest that boots from its disk (bench/fpbench/sections/backup.py, (D)) -------------------
#
# The kernel comes from the host (direct kernel boot, as every guest here); a tiny initramfs
# (static busybox, virtio_blk.ko, BOOT_INIT) mounts /dev/vda read-only and switch_roots into it.
# The disk's root file system is the guest tests' own initramfs unpacked into ext4 (busybox, fio,
# e2fsprogs, cryptsetup, nvme-cli and their libraries, the modules), with BOOT_STAGE2 as its
# init: it runs the root's programs once (loading them and their libraries), reads every other
# file once (a boot's working set: here the whole root), prints FPBENCH-BOOTED with the guest's
# uptime and the KiB read, and powers off.

BOOT_INIT = INIT_PROLOGUE + r"""insmod /lib/modules/virtio_blk.ko
i=0
while [ ! -b /dev/vda ]; do i=$((i + 1)); [ $i -gt 200 ] && echo "FPBENCH-FAIL no disk" && poweroff -f; sleep 0.05; done
dmesg -n 1
mkdir -p /newroot
mount -t ext4 -o ro /dev/vda /newroot || { echo "FPBENCH-FAIL mounting /dev/vda"; poweroff -f; }
echo "FPBENCH-ROOT $(cut -d' ' -f1 /proc/uptime)"
exec switch_root /newroot /fpbench-boot
"""

BOOT_STAGE2 = r"""#!/bin/busybox sh
B=/bin/busybox
$B mount -t proc proc /proc
$B mount -t devtmpfs dev /dev
export PATH=/bin:/sbin:/usr/bin:/usr/sbin
for p in fio mke2fs e2fsck cryptsetup nvme keyctl; do
    x=$($B which $p) && "$x" --version > /dev/null 2>&1
done
$B find / -xdev -type f -exec $B cat {} + > /dev/null
r0=$($B awk '$3 == "vda" { print $6 }' /proc/diskstats)
echo "FPBENCH-BOOTED $($B cut -d' ' -f1 /proc/uptime) $((r0 / 2))"
$B poweroff -f
"""


def boot_initramfs(base, work):
    """The stage-one initramfs of the disk-booting guest (BOOT_INIT) from the image's initramfs
    `base`; its path."""
    d = os.path.join(work, "initramfs-boot")
    os.makedirs(d, exist_ok=True)
    with open(base, "rb") as f:
        subprocess.run(["cpio", "-idm", "--quiet", "bin/busybox", "lib/modules/virtio_blk.ko"], stdin=f,
                       cwd=d, check=True, capture_output=True, timeout=120)
    with open(os.path.join(d, "init"), "w") as f:
        f.write(BOOT_INIT)
    os.chmod(os.path.join(d, "init"), 0o755)
    names = "init\nbin\nbin/busybox\nlib\nlib/modules\nlib/modules/virtio_blk.ko\n"
    archive = subprocess.run(["cpio", "-o", "-H", "newc", "--quiet", "-R", "0:0"], input=names.encode(), cwd=d,
                             check=True, capture_output=True, timeout=60).stdout
    path = os.path.join(work, "initramfs-boot.cpio")
    with open(path, "wb") as f:
        f.write(archive)
    return path


def boot_root_image(base, work, size):
    """An ext4 image of `size` bytes holding the image's initramfs `base` unpacked, with
    BOOT_STAGE2 as /fpbench-boot (mkfs.ext4 -d: no mount, no root); its path and the bytes of
    its files."""
    d = os.path.join(work, "bootroot")
    os.makedirs(d, exist_ok=True)
    with open(base, "rb") as f:
        subprocess.run(["cpio", "-idm", "--quiet", "--no-absolute-filenames"], stdin=f, cwd=d, check=True,
                       capture_output=True, timeout=300)
    for sub in ("proc", "dev", "sys", "tmp"):
        os.makedirs(os.path.join(d, sub), exist_ok=True)
    stage2 = os.path.join(d, "fpbench-boot")
    with open(stage2, "w") as f:
        f.write(BOOT_STAGE2)
    os.chmod(stage2, 0o755)
    files = sum(os.path.getsize(os.path.join(r, n)) for r, _, ns in os.walk(d) for n in ns
                if os.path.isfile(os.path.join(r, n)) and not os.path.islink(os.path.join(r, n)))
    path = os.path.join(work, "bootroot.img")
    with open(path, "wb") as f:
        f.truncate(size)
    run(["mkfs.ext4", "-q", "-F", "-L", "fpboot", "-E", "root_owner=0:0", "-d", d, path], 300)
    return path, files


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


# -- the notification counts (bench/fpbench/sections/guest_notify.py) --------------------------
#
# That section needs fio in the guest, so it boots the guest tests' own initramfs (fio and its
# libraries) with one more file appended: the init below, started with rdinit=. Linux unpacks
# concatenated cpio archives in order, so the appended file joins the image unchanged.
# The host drives it one line at a time on the serial console:
#   run ID DEV QD SECS ENGINE   fio, 4 KiB randread, direct=1, on /dev/DEV; prints one
#                               FPBENCH-RESULT ID line with fio's figures and the counters'
#                               deltas over the fio process
#   quit                        powers off
# Kicks are counted by a kprobe on virtqueue_notify (the kick itself, after the ring's
# notification suppression; vp_notify if that cannot be probed) and one on
# virtqueue_kick_prepare (each chance to kick), their hit counts from kprobe_profile with tracing
# off (the probes count, the ring buffer records nothing). Both counts are global: fio runs on
# one disk at a time and nothing else in the guest touches a virtqueue meanwhile.

NOTIFY_INIT = INIT_PROLOGUE + r"""NDISKS=1
for a in $(cat /proc/cmdline); do case $a in fpbench.disks=*) NDISKS=${a#fpbench.disks=} ;; esac; done
insmod /lib/modules/virtio_blk.ko
i=0
while [ "$(ls -d /sys/block/vd* 2>/dev/null | wc -l)" -lt "$NDISKS" ]; do
    i=$((i + 1)); [ $i -gt 200 ] && echo "FPBENCH-FAIL $NDISKS disks wanted, found: $(ls /sys/block)" && poweroff -f
    sleep 0.05
done
dmesg -n 1
T=/sys/kernel/tracing
mount -t tracefs nodev $T 2>/dev/null
echo 0 > $T/tracing_on 2>/dev/null
PROBE=none
for fn in virtqueue_notify vp_notify; do
    if echo "p:fpbench/fpkick $fn" >> $T/kprobe_events 2>/dev/null &&
        echo 1 > $T/events/fpbench/fpkick/enable 2>/dev/null; then
        PROBE=$fn
        break
    fi
done
PREP=none
if echo "p:fpbench/fpprep virtqueue_kick_prepare" >> $T/kprobe_events 2>/dev/null &&
    echo 1 > $T/events/fpbench/fpprep/enable 2>/dev/null; then
    PREP=virtqueue_kick_prepare
fi
# hits NAME [COLUMN]: a probe's hits (column 2) or misses (3, hits it could not count).
hits() { awk -v n="$1" -v c="${2:-2}" '$1 == n { h = $c } END { print h + 0 }' $T/kprobe_profile 2>/dev/null || echo 0; }
# irqs NAME: the interrupts of the vectors named NAME (virtioN-req or virtioN-config), all CPUs.
irqs() {
    awk -v p="^$1" '$NF ~ p { for (i = 2; i <= NF && $i ~ /^[0-9]+$/; i++) s += $i } END { print s + 0 }' /proc/interrupts
}
for b in /sys/block/vd*; do
    d=${b##*/}
    echo "FPBENCH-DISK $d $(basename "$(readlink "$b/device")") $(basename "$(readlink -f "$b/device/..")") $(cat "$b/device/features")"
done
stty -echo 2>/dev/null
echo "FPBENCH-READY kick=$PROBE prepare=$PREP"
while read -r cmd id dev qd secs engine; do
    case $cmd in
    run)
        v=$(basename "$(readlink /sys/block/$dev/device)")
        set -- $(cat /sys/block/$dev/stat); r0=$1
        q0=$(irqs "$v-req"); c0=$(irqs "$v-config"); k0=$(hits fpkick); p0=$(hits fpprep); m0=$(hits fpkick 3)
        fio --name=gn --filename=/dev/$dev --rw=randread --bs=4k --direct=1 --ioengine=$engine \
            --iodepth=$qd --runtime=$secs --time_based --norandommap --randrepeat=0 \
            --output-format=terse --terse-version=3 > /tmp/fio.out 2> /tmp/fio.err
        rc=$?
        q1=$(irqs "$v-req"); c1=$(irqs "$v-config"); k1=$(hits fpkick); p1=$(hits fpprep); m1=$(hits fpkick 3)
        set -- $(cat /sys/block/$dev/stat); r1=$1
        f=$(grep '^3;' /tmp/fio.out | head -n 1)
        echo "FPBENCH-RESULT $id rc=$rc kib=$(echo "$f" | cut -d';' -f6) iops=$(echo "$f" | cut -d';' -f8)" \
            "ms=$(echo "$f" | cut -d';' -f9) fio_errors=$(echo "$f" | cut -d';' -f5) irqs=$((q1 - q0))" \
            "config_irqs=$((c1 - c0)) kicks=$((k1 - k0)) kicks_missed=$((m1 - m0)) prepares=$((p1 - p0))" \
            "reads=$((r1 - r0))"
        [ $rc -eq 0 ] || echo "FPBENCH-FIOERR $id $(tail -c 400 /tmp/fio.err | tr '\n' ' ')"
        ;;
    quit) poweroff -f ;;
    esac
done
echo "FPBENCH-FAIL the console closed"
poweroff -f
"""


def notify_initramfs(base, work):
    """The guest tests' initramfs `base` with /fpbench-notify (NOTIFY_INIT) appended; its path.
    Boot it with rdinit=/fpbench-notify."""
    return appended_initramfs(base, work, "notify", {"fpbench-notify": NOTIFY_INIT})


def appended_initramfs(base, work, tag, files):
    """The initramfs `base` with `files` appended as one more cpio archive; its path
    (`<work>/initramfs-<tag>.cpio`). `files` maps a path in the guest (relative, no leading /)
    to the file's text (str, made executable) or to a host file to copy (a dict {"src": path});
    the directories on the way are made. Linux unpacks concatenated archives in order, so the
    appended files join the image unchanged (and replace files of the same path)."""
    d = os.path.join(work, f"initramfs-{tag}")
    names = []
    for rel, what in files.items():
        dst = os.path.join(d, rel)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        if isinstance(what, str):
            with open(dst, "w") as f:
                f.write(what)
        else:
            shutil.copyfile(what["src"], dst)
        os.chmod(dst, 0o755)
        parts = rel.split("/")
        names += ["/".join(parts[:k]) for k in range(1, len(parts))] + [rel]
    names = list(dict.fromkeys(names))  # parents first, each once
    extra = subprocess.run(["cpio", "-o", "-H", "newc", "--quiet", "-R", "0:0"], input="\n".join(names).encode() + b"\n",
                           cwd=d, check=True, capture_output=True, timeout=120).stdout
    path = os.path.join(work, f"initramfs-{tag}.cpio")
    with open(base, "rb") as src, open(path, "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
        # The kernel skips NUL padding between archives but wants each header 4-byte aligned.
        dst.write(b"\0" * (-dst.tell() % 4))
        dst.write(extra)
    return path


class ConsoleGuest(Guest):
    """A guest like Guest (TCG, `vcpus` vCPUs, memfd RAM shared with the back ends) with one
    vhost-user-blk disk per socket in `socks` (one queue each, at PCI slots 4, 5, ... in that
    order), booting `rdinit` (NOTIFY_INIT by default), whose serial console also takes input:
    `send` writes a line to it. The console's output still goes to `<dir>/console.log` (QEMU's
    logfile). `cpu` is taskset's CPU list for QEMU."""

    def __init__(self, name, work, cpu, socks, kernel, initrd, mem_mib, vcpus=1, rdinit="/fpbench-notify"):
        self.name = name
        self.dir = os.path.join(work, name)
        os.makedirs(self.dir, exist_ok=True)
        self.qmp_path = os.path.join(self.dir, "qmp.sock")
        self.console = os.path.join(self.dir, "console.log")
        self.serial_path = os.path.join(self.dir, "serial.sock")
        cmd = ["taskset", "-c", str(cpu), "qemu-system-x86_64", "-accel", "tcg", "-cpu", "max",
               "-smp", str(vcpus), "-m", f"{mem_mib}M",
               "-object", f"memory-backend-memfd,id=mem,size={mem_mib}M,share=on",
               "-machine", "memory-backend=mem"]
        for i, sock in enumerate(socks):
            cmd += ["-chardev", f"socket,id=disk{i},path={sock}",
                    "-device", f"vhost-user-blk-pci,chardev=disk{i},num-queues=1,addr={4 + i:#x}"]
        cmd += ["-display", "none", "-nodefaults", "-no-reboot",
                "-chardev", f"socket,id=ser0,path={self.serial_path},server=on,wait=off,logfile={self.console}",
                "-serial", "chardev:ser0",
                "-qmp", f"unix:{self.qmp_path},server=on,wait=off",
                "-kernel", kernel, "-initrd", initrd,
                "-append", f"console=ttyS0 panic=-1 cryptomgr.notests initcall_blacklist=jent_mod_init "
                           f"rdinit={rdinit} fpbench.disks={len(socks)}"]
        self.proc = spawn(cmd, os.path.join(self.dir, "qemu.log"))
        self.qmp = Qmp(self.qmp_path)
        self.serial = socket.socket(socket.AF_UNIX)
        self.serial.connect(self.serial_path)
        # The console's output also comes down the socket: drained here (the logfile keeps it),
        # or the guest would block once the socket's buffer is full.
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self):
        try:
            while self.serial.recv(65536):
                pass
        except OSError:
            pass

    def send(self, line):
        self.serial.sendall(line.encode() + b"\n")

    def stop(self):
        try:
            self.send("quit")
        except OSError:
            pass
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            pass
        try:
            self.serial.close()
        except OSError:
            pass
        super().stop()
