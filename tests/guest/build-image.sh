#!/usr/bin/env bash
# Builds (or reuses) the boot image of the guest tests: an uncompressed kernel (vmlinux, booted
# directly through PVH) and an initramfs holding static busybox, virtio_blk.ko, the modules of a
# virtio-net NIC and of the kernel's NVMe/TCP host, of VFIO, of the kernel's NVMe/TCP target
# (nvmet) and NBD, of dm-crypt, of kernel TLS and ublk_drv, the fpio data tool, mke2fs, e2fsck, fio,
# nvme-cli, cryptsetup, keyctl, tlshd and socat (with their shared libraries),
# libgcc_s for flashpath's binaries (which a test adds in a second cpio) and the scenario script
# `init`.
#
#   tests/guest/build-image.sh        prints "image: DIR" as its last line; DIR holds
#                                     vmlinux, initramfs.cpio and manifest.txt
#
# Nothing is fetched at guest run time. The downloads are two packages, once each, into the
# cache: the kernel package with `apt-get download` from Debian (bookworm-backports), and
# Debian 13's ktls-utils package for tlshd from the pool of the Debian archive apt already
# uses, pinned by its sha256 (see KTLS_DEB below). The image is cached in
# $FLASHPATH_GUEST_CACHE (default /var/tmp/flashpath-guest) under a key made of the kernel
# version and a hash of this script, init, fpio.c and the versions of the host packages copied
# into the image, so a second run only checks the key. Builds of the same key are serialised
# with flock. Host tools are not installed here: `./run test` installs them (see
# ensure_guest_packages in ./run); a missing one fails the build with the packages to install.
#
# Environment: FLASHPATH_GUEST_CACHE (cache directory), FLASHPATH_GUEST_KERNEL (a different
# linux-image-*-cloud-amd64 ABI name, for trying a new kernel before changing the pin below).
set -euo pipefail

# The one place the kernel is pinned: Debian's linux-image-<this>, from bookworm-backports.
KERNEL_PIN=6.12.95+deb12-cloud-amd64
KERNEL=${FLASHPATH_GUEST_KERNEL:-$KERNEL_PIN}

HERE=$(cd "$(dirname "$0")" && pwd)
CACHE=${FLASHPATH_GUEST_CACHE:-/var/tmp/flashpath-guest}

log() { printf 'build-image: %s\n' "$*" >&2; }
die() { printf 'build-image: error: %s\n' "$*" >&2; exit 1; }

# Host tools, with the Debian package each comes from.
need=(
    busybox:busybox-static cpio:cpio zstd:zstd xz:xz-utils fio:fio mke2fs:e2fsprogs
    dpkg-deb:dpkg apt-get:apt cc:build-essential flock:util-linux ldd:libc-bin od:coreutils
    nvme:nvme-cli cryptsetup:cryptsetup-bin keyctl:keyutils curl:curl socat:socat
)
missing=()
for pair in "${need[@]}"; do
    command -v "${pair%%:*}" >/dev/null 2>&1 || PATH=$PATH:/usr/sbin:/sbin command -v "${pair%%:*}" >/dev/null 2>&1 ||
        missing+=("${pair#*:}")
done
if [ ${#missing[@]} -gt 0 ]; then
    die "missing host tools; install them with: apt-get install ${missing[*]} (./run test does this)"
fi
export PATH=$PATH:/usr/sbin:/sbin
# busybox-static replaces the dynamic busybox; a dynamic one cannot run in the initramfs.
BUSYBOX=$(command -v busybox)
if ldd "$BUSYBOX" >/dev/null 2>&1; then
    die "$BUSYBOX is dynamically linked; install busybox-static"
fi

# The host packages whose files are copied into the image: their versions are part of the key.
COPIED_PKGS="busybox-static fio e2fsprogs libc6 nvme-cli libnvme1 libgcc-s1 cryptsetup-bin libcryptsetup12 libdevmapper1.02.1
    socat keyutils libkeyutils1 libgnutls30 libglib2.0-0 libnl-3-200 libnl-genl-3-200"
pkg_version() { dpkg-query -W -f='${Version}' "$1" 2>/dev/null || echo none; }
key_input() {
    cat "$0" "$HERE/init" "$HERE/fpio.c"
    for p in $COPIED_PKGS; do printf '%s=%s\n' "$p" "$(pkg_version "$p")"; done
}
HASH=$(key_input | sha256sum | cut -c1-16)
OUT=$CACHE/$KERNEL-$HASH

if [ -f "$OUT/ready" ]; then
    log "cached image $OUT"
    echo "image: $OUT"
    exit 0
fi

mkdir -p "$CACHE/debs"
exec 9>"$CACHE/.lock"
flock 9
if [ -f "$OUT/ready" ]; then # built by another process while we waited
    echo "image: $OUT"
    exit 0
fi

# ---- the kernel package -------------------------------------------------------------------
PKG=linux-image-$KERNEL
deb=$(ls "$CACHE"/debs/"${PKG}"_*.deb 2>/dev/null | head -n1 || true)
if [ -z "$deb" ]; then
    log "downloading $PKG (apt-get download)"
    dl() { (cd "$CACHE/debs" && apt-get download -q -o APT::Sandbox::User=root "$PKG") >&2; }
    if ! dl; then
        log "not found in the package lists; running apt-get update and trying again"
        apt-get update -qq >&2 || true
        dl || die "the pinned guest kernel package $PKG is not in the archive any more.
  Pick a current one: apt-cache search --names-only 'linux-image-.*-cloud-amd64\$' (needs
  bookworm-backports in the apt sources), try it with FLASHPATH_GUEST_KERNEL=<abi-name>, then
  change KERNEL_PIN in tests/guest/build-image.sh."
    fi
    deb=$(ls "$CACHE"/debs/"${PKG}"_*.deb | head -n1)
fi

# ---- tlshd --------------------------------------------------------------------------------
# tlshd (ktls-utils) is the user-space agent of the kernel's TLS handshake upcall
# (net/handshake): the kernel's NVMe/TCP host and target hand it each TLS queue's socket, it
# runs the TLS 1.3 PSK handshake with GnuTLS and gives the socket back with kTLS set up. No
# Debian 12 package has it. Debian 13 (trixie) builds it as ktls-utils 1.0.0-1; its source
# package is listed in trixie's Sources index, but the mirror does not serve the source files
# (404), so the image takes Debian's own build: that binary needs no newer symbol than Debian
# 12's libraries have (GLIBC_2.34, GNUTLS_3_7_3, KEYUTILS_1.5), so add_dynamic copies it
# with Debian 12's libgnutls30, libglib2.0-0, libnl-3-200, libnl-genl-3-200 and libkeyutils1,
# and the chroot check below runs it. The package comes from the pool of the Debian archive
# that apt already uses here (every suite shares the pool), checked against this sha256 (from
# trixie's Packages index) and cached beside the kernel package.
KTLS_DEB=ktls-utils_1.0.0-1_amd64.deb
KTLS_SHA256=a7095cdbf262ba4fcefbb924162ae34aa973a2963c1f4660ef75b553649b2998
ktls=$CACHE/debs/$KTLS_DEB
if ! echo "$KTLS_SHA256  $ktls" | sha256sum -c --status 2>/dev/null; then
    codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
    # apt lists its archives once it has their indexes (after an apt-get update).
    archive_of() {
        apt-get indextargets --format '$(REPO_URI) $(CODENAME)' 2>/dev/null |
            awk -v c="$codename" '$2 == c { print $1; exit }'
    }
    archive=$(archive_of)
    if [ -z "$archive" ]; then
        log "apt knows no archive of '$codename' yet; running apt-get update"
        apt-get update -qq >&2 || true
        archive=$(archive_of)
    fi
    [ -n "$archive" ] || die "apt has no Debian archive for '$codename' to fetch $KTLS_DEB from"
    log "downloading $KTLS_DEB from ${archive}pool/main/k/ktls-utils/"
    curl -fsS --retry 3 -o "$ktls.part" "${archive}pool/main/k/ktls-utils/$KTLS_DEB" >&2 ||
        die "cannot download $KTLS_DEB from $archive"
    echo "$KTLS_SHA256  $ktls.part" | sha256sum -c --status ||
        die "$KTLS_DEB from $archive does not have the pinned sha256 $KTLS_SHA256"
    mv "$ktls.part" "$ktls"
fi

WORK=$(mktemp -d "$CACHE/build.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
log "unpacking $(basename "$deb")"
dpkg-deb -x "$deb" "$WORK/pkg"
dpkg-deb -x "$ktls" "$WORK/ktls"
vmlinuz=$WORK/pkg/boot/vmlinuz-$KERNEL
[ -f "$vmlinuz" ] || die "$deb has no boot/vmlinuz-$KERNEL"

# vmlinuz is a bzImage whose payload is the zstd-compressed ELF vmlinux. The setup header gives
# its place: setup_sects at 0x1f1, payload_offset at 0x248 and payload_length at 0x24c, the
# offset counted from the protected-mode code at (setup_sects + 1) * 512. The payload's last 4
# bytes are the decompressed size (for the kernel's own decompressor), not zstd data.
u8() { od -An -tu1 -j "$1" -N1 "$vmlinuz" | tr -d ' '; }
u32() { od -An -tu4 -j "$1" -N4 "$vmlinuz" | tr -d ' '; }
setup_sects=$(u8 $((0x1f1)))
payload_offset=$(u32 $((0x248)))
payload_length=$(u32 $((0x24c)))
start=$(((setup_sects + 1) * 512 + payload_offset))
magic=$(od -An -tx1 -j "$start" -N4 "$vmlinuz" | tr -d ' ')
[ "$magic" = 28b52ffd ] || die "the payload of $vmlinuz is not zstd (magic $magic)"
dd if="$vmlinuz" iflag=skip_bytes,count_bytes skip="$start" count=$((payload_length - 4)) bs=1M status=none |
    zstd -dq >"$WORK/vmlinux" || die "zstd could not decompress the kernel payload"
want_size=$(u32 $((start + payload_length - 4)))
got_size=$(stat -c %s "$WORK/vmlinux")
[ "$got_size" = "$want_size" ] || die "vmlinux is $got_size bytes, the header says $want_size"
[ "$(od -An -tx1 -N4 "$WORK/vmlinux" | tr -d ' ')" = 7f454c46 ] || die "vmlinux is not an ELF file"

# ---- the initramfs ------------------------------------------------------------------------
R=$WORK/root
mkdir -p "$R"/{bin,sbin,dev,proc,sys,mnt,tmp,etc,lib/modules,usr/bin}
# add_module NAME WANTED_DEPENDS: copies NAME.ko (decompressed) to /lib/modules and checks that
# its "depends=" (from the NUL-terminated .modinfo strings) is exactly WANTED_DEPENDS, the
# modules init loads before it; a kernel whose modules depend on more fails the build here
# instead of an insmod in the guest.
add_module() {
    local name=$1 want=$2 ko got
    ko=$(find "$WORK/pkg/lib/modules/$KERNEL" -name "$name.ko*" | head -n1)
    [ -n "$ko" ] || die "$deb has no $name module"
    case $ko in
        *.xz) xz -dc "$ko" >"$R/lib/modules/$name.ko" ;;
        *.zst) zstd -dcq "$ko" >"$R/lib/modules/$name.ko" ;;
        *) cp "$ko" "$R/lib/modules/$name.ko" ;;
    esac
    got=$(tr '\0' '\n' <"$R/lib/modules/$name.ko" | sed -n 's/^depends=//p')
    [ "$got" = "$want" ] || die "$name.ko depends on '$got', init loads only '$want' before it"
}
add_module virtio_blk ""
# The nvmf scenario's NIC and NVMe/TCP host, in the order init loads them (nvme-core, the
# keyring and fabrics authentication are built into this kernel).
add_module failover ""
add_module net_failover failover
add_module virtio_net net_failover
add_module nvme-fabrics ""
add_module nvme-tcp nvme-fabrics
# The nvme scenario: VFIO, to hand the emulated NVMe function to flashpath's user-space driver
# (the guest boots with intel_iommu=on; iommufd is not in this kernel), and the kernel's NVMe/TCP
# target (nvmet over configfs) for flashpath's TCP initiator on the host; NBD, whose export of
# the attached namespace the guest's fio verifies.
add_module irqbypass ""
add_module vfio ""
add_module vfio_iommu_type1 vfio
add_module vfio-pci-core vfio,irqbypass
add_module vfio-pci vfio-pci-core,vfio
add_module configfs ""
add_module nvmet configfs
add_module nvmet-tcp nvmet
add_module nbd ""
# The crypto scenario: dm-crypt for `cryptsetup open --type plain --cipher aes-xts-plain64`. AES
# itself is built into this kernel; the xts template is a module, which init loads before
# dm-crypt asks for "xts(aes)" (the guest has no modprobe that could load it on demand).
add_module dm-mod ""
add_module dm-crypt dm-mod
add_module xts ""
# Kernel TLS: tls.ko is what tlshd's setsockopt(TCP_ULP, "tls") needs, and kTLS's record
# cipher for the NVMe/TCP suites (TLS_AES_128_GCM_SHA256, TLS_AES_256_GCM_SHA384) is the
# gcm(aes) template: gcm.ko with ghash (AES and CTR are built in); the guest cannot load any of
# them on demand (without them tlshd's handshake succeeds and then the kernel refuses the
# session: "The kernel does not support the requested algorithm"). The handshake upcall
# (net/handshake), the .nvme keyring and the NVMe/TCP TLS code of nvme-tcp and nvmet-tcp
# (CONFIG_NVME_TCP_TLS, CONFIG_NVME_TARGET_TCP_TLS) are built into this kernel; the check below
# makes a kernel without them fail here.
add_module crypto_null ""
add_module gcm crypto_null
add_module gf128mul ""
add_module ghash-generic gf128mul
add_module tls ""
# The ublk scenario: the kernel's user-space block device driver (/dev/ublk-control).
add_module ublk_drv ""
# The ublk benchmark's reference (bench/fpbench/sections/ublk.py): the kernel's null_blk.
add_module null_blk configfs
for opt in CONFIG_NET_HANDSHAKE=y CONFIG_NVME_KEYRING=y CONFIG_NVME_TCP_TLS=y CONFIG_NVME_TARGET_TCP_TLS=y; do
    grep -qx "$opt" "$WORK/pkg/boot/config-$KERNEL" || die "$deb is not built with $opt (TLS scenarios)"
done

cp "$BUSYBOX" "$R/bin/busybox"
cp "$HERE/init" "$R/init"
chmod 755 "$R/init"
log "compiling fpio (static)"
cc -O2 -Wall -Wextra -Werror -static -o "$R/bin/fpio" "$HERE/fpio.c" ||
    die "cannot build fpio statically (needs libc6-dev for libc.a)"

# A dynamic binary goes in at its host path (or at DEST), with every library ldd resolves, at
# the same paths (the loader's default search and the libraries' RUNPATHs then find them
# without ld.so.cache).
add_dynamic() {
    local bin=$1 dest=${2:-$1} lib
    mkdir -p "$R$(dirname "$dest")"
    cp -L "$bin" "$R$dest"
    for lib in $(ldd "$bin" | awk '/=> \// { print $3 } /^[ \t]*\/[^ ]*ld-linux/ { print $1 }'); do
        [ -f "$R$lib" ] && continue
        mkdir -p "$R$(dirname "$lib")"
        cp -L "$lib" "$R$lib"
    done
}
add_dynamic "$(command -v fio)"
add_dynamic "$(command -v mke2fs)"
# nvme-cli (discover, connect, disconnect) for the nvmf scenario; it reads the host NQN from
# /etc/nvme/hostnqn, which init writes.
add_dynamic "$(command -v nvme)"
# e2fsck and cryptsetup for the crypto scenario: the guest opens the raw disk under dm-crypt and
# checks the file system it finds there.
add_dynamic "$(command -v e2fsck)"
add_dynamic "$(command -v cryptsetup)"
# The TLS scenarios: keyctl puts the TLS PSKs in the kernel's .nvme keyring, tlshd does the
# handshakes (see "tlshd" above); init writes /etc/tlshd.conf.
add_dynamic "$(command -v keyctl)"
# The ublk scenario relays a forwarded TCP port to the daemon's RPC socket, so that SPDK's client
# on the host reaches the daemon in the guest.
add_dynamic "$(command -v socat)"
add_dynamic "$WORK/ktls/usr/sbin/tlshd" /usr/sbin/tlshd
[ -f /etc/mke2fs.conf ] && cp /etc/mke2fs.conf "$R/etc/"
# flashpath's binaries need libgcc_s (unwinding) besides libc. They change with every build, so
# they are not in this cached image: the nvme test packs them into a second cpio that QEMU loads
# after this one (crates/flashpath/tests/common/guest.rs, VmConfig::extra_files).
libgcc=$(ldconfig -p | awk '/libgcc_s\.so\.1 .*x86-64/ && !found { print $NF; found = 1 }')
[ -n "$libgcc" ] || die "no libgcc_s.so.1 on the host (package libgcc-s1)"
mkdir -p "$R$(dirname "$libgcc")"
cp -L "$libgcc" "$R$libgcc"
# The copied programs must start inside the image (checked with chroot, which needs root).
if [ "$(id -u)" -eq 0 ]; then
    for prog in "/usr/bin/fio --version" "/usr/sbin/mke2fs -V" "/usr/sbin/nvme version" "$(command -v e2fsck) -V" "$(command -v cryptsetup) --version" "$(command -v keyctl) --version" "/usr/sbin/tlshd -v" "/bin/busybox true" "/bin/fpio -b verify /init 0 8 0"; do
        # (fpio compares the first 8 bytes of /init with the pattern: status 1, "differs", means it ran.)
        rc=0
        chroot "$R" $prog >/dev/null 2>&1 || rc=$?
        [ $rc -eq 0 ] || { [ "${prog#/bin/fpio}" != "$prog" ] && [ $rc -eq 1 ]; } ||
            die "$prog does not run inside the image (status $rc)"
    done
fi

{
    echo "kernel: $PKG ($(basename "$deb"))"
    echo "key: $HASH"
    for p in $COPIED_PKGS; do echo "$p: $(pkg_version "$p")"; done
    echo "tlshd: $KTLS_DEB (sha256 $KTLS_SHA256)"
    echo "initramfs: $(du -sm "$R" | cut -f1) MiB uncompressed"
} >"$WORK/manifest.txt"

# Not compressed: under TCG the guest unpacks the 86 MiB cpio about 2 s sooner than it inflates
# the 36 MiB gzip -1 of it (docs/guest-tests.md has the measurement).
log "packing the initramfs ($(du -sm "$R" | cut -f1) MiB)"
(cd "$R" && find . -print0 | LC_ALL=C sort -z | cpio --null -o -H newc --quiet -R 0:0) >"$WORK/initramfs.cpio"

mkdir -p "$OUT"
mv "$WORK/vmlinux" "$WORK/initramfs.cpio" "$WORK/manifest.txt" "$OUT/"
touch "$OUT/ready"
# Older images of the same kernel or of other kernels are left for other checkouts; remove
# $CACHE to reclaim the space.
log "built $OUT"
echo "image: $OUT"
