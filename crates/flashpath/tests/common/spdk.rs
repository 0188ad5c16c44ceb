//! SPDK's own RPC client, `spdk-rpc` (the Python package `spdk`), for the tests that drive
//! flashpath with it (spdk_rpc.rs on the host, guest_ublk.rs through a port forwarded to a guest).

use std::path::{Path, PathBuf};

/// Where spdk-rpc is, or a failed test saying how to install it.
pub fn spdk_rpc_path() -> PathBuf {
    if let Some(p) = std::env::var_os("FLASHPATH_SPDK_RPC") {
        let p = PathBuf::from(p);
        assert!(p.is_file(), "FLASHPATH_SPDK_RPC={} is not a file", p.display());
        return p;
    }
    // CARGO_TARGET_TMPDIR is `<target>/tmp`: its parent is the target directory in use.
    let target = std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| {
        Path::new(env!("CARGO_TARGET_TMPDIR")).parent().expect("target dir").to_path_buf()
    });
    let p = target.join("spdk-venv/bin/spdk-rpc");
    assert!(
        p.is_file(),
        "SPDK's client spdk-rpc not found (FLASHPATH_SPDK_RPC unset, no {}): `./run test` installs it, or \
         `python3 -m venv {t}/spdk-venv && {t}/spdk-venv/bin/pip install spdk==26.9`",
        p.display(),
        t = target.display()
    );
    p
}
