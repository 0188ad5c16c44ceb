"""The formatters of results.md's numbers, below report.py and every section's report module,
which all write them."""


def fmt_iops(v):
    if v is None:
        return "-"
    if v >= 1e6:
        return f"{v / 1e6:.2f} M"
    return f"{v / 1e3:.1f} K"


def fmt_us(ns):
    return "-" if ns is None else f"{ns / 1000:.2f}"


def fmt_ns(ns):
    return "-" if ns is None else f"{ns:.0f}"


def fmt_ratio(r):
    return "-" if r is None else f"{r:.2f}"
