//! Fuzz the `serve --config` loader: the input (as UTF-8; other inputs are skipped, since
//! `ConfigFile::load` refuses them before parsing) goes to `flashpath::config::ConfigFile::parse`
//! and, when it parses, `apply` runs it against a fresh `fp_registry::Registry`
//! with real reactors, so RAM, null, delay and io_uring bdevs and vhost-user-blk controllers
//! (listening sockets and their threads) are really created. Afterwards every controller is
//! stopped and the target dropped, so nothing carries over to the next input.
//!
//! The target is built as `serve` builds it (`RegistryOptions` with the file's `[limits]` and
//! `[security] socket_mode`), except for the directories: controllers bind in a scratch
//! `vhost` directory, and the export directories (where `uring` bdevs may open files) are
//! always just the scratch `export` directory, whatever `[security] export_dirs` says, so the
//! fuzzer cannot open arbitrary files read-write. A `filename` starting with `@` has the `@`
//! replaced by that directory's path, so inputs reach the files inside it: `disk.img` (1 MiB),
//! `tiny.img` (100 bytes, less than a block), `sub/` (a directory) and `escape`, a symlink to
//! `../outside.img` (3 MiB + 1.5 KiB, outside the export directory). Other filenames (absolute,
//! relative, `..`, `/proc/self/...`) go to the confinement code as written. Nothing else in a
//! config touches the file system (`rpc` and `vhost_dir` are only parsed: `serve` uses them,
//! `apply` does not). RAM disks are mapped lazily, so a huge `num_blocks` costs address
//! space, not memory.
//!
//! Ceph: every `[[rbd_cluster]]` table and every `[[bdev]]` of type `rbd` without
//! `cluster_name` gets `mon_host = "127.0.0.1:9"` (nothing listens there) and
//! `client_mount_timeout = "1"` in its `config_param` / `config` (when that is absent or a
//! table; anything else is refused before connecting), so an input cannot make the target reach
//! a real cluster, or anything off the machine, and a connection costs about a second.
//!
//! NBD: every `[[nbd_disk]]` listens in the scratch `nbd` directory and nowhere else, and never
//! on TCP (nor resolves a host name). Its `nbd_device` is rewritten before `apply` for each form
//! `fp_nbd::parse_device` accepts: an absolute path becomes `nbd/` plus the path with its `/`
//! made `_`; each `socket=` value of an `nbd+unix://` URI (query kept, `%` made `_` too, so no
//! escape leads out) the same; an `nbd://HOST[:PORT]/NAME` becomes
//! `nbd+unix:///NAME?socket=<nbd>/tcp-HOST[:PORT]`, so the name's parsing and the exports
//! sharing a listener (one per address as written) stay reachable. Any other string is refused by the parser as written. `tls_cert`, `tls_key`
//! and `tls_ca` strings starting with `@` have it replaced by the scratch `tls` directory (which
//! holds `garbage.pem`, not PEM, and `empty.pem`); any other is replaced by `tls/absent.pem`, so
//! an input cannot make the target read an arbitrary file (`/dev/zero` would never end).
//!
//! NVMe controllers: every `[[nvme_controller]]`'s `traddr` that is an IP address becomes
//! loopback (`127.0.0.1` or `::1`) and its `trsvcid` (when a string) `9`, where nothing
//! listens; any other `traddr` becomes the PCI function `ffff:ff:1f.7`, which no machine has:
//! an input can neither reach another host nor take a device bound to vfio-pci on the
//! fuzzing machine, and still reaches the parameter checks and a failing attach.
//!
//! NVMe-oF: the `[[nvmf_*]]` tables run as written, with `nvmf_allow_remote` always off, so a
//! listener binds a loopback address or is refused; `shutdown` stops the target, closing its
//! listeners before the next input.
//!
//! Checked: no panic; every error's message is one line and starts with its place
//! (`fuzz.toml:LINE:COLUMN: ` with a line inside the text, `nvme_options`,
//! `nvme_controller[i]` / `rbd_cluster[i]` / `bdev[i]` /
//! `vhost_blk[i]` / `qos_limit[i]` / `qos_group[i]` / `nbd_disk[i]` / `nvmf_*[i]` with `i` an existing entry,
//! `reactor.cpus: `, `limits.KEY: `, `security.KEY: `) followed by a non-empty reason; no `uring`
//! bdev opened `outside.img` (its size gives it away: 3 MiB or more, whatever the block size);
//! every socket (vhost and NBD) is gone once the target is shut down.
#![no_main]

mod common;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use flashpath::config::{ConfigError, ConfigFile};
use fp_registry::{ExportDirs, Registry, RegistryOptions, DEFAULT_SOCKET_MODE};
use libfuzzer_sys::fuzz_target;

/// The name errors must cite; any name works, `parse` only quotes it.
const FILE: &str = "fuzz.toml";

struct Env {
    vhost_dir: PathBuf,
    export: ExportDirs,
    export_dir: String,
    nbd_dir: PathBuf,
    tls_dir: String,
}

/// `outside.img`'s size. Whatever the block size, a bdev on it holds at least 3 MiB, more than
/// any file inside the export directory, so its size gives it away.
const OUTSIDE_BYTES: u64 = (3 << 20) + 1536;

fn env() -> &'static Env {
    static ENV: OnceLock<Env> = OnceLock::new();
    ENV.get_or_init(|| {
        let dir = common::scratch_dir("config_file");
        let vhost_dir = dir.join("vhost");
        let export_dir = dir.join("export");
        let nbd_dir = dir.join("nbd");
        let tls_dir = dir.join("tls");
        for d in [&vhost_dir, &export_dir, &export_dir.join("sub"), &nbd_dir, &tls_dir] {
            std::fs::create_dir(d).expect("create scratch directory");
        }
        let sized = |path: PathBuf, len: u64| {
            std::fs::File::create(&path).and_then(|f| f.set_len(len)).expect("create scratch file")
        };
        sized(export_dir.join("disk.img"), 1 << 20);
        sized(export_dir.join("tiny.img"), 100);
        sized(dir.join("outside.img"), OUTSIDE_BYTES);
        std::os::unix::fs::symlink("../outside.img", export_dir.join("escape")).expect("create symlink");
        std::fs::write(tls_dir.join("garbage.pem"), "not a certificate\n").expect("create scratch file");
        std::fs::write(tls_dir.join("empty.pem"), "").expect("create scratch file");
        let export = ExportDirs::new(std::slice::from_ref(&export_dir)).expect("export directory");
        Env {
            vhost_dir,
            export,
            export_dir: export_dir.display().to_string(),
            nbd_dir,
            tls_dir: tls_dir.display().to_string(),
        }
    })
}

/// Expands a leading `@` of every string `filename` (see the module docs).
fn expand_filenames(config: &mut ConfigFile, env: &Env) {
    for table in &mut config.bdev {
        if let Some(toml::Value::String(name)) = table.get_mut("filename") {
            if let Some(rest) = name.strip_prefix('@') {
                *name = format!("{}{rest}", env.export_dir);
            }
        }
    }
}

/// Points every Ceph connection an input asks for at a closed loopback port (module docs).
fn no_real_clusters(config: &mut ConfigFile) {
    let confine = |table: &mut toml::Table, key: &str| {
        let options = table.entry(key).or_insert_with(|| toml::Value::Table(toml::Table::new()));
        if let toml::Value::Table(options) = options {
            options.insert("mon_host".into(), "127.0.0.1:9".into());
            options.insert("client_mount_timeout".into(), "1".into());
        }
    };
    for table in config.tables.get_mut("rbd_cluster").into_iter().flatten() {
        confine(table, "config_param");
    }
    // A bdev on a registered cluster (`cluster_name`) makes no connection of its own, and may
    // not be given `config` too.
    for table in &mut config.bdev {
        if table.get("type").and_then(toml::Value::as_str) == Some("rbd")
            && !table.contains_key("cluster_name")
        {
            confine(table, "config");
        }
    }
}

/// Points every NVMe controller at a closed loopback port or at a PCI function that does not
/// exist (module docs).
fn no_real_nvme(config: &mut ConfigFile) {
    for table in config.tables.get_mut("nvme_controller").into_iter().flatten() {
        if let Some(toml::Value::String(traddr)) = table.get_mut("traddr") {
            *traddr = match traddr.parse::<std::net::IpAddr>() {
                Ok(std::net::IpAddr::V4(_)) => "127.0.0.1".into(),
                Ok(std::net::IpAddr::V6(_)) => "::1".into(),
                Err(_) => "ffff:ff:1f.7".into(),
            };
        }
        if let Some(toml::Value::String(port)) = table.get_mut("trsvcid") {
            *port = "9".into();
        }
    }
}

/// A socket path inside the scratch `nbd` directory standing for `path` (module docs).
fn nbd_socket(env: &Env, path: &str) -> String {
    let file: String = path.chars().map(|c| if c == '/' || c == '%' { '_' } else { c }).collect();
    format!("{}/{file}", env.nbd_dir.display())
}

/// Rewrites an `nbd_device` so that it binds in the scratch `nbd` directory only (module docs).
fn confine_nbd_device(device: &str, env: &Env) -> String {
    if device.starts_with('/') {
        return nbd_socket(env, device);
    }
    if let Some(rest) = device.strip_prefix("nbd+unix://") {
        let Some((path, query)) = rest.split_once('?') else { return device.to_string() };
        let query: Vec<String> = query
            .split('&')
            .map(|kv| match kv.strip_prefix("socket=") {
                Some(socket) => format!("socket={}", nbd_socket(env, socket)),
                None => kv.to_string(),
            })
            .collect();
        return format!("nbd+unix://{path}?{}", query.join("&"));
    }
    if let Some(rest) = device.strip_prefix("nbd://") {
        // One socket per HOST:PORT as written, so exports on one TCP address still share a
        // listener (and its TLS settings) and those on two do not.
        let (authority, name) = rest.split_once('/').unwrap_or((rest, ""));
        return format!("nbd+unix:///{name}?socket={}", nbd_socket(env, &format!("tcp-{authority}")));
    }
    device.to_string()
}

/// Confines every `[[nbd_disk]]`'s listener and TLS files (module docs).
fn confine_nbd(config: &mut ConfigFile, env: &Env) {
    for table in config.tables.get_mut("nbd_disk").into_iter().flatten() {
        if let Some(toml::Value::String(device)) = table.get_mut("nbd_device") {
            *device = confine_nbd_device(device, env);
        }
        for key in ["tls_cert", "tls_key", "tls_ca"] {
            if let Some(toml::Value::String(file)) = table.get_mut(key) {
                *file = match file.strip_prefix('@') {
                    Some(rest) => format!("{}{rest}", env.tls_dir),
                    None => format!("{}/absent.pem", env.tls_dir),
                };
            }
        }
    }
}

fn check_error(e: &ConfigError, text: &str, config: Option<&ConfigFile>) {
    let msg = e.to_string();
    if common::trace() {
        eprintln!("error: {msg}");
    }
    assert!(!msg.contains('\n'), "error message spans lines: {msg:?}");
    let (place, reason) = match e {
        ConfigError::Syntax { line, column, message, .. } => {
            let lines = text.split('\n').count();
            assert!((1..=lines).contains(line), "line {line} outside the text's {lines} lines: {msg:?}");
            assert!(*column >= 1, "column 0: {msg:?}");
            (format!("{FILE}:{line}:{column}: "), message)
        }
        ConfigError::Entry { table, index, reason, .. } => {
            let config = config.expect("entry errors come from apply");
            let entries = match *table {
                "bdev" => config.bdev.len(),
                "qos_limit" => config.qos_limit.len(),
                "qos_group" => config.qos_group.len(),
                kind if config.tables.contains_key(kind) => config.tables(kind).len(),
                other => panic!("unknown table {other:?}: {msg:?}"),
            };
            assert!(*index < entries, "{table}[{index}] but only {entries} entries: {msg:?}");
            (format!("{table}[{index}]"), reason)
        }
        ConfigError::Table { table, reason, .. } => {
            let config = config.expect("table errors come from apply");
            let single = if *table == "bdev_options" {
                config.bdev_options.is_some()
            } else {
                config.tables(table).len() == 1
            };
            assert!(single, "{msg:?}");
            (table.to_string(), reason)
        }
        ConfigError::Cpus(reason) => ("reactor.cpus: ".to_string(), reason),
        ConfigError::Limit { key, reason } => (format!("limits.{key}: "), reason),
        ConfigError::Security { key, reason } => (format!("security.{key}: "), reason),
        ConfigError::KindOption { table, key, .. } => (format!("{table}.{key}: "), &msg),
        ConfigError::Read { .. } => panic!("parse and apply never read a file: {msg:?}"),
    };
    assert!(msg.starts_with(&place), "error does not start with its place {place:?}: {msg:?}");
    assert!(!reason.trim().is_empty(), "error without a reason: {msg:?}");
}

fn no_sockets_left(dir: &Path) {
    let left: Vec<_> =
        std::fs::read_dir(dir).expect("read socket directory").flatten().map(|e| e.file_name()).collect();
    assert!(left.is_empty(), "left behind in {}: {left:?}", dir.display());
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let mut config = match ConfigFile::parse(text, Path::new(FILE)) {
        Ok(c) => c,
        Err(e) => return check_error(&e, text, None),
    };
    let env = env();
    expand_filenames(&mut config, env);
    no_real_clusters(&mut config);
    no_real_nvme(&mut config);
    confine_nbd(&mut config, env);
    let options = RegistryOptions {
        limits: config.limits.limits(),
        socket_mode: config.security.socket_mode.unwrap_or(DEFAULT_SOCKET_MODE),
        export_dirs: Some(env.export.clone()),
        iostat: config.stats.iostat.unwrap_or(true),
        // The export kinds' options keep their defaults: whatever `[security] nvmf_allow_remote`
        // says, NVMe/TCP listeners stay on loopback, and the file's `[vhost]`, `[nvmf]` and
        // `[nbd]` bounds (checked by `parse`, which `serve` reads them through) are not used.
        ..RegistryOptions::default()
    };
    let target = Registry::with_options(common::reactors().to_vec(), &env.vhost_dir, options);
    if let Err(e) = config.apply(&target) {
        check_error(&e, text, Some(&config));
    }
    for bdev in target.bdevs(None).expect("list bdevs") {
        let info = &bdev.info;
        assert!(
            info.driver != "uring" || info.size_bytes() < 3 << 20,
            "uring bdev {:?} opened a file outside the export directory: {:?}",
            info.name,
            info.driver_specific
        );
    }
    target.shutdown();
    drop(target);
    no_sockets_left(&env.vhost_dir);
    no_sockets_left(&env.nbd_dir);
});
