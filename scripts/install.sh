# shellcheck shell=bash
# Sourced by ./run: the installers. Each installs what is missing (apt-get, as root or through
# sudo; rustup for the nightly toolchain; pip in a venv for SPDK's RPC client) and does nothing
# when everything is there. Needs scripts/lib.sh.

ensure_toolchain() {
    if ! command -v cargo >/dev/null 2>&1 && [ -x "${HOME:-/root}/.cargo/bin/cargo" ]; then
        export PATH="${HOME:-/root}/.cargo/bin:$PATH"
    fi
    command -v cargo >/dev/null 2>&1 ||
        die "cargo not found: install Rust 1.85 or newer (https://rustup.rs) and re-run"
    # Rust links through the system C compiler. No crate here needs pkg-config or C libraries:
    # libblkio and io_uring are used through pure-Rust crates, and librbd and libcrypto (the
    # crypto bdev's OpenSSL engine) are opened at run time.
    if ! command -v cc >/dev/null 2>&1; then
        apt_install build-essential
    fi
    command -v cc >/dev/null 2>&1 || die "no C compiler (cc) for linking; install build-essential"
}

# ensure_bookworm_backports: on Debian 12, adds bookworm-backports to the apt sources if it is
# not there yet and returns 0; returns 1 on other systems. Debian 12's own QEMU is 7.2; the
# benchmark and the guest tests want 10.x from backports.
ensure_bookworm_backports() {
    local codename=
    [ -r /etc/os-release ] && codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
    [ "$codename" = bookworm ] || return 1
    if ! grep -rqs bookworm-backports /etc/apt/sources.list /etc/apt/sources.list.d/; then
        say "adding Debian bookworm-backports"
        printf '%s\n' 'Types: deb' 'URIs: http://deb.debian.org/debian' \
            'Suites: bookworm-backports' 'Components: main' \
            'Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg' |
            as_root tee /etc/apt/sources.list.d/backports.sources >/dev/null
    fi
}

# Miri runs on the nightly toolchain (installed with the minimal profile by fuzz/ci.sh if
# missing) and needs its component and the standard library's source.
ensure_miri() {
    if ! cargo +nightly --version >/dev/null 2>&1; then
        rustup toolchain install nightly --profile minimal || return 1
    fi
    if ! cargo +nightly miri --version >/dev/null 2>&1; then
        rustup component add --toolchain nightly miri rust-src || return 1
    fi
}

# ensure_qemu: QEMU 10 from bookworm-backports on Debian 12 (Debian's own is 7.2):
# qemu-system-x86 for the guest tests and qemu-utils, whose qemu-storage-daemon and qemu-img
# the workspace tests run (the NBD client's interop test, the benchmark's peer). Both come from
# one build, so both are installed together whenever either is older than 9.1.
ensure_qemu() {
    local want='version (9\.[1-9]|[1-9][0-9])\.'
    if ! qemu-system-x86_64 --version 2>/dev/null | grep -Eq "$want" ||
        ! qemu-storage-daemon --version 2>/dev/null | grep -Eq "$want"; then
        if ensure_bookworm_backports; then
            say "installing qemu-system-x86 and qemu-utils from bookworm-backports"
            apt_get update -qq
            apt_get install -y -qq --no-install-recommends \
                -t bookworm-backports qemu-system-x86 qemu-utils
        else
            apt_install qemu-system-x86 qemu-utils
        fi
    fi
    qemu-storage-daemon --version >/dev/null 2>&1 || die "qemu-storage-daemon is not installed"
    qemu-system-x86_64 --version | head -n 1
    qemu-storage-daemon --version | head -n 1
}

# The guest tests' tools (docs/guest-tests.md): QEMU 9.1 or newer (for reconnect-ms), what
# tests/guest/build-image.sh puts in the image, and socat, which QEMU runs for each connection
# the nvmf guest forwards to the host's loopback. For the TLS scenarios the image gets keyctl
# and Debian 13's tlshd (which build-image.sh downloads with curl) with these Debian 12
# libraries of tlshd's.
ensure_guest_packages() {
    ensure_qemu
    apt_install busybox-static cpio fio e2fsprogs xz-utils zstd libc6-dev nvme-cli socat cryptsetup-bin \
        keyutils curl libgnutls30 libglib2.0-0 libnl-3-200 libnl-genl-3-200 libkeyutils1
}

# The benchmark's tools: qemu-storage-daemon 10.x (ensure_qemu), fio, valgrind (callgrind, for
# instructions per I/O), matplotlib for /usr/bin/python3, for the RBD section a single-node Ceph cluster (tests/ceph/cluster.sh)
# and qsd's rbd driver, for the backup peer its RADOS Gateway and rclone, and for the NBD section nbdkit and libnbd-bin, for the ublk section nbd-client.
ensure_bench_tools() {
    command -v taskset >/dev/null 2>&1 || apt_install util-linux
    ensure_qemu
    # qsd loads its rbd driver from qemu-block-extra, whose modules must be the same build as
    # qsd itself: the same version as the installed qemu-utils (from backports on Debian 12).
    # The backup section's peer is `rclone copy` into a bucket of the cluster's RADOS Gateway.
    apt_install ceph-mon ceph-osd ceph-common uuid-runtime radosgw rclone curl
    local qver
    qver=$(dpkg-query -W -f='${Version}' qemu-utils 2>/dev/null || true)
    if [ -n "$qver" ] && [ "$(dpkg-query -W -f='${Version}' qemu-block-extra 2>/dev/null || true)" != "$qver" ]; then
        say "installing qemu-block-extra $qver (qsd's rbd driver)"
        apt_get update -qq
        apt_get install -y -qq --no-install-recommends \
            "qemu-block-extra=$qver"
    fi
    command -v fio >/dev/null 2>&1 || apt_install fio
    # The NBD section: nbdkit (its memory plugin) to compare with, libnbd's tools (nbdinfo,
    # nbdcopy; fio's nbd engine links libnbd too).
    apt_install nbdkit libnbd-bin
    # The ublk section: the kernel's NBD client in its guest (nbd-client, with its libraries).
    apt_install nbd-client
    command -v valgrind >/dev/null 2>&1 || apt_install valgrind
    /usr/bin/python3 -c 'import matplotlib' 2>/dev/null || apt_install python3-matplotlib
    /usr/bin/python3 -c 'import matplotlib' || die "/usr/bin/python3 cannot import matplotlib"
}

# SPDK's own JSON-RPC client, the Python package spdk (command spdk-rpc), for the test that
# drives the methods flashpath shares with SPDK through SPDK's code. It goes in a venv in the
# build directory: pip may not write to the system's python3 (PEP 668), and a fresh clone's
# target/ is where the rest of the build lives.
ensure_spdk_rpc() {
    local venv
    venv=$(target_dir)/spdk-venv
    [ -x "$venv/bin/spdk-rpc" ] && return 0
    /usr/bin/python3 -c 'import ensurepip, venv' 2>/dev/null || apt_install python3-venv
    say "installing SPDK's RPC client in $venv (pip install spdk==26.9)"
    /usr/bin/python3 -m venv "$venv" || return 1
    "$venv/bin/pip" install --quiet --disable-pip-version-check spdk==26.9 || return 1
    [ -x "$venv/bin/spdk-rpc" ] || die "pip installed spdk==26.9 but $venv/bin/spdk-rpc is missing"
}
