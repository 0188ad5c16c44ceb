"""The main matrix: null, RAM and file backends on both servers, the client's own ceiling,
flashpath with two reactors (scaling), and packed vs split rings.
"""

from fpbench.common import GIB, log, median, ratio
from fpbench.load import fio_run, measure, merge_hists, point_key, point_label, summarize
from fpbench.report_format import fmt_ratio
from fpbench.servers import Flashpath, Qsd


class NullRamFileSection:
    """Bench's methods for this section (mixed into bench.Bench)."""

    def run_backend(self, backend):
        size = self.cfg["sizes"][backend]
        path = self.backing_path(backend, size)
        fp = Flashpath(self.args.bin_dir, self.work, str(self.server_cpu))
        qsd = Qsd(self.work, self.server_cpu, backend, size, path)
        try:
            fp_sock = fp.add_disk(backend, size, path)
            if backend == "ram":
                log("filling the flashpath RAM disk")
                self.fill_ram(fp_sock, size)
            self.idle(backend, [(fp, fp_sock), (qsd, qsd.sock)])
            points = self.cfg.get(f"{backend}_points", self.cfg["points"])
            for point in points:
                pk = point_key(backend, point)
                want_hist = point[2] == 1
                with_fio = backend == "file" and point[3] == 1 and point[4] is False
                runs = {"flashpath": [], "qsd": [], "fio": []}
                for rep in range(self.reps):
                    runs["flashpath"].append(measure(fp, self.loader, fp_sock, point, self.secs, want_hist))
                    runs["qsd"].append(measure(qsd, self.loader, qsd.sock, point, self.secs, want_hist))
                    if with_fio:
                        runs["fio"].append(fio_run(path, size, point, self.secs, self.client_cpu))
                for server in ("flashpath", "qsd"):
                    e = dict(pk, server=server, runs=runs[server], median=summarize(runs[server]))
                    if want_hist:
                        e["histogram"] = merge_hists(runs[server])
                        for r in runs[server]:
                            r.pop("histogram", None)
                    self.results["points"].append(e)
                if with_fio:
                    fk = dict(pk)
                    fk.pop("client")
                    self.results["fio"].append(dict(fk, runs=runs["fio"], median=summarize(runs["fio"])))
                mf = median([r["iops"] for r in runs["flashpath"]])
                mq = median([r["iops"] for r in runs["qsd"]])
                extra = ""
                if with_fio:
                    extra = f"  fio {median([r['iops'] for r in runs['fio']]):>10.0f}"
                log(f"{point_label(pk):<36} flashpath {mf:>10.0f}  qsd {mq:>10.0f}  "
                    f"ratio {mf / mq:5.2f}{extra}")
        finally:
            fp.stop()
            qsd.stop()

    def run_ceiling(self):
        """The client's own ceiling: fp-load with --client-busy on the null QD32 polled point."""
        n = self.cfg["ceiling_reps"]
        if not n:
            return
        fp = Flashpath(self.args.bin_dir, self.work, str(self.server_cpu), name="flashpath-ceiling")
        try:
            sock = fp.add_disk("null", GIB)
            point = ("randread", 4096, 32, 1, True)
            runs = [measure(fp, self.loader, sock, point, self.secs, False, client_busy=True)
                    for _ in range(n)]
            med = summarize(runs)
            self.results["client_ceiling"] = dict(point_key("null", point), runs=runs, median=med)
            log(f"client ceiling: client busy {med['client_busy_ns_per_io']:.1f} ns/IO "
                f"({100 * med['client_busy_frac']:.0f} % of its core), reactor busy "
                f"{med['reactor_busy_ns_per_io']:.1f} ns/IO, {med['iops']:.0f} IOPS")
        finally:
            fp.stop()

    def run_scaling(self):
        """flashpath with reactors on both cores: 1 queue (one reactor) vs 2 queues (two)."""
        if not self.cfg["scaling_points"]:
            return
        cpus = f"{self.server_cpu},{self.client_cpu}"
        fp = Flashpath(self.args.bin_dir, self.work, cpus, name="flashpath-2reactors")
        try:
            sock = fp.add_disk("null", GIB)
            for qd, poll in self.cfg["scaling_points"]:
                for queues in (1, 2):
                    point = ("randread", 4096, qd, queues, poll)
                    runs = [measure(fp, self.loader, sock, point, self.secs, False)
                            for _ in range(self.reps)]
                    e = dict(point_key("null", point), server="flashpath", reactors=2, cpus=cpus,
                             runs=runs, median=summarize(runs))
                    self.results["scaling"].append(e)
                    log(f"2 reactors: {point_label(e):<30} {e['median']['iops']:>10.0f} IOPS")
        finally:
            fp.stop()

    def run_packed(self):
        """fp-load over packed rings (--packed, virtio-driver) vs split rings (libblkio) on one
        flashpath null disk, the two interleaved in each repetition."""
        if not self.cfg["packed_points"]:
            return
        fp = Flashpath(self.args.bin_dir, self.work, str(self.server_cpu), name="flashpath-packed")
        try:
            sock = fp.add_disk("null", GIB)
            for qd, poll in self.cfg["packed_points"]:
                point = ("randread", 4096, qd, 1, poll)
                runs = {"split": [], "packed": []}
                for _ in range(self.reps):
                    for ring in ("split", "packed"):
                        runs[ring].append(measure(fp, self.loader, sock, point, self.secs, False,
                                                  packed=ring == "packed"))
                e = dict(point_key("null", point), server="flashpath",
                         split=dict(runs=runs["split"], median=summarize(runs["split"])),
                         packed=dict(runs=runs["packed"], median=summarize(runs["packed"])))
                e["ratio"] = ratio(e["packed"]["median"]["iops"], e["split"]["median"]["iops"])
                self.results["packed"].append(e)
                log(f"{point_label(e):<36} split {e['split']['median']['iops']:>10.0f}  packed "
                    f"{e['packed']['median']['iops']:>10.0f}  ratio {fmt_ratio(e['ratio'])}")
        finally:
            fp.stop()
