"""One mixin per section of the benchmark, each holding that section's methods of bench.Bench."""
