# shellcheck shell=bash
# Sourced by ./run: ./run test (docs/testing.md). Needs scripts/lib.sh, scripts/install.sh and,
# for the closing benchmark smoke run, scripts/bench.sh.

# ci_refuses_skips: under CI=true every step runs; a FLASHPATH_SKIP_* variable fails the run
# rather than hiding a step.
ci_refuses_skips() {
    [ "${CI:-}" = true ] || return 0
    local v
    for v in LINT GUEST FUZZ MIRI BENCH_SMOKE; do
        local name=FLASHPATH_SKIP_$v
        [ "${!name:-0}" = 1 ] && die "$name=1 is set, but under CI=true every step runs"
    done
    return 0
}

# missing_tool WHAT: outside CI, says that a step is skipped; under CI=true, fails the run.
missing_tool() {
    [ "${CI:-}" = true ] && die "$1 is not installed (under CI=true no step may be skipped)"
    echo "run: $1 is not installed; skipping its step"
}

cmd_test() {
    ensure_toolchain
    ci_refuses_skips
    # A CI run builds once from nothing: incremental state would only cost time and disk.
    [ "${CI:-}" = true ] && export CARGO_INCREMENTAL=0
    # The whole run writes about 8 GB (builds, fuzz and Miri targets, guest images): a full
    # disk fails every later step, so the log says how much there was.
    echo "run: $(df -h --output=avail . | tail -1 | tr -d ' ') free on the file system of $PWD"
    if [ "${FLASHPATH_SKIP_LINT:-0}" != 1 ]; then
        if cargo fmt --version >/dev/null 2>&1; then
            say "cargo fmt --check"
            cargo fmt --all -- --check -l || die "the files above are not rustfmt-formatted (cargo fmt --all fixes them)"
            echo "all files are formatted"
        else
            missing_tool "rustfmt (rustup component add rustfmt)"
        fi
        if cargo clippy --version >/dev/null 2>&1; then
            say "cargo clippy (warnings are errors)"
            cargo clippy --workspace --all-targets -- -D warnings
            say "cargo doc (warnings are errors: broken intra-doc links)"
            RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --quiet
        else
            missing_tool "clippy (rustup component add clippy)"
        fi
    fi
    # The metrics test scrapes the daemon with a real Prometheus and lints with promtool; the
    # `flashpath top` test drives it under tmux.
    command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1 || apt_install prometheus
    command -v tmux >/dev/null 2>&1 || apt_install tmux
    # The RBD tests start a real one-monitor, one-OSD Ceph cluster (tests/ceph/cluster.sh);
    # librbd1 and librados2, which the daemon loads at run time, come with ceph-common. The S3
    # tests add its RADOS Gateway (radosgw; radosgw-admin is in ceph-common) and sign their
    # requests with curl's --aws-sigv4.
    apt_install ceph-mon ceph-osd ceph-common uuid-runtime radosgw curl
    # The NBD export's tests drive it with the real tools: nbdinfo and nbdcopy (libnbd-bin),
    # nbdsh (python3-libnbd, for the system's python3), nbdkit, qemu-img (qemu-utils; any
    # version: the guest step below upgrades it where it must) and certtool (gnutls-bin) for
    # the TLS test's CA.
    apt_install libnbd-bin nbdkit python3-libnbd gnutls-bin
    # The fault matrix names a leaked socket's peer with ss (iproute2) when its fd check fails.
    command -v ss >/dev/null 2>&1 || apt_install iproute2
    # qemu-img and qemu-storage-daemon (the NBD client's interop test) from QEMU 10, installed
    # here with the guest tests' QEMU, before any test needs them: Debian 12's own qemu-utils
    # (7.2) has no qemu-storage-daemon.
    ensure_qemu
    # The crypto bdev's ciphertext is checked against Python's AES-XTS, and DH-HMAC-CHAP's
    # responses and DH secrets against Python's hmac and cryptography (fp-crypto's tests).
    apt_install python3-cryptography
    # DH-HMAC-CHAP secrets and their transform are checked against nvme-cli's gen-dhchap-key.
    command -v nvme >/dev/null 2>&1 || apt_install nvme-cli
    # NVMe/TCP's TLS session is checked against `openssl s_server`/`s_client` and `openssl kdf`;
    # with an nvme-cli that inserts TLS PSKs (2.7 on), the keys are read back with keyctl.
    command -v openssl >/dev/null 2>&1 || apt_install openssl
    command -v keyctl >/dev/null 2>&1 || apt_install keyutils
    # The SPDK compatibility test drives flashpath through SPDK's published client.
    ensure_spdk_rpc || die "could not install SPDK's RPC client (pip install spdk==26.9)"
    export FLASHPATH_SPDK_RPC
    FLASHPATH_SPDK_RPC=$(target_dir)/spdk-venv/bin/spdk-rpc
    say "cargo test --workspace"
    # The end-to-end tests start one daemon each; two test threads keep a 2-core machine busy
    # without oversubscribing it badly.
    local log rc=0
    log=$(mktemp)
    cargo test --workspace --no-fail-fast -- --test-threads="${TEST_THREADS:-2}" --skip guest_vm:: 2>&1 |
        tee "$log" || rc=$?
    # The guest tests (crates/flashpath/tests/guest.rs, guest_nvmf.rs, guest_nvme.rs, guest_backup.rs,
    # guest_ublk.rs, migration.rs, migration_rbd.rs) boot QEMU guests whose two vCPUs and daemons fill the machine: they run
    # alone, after the others, one at a time.
    if [ "${FLASHPATH_SKIP_GUEST:-0}" = 1 ]; then
        echo "run: FLASHPATH_SKIP_GUEST=1: not running the guest tests"
    else
        ensure_guest_packages
        say "guest tests (QEMU, one guest at a time)"
        # guest_nvme ships fp-load and fp-nvme's examples into its guest: built by the step above, and
        # here again (a no-op then) so that this step alone finds them.
        cargo build -p fp-loadgen --bin fp-load -p fp-nvme --example nvme_guest --example vfio_bdev 2>&1 |
            tee -a "$log" || rc=$?
        cargo test --workspace --no-fail-fast --test guest --test guest_nvmf --test guest_nvme --test guest_backup --test guest_ublk \
            -- --test-threads=1 2>&1 |
            tee -a "$log" || rc=$?
        # --nocapture: the log keeps each migration's downtime and total time, and each chain's.
        cargo test --workspace --no-fail-fast --test migration --test migration_rbd -- --test-threads=1 \
            --nocapture 2>&1 | tee -a "$log" || rc=$?
    fi
    # cargo ends with the doc-test summary of the last crate; print the totals last.
    local totals
    totals=$(awk '/^test result:/ {
            for (i = 2; i <= NF; i++) {
                if ($i ~ /^passed;?$/) p += $(i - 1)
                if ($i ~ /^failed;?$/) f += $(i - 1)
                if ($i ~ /^ignored;?$/) s += $(i - 1)
            }
        }
        END { printf "%d %d %d", p, f, s }' "$log")
    rm -f "$log"
    local passed failed skipped
    read -r passed failed skipped <<<"$totals"
    # The fuzz step counts as one test. It runs even when tests failed: a fuzz regression is
    # independent news, and the step's length is fixed (about 30 s per target plus the build).
    if [ "${FLASHPATH_SKIP_FUZZ:-0}" = 1 ]; then
        echo "run: FLASHPATH_SKIP_FUZZ=1: not running the fuzz step"
        skipped=$((skipped + 1))
    else
        say "fuzz: replay the regression corpora, 30 s smoke run per target (fuzz/ci.sh)"
        if fuzz/ci.sh; then
            passed=$((passed + 1))
        else
            rc=1
            failed=$((failed + 1))
        fi
    fi
    # Miri checks the unsafe code of the request parser (the data path's trust boundary) for
    # undefined behaviour; it counts as one test. The other crates' unsafe code talks to the
    # kernel (memfd, mmap of files, epoll, io_uring), which Miri cannot run; ASan covers it in
    # the fuzz step.
    if [ "${FLASHPATH_SKIP_MIRI:-0}" = 1 ]; then
        echo "run: FLASHPATH_SKIP_MIRI=1: not running Miri"
        skipped=$((skipped + 1))
    else
        say "miri: fp-virtq's and fp-virtio-blk's tests under Miri"
        if ensure_miri && cargo +nightly miri test -p fp-virtq -p fp-virtio-blk; then
            passed=$((passed + 1))
        else
            rc=1
            failed=$((failed + 1))
        fi
    fi
    # A one-minute soak (docs/testing.md, "Soak"): matrix cases on a seeded schedule beside a
    # long-lived daemon whose RSS, fds and threads are sampled; one test. Its NBD cases use
    # nbdcopy (libnbd-bin, installed above for the NBD tests; cmd_soak installs it if missing).
    say "soak: 60 s (./run soak --minutes 1)"
    # shellcheck source=scripts/soak.sh
    . scripts/soak.sh
    if (cmd_soak --minutes 1 --seed "${SOAK_SEED:-1}"); then
        passed=$((passed + 1))
    else
        rc=1
        failed=$((failed + 1))
    fi
    # The benchmark smoke run counts as one more test.
    if [ "$rc" -ne 0 ]; then
        skipped=$((skipped + 1))
    elif [ "${FLASHPATH_SKIP_BENCH_SMOKE:-0}" = 1 ]; then
        echo "run: FLASHPATH_SKIP_BENCH_SMOKE=1: not running the benchmark smoke run"
        skipped=$((skipped + 1))
    elif cmd_bench --smoke; then
        passed=$((passed + 1))
    else
        rc=1
        failed=$((failed + 1))
    fi
    # The benchmark's own unit tests (parsing of openssl and xts_speed output, the per-CPU
    # figures, targets and --validate of the raid, crypto, path-length and density sections, the long-minus-short
    # method, a server dying with a bench killed outright): one test, under a second.
    say "bench: the sections' unit tests (python3 -m unittest fpbench.tests_*)"
    if (cd bench && /usr/bin/python3 -m unittest -q fpbench.tests_crypto fpbench.tests_raid fpbench.tests_pathlen fpbench.tests_servers fpbench.tests_nvme_tcp fpbench.tests_paths fpbench.tests_tls fpbench.tests_s3 fpbench.tests_backup fpbench.tests_ublk fpbench.tests_luks fpbench.tests_density); then
        passed=$((passed + 1))
    else
        rc=1
        failed=$((failed + 1))
    fi
    # The NVMe/TCP floor (bench/tcp_floor.c, the benchmark's minimal responder): built with cc,
    # flashpath's initiator attached to it and reading through a vhost export, in both of its
    # system call modes, and the section's figures from it: one test, seconds (the debug
    # flashpath and fp-load the smoke run built; built here if it did not run).
    say "bench: the NVMe/TCP floor responder against flashpath's initiator (fpbench.tests_floor)"
    if cargo build -q -p flashpath -p fp-loadgen \
        && (cd bench && FLASHPATH_BIN_DIR="$(target_dir)/debug" /usr/bin/python3 -m unittest -q fpbench.tests_floor); then
        passed=$((passed + 1))
    else
        rc=1
        failed=$((failed + 1))
    fi
    # The vhost-user floor (bench/vhost_floor.c): built with cc, driven by fp-load's own
    # frontend over huge pages (polled at QD1 and QD32, notified at QD1), its request count
    # against the client's, a second client, a bad message dropping its client: seconds. It
    # reserves a few 2 MiB huge pages as root (skips without them).
    say "bench: the vhost-user floor against fp-load's frontend (fpbench.tests_vhost_floor)"
    if cargo build -q -p fp-loadgen \
        && (cd bench && FLASHPATH_BIN_DIR="$(target_dir)/debug" /usr/bin/python3 -m unittest -q fpbench.tests_vhost_floor); then
        passed=$((passed + 1))
    else
        rc=1
        failed=$((failed + 1))
    fi
    printf '\ntotal: %d passed, %d failed, %d skipped\n' "$passed" "$failed" "$skipped"
    return "$rc"
}
