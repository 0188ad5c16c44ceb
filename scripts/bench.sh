# shellcheck shell=bash
# Sourced by ./run: ./run bench [--quick|--smoke] (bench/bench.py, docs/benchmarks.md). Needs
# scripts/lib.sh and scripts/install.sh.

cmd_bench() {
    local mode=full
    case "${1:-}" in
        "") ;;
        --quick) mode=quick ;;
        --smoke) mode=smoke ;;
        *) die "usage: ./run bench [--quick|--smoke]" ;;
    esac
    ensure_toolchain
    ensure_bench_tools
    [ "$(nproc)" -ge 2 ] || die "the benchmark needs two CPUs (server on CPU 0, client on CPU 1)"
    local bin out
    if [ "$mode" = smoke ]; then
        # The smoke run checks that the pipeline works, not figures: the debug build that
        # ./run test has just made saves CI a release build.
        say "cargo build (debug: flashpath, fp-load)"
        cargo build -p flashpath -p fp-loadgen || return 1
        bin=$(target_dir)/debug
    else
        say "cargo build --release (flashpath, fp-load)"
        cargo build --release -p flashpath -p fp-loadgen || return 1
        bin=$(target_dir)/release
    fi
    out=$ROOT/bench/results/$(date +%Y%m%d-%H%M%S)-$mode
    say "bench/bench.py --mode $mode (results in $out)"
    # (Called from ./run test inside a condition, where set -e does not apply: every step
    # checks its own status.)
    # shellcheck disable=SC2086
    timeout --kill-after=30 3600 /usr/bin/python3 bench/bench.py --mode "$mode" --bin-dir "$bin" \
        --out "$out" ${BENCH_ARGS:-} || {
        echo "run: bench/bench.py failed" >&2
        return 1
    }
    say "checking the outputs in $out"
    /usr/bin/python3 bench/bench.py --mode "$mode" --bin-dir "$bin" --validate "$out"
}
