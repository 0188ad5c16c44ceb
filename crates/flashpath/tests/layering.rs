//! The workspace's layering, read from the manifests:
//!
//! * the daemon crate is wiring: among the workspace's crates its (non-dev) dependencies name
//!   only the registry, the RPC transport and the reactors. Everything a bdev module or an export
//!   kind brings reaches it through the registry, so adding one never touches this crate
//!   (docs/architecture.md, "Adding an export");
//! * the NVMe facts live below both NVMe crates: fp-nvme-spec depends on no workspace crate and
//!   has no unsafe code, and no crate but the registry builds on the NVMe/TCP target (fp-nvmf);
//!   tests may start one (dev-dependencies).
//! * fp-bdev, which every crate builds on, carries no cipher: AES, XTS and the libcrypto loader
//!   are fp-crypto's (the crypto bdev and the keyring);
//! * the stacked bdev modules and the NVMe/TCP target, which need no unsafe code, forbid it;
//! * the plain system calls go through fp-sys's wrappers (`layering/syscalls.rs`);
//! * unsafe code stays at the edges (`layering/unsafe_sites.rs`).
//! * sibling bdev modules (raid, lvol) do not build on each other.
//! * the LUKS format library (fp-luks) builds on no workspace crate and forbids unsafe code;
//!   fp-crypto builds on it, and fp-bdev carries neither;
//! * the backup store (fp-backup) runs on control threads: it builds on no workspace crate (no
//!   reactor, no bdev), forbids unsafe code, and the jobs above it hand it a disk to read.
//! * the backup bdev module (fp-backup-bdev: the store table, the catalogue, the live-restore
//!   bdev) sits above fp-bdev, fp-crypto and fp-backup and below fp-registry, the only crate
//!   that builds on it, and forbids unsafe code.

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

/// The workspace's own crates and their manifest directories.
fn workspace_crate_dirs(root_dir: &Path) -> Vec<(String, std::path::PathBuf)> {
    let root = manifest(&root_dir.join("Cargo.toml"));
    let deps = root["workspace"]["dependencies"].as_table().expect("[workspace.dependencies]");
    deps.iter()
        .filter_map(|(name, d)| Some((name.clone(), root_dir.join(d.get("path")?.as_str()?))))
        .collect()
}

/// The workspace crates `crate_manifest` names in its non-dev dependency tables.
fn non_dev_workspace_deps(crate_manifest: &toml::Table, ours: &[String]) -> Vec<String> {
    assert!(crate_manifest.get("target").is_none(), "target-specific dependencies: check them here");
    ["dependencies", "build-dependencies"]
        .iter()
        .filter_map(|section| crate_manifest.get(*section).and_then(|d| d.as_table()))
        .flat_map(|deps| deps.keys().filter(|d| ours.contains(d)).cloned())
        .collect()
}

#[test]
fn only_the_registry_builds_on_the_nvme_tcp_target() {
    let root_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let crates = workspace_crate_dirs(&root_dir);
    let ours: Vec<String> = crates.iter().map(|(name, _)| name.clone()).collect();
    for expected in ["fp-nvmf", "fp-nvme", "fp-nvme-spec", "fp-registry"] {
        assert!(ours.iter().any(|c| c == expected), "{expected} is not a workspace crate: {ours:?}");
    }
    let mut users = Vec::new();
    for (name, dir) in &crates {
        if non_dev_workspace_deps(&manifest(&dir.join("Cargo.toml")), &ours).iter().any(|d| d == "fp-nvmf") {
            users.push(name.as_str());
        }
    }
    assert_eq!(
        users,
        ["fp-registry"],
        "only fp-registry may depend on fp-nvmf (the NVMe/TCP target); the NVMe facts both sides \
         share are fp-nvme-spec's, and a test that starts a target names fp-nvmf in \
         [dev-dependencies]"
    );
}

/// Sibling bdev modules that stand side by side, neither built on the other: what both need
/// (an identity type, say) lives below them, in fp-bdev.
const SIBLINGS: [(&str, &str); 1] = [("fp-raid", "fp-lvol")];

#[test]
fn sibling_bdev_modules_do_not_build_on_each_other() {
    let root_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let crates = workspace_crate_dirs(&root_dir);
    let ours: Vec<String> = crates.iter().map(|(name, _)| name.clone()).collect();
    for (a, b) in SIBLINGS {
        for (user, used) in [(a, b), (b, a)] {
            let (_, dir) = crates.iter().find(|(name, _)| name == user).unwrap_or_else(|| panic!("{user}?"));
            assert!(ours.iter().any(|c| c == used), "{used} is not a workspace crate: {ours:?}");
            let deps = non_dev_workspace_deps(&manifest(&dir.join("Cargo.toml")), &ours);
            assert!(
                !deps.iter().any(|d| d == used),
                "{user} depends on {used}: move what both use down into fp-bdev"
            );
        }
    }
}

/// Checks that `package` depends on no workspace crate (`why` says why it must not) and that
/// its lib.rs forbids unsafe code.
fn assert_stands_alone_without_unsafe(package: &str, why: &str) {
    let root_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let crates = workspace_crate_dirs(&root_dir);
    let ours: Vec<String> = crates.iter().map(|(name, _)| name.clone()).collect();
    let (_, dir) = crates
        .iter()
        .find(|(name, _)| name == package)
        .unwrap_or_else(|| panic!("{package} is not a workspace crate"));
    let deps = non_dev_workspace_deps(&manifest(&dir.join("Cargo.toml")), &ours);
    assert!(deps.is_empty(), "{package} depends on workspace crates {deps:?}: {why}");
    let lib = dir.join("src/lib.rs");
    let text = std::fs::read_to_string(&lib).unwrap_or_else(|e| panic!("{}: {e}", lib.display()));
    assert!(
        text.lines().any(|l| l.trim() == "#![forbid(unsafe_code)]"),
        "{} lacks #![forbid(unsafe_code)]",
        lib.display()
    );
}

#[test]
fn the_nvme_spec_crate_stands_alone_without_unsafe_code() {
    assert_stands_alone_without_unsafe("fp-nvme-spec", "it sits below both NVMe crates");
}

/// What only the crates that encrypt may depend on.
const CRYPTO_DEPENDENCIES: [&str; 12] = [
    "aes",
    "xts-mode",
    "libloading",
    "zeroize",
    "sha2",
    "hmac",
    "crypto-bigint",
    "fp-crypto",
    "fp-luks",
    "pbkdf2",
    "argon2",
    "sha1",
];

#[test]
fn the_bdev_layer_has_no_crypto_dependency() {
    let root_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let crates = workspace_crate_dirs(&root_dir);
    let (_, dir) = crates.iter().find(|(name, _)| name == "fp-bdev").expect("fp-bdev is a workspace crate");
    let bdev = manifest(&dir.join("Cargo.toml"));
    assert!(bdev.get("target").is_none(), "target-specific dependencies: check them here");
    for section in ["dependencies", "dev-dependencies", "build-dependencies"] {
        let Some(deps) = bdev.get(section).and_then(|d| d.as_table()) else { continue };
        for dep in CRYPTO_DEPENDENCIES {
            assert!(
                !deps.contains_key(dep),
                "crates/bdev [{section}] names {dep}: ciphers and keys live in fp-crypto"
            );
        }
    }
    assert!(!dir.join("src/modules/crypto").exists(), "crates/bdev/src/modules/crypto is back: fp-crypto's");
    let (_, crypto) =
        crates.iter().find(|(name, _)| name == "fp-crypto").expect("fp-crypto is a workspace crate");
    let crypto = manifest(&crypto.join("Cargo.toml"));
    assert!(
        crypto["dependencies"].as_table().is_some_and(|d| d.contains_key("aes")),
        "fp-crypto has the cipher"
    );
}

#[test]
fn the_luks_format_stands_alone_without_unsafe_code() {
    assert_stands_alone_without_unsafe(
        "fp-luks",
        "it is the LUKS on-disk format only; fp-crypto builds on it and hands it the device \
         through its MetaIo trait",
    );
}

#[test]
fn the_backup_store_stands_alone_without_unsafe_code() {
    assert_stands_alone_without_unsafe(
        "fp-backup",
        "it runs on control threads and reads a disk through its ChunkSource trait, which the \
         backup job (above it) implements",
    );
}

/// What fp-backup-bdev may build on among the workspace's crates.
const BACKUP_BDEV_BELOW: [&str; 5] = ["fp-bdev", "fp-rpc", "fp-sys", "fp-crypto", "fp-backup"];

#[test]
fn the_backup_bdev_module_sits_between_the_store_library_and_the_registry() {
    let root_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let crates = workspace_crate_dirs(&root_dir);
    let ours: Vec<String> = crates.iter().map(|(name, _)| name.clone()).collect();
    let mut users = Vec::new();
    for (name, dir) in &crates {
        let deps = non_dev_workspace_deps(&manifest(&dir.join("Cargo.toml")), &ours);
        if name == "fp-backup-bdev" {
            for dep in &deps {
                assert!(
                    BACKUP_BDEV_BELOW.contains(&dep.as_str()),
                    "fp-backup-bdev depends on {dep}; it builds on {BACKUP_BDEV_BELOW:?} only"
                );
            }
            for needed in ["fp-bdev", "fp-crypto", "fp-backup"] {
                assert!(deps.iter().any(|d| d == needed), "fp-backup-bdev no longer builds on {needed}?");
            }
        } else if deps.iter().any(|d| d == "fp-backup-bdev") {
            users.push(name.clone());
        }
    }
    assert_eq!(users, ["fp-registry"], "only fp-registry may build on fp-backup-bdev (one line in MODULES)");
}

#[path = "layering/circles.rs"]
mod circles;
#[path = "layering/python_source.rs"]
mod python_source;
#[path = "layering/rust_source.rs"]
mod rust_source;
#[path = "layering/syscalls.rs"]
mod syscalls;
#[path = "layering/unsafe_sites.rs"]
mod unsafe_sites;

/// Files whose code may not use `unsafe`: stacked bdevs work on requests whose buffers were
/// vouched for where they were described (`fp_bdev::Iovecs::from_raw`), so they need none.
/// Each carries `#![forbid(unsafe_code)]` (or, where its tests describe buffers of their own,
/// `#![cfg_attr(not(test), forbid(unsafe_code))]`).
const FORBID_UNSAFE: [&str; 9] = [
    "crates/backup-bdev/src/lib.rs",
    "crates/bdev/src/modules/error/mod.rs",
    "crates/bdev/src/modules/malloc/mod.rs",
    "crates/bdev/src/modules/delay/mod.rs",
    "crates/bdev/src/modules/null/mod.rs",
    "crates/raid/src/lib.rs",
    "crates/lvol/src/lib.rs",
    "crates/nvmf/src/lib.rs",
    "crates/nbd/src/lib.rs",
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

/// docs/architecture.md draws every workspace crate in its layer picture (`crates/<dir>`) and
/// gives each a row of its crate table (`` | `<package>` | ``): a new crate is not done until
/// a reader can find it there.
#[test]
fn the_architecture_page_shows_every_crate() {
    let root_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let page_path = root_dir.join("docs/architecture.md");
    let page = std::fs::read_to_string(&page_path).expect("docs/architecture.md");
    let section = page.split("## Layers and crates").nth(1).expect("a \"Layers and crates\" section");
    let picture = section.split("```").nth(1).expect("the layer picture, a fenced block");
    let root = manifest(&root_dir.join("Cargo.toml"));
    let members = root["workspace"]["members"].as_array().expect("[workspace] members");
    let mut missing = Vec::new();
    for member in members {
        let dir = member.as_str().expect("a member path");
        let package = manifest(&root_dir.join(dir).join("Cargo.toml"));
        let name = package["package"]["name"].as_str().expect("package.name").to_string();
        if !picture.contains(&format!("{dir} ")) && !picture.contains(&format!("{dir}\n")) {
            missing.push(format!("{dir} is not in the layer picture"));
        }
        if !section.contains(&format!("| `{name}` |")) {
            missing.push(format!("{name} has no row in the crate table"));
        }
    }
    assert!(missing.is_empty(), "{}: {}", page_path.display(), missing.join("; "));
}
