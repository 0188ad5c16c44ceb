//! The daemon crate is wiring: among the workspace's crates its (non-dev) dependencies name only
//! the registry, the RPC transport and the reactors. Everything a bdev module or an export kind
//! brings reaches it through the registry, so adding one never touches this crate
//! (docs/architecture.md, "Adding an export"). And the stacked bdev modules that need no unsafe
//! code forbid it.

use std::path::Path;

/// What the flashpath crate may depend on among the workspace's own crates.
const ALLOWED: [&str; 3] = ["fp-registry", "fp-rpc", "fp-reactor"];

fn manifest(path: &Path) -> toml::Table {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.parse().unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The workspace's own crates: the dependencies it declares by path.
fn workspace_crates(root: &toml::Table) -> Vec<String> {
    let deps = root["workspace"]["dependencies"].as_table().expect("[workspace.dependencies]");
    deps.iter().filter(|(_, d)| d.get("path").is_some()).map(|(name, _)| name.clone()).collect()
}

#[test]
fn the_daemon_depends_on_registry_rpc_and_reactor_only() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let ours = workspace_crates(&manifest(&dir.join("../../Cargo.toml")));
    // The check means something only while the workspace has crates beyond the allowed ones.
    for expected in ["fp-bdev", "fp-vhost-blk", "fp-nbd", "fp-registry"] {
        assert!(ours.iter().any(|c| c == expected), "{expected} is not a workspace crate: {ours:?}");
    }
    let crate_manifest = manifest(&dir.join("Cargo.toml"));
    for section in ["dependencies", "build-dependencies"] {
        let Some(deps) = crate_manifest.get(section).and_then(|d| d.as_table()) else { continue };
        let named: Vec<&String> = deps.keys().filter(|d| ours.contains(d)).collect();
        for dep in &named {
            assert!(
                ALLOWED.contains(&dep.as_str()),
                "crates/flashpath [{section}] names {dep}; the daemon may only depend on {ALLOWED:?} \
                 among the workspace's crates: reach it through fp-registry"
            );
        }
        if section == "dependencies" {
            assert_eq!(named.len(), ALLOWED.len(), "[dependencies] names {named:?}");
        }
    }
    // A target-specific table would be a way around the check.
    assert!(crate_manifest.get("target").is_none(), "target-specific dependencies: check them here");
}

/// Files whose code may not use `unsafe`: stacked bdevs work on requests whose buffers were
/// vouched for where they were described (`fp_bdev::Iovecs::from_raw`), so they need none.
/// Each carries `#![forbid(unsafe_code)]` (or, where its tests describe buffers of their own,
/// `#![cfg_attr(not(test), forbid(unsafe_code))]`).
const FORBID_UNSAFE: [&str; 3] = [
    "crates/bdev/src/modules/error/mod.rs",
    "crates/bdev/src/modules/delay/mod.rs",
    "crates/bdev/src/modules/null/mod.rs",
];

#[test]
fn stacked_bdev_modules_forbid_unsafe_code() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    for file in FORBID_UNSAFE {
        let text = std::fs::read_to_string(root.join(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
        let forbids =
            text.lines().map(str::trim).filter(|l| l.starts_with("#![")).any(|l| {
                l == "#![forbid(unsafe_code)]" || l == "#![cfg_attr(not(test), forbid(unsafe_code))]"
            });
        assert!(forbids, "{file} does not carry #![forbid(unsafe_code)] among its inner attributes");
    }
}
