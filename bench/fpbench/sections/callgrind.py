"""Path length: instructions per I/O of each server under callgrind (null backend).
"""

import os

from fpbench.common import GIB, log, median
from fpbench.load import CALLGRIND, callgrind_total, point_key, point_label
from fpbench.servers import Flashpath, Qsd


class CallgrindSection:
    """Bench's methods for this section (mixed into bench.Bench)."""

    def callgrind_run(self, kind, point, secs, variant="counters", disk=None, retry=True):
        """A fresh server of `kind` under callgrind with a null disk and one fp-load run against
        it; the server's instructions from start to exit and the run's I/Os. `variant` picks
        flashpath's disk-layer accounting: "off" (--no-iostat), "counters" (the default) or
        "histograms" (enabled before the run). `disk(server)`, for flashpath, sets up another
        disk instead of the null one and returns its socket."""
        self.callgrind_n += 1
        name = f"callgrind-{self.callgrind_n}"
        out = os.path.join(self.work, f"{name}.out")
        wrap = CALLGRIND + [f"--callgrind-out-file={out}"]
        if kind == "flashpath":
            extra = ["--no-iostat"] if variant == "off" else []
            server = Flashpath(self.args.bin_dir, self.work, str(self.server_cpu), name=name, wrap=wrap,
                               extra=extra)
        else:
            server = Qsd(self.work, self.server_cpu, "null", GIB, None, name=name, wrap=wrap)
        try:
            if kind != "flashpath":
                sock = server.sock
            elif disk is not None:
                sock = disk(server)
            else:
                sock = server.add_disk("null", GIB)
            if kind == "flashpath" and variant == "histograms":
                server.rpc("bdev_enable_histogram", {"name": "Null0", "enable": True})
            res = self.loader.run(sock, *point, secs)
        finally:
            server.stop()
        if res["errors"]:
            raise RuntimeError(f"{kind} under callgrind: {res['errors']} requests failed "
                               f"(first {res['first_error']})")
        try:
            ir = callgrind_total(out)
        except RuntimeError as e:
            # A profile cut short on the way out (seen once with qsd on a loaded machine in CI):
            # the run is repeated once rather than the whole bench failing on it.
            if retry:
                log(f"callgrind: {e}; running {kind} once more")
                return self.callgrind_run(kind, point, secs, variant, disk, retry=False)
            raise
        return {"seconds": secs, "ios": res["ios"], "iops": res["iops"], "ir": ir}

    def run_callgrind(self):
        """Instructions per I/O: (Ir of a long run - Ir of a short run) / (I/Os of the long run -
        I/Os of the short run), each run a whole server life, so start-up, set-up, connection and
        exit cancel. Servers and run lengths interleaved: flashpath short, long, qsd short, long."""
        cg = self.cfg.get("callgrind")
        if not cg:
            return
        for point in cg["points"]:
            runs = {"flashpath": [], "qsd": []}
            for _ in range(cg["reps"]):
                for kind, rs in runs.items():
                    short = self.callgrind_run(kind, point, cg["short_s"])
                    long_ = self.callgrind_run(kind, point, cg["long_s"])
                    if long_["ios"] <= short["ios"]:
                        raise RuntimeError(f"{kind} under callgrind: the long run did {long_['ios']} "
                                           f"I/Os, the short one {short['ios']}")
                    rs.append({"short": short, "long": long_,
                               "ir_per_io": (long_["ir"] - short["ir"]) / (long_["ios"] - short["ios"])})
            for kind, rs in runs.items():
                xs = [r["ir_per_io"] for r in rs]
                med = median(xs)
                e = dict(point_key("null", point), server=kind, short_s=cg["short_s"],
                         long_s=cg["long_s"], runs=rs, ir_per_io=med,
                         spread=(max(xs) - min(xs)) / med)
                self.results["callgrind"].append(e)
                log(f"callgrind: {point_label(e):<30} {kind:<9} {med:>9.0f} instructions/IO "
                    f"(spread {100 * e['spread']:.1f} %, {len(xs)} repetitions)")

    # -- logical volumes (issue 11) -----------------------------------------------------------
