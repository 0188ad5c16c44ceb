"""The AES-XTS section (issue 27, `--only crypto`) in results.md, its targets and the check of its
outputs."""

from fpbench.common import MIB
from fpbench.load import point_key, point_label
from fpbench.report_format import fmt_iops as _iops, fmt_ns as _ns, fmt_ratio as _x, fmt_us as _us
from fpbench.report_format import fmt_spread
from fpbench.sections.crypto import (CLEAN_CPU_SHARE, ENGINES, FP_VARIANTS, KEY_BITS, OPS, PATTERN_OP, SIZES, TARGET,
                                     VARIANTS)


def _num(v, form):
    return "-" if v is None else form.format(v)


def _mbs(bps):
    return _num(None if bps is None else bps / 1e6, "{:,.0f}")


def _label(p):
    return f"{p['pattern']} 4K QD{p['qd']} {p['client']}"


def engine_names(e):
    """The engines xts_speed reported in this run's judged runs (its `engine` field)."""
    names = sorted({r.get("engine") or "-" for r in e["cipher"]["runs"] if r["tool"] == "flashpath"})
    return ", ".join(f"`{n}`" for n in names) or "-"


def crypto_markdown(res):
    e, m = res["crypto"], res["meta"]
    c = e["config"]
    lines = ["", "## AES-XTS: the crypto bdev's cipher and data path (issue 27)", "",
             f"Load average before the section {e['loadavg_before'][0]:.2f}, after "
             f"{e.get('loadavg_after', [0])[0]:.2f} (2 CPUs; other work on the machine shows there). "
             f"{e.get('openssl_version', '')}; CPU features: {', '.join(e.get('cpu_flags') or []) or '-'}.", "",
             "### The cipher on one core", "",
             f"`openssl speed -elapsed -mr -seconds {c['cipher_secs']} -bytes N [-decrypt] -evp aes-256-xts` (and "
             "aes-128-xts) against flashpath's `xts_speed --bytes N --seconds "
             f"{c['cipher_secs']} --key-bits 512|256` (crates/bdev/examples/xts_speed.rs: the crypto bdev's "
             "cipher engine on one buffer, 4 KiB data units from 4096 bytes up; **flashpath**: the engine its "
             f"channels use on this host ({engine_names(e)}), judged; **fallback**: `--engine rust`, the XTS over "
             f"the `aes` crate used where libcrypto does not load, reported), all under `taskset -c {e['cpu']}`; "
             f"{c['cipher_reps']} rounds, the tools alternating; medians. MB/s per CPU second: bytes over the CPU "
             "time the run got (xts_speed's own per-operation figure; openssl's wall-clock figure, `-elapsed`, over "
             "its process's CPU share from wait4's rusage): one core's worth, judged. wall: the same by the wall "
             "clock. min CPU share: the lowest share of a core any of the row's openssl and flashpath runs got "
             f"(under {CLEAN_CPU_SHARE:.0%}: the run shared the core with other work, and its wall figure is low by "
             "as much).", "",
             "| cipher | bytes | op | openssl MB/s per CPU s | flashpath MB/s per CPU s | flashpath / openssl | "
             "fallback MB/s per CPU s | fallback / openssl | wall: openssl MB/s | wall: flashpath MB/s | "
             "wall: flashpath / openssl | flashpath ns per buffer (wall) | min CPU share |", "|" + "---|" * 13]
    for row in e["cipher"]["rows"]:
        lines.append(f"| {row['cipher']} | {row['bytes']} | {row['op']} | {_mbs(row['openssl_bytes_per_cpu_sec'])} | "
                     f"{_mbs(row['flashpath_bytes_per_cpu_sec'])} | **{_x(row['ratio'])}** | "
                     f"{_mbs(row.get('fallback_bytes_per_cpu_sec'))} | {_x(row.get('fallback_ratio'))} | "
                     f"{_mbs(row['openssl_bytes_per_sec'])} | {_mbs(row['flashpath_bytes_per_sec'])} | "
                     f"{_x(row['ratio_wall'])} | "
                     f"{_num(row.get('flashpath_ns_per_buffer'), '{:,.0f}')} | {row['min_cpu_share']:.0%} |")
    pts = e.get("points") or []
    if pts:
        lines += ["", "### 4 KiB QD32 on an encrypted RAM disk", "",
                  f"One flashpath (`flashpath serve --cpus {m['server_cpu']}` under taskset) with three disks of "
                  f"{c['size'] // MIB} MiB: **fp-plain** a malloc bdev with 4096-byte blocks; **fp-crypto** "
                  "`bdev_crypto_create` (a 512-bit AES-XTS key) over a malloc bdev with 4096-byte blocks (one "
                  "4 KiB XTS unit per I/O, as openssl's 4096-byte buffer); **fp-crypto-512** the same over "
                  "512-byte blocks (eight 512-byte units per I/O, as LUKS). One qemu-storage-daemon on the same "
                  "CPU (one iothread) with **qsd-raw** (`driver=file` on /dev/shm, io_uring, page cache, as the "
                  "other sections' RAM disk) and **qsd-luks** (`driver=luks` over such a file: `qemu-img create -f "
                  "luks`, qemu's defaults, aes-256 xts plain64, 512-byte sectors). Every disk written in full "
                  f"first. fp-load (libblkio, one polled queue) on CPU {m['client_cpu']}; {c['reps']} runs of "
                  f"{c['secs']:g} s per point and disk, the order rotating; medians. busy/IO: flashpath's reactor "
                  "busy time per I/O; CPU/IO: the server's CPU time (all threads, schedstat) per I/O; wait: the "
                  "share of the run the server was runnable while something else had its CPU. **vs openssl**: "
                  "the IOPS against openssl's aes-256-xts 4096-byte buffers per CPU second (one core), for the "
                  "operation the pattern needs (decrypt for reads, encrypt for writes), from the cipher part "
                  "above: by the wall clock (IOPS), and per CPU second (**IOPS per CPU s**: 1 s / CPU/IO, the I/Os "
                  "one whole core of the server's would do at this cost; judged, as the cipher part is: on a "
                  "loaded machine the wall-clock IOPS measure the other work too). **server cores**: the server's "
                  "CPU time over the run's length: near 1, the server was busy all the run; well under 1, the server "
                  "was not what limited the IOPS (the client's CPU, shared with the machine's other work, was), and "
                  "flashpath's reactor slept or polled empty part of the time, which its CPU/IO counts. **other cores**: the CPU time everything "
                  "else on the machine used meanwhile (other processes, the idle daemon), in cores.", "",
                  "| workload | disk | IOPS | MB/s | spread | wait | server cores | other cores | p50 µs | p99 µs | "
                  "busy/IO ns | CPU/IO ns | vs openssl | IOPS per CPU s | vs openssl per CPU s |", "|" + "---|" * 15]
        for p in pts:
            for v in VARIANTS:
                md = p["median"][v]
                lines.append(f"| {_label(p)} | {v} | {_iops(md.get('iops'))} | {_num(md.get('mbps'), '{:,.0f}')} | "
                             f"{fmt_spread(md.get('iops_spread'))} | {_num(md.get('server_wait_share'), '{:.0%}')} | "
                             f"{_num(md.get('server_cores'), '{:.2f}')} | {_num(md.get('other_cpu_cores'), '{:.2f}')} | "
                             f"{_us(md.get('p50_ns'))} | {_us(md.get('p99_ns'))} | "
                             f"{_ns(md.get('reactor_busy_ns_per_io'))} | {_ns(md.get('server_cpu_ns_per_io'))} | "
                             f"{_x(md.get('vs_openssl_bound'))} | {_iops(md.get('iops_per_cpu_sec'))} | "
                             f"**{_x(md.get('vs_openssl_bound_cpu'))}** |")
        lines += ["", "What encryption costs: the encrypted disk against the plain one on the same server (IOPS "
                      "ratios by the wall clock; **extra CPU/IO**: the encrypted disk's CPU time per I/O minus the "
                      "plain one's), and the cipher alone (xts_speed's CPU time for one 4 KiB buffer, aes-256-xts, "
                      "from its figure per CPU second).", "",
                  "| workload | openssl bound (4 KiB blocks per CPU s) | fp-crypto / fp-plain IOPS | fp-crypto-512 / "
                  "fp-plain IOPS | qsd-luks / qsd-raw IOPS | fp-crypto / qsd-luks IOPS | fp-crypto-512 / qsd-luks IOPS | "
                  "fp-crypto extra CPU/IO ns | fp-crypto-512 extra CPU/IO ns | qsd-luks extra CPU/IO ns | "
                  "xts_speed CPU ns per 4 KiB |", "|" + "---|" * 11]
        for p in pts:
            r, k = p["ratios"], p["cost"]
            lines.append(f"| {_label(p)} ({p['op']}) | {_iops(p.get('openssl_bound_iops'))} | "
                         f"{_x(r['fp_crypto_vs_plain_iops'])} | {_x(r['fp_crypto_512_vs_plain_iops'])} | "
                         f"{_x(r['qsd_luks_vs_raw_iops'])} | {_x(r['fp_crypto_vs_qsd_luks_iops'])} | "
                         f"{_x(r['fp_crypto_512_vs_qsd_luks_iops'])} | {_ns(k['fp_crypto_cpu_ns_per_io'])} | "
                         f"{_ns(k['fp_crypto_512_cpu_ns_per_io'])} | {_ns(k['qsd_luks_cpu_ns_per_io'])} | "
                         f"{_ns(k.get('xts_speed_cpu_ns_per_4k'))} |")
        lines += ["", f"What the data-path target leaves for the cipher: one core doing {TARGET:.1f}x openssl's "
                      "4 KiB blocks per second may spend **allowed** ns of CPU per I/O; fp-plain's own CPU/IO (moving "
                      "the request, no cipher) comes off that, leaving **left for the cipher**; openssl's own cipher "
                      "takes **openssl ns per 4 KiB**. Where what is left is below openssl's time, the target "
                      "needs a cipher faster than openssl's (or a cheaper request path), not only one as fast.", "",
                  "| workload | allowed CPU/IO ns | fp-plain CPU/IO ns | left for the cipher ns | openssl CPU ns per "
                  "4 KiB | flashpath cipher (xts_speed) CPU ns per 4 KiB |", "|" + "---|" * 6]
        for p in pts:
            b = p.get("budget") or {}
            lines.append(f"| {_label(p)} ({p['op']}) | {_ns(b.get('target_cpu_ns_per_io'))} | "
                         f"{_ns(p['median']['fp-plain'].get('server_cpu_ns_per_io'))} | "
                         f"{_ns(b.get('left_for_cipher_ns'))} | {_ns(b.get('openssl_cpu_ns_per_4k'))} | "
                         f"{_ns(p['cost'].get('xts_speed_cpu_ns_per_4k'))} |")
    return lines


def crypto_targets(res, add):
    """Issue 27's targets: AES-XTS throughput on one core >= 0.8x openssl's aes-256-xts (each size and
    operation); 4 KiB randread and randwrite QD32 on an encrypted RAM disk >= 0.8x openssl's
    4096-byte buffers per second (for the operation the pattern needs)."""
    e = res.get("crypto")
    if not e:
        return
    for row in e["cipher"]["rows"]:
        if row["bits"] != 512:
            continue  # aes-128-xts: reported in the table, not a target
        x = row["ratio"]
        add(f"AES-XTS on one core, aes-256-xts, {row['bytes']} bytes, {row['op']}: flashpath vs openssl speed",
            f">= {TARGET:.2f}x", f"{_mbs(row['flashpath_bytes_per_cpu_sec'])} vs "
            f"{_mbs(row['openssl_bytes_per_cpu_sec'])} MB/s per CPU second = {_x(x)}x", None if x is None else x >= TARGET,
            f"engine {row.get('flashpath_engine') or '-'}; wall clock {_x(row['ratio_wall'])}x, CPU share >= "
            f"{row['min_cpu_share']:.0%}; fallback engine {_x(row.get('fallback_ratio'))}x")
    for p in e.get("points") or []:
        md = p["median"]["fp-crypto"]
        x = md.get("vs_openssl_bound_cpu")
        add(f"{_label(p)} on an encrypted RAM disk (crypto over malloc, 4096-byte blocks): IOPS per server CPU "
            f"second vs openssl's aes-256-xts {p['op']} of 4096-byte buffers per CPU second", f">= {TARGET:.2f}x",
            f"{_iops(md.get('iops_per_cpu_sec'))} vs {_iops(p.get('openssl_bound_iops'))} = {_x(x)}x",
            None if x is None else x >= TARGET,
            f"wall clock {_iops(md.get('iops'))} IOPS = {_x(md.get('vs_openssl_bound'))}x; per CPU second "
            f"512-byte blocks {_x(p['median']['fp-crypto-512'].get('vs_openssl_bound_cpu'))}x, qsd LUKS "
            f"{_x(p['median']['qsd-luks'].get('vs_openssl_bound_cpu'))}x")


def validate_crypto(res, c):
    """Every cipher row from both tools with its runs and a positive figure; every point on every
    disk with its runs and positive IOPS, MB/s, latency and CPU per I/O (flashpath's reactor busy
    time too); openssl's bound and each disk's ratio to it."""
    problems = []
    e = res.get("crypto")
    if not e:
        return ["results.json has no 'crypto'"]
    rows = {(r["bits"], r["bytes"], r["op"]): r for r in (e.get("cipher") or {}).get("rows", [])}
    for bits in KEY_BITS:
        for size in SIZES:
            for op in OPS:
                r = rows.get((bits, size, op))
                if r is None:
                    problems.append(f"crypto cipher: no row for {bits}-bit {size} bytes {op}")
                    continue
                for tool in ("openssl", *ENGINES):
                    if r.get(f"{tool}_runs") != c["cipher_reps"]:
                        problems.append(f"crypto cipher {bits}-bit {size} {op}: {r.get(f'{tool}_runs')} {tool} runs, "
                                        f"want {c['cipher_reps']}")
                    for k in (f"{tool}_bytes_per_sec", f"{tool}_bytes_per_cpu_sec"):
                        v = r.get(k)
                        if not isinstance(v, (int, float)) or v <= 0:
                            problems.append(f"crypto cipher {bits}-bit {size} {op}: {k} = {v!r}")
                for k in ("ratio", "ratio_wall"):
                    if not isinstance(r.get(k), (int, float)):
                        problems.append(f"crypto cipher {bits}-bit {size} {op}: no {k}")
    got = {(p["pattern"], p["qd"]): p for p in e.get("points", [])}
    for pattern in PATTERN_OP:
        pk = point_key("ram", (pattern, 4096, 32, 1, True))
        p = got.get((pattern, 32))
        if p is None:
            problems.append(f"crypto: missing point {point_label(pk)}")
            continue
        for k, v in (("openssl bound", p.get("openssl_bound_iops")),
                     ("allowed CPU per I/O", (p.get("budget") or {}).get("target_cpu_ns_per_io"))):
            if not isinstance(v, (int, float)) or v <= 0:
                problems.append(f"crypto {point_label(pk)}: {k} = {v!r}")
        for v in VARIANTS:
            rs = p["runs"].get(v) or []
            if len(rs) != c["reps"]:
                problems.append(f"crypto {point_label(pk)} {v}: {len(rs)} runs, want {c['reps']}")
            want = ["iops", "mbps", "p50_ns", "p99_ns", "server_cpu_ns_per_io", "vs_openssl_bound", "iops_per_cpu_sec",
                    "vs_openssl_bound_cpu"]
            if v in FP_VARIANTS:
                want.append("reactor_busy_ns_per_io")
            for k in want:
                x = p["median"].get(v, {}).get(k)
                if not isinstance(x, (int, float)) or x <= 0:
                    problems.append(f"crypto {point_label(pk)} {v}: {k} = {x!r}")
    return problems
