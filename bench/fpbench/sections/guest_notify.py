"""Notifications in a real guest (issue 23): interrupts and kicks per I/O when a Linux guest
(TCG) runs fio on a flashpath disk and on a qemu-storage-daemon disk.

One guest boots with both disks (a null disk from each server, one queue each) and runs fio,
4 KiB randread with O_DIRECT, at each queue depth on one disk at a time, the servers
interleaved. The guest counts, around each fio run, the interrupts of the disk's request
vector (/proc/interrupts) and the kicks (a kprobe on virtqueue_notify); the host reads
flashpath's own counters around the same run. docs/benchmarks.md, "Notifications in a real
guest", describes it. Not in smoke runs: the guest boots under TCG.
"""

import os
import re
import shutil
import subprocess

from fpbench.common import GIB, log, median, note, proc_cpu, ratio
from fpbench.guest import ConsoleGuest, guest_boot_files, notify_initramfs
from fpbench.servers import Flashpath, Qsd

SERVERS = ("flashpath", "qsd")
CTRLR = "gn.fp"
# flashpath's per-controller counters read around each run (vhost_get_controllers "stats"):
# `kicks` only once the daemon counts them.
FP_COUNTERS = ("notifications", "kicks", "read_ops")

# Per mode: fio's seconds per run, repetitions per (server, QD), queue depths, fio's engine,
# guest RAM (the guest tests' 86 MiB initramfs needs 320 MiB to unpack) and the disk's size.
CONFIG = {
    "full": {"secs": 3, "reps": 3, "qds": [1, 32], "engine": "libaio", "mem_mib": 384, "size": GIB,
             "boot_timeout": 180},
    "quick": {"secs": 2, "reps": 2, "qds": [1, 32], "engine": "libaio", "mem_mib": 384, "size": GIB,
              "boot_timeout": 180},
}

RESULT_RX = re.compile(r"FPBENCH-RESULT (\S+) (.*)$")


def guest_notify_config(mode):
    """The section's settings for `mode`, or None (smoke: never)."""
    return CONFIG.get(mode)


def guest_notify_missing():
    """What the section needs and this machine lacks: QEMU (qemu-system-x86), cpio and what
    tests/guest/build-image.sh needs to build the image (it names those itself)."""
    tools = {"qemu-system-x86_64": "qemu-system-x86", "cpio": "cpio"}
    return [f"{t} ({pkg})" for t, pkg in tools.items() if shutil.which(t) is None]


def fp_counters(fp):
    r = fp.rpc("vhost_get_controllers", {"name": CTRLR})
    st = (r[0] if r else {}).get("stats", {})
    return {k: st[k] for k in FP_COUNTERS if isinstance(st.get(k), int)}


def parse_result(line):
    """The key=value fields of a FPBENCH-RESULT line, as ints where they are."""
    m = RESULT_RX.search(line)
    out = {}
    for kv in m.group(2).split():
        k, _, v = kv.partition("=")
        try:
            out[k] = int(v)
        except ValueError:
            out[k] = v or None
    return out


def per_io(n, ios):
    return None if n is None or not ios else n / ios


class GuestNotifySection:
    """Bench's methods for this section (mixed into bench.Bench)."""

    def run_guest_notify(self):
        c = guest_notify_config(self.args.mode) or CONFIG["quick"]
        e = {"config": c, "serve_args": self.args.guest_notify_serve_args, "runs": [], "summary": [], "notes": []}
        self.results["guest_notify"] = e
        missing = guest_notify_missing()
        if missing:
            note(e, f"not run: this machine lacks {', '.join(missing)}")
            return
        try:
            kernel, initrd = guest_boot_files(notify_initramfs, self.work)
        except Exception as ex:  # noqa: BLE001 - the reason goes in the results
            note(e, f"not run: no guest image: {str(ex)[-500:]}")
            return
        servers = {}
        guest = None
        try:
            fp = Flashpath(self.args.bin_dir, self.work, str(self.server_cpu), name="flashpath-gn",
                           extra=self.args.guest_notify_serve_args.split())
            servers["flashpath"] = fp
            fp.rpc("bdev_null_create", {"name": "Null0", "num_blocks": c["size"] // 512, "block_size": 512})
            fp.sock = fp.export(CTRLR, "Null0", 1)
            q = Qsd(self.work, self.server_cpu, "null", c["size"], None, queues=1, name="qsd-gn")
            servers["qsd"] = q
            guest = ConsoleGuest("guest-gn", self.work, self.client_cpu, [fp.sock, q.sock], kernel, initrd,
                                 c["mem_mib"])
            ready = guest.wait_line("FPBENCH-READY", c["boot_timeout"])
            e["guest"] = self.gn_guest_info(guest, ready, kernel, c)
            slots = {"flashpath": "0000:00:04.0", "qsd": "0000:00:05.0"}
            devs = {kind: d["dev"] for kind in SERVERS for d in e["guest"]["disks"] if d["pci"] == slots[kind]}
            if len(devs) != len(SERVERS):
                raise RuntimeError(f"the guest's disks are not at PCI slots {slots}: {e['guest']['disks']}")
            for rep in range(c["reps"]):
                for qd in c["qds"]:
                    for kind in (SERVERS if rep % 2 == 0 else SERVERS[::-1]):
                        e["runs"].append(self.gn_run(guest, servers[kind], kind, devs[kind], qd, rep, c))
        except Exception as ex:  # noqa: BLE001 - recorded; the runs so far stand
            note(e, f"stopped: {str(ex)[-800:]}")
        finally:
            if guest is not None:
                guest.stop()
            for s in servers.values():
                s.stop()
        e["summary"] = gn_summary(e["runs"], c)
        e["checks"] = gn_checks(e["runs"])

    def gn_guest_info(self, guest, ready, kernel, c):
        """What the guest reported at boot: its disks (device, virtio device, PCI slot, the
        negotiated feature bits) and which functions its kprobes count."""
        disks = []
        for line in guest.lines():
            m = re.match(r"FPBENCH-DISK (\S+) (\S+) (\S+) ([01]+)$", line.strip())
            if m:
                f = m.group(4)
                disks.append({"dev": m.group(1), "virtio": m.group(2), "pci": m.group(3), "features": f,
                              "event_idx": f[29:30] == "1", "packed": f[34:35] == "1"})
        probes = dict(kv.split("=", 1) for kv in ready.split()[1:])
        info = {"kernel": os.path.basename(os.path.dirname(kernel)), "vcpus": 1, "accel": "tcg",
                "mem_mib": c["mem_mib"], "disks": disks, "kick_probe": probes.get("kick"),
                "prepare_probe": probes.get("prepare")}
        log(f"guest up: disks {', '.join(d['dev'] + '@' + d['pci'] for d in disks)}, kicks counted at "
            f"{info['kick_probe']}")
        if info["kick_probe"] in (None, "none"):
            raise RuntimeError("the guest kernel refused the kprobe on virtqueue_notify and vp_notify")
        return info

    def gn_run(self, guest, server, kind, dev, qd, rep, c):
        """One fio run on `dev` (served by `server`), with the guest's and flashpath's counters
        around it."""
        rid = f"{kind}-qd{qd}-{rep}"
        c0 = fp_counters(server) if kind == "flashpath" else {}
        cpu0 = proc_cpu(server.pid)
        guest.send(f"run {rid} {dev} {qd} {c['secs']} {c['engine']}")
        line = guest.wait_line(rf"FPBENCH-RESULT {re.escape(rid)} ", c["secs"] + 120)
        cpu1 = proc_cpu(server.pid)
        c1 = fp_counters(server) if kind == "flashpath" else {}
        g = parse_result(line)
        r = {"server": kind, "qd": qd, "rep": rep, "dev": dev, "guest": g}
        if g.get("rc") != 0 or not g.get("kib"):
            err = [x for x in guest.lines() if x.startswith(f"FPBENCH-FIOERR {rid} ")]
            r["error"] = f"fio exited {g.get('rc')}: {err[0][len(rid) + 16:] if err else 'no output'}"
            log(f"guest-notify {rid}: {r['error']}")
            return r
        ios = g["kib"] // 4  # 4 KiB reads
        r.update({"ios": ios, "iops": g["iops"], "irqs_per_io": per_io(g["irqs"], ios),
                  "kicks_per_io": per_io(g["kicks"], ios), "prepares_per_io": per_io(g["prepares"], ios),
                  "config_irqs": g["config_irqs"], "disk_reads": g["reads"], "kicks_missed": g.get("kicks_missed"),
                  "server_cpu_ns_per_io": per_io(cpu1["sched_ns"] - cpu0["sched_ns"], ios),
                  "server_wait_ns_per_io": per_io(cpu1["wait_ns"] - cpu0["wait_ns"], ios)})
        for k in c0:
            if k in c1:
                r[f"server_{k}"] = c1[k] - c0[k]
                r[f"server_{k}_per_io"] = per_io(c1[k] - c0[k], ios)
        log(f"guest-notify {kind:<9} QD{qd:<2} #{rep}: {g['iops']:>6} IOPS, {r['irqs_per_io']:.3f} irqs/IO, "
            f"{r['kicks_per_io']:.3f} kicks/IO ({r['prepares_per_io']:.3f} kick chances/IO)"
            + (f", server notifications {r['server_notifications_per_io']:.3f}/IO"
               if r.get("server_notifications_per_io") is not None else ""))
        return r


def gn_summary(runs, c):
    """Per (QD, server): the medians over the repetitions; and flashpath over qsd per QD."""
    keys = ("iops", "irqs_per_io", "kicks_per_io", "prepares_per_io", "server_cpu_ns_per_io", "server_wait_ns_per_io",
            "server_notifications_per_io", "server_kicks_per_io", "server_read_ops_per_io")
    out = []
    for qd in c["qds"]:
        row = {"qd": qd, "servers": {}, "ratios": {}}
        for kind in SERVERS:
            ok = [r for r in runs if r["server"] == kind and r["qd"] == qd and "error" not in r]
            med = {k: median([r.get(k) for r in ok]) for k in keys}
            rng = {k: [min(v), max(v)] for k in ("irqs_per_io", "kicks_per_io")
                   if (v := [r[k] for r in ok if r.get(k) is not None])}
            row["servers"][kind] = {"runs": len(ok), "median": med, "range": rng,
                                    "errors": [r["error"] for r in runs if r["server"] == kind and r["qd"] == qd
                                               and "error" in r]}
        f, q = row["servers"]["flashpath"]["median"], row["servers"]["qsd"]["median"]
        row["ratios"] = {k: ratio(f[k], q[k]) for k in ("iops", "irqs_per_io", "kicks_per_io", "server_cpu_ns_per_io")}
        out.append(row)
    return out


def gn_checks(runs):
    """What would make the counts wrong, summed over the runs: kprobe hits the kernel could not
    count, config interrupts (counted apart), and fio's I/Os against the disk's own read count
    (they differ only if something else read the disk)."""
    ok = [r for r in runs if "error" not in r]
    return {"kicks_missed": sum(r.get("kicks_missed") or 0 for r in ok),
            "config_irqs": sum(r.get("config_irqs") or 0 for r in ok),
            "disk_reads_minus_fio_ios": sum(r["disk_reads"] - r["ios"] for r in ok)}
