# shellcheck shell=bash
# Sourced by ./run: messages, root, apt and the build directory. Expects ROOT (the repository's
# root, the current directory).

say() { printf '\n==> %s\n' "$*"; }
die() { printf 'run: %s\n' "$*" >&2; exit 1; }

as_root() {
    if [ "$(id -u)" -eq 0 ]; then
        "$@"
    elif command -v sudo >/dev/null 2>&1; then
        sudo "$@"
    else
        die "need root (or sudo) to run: $*"
    fi
}

# apt_get ARGS...: apt-get as root, non-interactive, waiting up to 10 minutes for the package
# database's lock (another apt-get, or unattended-upgrades on a fresh machine) instead of failing.
apt_get() {
    as_root env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 "$@"
}

# apt_install PKG...: installs the packages that are not installed yet; runs apt-get update
# only when something is missing.
apt_install() {
    local missing=()
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    command -v apt-get >/dev/null 2>&1 || die "missing ${missing[*]} and no apt-get to install them"
    say "installing ${missing[*]}"
    apt_get update -qq
    apt_get install -y -qq --no-install-recommends "${missing[@]}"
}

target_dir() {
    local d=${CARGO_TARGET_DIR:-$ROOT/target}
    case $d in /*) ;; *) d=$ROOT/$d ;; esac
    printf '%s' "$d"
}
