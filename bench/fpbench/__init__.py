"""The benchmark's parts, by role; bench/bench.py is the entry point (docs/benchmarks.md)."""
