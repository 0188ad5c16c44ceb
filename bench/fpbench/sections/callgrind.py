"""Path length: instructions per I/O of each server under callgrind (null backend), and the
method every section that counts instructions shares: a long run's instructions less a short
run's, over the difference in I/Os, each run a whole server life.
"""

import os

from fpbench.common import GIB, log, median
from fpbench.load import CALLGRIND, callgrind_total, point_key, point_label
from fpbench.servers import Flashpath, Qsd


def long_minus_short(life, short_s, long_s, what):
    """Instructions per I/O from two whole server lives: `life(secs)` starts a fresh server
    under callgrind, drives it for `secs` and stops it, returning at least its instructions
    ("ir") and the I/Os done ("ios"). (Ir long − Ir short) / (I/Os long − I/Os short): start-up,
    set-up, connection and exit are in both runs and cancel. `what` names the server in errors."""
    short = life(short_s)
    long_ = life(long_s)
    if long_["ios"] <= short["ios"]:
        raise RuntimeError(f"{what} under callgrind: the long run did {long_['ios']} I/Os, the short one "
                           f"{short['ios']}")
    return {"short": short, "long": long_, "ir_per_io": (long_["ir"] - short["ir"]) / (long_["ios"] - short["ios"])}


def ir_summary(runs):
    """The median instructions per I/O of `runs` (long_minus_short's results), their range and
    spread, (max − min) / median."""
    xs = [r["ir_per_io"] for r in runs]
    med = median(xs)
    return {"ir_per_io": med, "range": [min(xs), max(xs)], "spread": (max(xs) - min(xs)) / med}


class CallgrindSection:
    """Bench's methods for this section (mixed into bench.Bench)."""

    def under_callgrind(self, what, life, retry=True):
        """One whole server life under callgrind: `life(wrap, name)` starts the server with
        `wrap` (the valgrind command, its profile's path included) before its command line and
        `name` as its directory, drives it, stops it and returns the run's result (with "ios");
        that result with the server's total instructions ("ir") added. A profile cut short on
        the way out (seen once with qsd on a loaded machine in CI) repeats the life once rather
        than failing the whole bench on it."""
        self.callgrind_n += 1
        name = f"callgrind-{self.callgrind_n}"
        out = os.path.join(self.work, f"{name}.out")
        res = life(CALLGRIND + [f"--callgrind-out-file={out}"], name)
        try:
            ir = callgrind_total(out)
        except RuntimeError as e:
            if retry:
                log(f"callgrind: {e}; running {what} once more")
                return self.under_callgrind(what, life, retry=False)
            raise
        return dict(res, ir=ir)

    def callgrind_run(self, kind, point, secs, variant="counters", disk=None):
        """A fresh server of `kind` under callgrind with a null disk and one fp-load run against
        it; the server's instructions from start to exit and the run's I/Os. `variant` picks
        flashpath's disk-layer accounting: "off" (--no-iostat), "counters" (the default) or
        "histograms" (enabled before the run). `disk(server)`, for flashpath, sets up another
        disk instead of the null one and returns its socket."""

        def life(wrap, name):
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
            return {"seconds": secs, "ios": res["ios"], "iops": res["iops"]}

        return self.under_callgrind(kind, life)

    def callgrind_ir_per_io(self, kind, point, cg, variant="counters", disk=None):
        """One long-minus-short measurement of `kind` on `point` with the lengths of `cg`."""
        return long_minus_short(lambda secs: self.callgrind_run(kind, point, secs, variant, disk),
                                cg["short_s"], cg["long_s"], kind)

    def run_callgrind(self):
        """Instructions per I/O (long_minus_short) of flashpath and qsd over vhost-user.
        Servers and run lengths interleaved: flashpath short, long, qsd short, long."""
        cg = self.cfg.get("callgrind")
        if not cg:
            return
        for point in cg["points"]:
            runs = {"flashpath": [], "qsd": []}
            for _ in range(cg["reps"]):
                for kind, rs in runs.items():
                    rs.append(self.callgrind_ir_per_io(kind, point, cg))
            for kind, rs in runs.items():
                s = ir_summary(rs)
                e = dict(point_key("null", point), server=kind, short_s=cg["short_s"],
                         long_s=cg["long_s"], runs=rs, ir_per_io=s["ir_per_io"], spread=s["spread"])
                self.results["callgrind"].append(e)
                log(f"callgrind: {point_label(e):<30} {kind:<9} {s['ir_per_io']:>9.0f} instructions/IO "
                    f"(spread {100 * e['spread']:.1f} %, {len(rs)} repetitions)")
