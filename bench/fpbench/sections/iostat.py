"""The disk layer's cost: I/O statistics off, on, and with latency histograms.
"""

from fpbench.common import GIB, log, ratio
from fpbench.load import measure, point_key, summarize
from fpbench.report_format import fmt_ratio
from fpbench.servers import Flashpath


class IostatSection:
    """Bench's methods for this section (mixed into bench.Bench)."""

    def run_iostat(self):
        """What the disk layer's accounting costs: null QD32 polled IOPS on a daemon with
        statistics off (`serve --no-iostat`) and on one with them on, without and with latency
        histograms (`bdev_enable_histogram`), the three interleaved in every repetition. Both
        daemons are pinned to the server CPU; the one not measured sleeps (no client I/O)."""
        reps = self.cfg.get("iostat_reps", 0)
        if not reps:
            return
        cpu = str(self.server_cpu)
        off = Flashpath(self.args.bin_dir, self.work, cpu, name="flashpath-iostat-off", extra=["--no-iostat"])
        on = Flashpath(self.args.bin_dir, self.work, cpu, name="flashpath-iostat-on")
        try:
            socks = {"off": off.add_disk("null", GIB), "on": on.add_disk("null", GIB)}
            point = ("randread", 4096, 32, 1, True)
            runs = {"off": [], "counters": [], "histograms": []}
            for _ in range(reps):
                runs["off"].append(measure(off, self.loader, socks["off"], point, self.secs, False))
                runs["counters"].append(measure(on, self.loader, socks["on"], point, self.secs, False))
                on.rpc("bdev_enable_histogram", {"name": "Null0", "enable": True})
                runs["histograms"].append(measure(on, self.loader, socks["on"], point, self.secs, False))
                on.rpc("bdev_enable_histogram", {"name": "Null0", "enable": False})
            # The daemon counted what the client did: a check that the layer was really on.
            stat = on.rpc("bdev_get_iostat", {"name": "Null0"})["bdevs"][0]
            client_ios = sum(r["ios"] for r in runs["counters"] + runs["histograms"])
            e = dict(point_key("null", point), server="flashpath",
                     variants={k: dict(runs=v, median=summarize(v)) for k, v in runs.items()},
                     daemon_read_ops=stat["num_read_ops"], client_ios=client_ios)
            base = e["variants"]["off"]["median"]["iops"]
            e["ratios"] = {k: ratio(e["variants"][k]["median"]["iops"], base) for k in ("counters", "histograms")}
            self.results["iostat"].append(e)
            cg = self.cfg.get("callgrind")
            if cg and self.cfg.get("iostat_callgrind"):
                # Path length of each variant (the callgrind section's method: a long run's
                # instructions less a short run's, over the difference in I/Os).
                e["ir_per_io"] = {}
                for k in runs:
                    e["ir_per_io"][k] = self.callgrind_ir_per_io("flashpath", point, cg, variant=k)["ir_per_io"]
                log("iostat path length (instructions/IO): " +
                    ", ".join(f"{k} {v:.0f}" for k, v in e["ir_per_io"].items()))
            log(f"iostat cost: off {base:>10.0f}  counters {e['variants']['counters']['median']['iops']:>10.0f} "
                f"({fmt_ratio(e['ratios']['counters'])})  +histograms "
                f"{e['variants']['histograms']['median']['iops']:>10.0f} ({fmt_ratio(e['ratios']['histograms'])}); "
                f"daemon counted {stat['num_read_ops']} reads, the client {client_ios} (plus warm-up)")
        finally:
            off.stop()
            on.stop()
