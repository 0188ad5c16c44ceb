"""Live migration (issue 22): the dirty log's cost, migration downtime and total time against
qemu-storage-daemon, and the back-end mirror's copy speed against nbdcopy.

docs/benchmarks.md, "Live migration", describes every step. Each part records what it could
not measure (a method or feature the daemon lacks, a refused migration) instead of failing the
run, so the section also runs against a daemon without the migration work.
"""

import hashlib
import json
import os
import subprocess
import tempfile
import time

from fpbench.common import MIB, log, median, note, proc_cpu, ratio, run, wait_for
from fpbench.guest import Guest, bench_initramfs, guest_boot_files, guest_rate, log_migration, migrate
from fpbench.load import measure
from fpbench.servers import Flashpath, Qsd, spawn, stop

# The back end's dirty-log counters in vhost_get_controllers' "stats" (crates/vhost-blk).
LOG_COUNTERS = ("logged_pages", "logged_data_pages")
MIRROR_METHODS = ("bdev_nbd_client_create", "bdev_mirror_start", "bdev_mirror_get_jobs")


def err_text(e):
    """A failed command's own message (its stderr), else the exception's."""
    if isinstance(e, subprocess.CalledProcessError):
        return (e.stderr or e.stdout or str(e)).strip()[-500:]
    return str(e)[-500:]


def ctrl_stats(fp, ctrlr):
    """The controller's stats object from vhost_get_controllers."""
    r = fp.rpc("vhost_get_controllers", {"name": ctrlr})
    return (r[0] if r else {}).get("stats", {})


class MigrationSection:
    """Bench's methods for this section (mixed into bench.Bench)."""

    def run_migration(self):
        c = self.cfg["migration"]
        e = {"config": c, "logging": [], "migrations": [], "mirror": None, "notes": []}
        self.results["migration"] = e
        log("--- the dirty log's cost: fp-load's own frontend, logging off vs on")
        self.mig_logging(c["logging"], e)
        log("--- migration downtime and total time: two QEMUs (TCG), flashpath vs qsd")
        self.mig_migrations(c["migrate"], e)
        log("--- the back-end mirror vs nbdcopy, flashpath NBD export to flashpath NBD export")
        self.mig_mirror(c["mirror"], e)

    # -- 1. the dirty log's cost ---------------------------------------------------------------

    def mig_logging(self, c, e):
        """fp-load --frontend (logging off) vs --dirty-log (on) on a RAM disk of each server,
        QD32 4 KiB randread and randwrite, one polled queue, interleaved run by run with the
        order of off/on reversed every repetition."""
        size = c["size_mib"] * MIB
        fp = Flashpath(self.args.bin_dir, self.work, str(self.server_cpu), name="flashpath-log")
        servers = []
        try:
            fp.rpc("bdev_malloc_create", {"name": "Malloc0", "num_blocks": size // 512, "block_size": 512})
            fsock = fp.export("vhost.log", "Malloc0", 1)
            self.fill_ram(fsock, size)
            servers.append((fp, fsock))
            path = self.backing_path("ram", size)
            q = Qsd(self.work, self.server_cpu, "ram", size, path, queues=1, name="qsd-log")
            servers.append((q, q.sock))
            for pattern in c["patterns"]:
                point = (pattern, 4096, c["qd"], 1, True)
                for s, sock in servers:
                    runs = {"off": [], "on": []}
                    entry = {"server": s.kind, "pattern": pattern, "qd": c["qd"], "runs": runs}
                    for rep in range(c["reps"]):
                        order = ("off", "on") if rep % 2 == 0 else ("on", "off")
                        for mode in order:
                            r = self.mig_log_run(s, sock, point, c["secs"], mode)
                            if "error" in r:
                                entry["error"] = r["error"]
                                break
                            runs[mode].append(r)
                        if "error" in entry:
                            break
                    self.mig_log_summary(entry)
                    e["logging"].append(entry)
        finally:
            for s, _ in servers:
                s.stop()
            if not servers:
                fp.stop()

    def mig_log_run(self, server, sock, point, secs, mode):
        """One run with logging `mode` (off: --frontend, on: --dirty-log); the measurement with
        the log's report and, for flashpath, its counters' deltas; or {"error": why}."""
        flag = "--dirty-log" if mode == "on" else "--frontend"
        c0 = ctrl_stats(server, "vhost.log") if server.kind == "flashpath" else None
        try:
            r = measure(server, self.loader, sock, point, secs, False, extra=(flag,))
        except (subprocess.CalledProcessError, RuntimeError) as ex:
            why = err_text(ex)
            log(f"logging {mode} on {server.kind}: not measured: {why}")
            return {"error": why}
        r.setdefault("dirty_log", None)
        if c0 is not None:
            c1 = ctrl_stats(server, "vhost.log")
            for k in LOG_COUNTERS:
                if isinstance(c0.get(k), int) and isinstance(c1.get(k), int):
                    r[k] = c1[k] - c0[k]
                    r[k + "_per_io"] = r[k] / r["ios"] if r["ios"] else None
        d = r["dirty_log"] or {}
        log(f"logging {mode:<3} {server.kind:<9} {point[0]:<9} {r['iops']:>9.0f} IOPS"
            + (f"  log: {d.get('bits_seen')} bits in {d.get('syncs')} scans, data pages {d.get('data_pages')}"
               f"/{d.get('data_pages_expected')} expected" if d else "")
            + (f"  back end: {r.get('logged_pages_per_io'):.2f} pages/IO ({r.get('logged_data_pages_per_io'):.2f} data)"
               if r.get("logged_pages_per_io") is not None else ""))
        return r

    def mig_log_summary(self, entry):
        runs = entry["runs"]
        md = {m: median([r["iops"] for r in runs[m]]) for m in ("off", "on")}
        entry["median_iops"] = md
        entry["ratio"] = ratio(md["on"], md["off"])
        # Each repetition's off and on ran back to back: their ratios drift less than the medians.
        entry["pair_ratios"] = [ratio(b["iops"], a["iops"]) for a, b in zip(runs["off"], runs["on"])]
        busy = [ratio(b.get("reactor_busy_ns_per_io"), a.get("reactor_busy_ns_per_io"))
                for a, b in zip(runs["off"], runs["on"])]
        entry["busy_per_io_ratio"] = median(busy) if any(x is not None for x in busy) else None
        on = runs["on"]
        entry["pages"] = {
            k: median([r.get(k) for r in on]) for k in
            ("logged_pages_per_io", "logged_data_pages_per_io")
        }
        # The counters also count the requests in flight when fp-load stopped counting (at most
        # the queue depth): the back end's data pages minus the requests fp-load counted.
        extra = [r["logged_data_pages"] - r["ios"] for r in on if isinstance(r.get("logged_data_pages"), int)]
        if extra:
            entry["pages"]["data_pages_minus_ios"] = [min(extra), max(extra)]
        logs = [r["dirty_log"] for r in on if r.get("dirty_log")]
        if logs:
            entry["pages"].update({
                "data_pages": [d["data_pages"] for d in logs],
                "data_pages_expected": logs[0]["data_pages_expected"],
                "header_pages": max(d["header_pages"] for d in logs),
                "ring_pages": max(d["ring_pages"] for d in logs),
                "other_pages": max(d["other_pages"] for d in logs),
                "bits_seen_per_io": median([d["bits_seen"] / r["ios"] for d, r in
                                            zip(logs, [r for r in on if r.get("dirty_log")]) if r["ios"]]),
                "syncs": median([d["syncs"] for d in logs]),
            })
        if entry["ratio"] is not None:
            log(f"logging {entry['server']} {entry['pattern']}: on/off {entry['ratio']:.3f} "
                f"({md['on']:.0f} vs {md['off']:.0f} IOPS)")

    # -- 2. migration downtime and total time --------------------------------------------------

    def mig_migrations(self, c, e):
        """A guest (TCG) on a RAM disk migrated between two QEMUs on the client CPU, each server
        on the server CPU with its two exports of one disk: flashpath two controllers on one
        bdev (`migrate_from`), qsd two vhost-user-blk exports of one node. Idle and with the
        guest at QD32 4 KiB randwrite; the servers interleaved."""
        size = c["size_mib"] * MIB
        try:
            kernel, initrd = guest_boot_files(bench_initramfs, self.work)
        except Exception as ex:  # noqa: BLE001 - the reason goes in the results
            note(e, f"no guest image, no migrations: {err_text(ex)}")
            return
        e["guest"] = {"kernel": kernel, "mem_mib": c["mem_mib"], "vcpus": 1, "accel": "tcg",
                      "params": c["params"]}
        servers = {}
        try:
            fp = Flashpath(self.args.bin_dir, self.work, str(self.server_cpu), name="flashpath-mig")
            servers["flashpath"] = fp
            fp.rpc("bdev_malloc_create", {"name": "Malloc0", "num_blocks": size // 512, "block_size": 512})
            src = fp.export("mig.src", "Malloc0", 1)
            try:
                fp.rpc("vhost_create_blk_controller", {"ctrlr": "mig.dst", "dev_name": "Malloc0", "num_queues": 1,
                                                       "migrate_from": "mig.src"})
                dst = os.path.join(fp.vhost_dir, "mig.dst")
                wait_for(lambda: os.path.exists(dst), 10, "flashpath socket mig.dst", fp.proc)
                fp.socks = (src, dst)
            except subprocess.CalledProcessError as ex:
                note(e, f"flashpath: no second controller on one disk: {err_text(ex)}")
                fp.socks = None
            if not getattr(self, "shm_dir", None):
                self.shm_dir = tempfile.mkdtemp(prefix="fp-bench.", dir="/dev/shm")
            path = os.path.join(self.shm_dir, "mig.img")
            with open(path, "wb") as f:
                f.truncate(size)  # qsd's RAM disk; the guest only writes
            qsd = QsdTwoExports(self.work, self.server_cpu, path)
            servers["qsd"] = qsd
            for rep in range(c["reps"]):
                for mode in c["modes"]:
                    kinds = ("flashpath", "qsd") if rep % 2 == 0 else ("qsd", "flashpath")
                    for kind in kinds:
                        s = servers[kind]
                        if not s.socks:
                            continue
                        r = self.mig_one(kind, s, mode, kernel, initrd, c, rep)
                        e["migrations"].append(r)
        finally:
            for s in servers.values():
                s.stop()
        e["migration_summary"] = mig_summary(e["migrations"])

    def mig_one(self, kind, server, mode, kernel, initrd, c, rep):
        """One migration of a fresh guest from `server`'s first socket to its second."""
        tag = f"{kind}-{mode}-{rep}"
        r = {"server": kind, "mode": mode, "rep": rep}
        src = dst = None
        try:
            src = Guest(f"src-{tag}", self.work, self.client_cpu, server.socks[0], kernel, initrd, mode, c["mem_mib"])
            src.wait_line("FPBENCH-READY", c["boot_timeout"])
            time.sleep(c["settle_s"])
            before = src.samples()
            r["guest_write_iops_before"] = guest_rate(before[-int(c["settle_s"]):])
            dst = Guest(f"dst-{tag}", self.work, self.client_cpu, server.socks[1], kernel, initrd, mode,
                        c["mem_mib"], incoming=True)
            try:
                q = migrate(src, dst, f"unix:{os.path.join(self.work, f'mig-{tag}.sock')}", c["params"],
                            c["timeout"])
            except RuntimeError as ex:
                q = {"status": "refused", "error-desc": str(ex)}
            log_migration(kind, mode, q)
            r.update({"status": q.get("status"), "downtime_ms": q.get("downtime"),
                      "total_time_ms": q.get("total-time"), "setup_time_ms": q.get("setup-time"),
                      "wall_s": q.get("wall_s"), "error": q.get("error-desc"),
                      "ram": {k: (q.get("ram") or {}).get(k) for k in
                              ("transferred", "dirty-sync-count", "precopy-bytes", "downtime-bytes", "mbps")}})
            if q.get("status") == "completed":
                # The guest runs on at the destination: its lines go on, its disk still answers.
                n0 = len(dst.samples())
                wait_for(lambda: len(dst.samples()) >= n0 + c["after_s"] + 1, c["after_s"] + 20,
                         "the destination guest's progress lines", dst.proc)
                after = dst.samples()[n0:]
                r["guest_write_iops_after"] = guest_rate(after)
                r["guest_alive_after"] = True
        except Exception as ex:  # noqa: BLE001 - one failed migration is a result, not the run's end
            r["status"] = r.get("status") or "error"
            r["error"] = err_text(ex)
            log(f"migration {kind} {mode}: {r['error']}")
        finally:
            for g in (src, dst):
                if g is not None:
                    g.stop()
        return r

    # -- 3. the mirror ---------------------------------------------------------------------------

    def mig_mirror(self, c, e):
        """Two flashpath daemons, source on the server CPU and destination on the client CPU,
        each with a RAM disk exported over NBD on a Unix socket; the source disk filled with
        random data (nbdkit's random plugin). nbdcopy (client CPU) copies source export to
        destination export. Then the source's export gives way to a vhost-user controller (a
        writable export claims its disk), and the mirror job (bdev_nbd_client_create on the
        destination's socket, bdev_mirror_start until ready) copies inside the source daemon.
        Then fp-load (client CPU) at QD32 4 KiB randwrite on the source disk, without a mirror,
        during one (its copy phase) and with the job ready (every write mirrored)."""
        size = c["size_mib"] * MIB
        m = {"size": size, "config": c, "nbdcopy": [], "mirror": [], "iops": {}, "notes": []}
        e["mirror"] = m
        daemons = []
        try:
            src = Flashpath(self.args.bin_dir, self.work, str(self.server_cpu), name="flashpath-msrc")
            daemons.append(src)
            dst = Flashpath(self.args.bin_dir, self.work, str(self.client_cpu), name="flashpath-mdst")
            daemons.append(dst)
            for d in (src, dst):
                d.rpc("bdev_malloc_create", {"name": "Malloc0", "num_blocks": size // 512, "block_size": 512})
                d.nbd = os.path.join(d.dir, "nbd.sock")
                d.rpc("nbd_start_disk", {"bdev_name": "Malloc0", "nbd_device": d.nbd})
                wait_for(lambda d=d: os.path.exists(d.nbd), 10, f"{d.name} NBD socket", d.proc)
                d.uri = f"nbd+unix:///Malloc0?socket={d.nbd}"
            run(["taskset", "-c", str(self.client_cpu), "nbdcopy", "--", "[", "nbdkit", "random",
                 str(size), "]", src.uri], 600)
            m["source_sha256"] = nbd_sha256(src.uri)
            # One copy first, not counted: the destination's RAM disk takes its page faults
            # here, as it has by the time the mirror runs.
            m["nbdcopy_warmup"] = self.mig_nbdcopy(src, dst, size)
            for rep in range(c["reps"]):
                m["nbdcopy"].append(self.mig_nbdcopy(src, dst, size))
            if nbd_sha256(dst.uri) != m["source_sha256"]:
                raise RuntimeError("after nbdcopy the destination differs from the source")
            src.rpc("nbd_stop_disk", {"nbd_device": src.nbd})
            sock = src.export("vhost.msrc", "Malloc0", 1)
            methods = set(src.rpc("rpc_get_methods") or [])
            missing = [x for x in MIRROR_METHODS if x not in methods]
            if missing:
                note(m, f"this flashpath has no {', '.join(missing)}: no mirror figures")
            for rep in range(c["reps"]):
                if not missing:
                    m["mirror"].append(self.mig_mirror_copy(src, dst, size, c, m["source_sha256"]))
            m["nbdcopy_mbps"] = median([x["mbps"] for x in m["nbdcopy"]])
            m["mirror_mbps"] = median([x.get("mbps") for x in m["mirror"]]) if m["mirror"] else None
            m["ratio"] = ratio(m["mirror_mbps"], m["nbdcopy_mbps"])
            m["targets_identical"] = [x.get("identical") for x in m["mirror"]]
            self.mig_mirror_iops(src, dst, sock, c, m, missing)
        except Exception as ex:  # noqa: BLE001 - recorded; the other parts' figures stand
            note(m, f"mirror part stopped: {err_text(ex)}")
        finally:
            for d in daemons:
                d.stop()

    def mig_nbdcopy(self, src, dst, size):
        t0 = time.monotonic()
        run(["taskset", "-c", str(self.client_cpu), "nbdcopy", src.uri, dst.uri], 600)
        secs = time.monotonic() - t0
        r = {"seconds": secs, "mbps": size / secs / 1e6}
        log(f"nbdcopy: {size // MIB} MiB in {secs:.2f} s = {r['mbps']:.0f} MB/s")
        return r

    def mig_start_mirror(self, src, dst, speed=0, copy_mode=None):
        """Attaches the destination's export on the source and starts a job (copying at most
        `speed` bytes per second, 0: no limit; `copy_mode` as bdev_mirror_start's, None: the
        default); the job id."""
        src.rpc("bdev_nbd_client_create", {"name": "remote0", "address": dst.nbd, "export_name": "Malloc0"})
        params = {"source": "Malloc0", "target": "remote0", "job_id": "mig0"}
        if speed:
            params["speed"] = speed
        if copy_mode:
            params["copy_mode"] = copy_mode
        jid = src.rpc("bdev_mirror_start", params)
        return jid if isinstance(jid, str) else "mig0"

    def mig_job(self, src, jid):
        jobs = src.rpc("bdev_mirror_get_jobs")
        if isinstance(jobs, dict):
            jobs = [jobs]
        return next((j for j in jobs or [] if j.get("job_id", jid) == jid), None)

    def mig_wait_ready(self, src, jid, timeout):
        """Polls the job every 20 ms until it is ready; (seconds, the job's last status)."""
        t0 = time.monotonic()
        while True:
            j = self.mig_job(src, jid) or {}
            if j.get("state") in ("ready", "failed", "cancelled", "completed"):
                return time.monotonic() - t0, j
            if time.monotonic() - t0 > timeout:
                return None, j
            time.sleep(0.02)

    def mig_stop_mirror(self, src, jid, complete):
        try:
            src.rpc("bdev_mirror_complete" if complete else "bdev_mirror_cancel", {"job_id": jid})
        finally:
            try:
                src.rpc("bdev_nbd_client_delete", {"name": "remote0"})
            except subprocess.CalledProcessError:
                pass

    def mig_mirror_copy(self, src, dst, size, c, src_sha):
        """One mirror of the idle source disk to a destination disk holding other data (the
        destination is first overwritten with zeroes through nbdcopy, so nothing is there by
        chance): the time to ready, and whether the destination then holds the source's bytes
        (`src_sha`, taken before the source got its vhost-user controller)."""
        run(["taskset", "-c", str(self.client_cpu), "nbdcopy", "--", "[", "nbdkit", "null",
             str(size), "]", dst.uri], 600)
        r = {}
        try:
            jid = self.mig_start_mirror(src, dst)
            secs, j = self.mig_wait_ready(src, jid, c["timeout"])
            r.update({"seconds": secs, "state": j.get("state"), "job": j})
            if secs:
                r["mbps"] = size / secs / 1e6
            self.mig_stop_mirror(src, jid, complete=True)
            r["identical"] = nbd_sha256(dst.uri) == src_sha
        except subprocess.CalledProcessError as ex:
            r["error"] = err_text(ex)
        log(f"mirror: {size // MIB} MiB ready in {r.get('seconds') or 0:.2f} s = {r.get('mbps') or 0:.0f} MB/s, "
            f"state {r.get('state')}, identical {r.get('identical')}" + (f", {r['error']}" if "error" in r else ""))
        return r

    def mig_mirror_iops(self, src, dst, sock, c, m, missing):
        """fp-load on the source disk: alone, during a mirror's copy phase, with the job ready.
        With completion fds, not polled: the client shares its CPU with the destination daemon,
        which must run for every mirrored write, and a client spinning on that CPU starves it
        (ten times fewer IOPS with the job ready on this machine), where a guest's vCPU would
        be elsewhere."""
        point = ("randwrite", 4096, 32, 1, False)
        secs = c["iops_secs"]
        cpu = m.setdefault("cpu", {"alone": [], "during_copy": [], "ready": []})
        base = [self.mig_measure_cpu(src, dst, sock, point, secs, cpu["alone"]) for _ in range(c["reps"])]
        m["iops"]["alone"] = median(base)
        log(f"source disk alone: {m['iops']['alone']:.0f} IOPS")
        if missing:
            return
        during, ready, copy_s = self.mig_iops_during(src, dst, sock, c, point, secs, 0, cpu=cpu)
        m["iops"]["during_copy"] = median(during)
        m["iops"]["ready"] = median(ready)
        m["iops"]["copy_s_under_load"] = median(copy_s)
        m["iops"]["ratio_during_copy"] = ratio(m["iops"]["during_copy"], m["iops"]["alone"])
        m["iops"]["ratio_ready"] = ratio(m["iops"]["ready"], m["iops"]["alone"])
        log(f"source disk during the copy: {m['iops']['during_copy'] or 0:.0f} IOPS, job ready: "
            f"{m['iops']['ready'] or 0:.0f} IOPS (alone {m['iops']['alone']:.0f})")
        # The same with the job's speed limit (QEMU's `speed`), the knob that trades copy time
        # for the source's share: a quarter of nbdcopy's rate here.
        limit = int((m.get("nbdcopy_mbps") or 1000) * 1e6 / 4)
        during, _, copy_s = self.mig_iops_during(src, dst, sock, c, point, secs, limit)
        m["iops"]["limited"] = {"speed": limit, "during_copy": median(during), "copy_s_under_load": median(copy_s),
                                "ratio_during_copy": ratio(median(during), m["iops"]["alone"])}
        log(f"source disk during a copy limited to {limit / 1e6:.0f} MB/s: {median(during) or 0:.0f} IOPS, "
            f"{median(copy_s) or 0:.2f} s to ready")
        # Writes blocking from the start (QEMU's copy-mode=write-blocking): each write goes to
        # the target as well, so the copy converges at its share's pace whatever the load.
        during, _, copy_s = self.mig_iops_during(src, dst, sock, c, point, secs, 0, "write-blocking")
        m["iops"]["write_blocking"] = {"during_copy": median(during), "copy_s_under_load": median(copy_s),
                                       "ratio_during_copy": ratio(median(during), m["iops"]["alone"])}
        log(f"source disk during a write-blocking copy: {median(during) or 0:.0f} IOPS, "
            f"{median(copy_s) or 0:.2f} s to ready")

    def mig_measure_cpu(self, src, dst, sock, point, secs, into):
        """One `measure` on the source's export, with the CPU the destination daemon took
        meanwhile (it runs on the client's CPU: every mirrored write costs the client's core
        there) appended to `into`; the IOPS."""
        d0 = proc_cpu(dst.pid)
        r = measure(src, self.loader, sock, point, secs, False)
        d1 = proc_cpu(dst.pid)
        into.append(self.mig_cpu_figures(r["ios"], r["elapsed_s"], d1["sched_ns"] - d0["sched_ns"],
                                         r.get("reactor_busy_ns"), r.get("server_cpu_ns")))
        return r["iops"]

    @staticmethod
    def mig_cpu_figures(ios, secs, dst_ns, src_busy_ns, src_cpu_ns=None):
        per = (lambda x: x / ios if ios and x is not None else None)
        return {"ios": ios, "seconds": secs, "dst_cpu_ns": dst_ns, "dst_cores": dst_ns / 1e9 / secs if secs else None,
                "dst_cpu_ns_per_io": per(dst_ns), "src_busy_ns_per_io": per(src_busy_ns),
                "src_busy_frac": src_busy_ns / 1e9 / secs if secs and src_busy_ns is not None else None,
                "src_cpu_ns": src_cpu_ns}

    def mig_iops_during(self, src, dst, sock, c, point, secs, speed, copy_mode=None, cpu=None):
        """fp-load's IOPS on the source during the copy phase of a job limited to `speed`
        (0: none) in `copy_mode`, and with the job ready; (during, ready, seconds to ready) per
        repetition. With `cpu`, the destination daemon's CPU and the source's reactor busy
        during the copy phase and the ready run are appended to its lists."""
        during, ready, copy_s = [], [], []
        for _ in range(c["reps"]):
            # The copy phase: the job starts 0.2 s into a timeline run; IOPS over the whole 100 ms
            # windows between its start and its ready.
            p = subprocess.Popen([self.loader.bin, "--socket", sock, "--pattern", "randwrite", "--bs", "4096",
                                  "--qd", "32", "--time", f"{secs + (6 if speed else 2)}s", "--cpu", str(self.client_cpu),
                                  "--timeline", "100ms", "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True)
            t_run = time.monotonic()
            time.sleep(0.2)
            d0, b0 = proc_cpu(dst.pid), src.reactors()
            jid = self.mig_start_mirror(src, dst, speed, copy_mode)
            t_start = time.monotonic() - t_run
            took, j = self.mig_wait_ready(src, jid, c["timeout"])
            d1, b1 = proc_cpu(dst.pid), src.reactors()
            out, err = p.communicate(timeout=secs + 120)
            if p.returncode != 0:
                raise RuntimeError(f"fp-load during the mirror: {err.strip()}")
            tl = json.loads(out).get("timeline") or {}
            ios = tl.get("ios") or []
            if took:
                copy_s.append(took)
                # Only whole windows inside fp-load's run (a limited copy may outlast it).
                a, b = int(t_start * 10) + 1, min(int((t_start + took) * 10), len(ios))
                if b > a:
                    during.append(sum(ios[a:b]) / ((b - a) / 10))
                    if cpu is not None:
                        # Over the whole copy phase (ios: its windows, scaled to its length).
                        busy = sum(b1[k]["busy"] - b0[k]["busy"] for k in b1)
                        f = self.mig_cpu_figures(int(during[-1] * took), took, d1["sched_ns"] - d0["sched_ns"], busy)
                        f["copied_bytes"] = (j or {}).get("copied_bytes") or (j or {}).get("len")
                        cpu["during_copy"].append(f)
            # The job ready: every write goes to both disks.
            if (j or {}).get("state") == "ready":
                if cpu is not None:
                    ready.append(self.mig_measure_cpu(src, dst, sock, point, secs, cpu["ready"]))
                else:
                    ready.append(measure(src, self.loader, sock, point, secs, False)["iops"])
            self.mig_stop_mirror(src, jid, complete=False)
        return during, ready, copy_s


class QsdTwoExports:
    """qemu-storage-daemon with one RAM-backed node (a file on tmpfs through the page cache, as
    the matrix's qsd RAM disk) exported twice over vhost-user-blk, one queue each: the source
    and destination QEMU's disks, as one flashpath daemon's two controllers on one bdev."""
    kind = "qsd"

    def __init__(self, work, cpu, path):
        self.name = "qsd-mig"
        self.dir = os.path.join(work, self.name)
        os.makedirs(self.dir, exist_ok=True)
        self.socks = (os.path.join(self.dir, "mig.src"), os.path.join(self.dir, "mig.dst"))
        cmd = ["taskset", "-c", str(cpu), "qemu-storage-daemon", "--object", "iothread,id=iot0",
               "--blockdev", f"driver=file,node-name=disk0,filename={path},aio=io_uring,cache.direct=off"]
        for i, s in enumerate(self.socks):
            cmd += ["--export", f"type=vhost-user-blk,id=e{i},node-name=disk0,addr.type=unix,addr.path={s},"
                                "writable=on,iothread=iot0,num-queues=1"]
        self.proc = spawn(cmd, os.path.join(self.dir, "qsd.log"))
        self.pid = self.proc.pid
        wait_for(lambda: all(os.path.exists(s) for s in self.socks), 20, "qemu-storage-daemon sockets", self.proc)

    def stop(self):
        stop(self.proc, 20)


def nbd_sha256(uri):
    """SHA-256 of a whole NBD export, read with nbdcopy to a pipe."""
    h = hashlib.sha256()
    with tempfile.TemporaryFile() as err:
        p = subprocess.Popen(["nbdcopy", uri, "-"], stdout=subprocess.PIPE, stderr=err)
        for chunk in iter(lambda: p.stdout.read(1 << 20), b""):
            h.update(chunk)
        if p.wait(600) != 0:
            err.seek(0)
            raise RuntimeError(f"nbdcopy {uri} -: {err.read().decode(errors='replace').strip()}")
    return h.hexdigest()


def mig_summary(migs):
    """Medians of downtime and total time per (server, mode) over the completed migrations."""
    out = []
    for kind in ("flashpath", "qsd"):
        for mode in ("idle", "load"):
            rs = [r for r in migs if r["server"] == kind and r["mode"] == mode]
            if not rs:
                continue
            ok = [r for r in rs if r.get("status") == "completed"]
            out.append({"server": kind, "mode": mode, "runs": len(rs), "completed": len(ok),
                        "downtime_ms": median([r["downtime_ms"] for r in ok]),
                        "total_time_ms": median([r["total_time_ms"] for r in ok]),
                        "downtime_range": [min(r["downtime_ms"] for r in ok), max(r["downtime_ms"] for r in ok)] if ok else None,
                        "total_time_range": [min(r["total_time_ms"] for r in ok), max(r["total_time_ms"] for r in ok)] if ok else None,
                        "setup_time_ms": median([r["setup_time_ms"] for r in ok]),
                        "guest_write_iops_before": median([r.get("guest_write_iops_before") for r in rs]),
                        "guest_write_iops_after": median([r.get("guest_write_iops_after") for r in ok]),
                        "errors": sorted({r["error"] for r in rs if r.get("error")})})
    return out
