"""ublk (`--only ublk`, never in whole runs): flashpath in a TCG guest serving a null disk as a
Linux block device through ublk_drv, against the kernel's own null_blk and against the kernel's
NBD client connected to flashpath's NBD export of the same disk; then the recovery time after a
`kill -9` of the daemon.

One guest (2 vCPUs) boots the guest tests' image with this section's files appended: an init
(UBLK_INIT) that takes commands on the serial console, flashpath (stripped, from --bin-dir) and
Debian's nbd-client with its libraries. In the guest, flashpath (`--cpus 1`, pinned to vCPU 1)
serves a null bdev as /dev/ublkb7 (one queue on the reactor of vCPU 1) and another made alike
(a ublk disk claims its bdev) over NBD on a Unix socket, which nbd-client connects as /dev/nbd0; null_blk is /dev/nullb0. fio (pinned to vCPU 0)
runs 4 KiB randread at QD32 on the three devices in turn, each repetition. docs/benchmarks.md,
"ublk", describes it.
"""

import os
import re
import shutil
import subprocess

from fpbench.common import log, median, note, ratio
from fpbench.guest import INIT_PROLOGUE, ConsoleGuest, appended_initramfs, boot_image

DEVICES = ("null_blk", "ublk", "nbd")
# The goals: ublk/null_blk and ublk/NBD IOPS at 4 KiB randread QD32; recovery.
GOAL_NULL_BLK = 0.8
GOAL_NBD = 1.0
GOAL_RECOVERY_S = 1.0
NBD_CLIENT = "/usr/sbin/nbd-client"
# null_blk as close to a null device as it goes: no backing memory (reads return whatever the
# buffer held), completions inline in the submitter's context (irqmode=0: no timer, no softirq),
# blk-mq with one submission queue, the null disk's size and block size.
NULL_BLK_PARAMS = ("nr_devices=1 queue_mode=2 irqmode=0 memory_backed=0 submit_queues=1 hw_queue_depth=128 "
                   "bs=4096 gb=1")

# Per mode: fio's seconds per run, repetitions (each: the three devices in turn), the recovery's
# repetitions, guest RAM and its boot timeout.
CONFIG = {
    "full": {"secs": 10, "reps": 5, "qd": 32, "engine": "libaio", "recovery_reps": 3, "vcpus": 2, "mem_mib": 1024,
             "boot_timeout": 300},
    "quick": {"secs": 4, "reps": 3, "qd": 32, "engine": "libaio", "recovery_reps": 3, "vcpus": 2, "mem_mib": 1024,
              "boot_timeout": 300},
}

UBLK_INIT = INIT_PROLOGUE + r"""export FLASHPATH_RPC=/tmp/fp.sock
mkdir -p /tmp/vhost
dmesg -n 1
up() { cut -d' ' -f1 /proc/uptime; }
fail() { echo "FPBENCH-FAIL $*"; poweroff -f; }
PIN=""
command -v taskset >/dev/null 2>&1 && PIN="taskset -c 1"
PINNED=$([ -n "$PIN" ] && echo vcpu1 || echo no)
NSTARTS=0
# serve [CONFIG]: flashpath on vCPU 1 (reactor and control threads); FP_T0 when it was started,
# FP_TRPC when its socket first answered (/proc/uptime, 10 ms steps).
serve() {
    NSTARTS=$((NSTARTS + 1))
    rm -f /tmp/fp.sock
    FP_T0=$(up)
    $PIN flashpath serve --cpus 1 --vhost-dir /tmp/vhost --log-level info ${1:+--config "$1"} >/tmp/fp$NSTARTS.log 2>&1 &
    FP_PID=$!
    i=0
    until flashpath version >/dev/null 2>&1; do
        i=$((i + 1))
        [ $i -gt 3000 ] && fail "flashpath serve did not answer: $(tail -c 600 /tmp/fp$NSTARTS.log)"
        sleep 0.01
    done
    FP_TRPC=$(up)
}
rpc() { flashpath rpc "$@" >/tmp/rpc.out 2>&1 || fail "flashpath rpc $1: $(cat /tmp/rpc.out)"; }
waitdev() {
    i=0
    until [ -b "$1" ] && [ "$(cat /sys/block/${1#/dev/}/size 2>/dev/null || echo 0)" -gt 0 ]; do
        i=$((i + 1)); [ $i -gt 300 ] && fail "$1 did not appear"; sleep 0.1
    done
}
insmod /lib/modules/configfs.ko 2>/dev/null
insmod /lib/modules/null_blk.ko __NULL_BLK_PARAMS__ || fail "insmod null_blk.ko"
insmod /lib/modules/ublk_drv.ko || fail "insmod ublk_drv.ko"
insmod /lib/modules/nbd.ko nbds_max=1 || fail "insmod nbd.ko"
waitdev /dev/nullb0
cat >/tmp/fp-recover.toml <<EOT
[[bdev]]
type = "null"
name = "null0"
num_blocks = 262144
block_size = 4096

[ublk_target]
cpumask = "0x2"

[[ublk_recover_disk]]
bdev_name = "null0"
ublk_id = 7
EOT
serve
rpc bdev_null_create '{"name": "null0", "num_blocks": 262144, "block_size": 4096}'
rpc ublk_create_target '{"cpumask": "0x2"}'
rpc ublk_start_disk '{"bdev_name": "null0", "ublk_id": 7, "num_queues": 1, "queue_depth": 128, "user_recovery": true}'
waitdev /dev/ublkb7
# A ublk disk claims its bdev, so NBD serves a second null bdev made alike.
rpc bdev_null_create '{"name": "null1", "num_blocks": 262144, "block_size": 4096}'
rpc nbd_start_disk '{"bdev_name": "null1", "nbd_device": "/tmp/null1.nbd"}'
/usr/sbin/nbd-client -unix /tmp/null1.nbd /dev/nbd0 -name null1 -block-size 4096 >/tmp/nbdc.log 2>&1 ||
    fail "nbd-client: $(tail -c 400 /tmp/nbdc.log)"
waitdev /dev/nbd0
for d in nullb0 ublkb7 nbd0; do
    echo "FPBENCH-DEV $d size=$(cat /sys/block/$d/size) lbs=$(cat /sys/block/$d/queue/logical_block_size)" \
        "sched=$(sed 's/.*\[\(.*\)\].*/\1/' /sys/block/$d/queue/scheduler 2>/dev/null) nr_hw_queues=$(ls /sys/block/$d/mq 2>/dev/null | wc -l)"
done
echo "FPBENCH-NULLBLK $(for p in queue_mode irqmode memory_backed submit_queues hw_queue_depth bs gb; do
    printf '%s=%s ' $p "$(cat /sys/module/null_blk/parameters/$p 2>/dev/null)"; done)"
echo "FPBENCH-UBLK $(flashpath --json ublk list 7 | tr -d ' \n')"
stty -echo 2>/dev/null
echo "FPBENCH-READY guest vcpus=$(nproc) kernel=$(uname -r) pin=$PINNED nbd_client=$(/usr/sbin/nbd-client -V 2>&1 | head -n 1 | tr ' ' '_')"
while read -r cmd id dev qd secs engine; do
    case $cmd in
    run)
        fio --name=u --filename=/dev/$dev --rw=randread --bs=4k --direct=1 --ioengine=$engine \
            --iodepth=$qd --runtime=$secs --time_based --norandommap --randrepeat=0 --cpus_allowed=0 \
            --output-format=terse --terse-version=3 >/tmp/fio.out 2>/tmp/fio.err
        rc=$?
        f=$(grep '^3;' /tmp/fio.out | head -n 1)
        echo "FPBENCH-RESULT $id rc=$rc kib=$(echo "$f" | cut -d';' -f6) iops=$(echo "$f" | cut -d';' -f8)" \
            "ms=$(echo "$f" | cut -d';' -f9) clat_mean_us=$(echo "$f" | cut -d';' -f16) fio_errors=$(echo "$f" | cut -d';' -f5)"
        [ $rc -eq 0 ] || echo "FPBENCH-FIOERR $id $(tail -c 400 /tmp/fio.err | tr '\n' ' ')"
        ;;
    recover)
        # fio writing /dev/ublkb7 (vCPU 0), then kill -9 of the daemon under it.
        set -- $(cat /sys/block/ublkb7/stat); w0=$5
        fio --name=w --filename=/dev/ublkb7 --rw=randwrite --bs=4k --direct=1 --ioengine=libaio --iodepth=32 \
            --runtime=300 --time_based --norandommap --randrepeat=0 --cpus_allowed=0 >/tmp/fio-rec.out 2>&1 &
        F=$!
        i=0
        while set -- $(cat /sys/block/ublkb7/stat); [ $(($5 - w0)) -lt 2000 ]; do
            i=$((i + 1)); [ $i -gt 300 ] && fail "fio's writes did not reach /dev/ublkb7"; sleep 0.05
        done
        kill -9 $FP_PID
        wait $FP_PID 2>/dev/null
        TK=$(up)
        set -- $(cat /sys/block/ublkb7/stat); wk=$5
        # The probe: one direct 4 KiB read, started while no daemon serves the device (the kernel
        # holds it); the time it completes is the first I/O served after the restart.
        rm -f /tmp/probe
        ( dd if=/dev/ublkb7 of=/dev/null bs=4096 count=1 iflag=direct 2>/dev/null; echo "$? $(up)" >/tmp/probe ) &
        P=$!
        sleep 0.3
        held=$([ -s /tmp/probe ] && echo no || echo yes)
        kept=$([ -b /dev/ublkb7 ] && echo yes || echo no)
        serve /tmp/fp-recover.toml
        i=0
        until [ -s /tmp/probe ]; do
            i=$((i + 1)); [ $i -gt 3000 ] && fail "the probe read did not complete after the restart"; sleep 0.01
        done
        wait $P
        set -- $(cat /tmp/probe); prc=$1; tio=$2
        # fio goes on writing through the recovered device for a moment, then stops.
        set -- $(cat /sys/block/ublkb7/stat); w1=$5
        sleep 1
        set -- $(cat /sys/block/ublkb7/stat); w2=$5
        kill -INT $F
        wait $F
        frc=$?
        log=/tmp/fp$NSTARTS.log
        echo "FPBENCH-RECOVERY $id kill=$TK start=$FP_T0 rpc=$FP_TRPC io=$tio probe_rc=$prc held=$held kept=$kept" \
            "writes_before_kill=$((wk - w0)) writes_after=$((w2 - w1)) fio_rc=$frc fio_err=$(sed -n 's/.*err= *\([0-9-]*\).*/\1/p' /tmp/fio-rec.out | head -n 1)" \
            "log_recovering=$(grep -h 'recovering' $log | head -n 1 | cut -d']' -f1 | tr -d '[ ')" \
            "log_recovered=$(grep -h 'recovered (bdev' $log | head -n 1 | cut -d']' -f1 | tr -d '[ ')"
        ;;
    quit) poweroff -f ;;
    esac
done
fail "the console closed"
"""


def ublk_config(mode):
    """The section's settings for `mode`, or None (smoke: never)."""
    return CONFIG.get(mode)


def ublk_missing(bin_dir=None):
    """What the section needs and this machine lacks: QEMU, cpio, strip, nbd-client (Debian's
    nbd-client, for the guest) and, given `bin_dir`, a flashpath there."""
    tools = {"qemu-system-x86_64": "qemu-system-x86", "cpio": "cpio", "strip": "binutils"}
    out = [f"{t} ({pkg})" for t, pkg in tools.items() if shutil.which(t) is None]
    if not os.access(NBD_CLIENT, os.X_OK):
        out.append(f"{NBD_CLIENT} (nbd-client)")
    if bin_dir and not os.access(os.path.join(bin_dir, "flashpath"), os.X_OK):
        out.append(f"{bin_dir}/flashpath")
    return out


def libraries(binary):
    """The shared libraries `ldd` resolves for `binary` (absolute paths; the loader too)."""
    out = subprocess.run(["ldd", binary], capture_output=True, text=True, timeout=60).stdout
    return parse_ldd(out)


def parse_ldd(text):
    """The library paths in ldd's output: `name => /path (addr)` and `/path (addr)` lines; not
    the vDSO, nor libraries ldd did not find (those would fail in the guest, and the boot says so)."""
    libs = []
    for line in text.splitlines():
        m = re.search(r"(?:=>\s*)?(/\S+)\s+\(0x[0-9a-f]+\)", line)
        if m:
            libs.append(m.group(1))
    return list(dict.fromkeys(libs))


def ublk_initramfs(base, work, bin_dir):
    """The guest tests' initramfs `base` with UBLK_INIT (/fpbench-ublk), flashpath stripped as
    /usr/bin/flashpath and nbd-client with its libraries (at their host paths) appended; its path."""
    fp = os.path.join(work, "flashpath-stripped")
    subprocess.run(["strip", "-o", fp, os.path.join(bin_dir, "flashpath")], check=True, capture_output=True, timeout=120)
    files = {"fpbench-ublk": UBLK_INIT.replace("__NULL_BLK_PARAMS__", NULL_BLK_PARAMS),
             "usr/bin/flashpath": {"src": fp}, NBD_CLIENT.lstrip("/"): {"src": NBD_CLIENT}}
    for b in (NBD_CLIENT, fp):
        for lib in libraries(b):
            files.setdefault(lib.lstrip("/"), {"src": os.path.realpath(lib)})
    return appended_initramfs(base, work, "ublk", files)


def parse_fields(line, tag):
    """(id, fields) of a `TAG ID key=value ...` console line, or None: values as int or float
    where they parse, else the string (an empty value is None)."""
    m = re.search(rf"{re.escape(tag)} (\S+) (.*)$", line)
    if not m:
        return None
    out = {}
    for kv in m.group(2).split():
        k, _, v = kv.partition("=")
        for kind in (int, float):
            try:
                out[k] = kind(v)
                break
            except ValueError:
                pass
        else:
            out[k] = v or None
    return m.group(1), out


def recovery_times(f):
    """One recovery's figures from its FPBENCH-RECOVERY fields (guest uptime, 10 ms steps):
    from the restarted daemon's start and from its socket answering until the probe read
    completed, and from the kill to that; the daemon's own log clock (its start to the recovery
    done) when logged."""
    def since(a, b):
        return None if not isinstance(a, (int, float)) or not isinstance(b, (int, float)) else round(b - a, 3)
    return {"from_start_s": since(f.get("start"), f.get("io")), "from_rpc_s": since(f.get("rpc"), f.get("io")),
            "from_kill_s": since(f.get("kill"), f.get("io")),
            "log_recovered_s": f.get("log_recovered") if isinstance(f.get("log_recovered"), (int, float)) else None}


def ublk_summary(runs):
    """Per device: the runs, the median, min and max IOPS and the errors; the ratios of the
    medians (ublk over null_blk, ublk over NBD), and the same ratio per repetition (the devices
    ran back to back, so a repetition's ratio sees the same machine load)."""
    out = {"devices": {}, "ratios": {}, "rep_ratios": {"null_blk": [], "nbd": []}}
    for d in DEVICES:
        ok = [r["iops"] for r in runs if r["device"] == d and "error" not in r]
        out["devices"][d] = {"runs": len(ok), "iops": median(ok), "min": min(ok) if ok else None,
                             "max": max(ok) if ok else None,
                             "clat_mean_us": median([r.get("clat_mean_us") for r in runs
                                                     if r["device"] == d and "error" not in r]),
                             "errors": [r["error"] for r in runs if r["device"] == d and "error" in r]}
    u = out["devices"]["ublk"]["iops"]
    out["ratios"] = {"null_blk": ratio(u, out["devices"]["null_blk"]["iops"]),
                     "nbd": ratio(u, out["devices"]["nbd"]["iops"])}
    reps = sorted({r["rep"] for r in runs})
    for rep in reps:
        got = {r["device"]: r["iops"] for r in runs if r["rep"] == rep and "error" not in r}
        for other in ("null_blk", "nbd"):
            x = ratio(got.get("ublk"), got.get(other))
            if x is not None:
                out["rep_ratios"][other].append(x)
    return out


def recovery_summary(recs):
    """Over the recoveries that completed: the median and worst of each time, and how many
    held the probe while no daemon served, kept the device and let fio finish without error."""
    ok = [r for r in recs if "error" not in r]
    out = {"runs": len(ok), "errors": [r["error"] for r in recs if "error" in r]}
    for k in ("from_start_s", "from_rpc_s", "from_kill_s", "log_recovered_s"):
        v = [r[k] for r in ok if r.get(k) is not None]
        out[k] = {"median": median(v), "max": max(v) if v else None}
    out["held"] = sum(1 for r in ok if r.get("held") == "yes")
    out["kept"] = sum(1 for r in ok if r.get("kept") == "yes")
    # fio stopped by SIGINT after the recovery: its own error status (err=) 0, and writes done
    # through the recovered device.
    out["fio_clean"] = sum(1 for r in ok if r.get("fio_err") == 0 and (r.get("writes_after") or 0) > 0)
    out["probe_ok"] = sum(1 for r in ok if r.get("probe_rc") == 0)
    return out


class UblkSection:
    """Bench's methods for this section (mixed into bench.Bench)."""

    def run_ublk(self):
        c = ublk_config(self.args.mode) or CONFIG["quick"]
        e = {"config": c, "null_blk_params": NULL_BLK_PARAMS, "runs": [], "recoveries": [], "notes": []}
        self.results["ublk"] = e
        missing = ublk_missing(self.args.bin_dir)
        if missing:
            note(e, f"not run: this machine lacks {', '.join(missing)}")
            return
        try:
            kernel, base = boot_image()
            initrd = ublk_initramfs(base, self.work, self.args.bin_dir)
        except Exception as ex:  # noqa: BLE001 - the reason goes in the results
            note(e, f"not run: no guest image: {str(ex)[-500:]}")
            return
        guest = None
        try:
            # QEMU on both host CPUs: each vCPU is a host thread (multi-threaded TCG).
            cpus = f"{self.server_cpu},{self.client_cpu}"
            guest = ConsoleGuest("guest-ublk", self.work, cpus, [], kernel, initrd, c["mem_mib"], vcpus=c["vcpus"],
                                 rdinit="/fpbench-ublk")
            ready = guest.wait_line("FPBENCH-READY", c["boot_timeout"])
            e["guest"] = self.ublk_guest_info(guest, ready, kernel, c, cpus)
            devs = {"null_blk": "nullb0", "ublk": "ublkb7", "nbd": "nbd0"}
            for rep in range(c["reps"]):
                # The three devices in turn, the order rotated each repetition.
                order = DEVICES[rep % 3:] + DEVICES[:rep % 3]
                for d in order:
                    e["runs"].append(self.ublk_run(guest, d, devs[d], rep, c))
            for rep in range(c["recovery_reps"]):
                e["recoveries"].append(self.ublk_recover(guest, rep))
        except Exception as ex:  # noqa: BLE001 - recorded; the runs so far stand
            note(e, f"stopped: {str(ex)[-800:]}")
        finally:
            if guest is not None:
                guest.stop()
                e["console_tail"] = guest.lines()[-40:]
        e["summary"] = ublk_summary(e["runs"])
        e["recovery"] = recovery_summary(e["recoveries"])

    def ublk_guest_info(self, guest, ready, kernel, c, cpus):
        info = {"kernel": os.path.basename(os.path.dirname(kernel)), "accel": "tcg", "qemu_cpus": cpus,
                "mem_mib": c["mem_mib"], "devices": {}}
        got = parse_fields(ready, "FPBENCH-READY") or (None, {})
        info.update({k: v for k, v in got[1].items()})
        for line in guest.lines():
            p = parse_fields(line, "FPBENCH-DEV")
            if p:
                info["devices"][p[0]] = p[1]
            if line.startswith("FPBENCH-NULLBLK "):
                info["null_blk"] = dict(kv.split("=", 1) for kv in line.split()[1:] if "=" in kv)
            if line.startswith("FPBENCH-UBLK "):
                info["ublk_disk"] = line.split(" ", 1)[1].strip()
        log(f"guest up: {info.get('vcpus')} vCPUs, devices {', '.join(info['devices'])}, daemon pinned "
            f"{info.get('pin')}")
        return info

    def ublk_run(self, guest, device, dev, rep, c):
        rid = f"{device}-{rep}"
        guest.send(f"run {rid} {dev} {c['qd']} {c['secs']} {c['engine']}")
        line = guest.wait_line(rf"FPBENCH-RESULT {re.escape(rid)} ", c["secs"] + 120)
        g = parse_fields(line, "FPBENCH-RESULT")[1]
        r = {"device": device, "dev": dev, "rep": rep, "guest": g}
        if g.get("rc") != 0 or not g.get("iops"):
            err = [x for x in guest.lines() if x.startswith(f"FPBENCH-FIOERR {rid} ")]
            r["error"] = f"fio exited {g.get('rc')}: {err[0][len(rid) + 16:] if err else 'no output'}"
            log(f"ublk {rid}: {r['error']}")
            return r
        r.update({"iops": g["iops"], "clat_mean_us": g.get("clat_mean_us")})
        log(f"ublk {device:<8} #{rep}: {g['iops']:>7} IOPS (mean completion latency {g.get('clat_mean_us')} µs)")
        return r

    def ublk_recover(self, guest, rep):
        rid = f"rec-{rep}"
        guest.send(f"recover {rid}")
        line = guest.wait_line(rf"FPBENCH-RECOVERY {re.escape(rid)} ", 240)
        f = parse_fields(line, "FPBENCH-RECOVERY")[1]
        r = dict(f, rep=rep, **recovery_times(f))
        if f.get("probe_rc") != 0:
            r["error"] = f"the probe read failed (dd exit {f.get('probe_rc')})"
        log(f"ublk recovery #{rep}: first I/O {r['from_start_s']} s after the daemon's start, {r['from_rpc_s']} s "
            f"after its socket answered, {r['from_kill_s']} s after the kill; held={f.get('held')} kept={f.get('kept')} "
            f"fio exit {f.get('fio_rc')}")
        return r
