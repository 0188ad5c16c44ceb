# shellcheck shell=bash
# ./run soak --minutes N [--seed S]: the fault matrix's cases on a seeded schedule for N
# minutes beside a long-lived daemon under verified load, with its RSS, fds and threads sampled
# (docs/testing.md, "Soak"). The driver is the ignored test `soak` in
# crates/flashpath/tests/fault_matrix.rs; it prints the report and fails on any failed case,
# lost write, hang, bound missed, RSS growth after the first minute or fds/threads that do not
# come back.

cmd_soak() {
    local minutes=1 seed=1
    while [ $# -gt 0 ]; do
        case "$1" in
            --minutes)
                [ $# -ge 2 ] || die "soak: --minutes needs a number"
                minutes=$2
                shift 2
                ;;
            --seed)
                [ $# -ge 2 ] || die "soak: --seed needs a number"
                seed=$2
                shift 2
                ;;
            *) die "soak: unknown argument '$1' (usage: ./run soak --minutes N [--seed S])" ;;
        esac
    done
    [[ "$minutes" =~ ^[0-9]+$ ]] && [ "$minutes" -gt 0 ] || die "soak: --minutes must be a whole number above 0, not '$minutes'"
    [[ "$seed" =~ ^[0-9]+$ ]] || die "soak: --seed must be a whole number, not '$seed'"
    ensure_toolchain
    # The NBD cases read the export back with libnbd's nbdcopy.
    apt_install libnbd-bin
    say "soak: $minutes min, seed $seed"
    FP_SOAK_SECONDS=$((minutes * 60)) FP_SOAK_SEED=$seed \
        cargo test -p flashpath --test fault_matrix -- --ignored --exact soak --nocapture
}
