#!/usr/bin/env bash
# The fuzz step of ./run test (and CI): for every cargo-fuzz target, replay its regression corpus
# (fuzz/regressions/<target>/: seeds, crash reproducers, small interesting inputs), then fuzz it
# for a short smoke run starting from that corpus.
#
#   fuzz/ci.sh [TARGET...]      default: every target of `cargo fuzz list`
#
# Installs what is missing: the nightly toolchain (minimal profile; cargo-fuzz needs
# -Zsanitizer) and cargo-fuzz. Builds every target once (release, AddressSanitizer: cargo-fuzz's
# defaults). The smoke run fuzzes a throwaway copy of the corpus in a temp directory, so the
# repository does not grow; a crash leaves its reproducer in fuzz/artifacts/<target>/ and the log
# is printed. Prints one summary line per target and exits non-zero if any replay or smoke run
# failed.
#
# Environment: FUZZ_SMOKE_SECONDS (smoke run length per target, default 30), FUZZ_JOBS (targets
# run at a time, default one per CPU).
set -euo pipefail

cd "$(dirname "$0")"
# The fuzz workspace builds into fuzz/target, where cargo-fuzz looks for the binaries; a
# CARGO_TARGET_DIR meant for the root workspace would send the (ASan) build elsewhere.
unset CARGO_TARGET_DIR
SMOKE=${FUZZ_SMOKE_SECONDS:-30}

if ! cargo +nightly --version >/dev/null 2>&1; then
    echo "fuzz/ci.sh: installing the nightly toolchain"
    rustup toolchain install nightly --profile minimal
fi
if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
    echo "fuzz/ci.sh: installing cargo-fuzz"
    cargo install cargo-fuzz --locked
fi

if [ $# -gt 0 ]; then
    targets=("$@")
else
    mapfile -t targets < <(cargo +nightly fuzz list)
fi

# Per-target libFuzzer and sanitizer options. Leak detection is off for rpc_server: its
# connection threads can still be alive when LeakSanitizer checks at exit, and it then reports
# glibc's per-thread destructor list of such a thread (32 bytes from __cxa_thread_atexit_impl),
# which is not a flashpath leak (fuzz/README.md, finding 2). libFuzzer's -detect_leaks=0 only
# stops the per-input check; the check at exit is LeakSanitizer's own, so ASAN_OPTIONS turns
# that off too (cargo fuzz appends its options to ours). -timeout turns a stuck input (a queue
# that never stops, a read that never returns) into a failure well before the smoke run ends.
options() {
    case "$1" in
        rpc_server) echo "-detect_leaks=0 -timeout=20" ;;
        *) echo "-timeout=20" ;;
    esac
}
asan_options() {
    case "$1" in
        rpc_server) echo "detect_leaks=0" ;;
        *) echo "" ;;
    esac
}

start=$(date +%s)
echo "fuzz/ci.sh: building ${#targets[@]} targets"
cargo +nightly fuzz build
echo "fuzz/ci.sh: build took $(($(date +%s) - start)) s"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# The targets make their scratch directories (sockets, files) under the temp dir: put those in
# $work too, so the trap removes them.
mkdir "$work/tmp"
export TMPDIR=$work/tmp
# One target: its replay, then its smoke run. Writes its summary line to $work/$t.summary and
# its logs' tails (on a failure) to $work/$t.failure; returns non-zero when it failed.
run_target() {
    local t=$1 dir=regressions/$1 n t0 t1 t2 asan execs cov
    local -a opts
    if [ ! -d "$dir" ] || [ -z "$(ls -A "$dir")" ]; then
        echo "$t: FAILED (no regression corpus in fuzz/$dir)" >"$work/$t.summary"
        return 1
    fi
    read -r -a opts <<<"$(options "$t")"
    n=$(find "$dir" -type f | wc -l)
    t0=$(date +%s)
    # -runs=0: execute every input of the corpus once, mutate nothing.
    asan=$(asan_options "$t")
    if ! ASAN_OPTIONS=$asan cargo +nightly fuzz run "$t" "$dir" -- -runs=0 "${opts[@]}" >"$work/$t.replay.log" 2>&1; then
        tail -n 60 "$work/$t.replay.log" >"$work/$t.failure"
        echo "$t: FAILED replaying $n inputs of fuzz/$dir (log above)" >"$work/$t.summary"
        return 1
    fi
    t1=$(date +%s)
    cp -r "$dir" "$work/corpus/$t"
    if ! ASAN_OPTIONS=$asan cargo +nightly fuzz run "$t" "$work/corpus/$t" -- -max_total_time="$SMOKE" -print_final_stats=1 \
        "${opts[@]}" >"$work/$t.smoke.log" 2>&1; then
        tail -n 80 "$work/$t.smoke.log" >"$work/$t.failure"
        echo "$t: replay of $n inputs ok; FAILED in the ${SMOKE} s smoke run (log above, reproducer in fuzz/artifacts/$t/)" >"$work/$t.summary"
        return 1
    fi
    t2=$(date +%s)
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/$t.smoke.log")
    cov=$(grep -o 'cov: [0-9]*' "$work/$t.smoke.log" | tail -n 1 | cut -d' ' -f2)
    echo "$t: replay of $n inputs ok ($((t1 - t0)) s); smoke ok: ${execs:-?} execs in $((t2 - t1)) s, ${cov:-?} edges" >"$work/$t.summary"
}

# The targets run FUZZ_JOBS at a time (default: one per CPU): each libFuzzer run is one
# process on one core, so the step's fuzzing time is the same on fewer wall-clock seconds.
mkdir -p "$work/corpus"
jobs_max=${FUZZ_JOBS:-$(nproc)}
for t in "${targets[@]}"; do
    while [ "$(jobs -rp | wc -l)" -ge "$jobs_max" ]; do
        wait -n || true
    done
    run_target "$t" &
done
wait || true
summary=()
failed=0
for t in "${targets[@]}"; do
    if [ -f "$work/$t.failure" ]; then
        echo "--- $t"
        cat "$work/$t.failure"
    fi
    summary+=("$(cat "$work/$t.summary" 2>/dev/null || echo "$t: FAILED (no result)")")
    case "${summary[-1]}" in *FAILED*) failed=$((failed + 1)) ;; esac
done

echo
printf 'fuzz: %s\n' "${summary[@]}"
echo "fuzz/ci.sh: $failed of ${#targets[@]} targets failed; $(($(date +%s) - start)) s in all"
[ "$failed" -eq 0 ]
