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


# Figures whose rounds disagree by more than this ((max - min) / median) are flagged in
# results.md: such a figure measured the machine as much as the server.
SPREAD_FLAG_LIMIT = 0.10
SPREAD_FLAG = "⚑"
SPREAD_NOTE = (f"{SPREAD_FLAG}: the figure's spread across rounds ((max − min) / median) exceeds "
               f"{100 * SPREAD_FLAG_LIMIT:.0f} %; treat it as noisy.")


def spread_of(xs):
    """(max - min) / median of the rounds' values `xs` (Nones left out); None without a
    positive median."""
    xs = sorted(x for x in xs if x is not None)
    if not xs:
        return None
    n = len(xs)
    med = xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2
    return (xs[-1] - xs[0]) / med if med > 0 else None


def fmt_spread(s, digits=0):
    """A spread in % with `digits` decimals, flagged above SPREAD_FLAG_LIMIT."""
    if s is None:
        return "-"
    return f"{100 * s:.{digits}f} %" + (f" {SPREAD_FLAG}" if s > SPREAD_FLAG_LIMIT else "")


def with_spread(text, s):
    """A formatted figure `text` with its spread across rounds `s` (flagged above the limit)."""
    if text == "-" or s is None:
        return text
    return f"{text} ({fmt_spread(s)})"
