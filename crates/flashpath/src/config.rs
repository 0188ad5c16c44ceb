//! The `serve --config` file: TOML that declares bdevs and controllers to create at start-up.
//!
//! ```toml
//! rpc = "/var/tmp/flashpath.sock"      # optional; --rpc wins
//! vhost_dir = "/var/tmp/flashpath"     # optional; --vhost-dir wins
//! metrics = "127.0.0.1:9111"           # optional Prometheus endpoint; --metrics wins
//! state_dir = "/var/lib/flashpath"     # persistent dirty bitmaps (docs/backup.md); --state-dir wins
//!
//! [reactor]                            # optional
//! cpus = "0-1"                         # --cpus wins
//! idle_window_us = 200                 # --idle-window-us wins
//!
//! [limits]                             # optional; what RPC clients may create
//! max_bdevs = 1024                     # bdevs of every type at once
//! max_exports = 256                # vhost-user-blk controllers at once
//! max_malloc_bytes = 17179869184       # largest RAM bdev; default: the machine's RAM
//!
//! [security]                           # optional
//! socket_mode = 0o600            # mode of each vhost-user socket (the default)
//! export_dirs = ["/srv/disks"]         # where uring bdevs may open files; --export-dir wins
//! nvmf_allow_remote = false            # NVMe/TCP listeners off loopback too (docs/nvmf.md)
//!
//! [vhost]                              # optional; vhost-user-blk controllers
//! stop_timeout_ms = 5000               # a queue stop's bound (the default) for controllers created
//!                                      # without their own; --vhost-stop-timeout-ms wins
//!
//! [nvmf]                               # optional; flashpath's own bounds (SPDK has none)
//! drain_timeout_ms = 5000              # nvmf_subsystem_remove_ns's wait; --nvmf-drain-timeout-ms wins
//! close_timeout_ms = 5000              # a closing queue pair's retries of busy commands;
//!                                      # --nvmf-close-timeout-ms wins
//!
//! [nbd]                                # optional; flashpath's own bounds (SPDK has none)
//! stop_timeout_ms = 5000               # nbd_stop_disk's wait; --nbd-stop-timeout-ms wins
//! close_timeout_ms = 5000              # a closing connection's retries of busy requests;
//!                                      # --nbd-close-timeout-ms wins
//!
//! [stats]                              # optional
//! iostat = true                        # per-disk I/O statistics; false (or --no-iostat) skips them
//!
//! [bdev_options]                       # bdev_set_options, first of all
//! bdev_auto_examine = false            # e.g. a raid1 replica host (docs/raid.md)
//!
//! [nvme_options]                       # bdev_nvme_set_options (docs/nvme.md)
//! timeout_us = 5000000
//! action_on_timeout = "abort"
//!
//! [[nvme_controller]]                  # an NVMe controller; its namespaces are bdevs Nvme0n1, ...
//! name = "Nvme0"
//! trtype = "TCP"                       # or "PCIe" with traddr = "0000:00:04.0"
//! traddr = "127.0.0.1"
//! trsvcid = "4420"
//! subnqn = "nqn.2016-06.io.spdk:cnode1"
//!
//! [raid_options]                       # bdev_raid_set_options: how rebuilds run (docs/raid.md)
//! process_window_size_kb = 1024
//! process_max_bandwidth_mb_sec = 200
//! process_weight = 20                  # the rebuild's share beside guest I/O, percent
//!
//! [[rbd_cluster]]                      # a shared Ceph connection (SPDK's names)
//! name = "ceph"
//! config_file = "/etc/ceph/ceph.conf"
//! config_param = { rados_osd_op_timeout = "30" }
//!
//! [[accel_crypto_key]]                 # an AES-XTS key (docs/crypto.md): the file must then
//! name = "key0"                        # be owner-only (mode & 077 == 0)
//! cipher = "AES_XTS"
//! key = "<32 or 64 hex digits>"
//! key2 = "<as many, different>"
//!
//! [[keyring_file_key]]                 # keyring_file_add_key: an owner-only key file
//! name = "tls0"
//! path = "/etc/flashpath/tls0.key"
//!
//! [[bdev]]
//! type = "malloc"                      # null | malloc | uring | delay | error | crypto | rbd
//! name = "ram0"
//! num_blocks = 262144
//! block_size = 4096
//!
//! [[bdev]]
//! type = "rbd"
//! name = "vm1"
//! pool_name = "rbd"
//! rbd_name = "vm1"
//! cluster_name = "ceph"
//!
//! [[bdev]]                             # after its bases (docs/raid.md)
//! type = "raid"
//! name = "r1"
//! raid_level = "raid1"
//! base_bdevs = ["ram0", "vm1"]
//! superblock = true
//!
//! [[qos_limit]]                        # per-disk limits (SPDK's units; MB = MiB)
//! name = "ram0"
//! rw_ios_per_sec = 20000
//!
//! [[qos_group]]                        # disks sharing limits (QEMU's names; bps in bytes/s)
//! name = "tenants"
//! iops_total = 10000
//! members = [ { bdev_name = "ram0", weight = 3 }, { bdev_name = "ram1" } ]
//!
//! [[dirty_bitmap]]                     # changed-block tracking (docs/backup.md)
//! bdev = "ram0"
//! name = "daily"
//! persistent = true                    # needs state_dir; brought back at each start
//!
//! [[mirror]]                           # copy a disk to another, live (docs/mirror.md)
//! source = "ram0"
//! target = "ram2"
//! job_id = "move-ram0"                 # optional; the source's name by default
//!
//! [[vhost_blk]]
//! ctrlr = "vhost.0"
//! dev_name = "ram0"
//! cpumask = "[0,1]"
//! num_queues = 2
//!
//! [[nbd_disk]]                         # an NBD export (docs/nbd.md)
//! bdev_name = "ram1"
//! nbd_device = "/var/tmp/flashpath/ram1.nbd"   # or nbd+unix:///NAME?socket=PATH, nbd://HOST:PORT/NAME
//! readonly = true
//!
//! [[nvmf_transport]]                   # NVMe over TCP (docs/nvmf.md); SPDK's parameters
//! trtype = "TCP"
//!
//! [[nvmf_subsystem]]
//! nqn = "nqn.2016-06.io.spdk:cnode1"
//! serial_number = "FP0001"
//! allow_any_host = true
//!
//! [[nvmf_listener]]
//! nqn = "nqn.2016-06.io.spdk:cnode1"
//! listen_address = { trtype = "TCP", adrfam = "IPv4", traddr = "127.0.0.1", trsvcid = "4420" }
//!
//! [[nvmf_host]]                        # when allow_any_host is false
//! nqn = "nqn.2016-06.io.spdk:cnode1"
//! host = "nqn.2014-08.org.nvmexpress:uuid:..."
//!
//! [[nvmf_ns]]
//! nqn = "nqn.2016-06.io.spdk:cnode1"
//! namespace = { bdev_name = "ram0", nsid = 1 }
//! ```
//!
//! `[bdev_options]` is the params of `bdev_set_options` (applied first of all: with
//! `bdev_auto_examine = false` no module examines the bdevs the file creates, so a raid1
//! replica host keeps its disk, which carries the raid's superblock, to export it). Then come
//! the bdev modules' own tables, each module's in the order it names them
//! (`BdevModule::config_tables`) and the modules in the order of
//! [`fp_registry::modules::MODULES`]: each `[[keyring_file_key]]` the params of
//! `keyring_file_add_key` and each `[[accel_crypto_key]]` those of `accel_crypto_key_create` (a
//! file with a table that holds key material is refused unless owner-only), `[raid_options]`
//! those of `bdev_raid_set_options` (before any bdev, so a rebuild that starts when examine
//! assembles a raid from its bases' superblocks already runs at the configured speed),
//! `[nvme_options]` those of `bdev_nvme_set_options` (before any controller), each
//! `[[nvme_controller]]` those of `bdev_nvme_attach_controller` (before the `[[bdev]]` tables,
//! which may stack on its namespaces' bdevs), each `[[rbd_cluster]]` those of
//! `bdev_rbd_register_cluster`. Each `[[bdev]]`
//! table (less `type`) those of `bdev_<type>_create`, each
//! `[[qos_limit]]` those of `bdev_set_qos_limit`, each `[[qos_group]]` (less `members`) those of
//! `bdev_qos_group_create` and each of its `members` (less the group's `name`) those of
//! `bdev_qos_group_add_bdev`, each `[[dirty_bitmap]]` those of `bdev_dirty_bitmap_add` (a
//! persistent one the state directory already brought back is left as it is), each `[[mirror]]`
//! those of `bdev_mirror_start`, each
//! `[[vhost_blk]]` table those of
//! `vhost_create_blk_controller`, each `[[nbd_disk]]` table those of `nbd_start_disk`
//! (`tls_cert`, `tls_key`, `tls_ca`, `bitmaps` included), and the NVMe-oF tables those of
//! `nvmf_create_transport`, `nvmf_create_subsystem`, `nvmf_subsystem_add_listener`,
//! `nvmf_subsystem_add_host` and `nvmf_subsystem_add_ns`, applied in that order wherever they
//! are written: each export kind names its tables and methods
//! ([`fp_registry::ExportKind::config_tables`]), and the kinds' tables come in the order of
//! [`fp_registry::EXPORT_KINDS`]. They are applied in that order through
//! [`Registry::call`] — the same code the RPC runs, so the file accepts exactly what the RPC does
//! and errors read the same, prefixed with the table and index (`bdev[1].block_size: ...`,
//! `rbd_cluster[0].config_param: ...`, `qos_group[0].members[1].weight: ...`). Clusters come
//! before the bdevs that name them; limits before controllers and NBD exports, so that no
//! client ever sees a disk unlimited, even for a moment. Mirror jobs start once their bdevs exist
//! and before the exports: a job marks what it must copy from the first write on. Registering a cluster connects to it,
//! so a monitor that does not answer holds start-up for `client_mount_timeout` (10 s unless
//! `config_param` says otherwise) and then stops it with an error naming the cluster.
//!
//! `[limits]` bounds the registry for the daemon's whole life, RPC calls included: a create
//! that would pass `max_bdevs` or `max_exports` fails with error code -28 (ENOSPC) and a
//! message naming the setting, and a RAM bdev larger than `max_malloc_bytes` is refused as an
//! invalid `num_blocks`. RAM bdevs are mapped lazily, so the cap is on one disk's size, not on
//! what several disks may add up to; see `fp_registry::Limits` for why each default is what it
//! is. Each value must be at least 1.
//!
//! `[security]`: the daemon runs with umask 077, so everything it creates starts out reachable
//! by its own user only. The JSON-RPC socket is always 0600 (it is bound in a private directory
//! and renamed into place, so it is never wider). `socket_mode` is the mode each export's Unix
//! socket (vhost-user, NBD) gets right after it is bound: 0o600 by default, since whoever
//! connects is the disk's guest; 0o660 lets a QEMU running as another user of the daemon's group attach.
//! The vhost directory, when `serve` creates it, is 0700, plus search permission for the
//! group or others if `socket_mode` grants them anything; an existing directory is left
//! as it is (with a warning if others may replace sockets in it).
//!
//! `[vhost]`: `stop_timeout_ms` is how long stopping a vhost-user queue may take (GET_VRING_BASE,
//! a disconnect, a memory-table change; docs/architecture.md, "Stopping a queue") for every
//! controller created without its own `stop_timeout_ms`, from this file or by RPC: 1 to 600000,
//! 5000 by default. It is also the daemon's stop bound unless `[nvmf] drain_timeout_ms` is shorter
//! (the daemon's is the shortest of the export kinds' bounds; the longest sets the exports'
//! deadline): at shutdown the bound every
//! export's stop shares (an NBD export's wait for its connections among them), and how long each
//! reactor waits, after the exports were stopped, for requests a bdev still holds before it lets
//! go of their guest memory.
//!
//! `[vhost]`, `[nvmf]`, `[nbd]` and `[security] nvmf_allow_remote` are the export kinds' options:
//! each kind declares its keys, their flags, defaults and ranges (`fp_registry::ExportKind::options`),
//! and this file reads them from those declarations.
//!
//! `[nvmf]` and `[nbd]` (docs/nvmf.md, docs/nbd.md): how long removing a namespace waits for
//! its commands (`drain_timeout_ms`; at daemon shutdown every namespace's drain shares one such
//! bound), how long `nbd_stop_disk` (and the shutdown, per export) waits for its connections
//! (`stop_timeout_ms`), and how long a closing NVMe/TCP queue pair or NBD connection keeps
//! retrying requests its disk refuses as busy before answering them with an error
//! (`close_timeout_ms`). Each 1 to 600000, 5000 by default.
//!
//! `export_dirs`, when present, confines `bdev_uring_create` (the only bdev type that opens a
//! host path) to files inside those directories, which must exist when `serve` starts. A
//! filename is resolved first (symlinks, `..`) and must lead inside one of them, or the call
//! fails with error code -13 (EACCES): `filename: '/etc/passwd' is outside the allowed export
//! directories`. The file is then opened one component at a time without following symlinks,
//! so swapping a directory for a symlink after the check cannot lead outside either (see
//! `fp_registry::ExportDirs`). An empty list allows no file at all; without the key any path the
//! daemon's user can open is allowed.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use fp_registry::exports::all_options;
use fp_registry::exports::{ConfigTable, KindOption, KindOptions, OptionError, OptionType, OptionValue};
use fp_registry::{Limits, MethodError, Registry};
use serde::Deserialize;
use serde_json::{Map, Value};

/// A configuration error; the message is one line and names the place.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}:{line}:{column}: {message}", path.display())]
    Syntax { path: PathBuf, line: usize, column: usize, message: String },
    /// An entry of an array of tables (`[[bdev]]`, `[[qos_group]]`, a module's or an export
    /// kind's) was refused;
    /// `field` is empty when the failure is not about one parameter (a duplicate name, say), and
    /// starts `members[i]` for a group member's.
    #[error("{table}[{index}]{}: {reason}", if field.is_empty() { String::new() } else { format!(".{field}") })]
    Entry { table: &'static str, index: usize, field: String, reason: String },
    /// A single table (`[bdev_options]`, a module's options) was refused.
    #[error("{table}{}: {reason}", if field.is_empty() { String::new() } else { format!(".{field}") })]
    Table { table: &'static str, field: String, reason: String },
    #[error("reactor.cpus: {0}")]
    Cpus(String),
    #[error("limits.{key}: {reason}")]
    Limit { key: &'static str, reason: String },
    #[error("security.{key}: {reason}")]
    Security { key: &'static str, reason: String },
    /// An export kind's option ([`fp_registry::exports::KindOption`]) was refused.
    #[error("{table}.{key}: {reason}")]
    KindOption {
        table: &'static str,
        key: &'static str,
        #[source]
        reason: OptionError,
    },
}

/// The file as written. See the module docs.
#[derive(Debug, Default, Deserialize)]
pub struct ConfigFile {
    pub rpc: Option<PathBuf>,
    pub vhost_dir: Option<PathBuf>,
    /// Where `serve` offers Prometheus metrics (`host:port` on loopback or `unix:PATH`).
    pub metrics: Option<String>,
    /// Where persistent dirty bitmaps are kept (`--state-dir` wins).
    pub state_dir: Option<PathBuf>,
    #[serde(default)]
    pub reactor: ReactorSection,
    #[serde(default)]
    pub limits: LimitsSection,
    #[serde(default)]
    pub security: SecuritySection,
    #[serde(default)]
    pub stats: StatsSection,
    /// The export kinds' options given in their tables (`[vhost]`, `[nbd]`, `[nvmf]`, and
    /// `[security] nvmf_allow_remote`), checked against their declarations
    /// ([`fp_registry::ExportKind::options`]).
    #[serde(skip)]
    pub kind_options: KindOptions,
    /// Kept as raw tables: their keys are checked by the RPC methods themselves.
    #[serde(default)]
    pub bdev_options: Option<toml::Table>,
    #[serde(default)]
    pub bdev: Vec<toml::Table>,
    #[serde(default)]
    pub qos_limit: Vec<toml::Table>,
    #[serde(default)]
    pub qos_group: Vec<toml::Table>,
    /// Mirror jobs, started once the bdevs exist.
    #[serde(default)]
    pub mirror: Vec<toml::Table>,
    /// Dirty bitmaps, added once the bdevs exist and before the mirror jobs and exports.
    #[serde(default)]
    pub dirty_bitmap: Vec<toml::Table>,
    /// The bdev modules' and export kinds' tables, by name (`raid_options`, `nbd_disk`): an
    /// array of tables as written, a single table as an array of one.
    #[serde(skip)]
    pub tables: BTreeMap<&'static str, Vec<toml::Table>>,
    /// Every other top-level key, sorted out by [`ConfigFile::parse`]: the modules' and export
    /// kinds' tables go to `tables`, anything else is an unknown field. (Those keys come from
    /// [`fp_registry::modules::MODULES`] and [`fp_registry::EXPORT_KINDS`], so serde cannot list
    /// them as fields, and `deny_unknown_fields` does not combine with `flatten`.)
    #[serde(flatten)]
    other: BTreeMap<String, toml::Value>,
}

/// The top-level keys [`ConfigFile`] declares, for the unknown-field message; the modules' and
/// export kinds' tables follow them there.
const FILE_KEYS: [&str; 14] = [
    "rpc",
    "vhost_dir",
    "metrics",
    "state_dir",
    "reactor",
    "limits",
    "security",
    "stats",
    "bdev_options",
    "bdev",
    "qos_limit",
    "qos_group",
    "mirror",
    "dirty_bitmap",
];

/// One RPC call that the file stands for, and the entry it comes from (for its errors).
#[derive(Debug, Clone, PartialEq)]
pub struct ConfigCall {
    pub method: String,
    pub params: Value,
    pub table: &'static str,
    pub index: usize,
    /// For a `[[qos_group]]` member: its index in `members`, which its errors are placed under
    /// (`members[1].weight`).
    pub member: Option<usize>,
    /// The entry is a single table (`[bdev_options]`, `[raid_options]`), whose errors have no
    /// index.
    pub single: bool,
}

impl ConfigCall {
    fn new(
        method: impl Into<String>,
        params: Map<String, Value>,
        table: &'static str,
        index: usize,
    ) -> ConfigCall {
        ConfigCall {
            method: method.into(),
            params: Value::Object(params),
            table,
            index,
            member: None,
            single: false,
        }
    }

    /// `e`, placed at this call's entry.
    fn error(&self, e: &MethodError) -> ConfigError {
        let (field, reason) = match e.bad_param() {
            Some((field, reason)) => (field.to_string(), reason.to_string()),
            None => (String::new(), e.to_string()),
        };
        let field = match self.member {
            // The group's `name` is the group table's field; everything else is the member's.
            Some(i) if field != "name" => member_field(i, &field),
            _ => field,
        };
        if self.single {
            return ConfigError::Table {
                table: self.table,
                field: one_line(&field),
                reason: one_line(&reason),
            };
        }
        ConfigError::Entry {
            table: self.table,
            index: self.index,
            field: one_line(&field),
            reason: one_line(&reason),
        }
    }
}

/// `members[i]`, or `members[i].field`.
fn member_field(i: usize, field: &str) -> String {
    if field.is_empty() {
        format!("members[{i}]")
    } else {
        format!("members[{i}].{field}")
    }
}

/// What a `[[qos_group]]` member may say; the group's `name` comes from the group.
const MEMBER_KEYS: [&str; 2] = ["bdev_name", "weight"];

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReactorSection {
    /// Same syntax as `--cpus`.
    pub cpus: Option<String>,
    pub idle_window_us: Option<u64>,
}

/// `[stats]`: what the disk layer counts. `iostat = false` hands the frontends the backends'
/// channels directly (no counters, no histograms), for measuring what the counting costs.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StatsSection {
    pub iostat: Option<bool>,
}

/// `[limits]`; an absent key keeps the default of [`Limits`].
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsSection {
    pub max_bdevs: Option<usize>,
    /// `max_controllers` is its name from when vhost-user-blk was the only export.
    #[serde(alias = "max_controllers")]
    pub max_exports: Option<usize>,
    pub max_malloc_bytes: Option<u64>,
}

impl LimitsSection {
    pub fn limits(&self) -> Limits {
        let d = Limits::default();
        Limits {
            max_bdevs: self.max_bdevs.unwrap_or(d.max_bdevs),
            max_exports: self.max_exports.unwrap_or(d.max_exports),
            max_malloc_bytes: self.max_malloc_bytes.unwrap_or(d.max_malloc_bytes),
        }
    }

    fn check(&self) -> Result<(), ConfigError> {
        let values = [
            ("max_bdevs", self.max_bdevs.map(|v| v as u64)),
            ("max_exports", self.max_exports.map(|v| v as u64)),
            ("max_malloc_bytes", self.max_malloc_bytes),
        ];
        match values.iter().find(|(_, v)| *v == Some(0)) {
            Some((key, _)) => Err(ConfigError::Limit { key, reason: "must be at least 1".into() }),
            None => Ok(()),
        }
    }
}

/// `[security]`.
#[derive(Debug, Default, Deserialize)]
pub struct SecuritySection {
    /// `vhost_socket_mode` is its name from when vhost-user-blk was the only export.
    #[serde(alias = "vhost_socket_mode")]
    pub socket_mode: Option<u32>,
    pub export_dirs: Option<Vec<PathBuf>>,
    /// Its other keys: export kinds' options in this table (`nvmf_allow_remote`), sorted out
    /// by [`ConfigFile::parse`], which refuses any other as an unknown field.
    #[serde(flatten)]
    kind_keys: BTreeMap<String, toml::Value>,
}

/// The keys [`SecuritySection`] declares, for the unknown-field message.
const SECURITY_KEYS: [&str; 2] = ["socket_mode", "export_dirs"];

impl SecuritySection {
    fn check(&self) -> Result<(), ConfigError> {
        match self.socket_mode {
            Some(mode) if mode > 0o777 => Err(ConfigError::Security {
                key: "socket_mode",
                reason: format!("{mode:#o} is not a permission mode from 0o000 to 0o777"),
            }),
            _ => Ok(()),
        }
    }
}

impl ConfigFile {
    pub fn load(path: &Path) -> Result<ConfigFile, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| ConfigError::Read { path: path.to_path_buf(), source })?;
        let config = ConfigFile::parse(&text, path)?;
        if let Some(secret) = plugin_tables().find(|t| t.secret && !config.tables(t.table).is_empty()) {
            use std::os::unix::fs::MetadataExt;
            let mode = std::fs::metadata(path)
                .map_err(|source| ConfigError::Read { path: path.to_path_buf(), source })?
                .mode();
            if mode & 0o077 != 0 {
                return Err(ConfigError::Entry {
                    table: secret.table,
                    index: 0,
                    field: String::new(),
                    reason: format!(
                        "{} holds key material and has mode {:o}: it must be owner-only (chmod 600)",
                        path.display(),
                        mode & 0o777
                    ),
                });
            }
        }
        Ok(config)
    }

    /// Parses `text`; `path` is only for messages.
    pub fn parse(text: &str, path: &Path) -> Result<ConfigFile, ConfigError> {
        let mut config: ConfigFile = toml::from_str(text).map_err(|e| {
            let offset = e.span().map_or(0, |s| s.start).min(text.len());
            let before = &text[..offset];
            let line = before.matches('\n').count() + 1;
            let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
            // toml's messages can run over several lines; the location is enough context.
            let mut message = one_line(&e.message().split_whitespace().collect::<Vec<_>>().join(" "));
            if message.is_empty() {
                message = "invalid TOML".into();
            }
            ConfigError::Syntax { path: path.to_path_buf(), line, column, message }
        })?;
        config.sort_out_tables(text, path)?;
        if let Some(cpus) = &config.reactor.cpus {
            fp_reactor::parse_cpu_list(cpus).map_err(|e| ConfigError::Cpus(one_line(&e)))?;
        }
        config.limits.check()?;
        config.security.check()?;
        Ok(config)
    }

    /// Moves the modules' and export kinds' tables from `other` to `tables`; refuses any other
    /// key, at its place in `text`, as serde would have.
    fn sort_out_tables(&mut self, text: &str, path: &Path) -> Result<(), ConfigError> {
        for (key, value) in std::mem::take(&mut self.security.kind_keys) {
            self.read_kind_option("security", &SECURITY_KEYS, &key, value, text, path)?;
        }
        for (key, value) in std::mem::take(&mut self.other) {
            let (line, column) = locate_key(text, &key);
            let syntax =
                |message: String| ConfigError::Syntax { path: path.to_path_buf(), line, column, message };
            if let Some(declared) = option_tables().find(|t| *t == key) {
                let toml::Value::Table(entries) = value else {
                    let found = value.type_str();
                    return Err(syntax(format!("invalid type: {found}, expected a table ([{declared}])")));
                };
                for (k, v) in entries {
                    self.read_kind_option(declared, &[], &k, v, text, path)?;
                }
                continue;
            }
            let Some(declared) = plugin_tables().find(|t| t.table == key) else {
                let expected: Vec<String> = FILE_KEYS
                    .iter()
                    .copied()
                    .chain(option_tables())
                    .chain(plugin_tables().map(|t| t.table))
                    .map(|k| format!("`{k}`"))
                    .collect();
                let key = one_line(&key);
                return Err(syntax(format!(
                    "unknown field `{key}`, expected one of {}",
                    expected.join(", ")
                )));
            };
            let table = declared.table;
            let tables = match value {
                toml::Value::Table(t) if declared.single => vec![t],
                other if declared.single => {
                    let found = other.type_str();
                    return Err(syntax(format!("invalid type: {found}, expected a table ([{table}])")));
                }
                toml::Value::Array(items) => items
                    .into_iter()
                    .map(|item| match item {
                        toml::Value::Table(t) => Ok(t),
                        _ => Err(syntax(format!("`{table}` entries must be tables ([[{table}]])"))),
                    })
                    .collect::<Result<Vec<_>, _>>()?,
                _ => return Err(syntax(format!("`{table}` must be an array of tables ([[{table}]])"))),
            };
            self.tables.insert(table, tables);
        }
        Ok(())
    }

    /// The entries of a module's or export kind's table (none when the file has none; one for
    /// a single table).
    pub fn tables(&self, table: &str) -> &[toml::Table] {
        self.tables.get(table).map_or(&[], Vec::as_slice)
    }

    /// The RPC calls the file stands for, in the order [`ConfigFile::apply`] makes them. Fails
    /// on what is wrong with an entry's shape (a bdev `type`, a group's `members`) before any
    /// call is made; what the methods check is left to them.
    pub fn calls(&self) -> Result<Vec<ConfigCall>, ConfigError> {
        let mut calls = Vec::new();
        if let Some(table) = &self.bdev_options {
            let mut call = ConfigCall::new("bdev_set_options", table_to_json(table), "bdev_options", 0);
            call.single = true;
            calls.push(call);
        }
        // The modules' own tables (their options, keys, clusters, controllers) come before the
        // bdevs, which may name what they declare.
        calls.extend(self.table_calls(fp_registry::modules::config_tables().filter(|t| !t.after_bdevs)));
        for (index, table) in self.bdev.iter().enumerate() {
            let entry = |field: &str, reason: String| ConfigError::Entry {
                table: "bdev",
                index,
                field: field.to_string(),
                reason: one_line(&reason),
            };
            let mut params = table_to_json(table);
            // `type` names a bdev module; its `bdev_<type>_create` takes the rest of the table.
            let types = || {
                fp_registry::modules::MODULES
                    .iter()
                    .filter(|m| m.configurable())
                    .map(|m| m.name())
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            let kind = match params.remove("type") {
                Some(Value::String(t))
                    if fp_registry::modules::find(&t).is_some_and(|m| m.configurable()) =>
                {
                    t
                }
                Some(Value::String(t)) => {
                    return Err(entry("type", format!("'{t}' is not one of {}", types())))
                }
                Some(_) => return Err(entry("type", format!("expected a string: one of {}", types()))),
                None => return Err(entry("type", format!("required (one of {})", types()))),
            };
            calls.push(ConfigCall::new(format!("bdev_{kind}_create"), params, "bdev", index));
        }
        for (index, table) in self.qos_limit.iter().enumerate() {
            calls.push(ConfigCall::new("bdev_set_qos_limit", table_to_json(table), "qos_limit", index));
        }
        for (index, table) in self.qos_group.iter().enumerate() {
            calls.extend(qos_group_calls(index, table)?);
        }
        for (index, table) in self.dirty_bitmap.iter().enumerate() {
            calls.push(ConfigCall::new("bdev_dirty_bitmap_add", table_to_json(table), "dirty_bitmap", index));
        }
        for (index, table) in self.mirror.iter().enumerate() {
            calls.push(ConfigCall::new("bdev_mirror_start", table_to_json(table), "mirror", index));
        }
        // Module objects built on the bdevs above (a live restore over its base).
        calls.extend(self.table_calls(fp_registry::modules::config_tables().filter(|t| t.after_bdevs)));
        calls.extend(self.table_calls(fp_registry::exports::config_tables()));
        Ok(calls)
    }

    /// The calls of `declared`'s tables, in that order.
    fn table_calls(&self, declared: impl Iterator<Item = ConfigTable>) -> Vec<ConfigCall> {
        let mut calls = Vec::new();
        for t in declared {
            for (index, table) in self.tables(t.table).iter().enumerate() {
                let mut call = ConfigCall::new(t.method, table_to_json(table), t.table, index);
                call.single = t.single;
                calls.push(call);
            }
        }
        calls
    }

    /// Makes the calls of [`ConfigFile::calls`]: sets the bdev options, makes each module's
    /// tables' calls (its options, keys, clusters, controllers), creates the declared bdevs,
    /// sets their limits, creates the groups and adds their members, starts the mirror jobs,
    /// then each export kind's tables' calls, stopping at the first failure.
    pub fn apply(&self, registry: &Registry) -> Result<(), ConfigError> {
        for call in self.calls()? {
            registry.call(&call.method, Some(call.params.clone())).map_err(|e| call.error(&e))?;
        }
        Ok(())
    }
}

/// Every table a bdev module or an export kind declares.
fn plugin_tables() -> impl Iterator<Item = ConfigTable> {
    fp_registry::modules::config_tables().chain(fp_registry::exports::config_tables())
}

/// The tables holding only export kinds' options (`vhost`, `nbd`, `nvmf`), each once, in the
/// order the kinds declare them; a daemon table that also holds some (`security`) is not one.
fn option_tables() -> impl Iterator<Item = &'static str> {
    let mut seen = Vec::new();
    all_options().map(|o| o.table).filter(move |t| {
        let new = !FILE_KEYS.contains(t) && !seen.contains(t);
        if new {
            seen.push(*t);
        }
        new
    })
}

/// An option's value as the file wrote it, if it is of a type some option takes.
fn option_value(value: &toml::Value) -> Option<OptionValue> {
    match value {
        toml::Value::Integer(n) => u64::try_from(*n).ok().map(OptionValue::Millis),
        toml::Value::Boolean(b) => Some(OptionValue::Bool(*b)),
        _ => None,
    }
}

impl ConfigFile {
    /// Checks `table.key = value` against the export kind's option it names and keeps it;
    /// `table_keys` are the table's other keys, for the unknown-field message.
    fn read_kind_option(
        &mut self,
        table: &'static str,
        table_keys: &[&str],
        key: &str,
        value: toml::Value,
        text: &str,
        path: &Path,
    ) -> Result<(), ConfigError> {
        let (line, column) = locate_table_key(text, table, key);
        let syntax =
            |message: String| ConfigError::Syntax { path: path.to_path_buf(), line, column, message };
        let declared: Vec<&'static KindOption> = all_options().filter(|o| o.table == table).collect();
        let Some(option) = declared.iter().find(|o| o.key == key) else {
            let expected: Vec<String> = table_keys
                .iter()
                .copied()
                .chain(declared.iter().map(|o| o.key))
                .map(|k| format!("`{k}`"))
                .collect();
            let key = one_line(key);
            return Err(syntax(format!("unknown field `{key}`, expected one of {}", expected.join(", "))));
        };
        let wrong_type = || {
            let expected = match option.value {
                OptionType::Millis { .. } => "a whole number of milliseconds",
                OptionType::Bool { .. } => "a boolean",
            };
            syntax(format!("invalid type: {}, expected {expected}", value.type_str()))
        };
        match option_value(&value).map(|v| option.check(v)) {
            Some(Ok(v)) => {
                self.kind_options.set(option.table, option.key, v);
                Ok(())
            }
            None | Some(Err(OptionError::WrongType { .. })) => Err(wrong_type()),
            Some(Err(reason)) => {
                Err(ConfigError::KindOption { table: option.table, key: option.key, reason })
            }
        }
    }
}

/// Where `key` of `[table]` is in `text` (line and column, from 1), or else the table's place.
fn locate_table_key(text: &str, table: &str, key: &str) -> (usize, usize) {
    let mut in_table = false;
    for (i, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        if let Some(header) = trimmed.strip_prefix('[') {
            in_table = header.split(']').next().is_some_and(|h| h.trim() == table);
        } else if in_table
            && trimmed.strip_prefix(key).is_some_and(|after| after.trim_start().starts_with(['=', '.']))
        {
            return (i + 1, line.len() - trimmed.len() + 1);
        }
    }
    locate_key(text, table)
}

/// A `[[qos_group]]` entry: `bdev_qos_group_create` with the table less `members`, then one
/// `bdev_qos_group_add_bdev` per member.
fn qos_group_calls(index: usize, table: &toml::Table) -> Result<Vec<ConfigCall>, ConfigError> {
    let entry = |field: String, reason: String| ConfigError::Entry {
        table: "qos_group",
        index,
        field: one_line(&field),
        reason: one_line(&reason),
    };
    let mut params = table_to_json(table);
    let members = match params.remove("members") {
        None => Vec::new(),
        Some(Value::Array(members)) => members,
        Some(_) => {
            return Err(entry("members".into(), "expected an array of tables {bdev_name, weight}".into()))
        }
    };
    // Without a string name the create call is refused anyway; the members then never run.
    let name = params.get("name").cloned().unwrap_or(Value::Null);
    let mut calls = vec![ConfigCall::new("bdev_qos_group_create", params, "qos_group", index)];
    for (i, member) in members.into_iter().enumerate() {
        let Value::Object(mut member) = member else {
            return Err(entry(member_field(i, ""), "expected a table {bdev_name, weight}".into()));
        };
        if let Some(key) = member.keys().find(|k| !MEMBER_KEYS.contains(&k.as_str())) {
            let reason = format!("unknown parameter; accepted: {}", MEMBER_KEYS.join(", "));
            return Err(entry(member_field(i, key), reason));
        }
        member.insert("name".into(), name.clone());
        let mut call = ConfigCall::new("bdev_qos_group_add_bdev", member, "qos_group", index);
        call.member = Some(i);
        calls.push(call);
    }
    Ok(calls)
}

/// Where the top-level `key` is written in `text` (1-based line and column): a table header
/// (`[key]`, `[[key]]`, `[key.sub]`) or, before the first header, `key = ...` or `key.sub = ...`.
/// The start of the file when it cannot be found (a quoted key, say).
fn locate_key(text: &str, key: &str) -> (usize, usize) {
    let names_key = |rest: &str| {
        rest.strip_prefix(key).is_some_and(|after| after.trim_start().starts_with([']', '.', '=']))
    };
    let mut in_table = false;
    for (i, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        let column = line.len() - trimmed.len() + 1;
        if let Some(header) = trimmed.strip_prefix('[') {
            in_table = true;
            if names_key(header.trim_start_matches('[').trim_start()) {
                return (i + 1, column);
            }
        } else if !in_table && names_key(trimmed) {
            return (i + 1, column);
        }
    }
    (1, 1)
}

/// Errors quote the values they refuse, and a TOML string may hold a newline or a terminal
/// escape: shown as escapes, they keep the message on one line and the terminal sane.
fn one_line(text: &str) -> String {
    if !text.chars().any(char::is_control) {
        return text.to_string();
    }
    text.chars()
        .map(|c| if c.is_control() { c.escape_default().to_string() } else { c.to_string() })
        .collect()
}

fn table_to_json(table: &toml::Table) -> Map<String, Value> {
    table.iter().map(|(k, v)| (k.clone(), toml_to_json(v))).collect()
}

/// TOML values as the JSON an RPC client would send. Dates have no JSON form; they become
/// strings, which every method then refuses with a message naming the field.
fn toml_to_json(v: &toml::Value) -> Value {
    match v {
        toml::Value::String(s) => Value::String(s.clone()),
        toml::Value::Integer(i) => Value::from(*i),
        toml::Value::Float(f) => Value::from(*f),
        toml::Value::Boolean(b) => Value::Bool(*b),
        toml::Value::Datetime(d) => Value::String(d.to_string()),
        toml::Value::Array(a) => Value::Array(a.iter().map(toml_to_json).collect()),
        toml::Value::Table(t) => Value::Object(table_to_json(t)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fp_registry::Registry;
    use fp_rpc::ParamError;
    use serde_json::json;

    fn parse(text: &str) -> Result<ConfigFile, ConfigError> {
        ConfigFile::parse(text, Path::new("test.toml"))
    }

    /// One null disk, `a`, before the tables under test.
    const NULL_DISK: &str = "[[bdev]]\ntype = \"null\"\nname = \"a\"\nnum_blocks = 8\nblock_size = 512\n";

    fn apply(text: &str) -> Result<std::sync::Arc<Registry>, String> {
        let dir = tempfile::tempdir().unwrap();
        let methods = Registry::new(vec![], dir.path());
        let config = parse(text).map_err(|e| e.to_string())?;
        config.apply(&methods).map_err(|e| e.to_string())?;
        Ok(methods)
    }

    /// Each `(extra, want)`: `base` followed by `extra` is refused with one line starting
    /// with `want`.
    fn assert_each_refused_in_one_line(base: &str, cases: &[(&str, &str)]) {
        for (extra, want) in cases {
            let err = apply(&format!("{base}{extra}")).err().unwrap_or_else(|| panic!("accepted: {extra}"));
            assert!(err.starts_with(want), "{extra}\n got: {err}\nwant: {want}");
            assert!(!err.contains('\n'), "{err}");
        }
    }

    #[test]
    fn mirror_tables_start_jobs_after_the_bdevs_and_before_the_exports() {
        let text = r#"
            [[vhost_blk]]
            ctrlr = "v0"
            dev_name = "a"
            [[mirror]]
            source = "a"
            target = "c"
            job_id = "move-a"
            [[bdev]]
            type = "malloc"
            name = "a"
            num_blocks = 64
            block_size = 512
        "#;
        let calls = parse(text).unwrap().calls().unwrap();
        let methods: Vec<&str> = calls.iter().map(|c| c.method.as_str()).collect();
        assert_eq!(methods, ["bdev_malloc_create", "bdev_mirror_start", "vhost_create_blk_controller"]);
        assert_eq!(calls[1].params, json!({ "source": "a", "target": "c", "job_id": "move-a" }));
        // Refused as the RPC refuses it, placed under its table.
        let e = apply(text).err().expect("the target does not exist");
        assert_eq!(e, "mirror[0]: bdev 'c' does not exist");
    }

    #[test]
    fn full_file_parses_and_applies() {
        let text = r#"
            rpc = "/tmp/x.sock"
            vhost_dir = "/tmp/vhost"
            [reactor]
            cpus = "0-1"
            idle_window_us = 250
            [[bdev]]
            type = "null"
            name = "n0"
            num_blocks = 1024
            block_size = 512
            [[bdev]]
            type = "malloc"
            num_blocks = 64
            block_size = 4096
        "#;
        let c = parse(text).unwrap();
        assert_eq!(c.rpc.as_deref(), Some(Path::new("/tmp/x.sock")));
        assert_eq!(c.vhost_dir.as_deref(), Some(Path::new("/tmp/vhost")));
        assert_eq!(c.reactor.cpus.as_deref(), Some("0-1"));
        assert_eq!(c.reactor.idle_window_us, Some(250));
        let methods = apply(text).unwrap();
        let bdevs = methods.call("bdev_get_bdevs", None).unwrap();
        let names: Vec<&str> =
            bdevs.as_array().unwrap().iter().map(|b| b["name"].as_str().unwrap()).collect();
        assert_eq!(names, ["Malloc0", "n0"]);
    }

    #[test]
    fn limits_table_overrides_defaults_key_by_key() {
        let c = parse("[limits]\nmax_bdevs = 10\nmax_malloc_bytes = 1048576\n").unwrap();
        let l = c.limits.limits();
        assert_eq!((l.max_bdevs, l.max_exports, l.max_malloc_bytes), (10, 256, 1 << 20));
        assert_eq!(parse("").unwrap().limits.limits(), Limits::default());
        let e = parse("[limits]\nmax_exports = 0\n").unwrap_err().to_string();
        assert_eq!(e, "limits.max_exports: must be at least 1");
        let e = parse("[limits]\nmax_bdevs = -1\n").unwrap_err().to_string();
        assert!(e.starts_with("test.toml:2:13: invalid value: integer `-1`"), "{e}");
        let e = parse("[limits]\nmax_disks = 1\n").unwrap_err().to_string();
        assert!(e.contains("unknown field `max_disks`") && e.contains("`max_bdevs`"), "{e}");
    }

    #[test]
    fn security_table_checks_the_socket_mode() {
        assert_eq!(parse("[security]\nsocket_mode = 0o660\n").unwrap().security.socket_mode, Some(0o660));
        assert_eq!(parse("").unwrap().security.socket_mode, None);
        let e = parse("[security]\nsocket_mode = 0o4600\n").unwrap_err().to_string();
        assert_eq!(e, "security.socket_mode: 0o4600 is not a permission mode from 0o000 to 0o777");
        let e = parse("[security]\nsocket_mode = \"600\"\n").unwrap_err().to_string();
        assert!(e.starts_with("test.toml:2:15: invalid type: string"), "{e}");
    }

    /// The keys' names from when vhost-user-blk was the only export still work.
    #[test]
    fn old_key_names_are_aliases() {
        let c = parse("[limits]\nmax_controllers = 7\n[security]\nvhost_socket_mode = 0o660\n").unwrap();
        assert_eq!((c.limits.limits().max_exports, c.security.socket_mode), (7, Some(0o660)));
        let e = parse("[limits]\nmax_controllers = 0\n").unwrap_err().to_string();
        assert_eq!(e, "limits.max_exports: must be at least 1");
        let e = parse("[limits]\nmax_controllers = 1\nmax_exports = 2\n").unwrap_err().to_string();
        assert!(e.contains("duplicate field `max_exports`"), "{e}");
    }

    /// The export kinds' tables are known keys; a misspelt one is an unknown field at its
    /// place, listing them; a kind's key that is not an array of tables is refused there.
    #[test]
    fn export_tables_come_from_the_export_kinds() {
        let c =
            parse("[[vhost_blk]]\nctrlr = \"v\"\n[[nbd_disk]]\nbdev_name = \"a\"\n[[nbd_disk]]\n").unwrap();
        assert_eq!((c.tables("vhost_blk").len(), c.tables("nbd_disk").len()), (1, 2));
        let e = parse("rpc = \"/x\"\n\n  [[nbd_disks]]\nbdev_name = \"a\"\n").unwrap_err().to_string();
        assert!(e.starts_with("test.toml:3:3: unknown field `nbd_disks`, expected one of `rpc`"), "{e}");
        assert!(e.contains("`vhost_blk`, `nbd_disk`"), "{e}");
        let e = parse("nbd_disk = 3\n").unwrap_err().to_string();
        assert_eq!(e, "test.toml:1:1: `nbd_disk` must be an array of tables ([[nbd_disk]])");
        let e = parse("vhost_blk = [1]\n").unwrap_err().to_string();
        assert_eq!(e, "test.toml:1:1: `vhost_blk` entries must be tables ([[vhost_blk]])");
    }

    #[test]
    fn a_uring_bdev_outside_the_export_dirs_is_an_entry_error_naming_filename() {
        let dir = tempfile::tempdir().unwrap();
        let options = fp_registry::RegistryOptions {
            export_dirs: Some(fp_registry::ExportDirs::new(&[dir.path().to_path_buf()]).unwrap()),
            ..Default::default()
        };
        let methods = Registry::with_options(vec![], dir.path(), options);
        let config = parse("[[bdev]]\ntype = \"uring\"\nname = \"u\"\nfilename = \"/etc/passwd\"\n").unwrap();
        let e = config.apply(&methods).unwrap_err().to_string();
        assert_eq!(e, "bdev[0].filename: '/etc/passwd' is outside the allowed export directories");
    }

    #[test]
    fn empty_file_is_fine() {
        let c = parse("").unwrap();
        assert!(c.bdev.is_empty() && c.tables("vhost_blk").is_empty() && c.rpc.is_none());
    }

    #[test]
    fn entry_errors_name_table_index_and_field() {
        let cases = [
            (
                "[[bdev]]\ntype = \"null\"\nname = \"b\"\nnum_blocks = 8\nblock_size = 1000\n",
                "bdev[1].block_size: 1000 is not a power of two between 512 and 65536",
            ),
            (
                "[[bdev]]\nname = \"b\"\n",
                "bdev[1].type: required (one of null, malloc, uring, delay, error, crypto, raid, rbd, nbd_client)",
            ),
            (
                "[[bdev]]\ntype = \"ram\"\n",
                "bdev[1].type: 'ram' is not one of null, malloc, uring, delay, error, crypto, raid, rbd, nbd_client",
            ),
            (
                "[[bdev]]\ntype = 3\n",
                "bdev[1].type: expected a string: one of null, malloc, uring, delay, error, crypto, raid, rbd, nbd_client",
            ),
            (
                "[[bdev]]\ntype = \"null\"\nname = \"b\"\nnum_blocks = 8\nblock_size = 512\nsize = 1\n",
                "bdev[1].size: unknown parameter; accepted: name, num_blocks, block_size",
            ),
            (
                "[[bdev]]\ntype = \"null\"\nname = \"b\"\nnum_blocks = -8\nblock_size = 512\n",
                "bdev[1].num_blocks: expected an integer between 0 and 18446744073709551615, got number -8",
            ),
            (
                "[[bdev]]\ntype = \"null\"\nname = \"a\"\nnum_blocks = 8\nblock_size = 512\n",
                "bdev[1]: bdev 'a' already exists",
            ),
            (
                "[[bdev]]\ntype = \"uring\"\nname = \"u\"\n",
                "bdev[1].filename: required parameter missing (a string)",
            ),
            (
                "[[vhost_blk]]\nctrlr = \"v0\"\n",
                "vhost_blk[0].dev_name: required parameter missing (a string)",
            ),
            (
                "[[vhost_blk]]\nctrlr = \"v0\"\ndev_name = \"a\"\ncpumask = \"x\"\n",
                "vhost_blk[0].cpumask: 'x' is not a cpu number or range",
            ),
            (
                "[[vhost_blk]]\nctrlr = \"v0\"\ndev_name = \"zz\"\nnum_queues = 1\n",
                "vhost_blk[0]: bdev 'zz' does not exist",
            ),
            (
                "[[vhost_blk]]\nctrlr = \"v0\"\ndev_name = \"a\"\nnum_queues = 65\n",
                "vhost_blk[0].num_queues: 65 is not between 1 and 64",
            ),
            (
                "[[vhost_blk]]\nctrlr = \"v0\"\ndev_name = \"a\"\nbogus = true\n",
                "vhost_blk[0].bogus: unknown parameter",
            ),
        ];
        assert_each_refused_in_one_line(NULL_DISK, &cases);
    }

    #[test]
    fn file_level_errors_are_one_line_with_location() {
        let e = parse("rpc = \"/x\"\nbogus = 1\n").unwrap_err().to_string();
        assert!(e.starts_with("test.toml:2:1: unknown field `bogus`"), "{e}");
        assert!(e.contains("`vhost_dir`"), "lists accepted keys: {e}");
        let e = parse("[reactor]\nidle_window_us = \"fast\"\n").unwrap_err().to_string();
        assert!(e.starts_with("test.toml:2:18: invalid type: string"), "{e}");
        let e = parse("[reactor]\ncpus = \"0-x\"\n").unwrap_err().to_string();
        assert!(e.starts_with("reactor.cpus: "), "{e}");
        let e = parse("[reactor]\nthreads = 2\n").unwrap_err().to_string();
        assert!(e.contains("unknown field `threads`"), "{e}");
        let e = parse("[[bdev]\n").unwrap_err().to_string();
        assert!(e.starts_with("test.toml:1:"), "{e}");
        let e = parse("a = [\n1,\n").unwrap_err().to_string();
        assert!(!e.contains('\n'), "{e}");
        let e = ConfigFile::load(Path::new("/nonexistent/flashpath.toml")).unwrap_err().to_string();
        assert!(e.starts_with("cannot read /nonexistent/flashpath.toml: "), "{e}");
    }

    #[test]
    fn qos_tables_become_calls_after_the_bdevs_and_before_the_controllers() {
        // Written out of order: the order of the calls is the loader's, not the file's.
        let c = parse(
            r#"
            [[vhost_blk]]
            ctrlr = "v0"
            dev_name = "ram0"
            [[qos_group]]
            name = "tenants"
            iops_total = 10000
            bps_read_max = 1048576
            members = [ { bdev_name = "ram0", weight = 3 }, { bdev_name = "ram1" } ]
            [[qos_group]]
            name = "empty"
            [[qos_limit]]
            name = "ram0"
            rw_ios_per_sec = 20000
            r_mbytes_per_sec = 0
            [[bdev]]
            type = "null"
            name = "ram0"
            num_blocks = 8
            block_size = 512
            "#,
        )
        .unwrap();
        let calls = c.calls().unwrap();
        let calls: Vec<(&str, &str, usize, Option<usize>, Value)> =
            calls.iter().map(|c| (c.method.as_str(), c.table, c.index, c.member, c.params.clone())).collect();
        let want = vec![
            (
                "bdev_null_create",
                "bdev",
                0,
                None,
                json!({"name": "ram0", "num_blocks": 8, "block_size": 512}),
            ),
            (
                "bdev_set_qos_limit",
                "qos_limit",
                0,
                None,
                json!({"name": "ram0", "rw_ios_per_sec": 20000, "r_mbytes_per_sec": 0}),
            ),
            (
                "bdev_qos_group_create",
                "qos_group",
                0,
                None,
                json!({"name": "tenants", "iops_total": 10000, "bps_read_max": 1048576}),
            ),
            (
                "bdev_qos_group_add_bdev",
                "qos_group",
                0,
                Some(0),
                json!({"name": "tenants", "bdev_name": "ram0", "weight": 3}),
            ),
            (
                "bdev_qos_group_add_bdev",
                "qos_group",
                0,
                Some(1),
                json!({"name": "tenants", "bdev_name": "ram1"}),
            ),
            ("bdev_qos_group_create", "qos_group", 1, None, json!({"name": "empty"})),
            ("vhost_create_blk_controller", "vhost_blk", 0, None, json!({"ctrlr": "v0", "dev_name": "ram0"})),
        ];
        assert_eq!(calls, want);
    }

    #[test]
    fn nbd_disk_tables_become_calls_after_the_controllers() {
        // Written first: the loader starts the exports last, each table as it is written.
        let c = parse(
            r#"
            [[nbd_disk]]
            bdev_name = "ram0"
            nbd_device = "/run/fp/ram0.nbd"
            readonly = true
            bitmaps = ["daily", { bdev = "ram2", name = "weekly" }]
            [[nbd_disk]]
            bdev_name = "ram1"
            nbd_device = "nbd://0.0.0.0/ram1"
            tls_cert = "/etc/fp/cert.pem"
            tls_key = "/etc/fp/key.pem"
            tls_ca = "/etc/fp/ca.pem"
            [[vhost_blk]]
            ctrlr = "v0"
            dev_name = "ram0"
            readonly = true
            [[bdev]]
            type = "null"
            name = "ram0"
            num_blocks = 8
            block_size = 512
            "#,
        )
        .unwrap();
        let calls: Vec<(String, &str, usize, Value)> =
            c.calls().unwrap().into_iter().map(|c| (c.method, c.table, c.index, c.params)).collect();
        let methods: Vec<&str> = calls.iter().map(|c| c.0.as_str()).collect();
        assert_eq!(
            methods,
            ["bdev_null_create", "vhost_create_blk_controller", "nbd_start_disk", "nbd_start_disk"]
        );
        assert_eq!(
            calls[2],
            (
                "nbd_start_disk".to_string(),
                "nbd_disk",
                0,
                json!({
                    "bdev_name": "ram0", "nbd_device": "/run/fp/ram0.nbd", "readonly": true,
                    "bitmaps": ["daily", { "bdev": "ram2", "name": "weekly" }],
                })
            )
        );
        assert_eq!(
            calls[3],
            (
                "nbd_start_disk".to_string(),
                "nbd_disk",
                1,
                json!({
                    "bdev_name": "ram1", "nbd_device": "nbd://0.0.0.0/ram1", "tls_cert": "/etc/fp/cert.pem",
                    "tls_key": "/etc/fp/key.pem", "tls_ca": "/etc/fp/ca.pem",
                })
            )
        );
    }

    /// The NVMe-oF tables, written in any order, become calls in the order objects depend on
    /// each other: transport, subsystems, listeners, hosts, namespaces; each table is SPDK's
    /// parameters of its method, nested `listen_address` and `namespace` included.
    #[test]
    fn nvmf_tables_become_calls_in_dependency_order() {
        let c = parse(
            r#"
            [[nvmf_ns]]
            nqn = "nqn.2016-06.io.spdk:cnode1"
            namespace = { bdev_name = "ram0", nsid = 1 }
            [[nvmf_host]]
            nqn = "nqn.2016-06.io.spdk:cnode1"
            host = "nqn.2014-08.org.nvmexpress:uuid:1"
            psk = "psk0"
            [[nvmf_listener]]
            nqn = "nqn.2016-06.io.spdk:cnode1"
            listen_address = { trtype = "TCP", adrfam = "IPv4", traddr = "127.0.0.1", trsvcid = "4420" }
            secure_channel = true
            [[nvmf_subsystem]]
            nqn = "nqn.2016-06.io.spdk:cnode1"
            serial_number = "FP0001"
            [[nvmf_transport]]
            trtype = "TCP"
            max_queue_depth = 64
            [[bdev]]
            type = "null"
            name = "ram0"
            num_blocks = 8
            block_size = 512
            "#,
        )
        .unwrap();
        let calls: Vec<(String, &str)> =
            c.calls().unwrap().into_iter().map(|c| (c.method, c.table)).collect();
        let want = [
            ("bdev_null_create", "bdev"),
            ("nvmf_create_transport", "nvmf_transport"),
            ("nvmf_create_subsystem", "nvmf_subsystem"),
            ("nvmf_subsystem_add_listener", "nvmf_listener"),
            ("nvmf_subsystem_add_host", "nvmf_host"),
            ("nvmf_subsystem_add_ns", "nvmf_ns"),
        ];
        assert_eq!(calls, want.map(|(m, t)| (m.to_string(), t)));
        // TLS: a secure listener, a host's PSK by its keyring name.
        assert_eq!(c.calls().unwrap()[3].params["secure_channel"], json!(true));
        assert_eq!(c.calls().unwrap()[4].params["psk"], json!("psk0"));
        let ns = &c.calls().unwrap()[5];
        assert_eq!(
            ns.params,
            json!({"nqn": "nqn.2016-06.io.spdk:cnode1", "namespace": {"bdev_name": "ram0", "nsid": 1}})
        );
        // A refusal is placed under its table and index, nested fields by their path.
        let e = apply(
            "[[nvmf_subsystem]]\nnqn = \"nqn.2016-06.io.spdk:c\"\n\
             [[nvmf_ns]]\nnqn = \"nqn.2016-06.io.spdk:c\"\nnamespace = { bdev_name = \"x\", nguid = \"zz\" }\n",
        )
        .err()
        .expect("a bad nguid");
        assert_eq!(e, "nvmf_ns[0].namespace.nguid: 'zz' is not 32 hexadecimal digits");
    }

    /// Refusals of `[[nbd_disk]]` entries that come before any socket is bound; the exports
    /// themselves start in `tests/cli.rs` (they need a daemon's reactors).
    #[test]
    fn nbd_entry_errors_name_table_index_and_field() {
        let ram = "[[bdev]]\ntype = \"malloc\"\nname = \"a\"\nnum_blocks = 64\nblock_size = 512\n";
        let cases = [
            ("[[nbd_disk]]\nnbd_device = \"/x.sock\"\n", "nbd_disk[0].bdev_name: required parameter missing"),
            // Without nbd_device the export gets a socket in the vhost directory (as SPDK picks
            // a device): the entry gets as far as its bdev.
            ("[[nbd_disk]]\nbdev_name = \"zz\"\n", "nbd_disk[0]: bdev 'zz' does not exist"),
            (
                "[[nbd_disk]]\nbdev_name = \"a\"\nnbd_device = \"rel.sock\"\n",
                "nbd_disk[0].nbd_device: 'rel.sock' is not an absolute socket path",
            ),
            (
                "[[nbd_disk]]\nbdev_name = \"a\"\nnbd_device = \"/x.sock\"\ntls_cert = \"/c.pem\"\n",
                "nbd_disk[0].tls_key: ",
            ),
            (
                "[[nbd_disk]]\nbdev_name = \"a\"\nnbd_device = \"/x.sock\"\nread_only = true\n",
                "nbd_disk[0].read_only: unknown parameter; accepted: ",
            ),
            (
                "[[nbd_disk]]\nbdev_name = \"zz\"\nnbd_device = \"/x.sock\"\n",
                "nbd_disk[0]: bdev 'zz' does not exist",
            ),
        ];
        assert_each_refused_in_one_line(ram, &cases);
    }

    #[test]
    fn qos_group_members_of_the_wrong_shape_are_refused_before_any_call() {
        let cases = [
            ("members = \"a\"", "qos_group[0].members: expected an array of tables {bdev_name, weight}"),
            ("members = [\"a\"]", "qos_group[0].members[0]: expected a table {bdev_name, weight}"),
            (
                "members = [{ bdev_name = \"a\" }, { bdev_name = \"a\", name = \"other\" }]",
                "qos_group[0].members[1].name: unknown parameter; accepted: bdev_name, weight",
            ),
            (
                "members = [{ bdev_name = \"a\", wieght = 2 }]",
                "qos_group[0].members[0].wieght: unknown parameter; accepted: bdev_name, weight",
            ),
        ];
        for (members, want) in cases {
            let text = format!("{NULL_DISK}[[qos_group]]\nname = \"g\"\n{members}\n");
            let config = parse(&text).unwrap();
            assert_eq!(config.calls().unwrap_err().to_string(), want, "{members}");
            // Nothing was created: the shape is checked before the first call.
            let dir = tempfile::tempdir().unwrap();
            let methods = Registry::new(vec![], dir.path());
            assert_eq!(config.apply(&methods).unwrap_err().to_string(), want);
            assert_eq!(methods.call("bdev_get_bdevs", None).unwrap(), json!([]));
        }
    }

    #[test]
    fn a_members_errors_are_placed_under_its_index_except_the_groups_name() {
        let c = parse("[[qos_group]]\nname = \"g\"\nmembers = [{ bdev_name = \"a\" }, {}]\n").unwrap();
        let calls = c.calls().unwrap();
        let member = &calls[2];
        let placed = |e: MethodError| member.error(&e).to_string();
        assert_eq!(
            placed(ParamError::new("weight", "0 is not between 1 and 65535").into()),
            "qos_group[0].members[1].weight: 0 is not between 1 and 65535"
        );
        assert_eq!(
            placed(ParamError::new("bdev_name", "required parameter missing (a string)").into()),
            "qos_group[0].members[1].bdev_name: required parameter missing (a string)"
        );
        assert_eq!(
            placed(MethodError::Failed { code: -17, message: "bdev 'a' is already in group 'h'".into() }),
            "qos_group[0].members[1]: bdev 'a' is already in group 'h'"
        );
        assert_eq!(
            placed(ParamError::new("name", "group 'g' does not exist").into()),
            "qos_group[0].name: group 'g' does not exist"
        );
        // The group's own call is not a member's.
        assert_eq!(
            calls[0].error(&ParamError::new("iops_total", "must be at least 1000").into()).to_string(),
            "qos_group[0].iops_total: must be at least 1000"
        );
    }

    /// Two RAM disks, `a` and `b`, before the QoS tables under test.
    const TWO_DISKS: &str = "[[bdev]]\ntype = \"malloc\"\nname = \"a\"\nnum_blocks = 64\nblock_size = 512\n\
                             [[bdev]]\ntype = \"malloc\"\nname = \"b\"\nnum_blocks = 64\nblock_size = 512\n";

    #[test]
    fn qos_tables_set_limits_and_groups_as_the_rpcs_report_them() {
        let methods = apply(&format!(
            "{TWO_DISKS}\
             [[qos_limit]]\nname = \"a\"\nrw_ios_per_sec = 20000\nw_mbytes_per_sec = 5\n\
             [[qos_group]]\nname = \"tenants\"\niops_total = 10000\nbps_total_max = 0\n\
             members = [ {{ bdev_name = \"a\", weight = 3 }}, {{ bdev_name = \"b\" }} ]\n\
             [[qos_group]]\nname = \"spare\"\nbps_read = 1048576\n"
        ))
        .unwrap();
        let a = &methods.call("bdev_get_bdevs", Some(json!({"name": "a"}))).unwrap()[0];
        assert_eq!(
            a["assigned_rate_limits"],
            json!({"rw_ios_per_sec": 20000, "rw_mbytes_per_sec": 0, "r_mbytes_per_sec": 0, "w_mbytes_per_sec": 5})
        );
        assert_eq!(a["qos_group"], json!({"name": "tenants", "weight": 3}));
        let groups = methods.call("bdev_qos_get_groups", None).unwrap();
        let by_name = |n: &str| groups.as_array().unwrap().iter().find(|g| g["name"] == n).unwrap().clone();
        let tenants = by_name("tenants");
        assert_eq!(tenants["iops_total"], 10000);
        let members: Vec<(&str, u64)> = tenants["members"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| (m["bdev_name"].as_str().unwrap(), m["weight"].as_u64().unwrap()))
            .collect();
        assert_eq!(members, [("a", 3), ("b", 1)]);
        let spare = by_name("spare");
        assert_eq!((spare["bps_read"].as_u64(), spare["members"].clone()), (Some(1 << 20), json!([])));
    }

    #[test]
    fn qos_entry_errors_name_table_index_member_and_field() {
        let cases = [
            ("[[qos_limit]]\nname = \"a\"\nrw_ios_per_sec = 10\n", "qos_limit[0].rw_ios_per_sec: 10 is below the minimum of 1000"),
            ("[[qos_limit]]\nname = \"zz\"\nrw_ios_per_sec = 1000\n", "qos_limit[0]: bdev 'zz' does not exist"),
            ("[[qos_limit]]\nname = \"a\"\niops = 1000\n", "qos_limit[0].iops: unknown parameter; accepted: "),
            ("[[qos_group]]\nname = \"g\"\niops_total = -1\n", "qos_group[0].iops_total: expected an integer between 0 and"),
            (
                "[[qos_group]]\nname = \"g\"\nmembers = [{ bdev_name = \"a\" }, { bdev_name = \"b\", weight = 0 }]\n",
                "qos_group[0].members[1].weight: 0 is not a weight (1 to 65535)",
            ),
            ("[[qos_group]]\nname = \"g\"\nmembers = [{ weight = 2 }]\n", "qos_group[0].members[0].bdev_name: required parameter missing"),
            ("[[qos_group]]\nname = \"g\"\nmembers = [{ bdev_name = \"zz\" }]\n", "qos_group[0].members[0]: bdev 'zz' does not exist"),
            (
                "[[qos_group]]\nname = \"g\"\nmembers = [{ bdev_name = \"a\" }]\n\
                 [[qos_group]]\nname = \"h\"\nmembers = [{ bdev_name = \"b\" }, { bdev_name = \"a\" }]\n",
                "qos_group[1].members[1].bdev_name: bdev 'a' is already in QoS group 'g'",
            ),
            ("[[qos_group]]\nname = \"g\"\n[[qos_group]]\nname = \"g\"\n", "qos_group[1]: QoS group 'g' already exists"),
        ];
        assert_each_refused_in_one_line(TWO_DISKS, &cases);
    }

    #[test]
    fn nvme_tables_become_calls_before_the_clusters_and_bdevs() {
        let text = r#"
            [[bdev]]
            type = "delay"
            name = "d0"
            base_bdev_name = "Nvme0n1"
            [[nvme_controller]]
            name = "Nvme0"
            trtype = "TCP"
            traddr = "127.0.0.1"
            subnqn = "nqn.2016-06.io.spdk:cnode1"
            [[rbd_cluster]]
            name = "ceph"
            [nvme_options]
            timeout_us = 1000000
            action_on_timeout = "reset"
            [[nvme_controller]]
            name = "Nvme1"
            trtype = "PCIe"
            traddr = "0000:00:04.0"
        "#;
        let calls = parse(text).unwrap().calls().unwrap();
        let got: Vec<(&str, &str, usize, bool)> =
            calls.iter().map(|c| (c.method.as_str(), c.table, c.index, c.single)).collect();
        assert_eq!(
            got,
            [
                ("bdev_nvme_set_options", "nvme_options", 0, true),
                ("bdev_nvme_attach_controller", "nvme_controller", 0, false),
                ("bdev_nvme_attach_controller", "nvme_controller", 1, false),
                ("bdev_rbd_register_cluster", "rbd_cluster", 0, false),
                ("bdev_delay_create", "bdev", 0, false),
            ]
        );
        assert_eq!(calls[0].params, json!({"timeout_us": 1000000, "action_on_timeout": "reset"}));
        assert_eq!(
            calls[1].params,
            json!({"name": "Nvme0", "trtype": "TCP", "traddr": "127.0.0.1", "subnqn": "nqn.2016-06.io.spdk:cnode1"})
        );
        let e = parse("nvme_options = 3\n").unwrap_err().to_string();
        assert!(e.starts_with("test.toml:1:1") && e.contains("invalid type"), "{e}");
    }

    /// `[bdev_options]` comes first of all, `[raid_options]` before any bdev: a raid that
    /// examine assembles from the config's bases starts its rebuild at the configured speed.
    #[test]
    fn raid_options_come_before_the_bdevs() {
        let text = r#"
            [[bdev]]
            type = "malloc"
            name = "m0"
            num_blocks = 64
            block_size = 512
            [raid_options]
            process_window_size_kb = 512
            process_max_bandwidth_mb_sec = 8
            [bdev_options]
            bdev_auto_examine = false
        "#;
        let calls = parse(text).unwrap().calls().unwrap();
        let got: Vec<(&str, &str, bool)> =
            calls.iter().map(|c| (c.method.as_str(), c.table, c.single)).collect();
        assert_eq!(
            got,
            [
                ("bdev_set_options", "bdev_options", true),
                ("bdev_raid_set_options", "raid_options", true),
                ("bdev_malloc_create", "bdev", false)
            ]
        );
        assert_eq!(calls[0].params, json!({"bdev_auto_examine": false}));
        assert_eq!(
            calls[1].params,
            json!({"process_window_size_kb": 512, "process_max_bandwidth_mb_sec": 8})
        );
        let e = parse("raid_options = 3\n").unwrap_err().to_string();
        assert!(e.starts_with("test.toml:1:1") && e.contains("invalid type"), "{e}");
    }

    /// An error bdev is a `[[bdev]]` of type "error" with `bdev_error_create`'s keys: it is
    /// `EE_<base_name>`, and its refusals name the table, index and field.
    #[test]
    fn an_error_bdev_table_is_bdev_error_create() {
        let text = format!("{TWO_DISKS}[[bdev]]\ntype = \"error\"\nbase_name = \"a\"\n");
        let calls = parse(&text).unwrap().calls().unwrap();
        assert_eq!(
            (calls[2].method.as_str(), &calls[2].params),
            ("bdev_error_create", &json!({"base_name": "a"}))
        );
        let r = apply(&text).unwrap();
        let b = &r.call("bdev_get_bdevs", Some(json!({"name": "EE_a"}))).unwrap()[0];
        assert_eq!(b["driver_specific"]["error"]["base_bdev_name"], "a", "{b}");
        let e = apply(&format!("{TWO_DISKS}[[bdev]]\ntype = \"error\"\nbase_name = \"a\"\nuuid = \"u\"\n"));
        let e = e.err().expect("refused");
        assert!(e.starts_with("bdev[2].uuid: "), "{e}");
    }

    /// A raid is a `[[bdev]]` of type "raid" with `bdev_raid_create`'s keys, made after its
    /// bases; its refusals name the table, index and field.
    #[test]
    fn a_raid_bdev_table_is_bdev_raid_create() {
        // Room for the superblock area (1 MiB) and some data.
        let disks = TWO_DISKS.replace("num_blocks = 64", "num_blocks = 8192");
        let text = format!(
            "{disks}[[bdev]]\ntype = \"raid\"\nname = \"r\"\nraid_level = \"raid1\"\n\
             base_bdevs = [\"a\", \"b\"]\nsuperblock = true\n"
        );
        let calls = parse(&text).unwrap().calls().unwrap();
        assert_eq!(calls[2].method, "bdev_raid_create");
        assert_eq!(
            calls[2].params,
            json!({"name": "r", "raid_level": "raid1", "base_bdevs": ["a", "b"], "superblock": true})
        );
        let r = apply(&text).unwrap();
        let raids = r.call("bdev_raid_get_bdevs", Some(json!({"category": "online"}))).unwrap();
        assert_eq!(raids[0]["name"], "r", "{raids}");
        let bad = format!(
            "{disks}[[bdev]]\ntype = \"raid\"\nname = \"r\"\nraid_level = \"raid0\"\n\
             base_bdevs = [\"a\", \"b\"]\nstrip_size_kb = 3\n"
        );
        let e = apply(&bad).err().expect("refused");
        assert!(e.starts_with("bdev[2].strip_size_kb: "), "{e}");
    }

    /// The NVMe tables' refusals are the methods' own, placed at the table (the single
    /// `[nvme_options]` without an index); none of these reaches a controller.
    #[test]
    fn nvme_entry_errors_name_table_index_and_field() {
        let cases = [
            ("[nvme_options]\naction_on_timeout = \"panic\"\n", "nvme_options.action_on_timeout: 'panic' is not one of none, abort, reset"),
            ("[nvme_options]\ntimeout_admin_us = 5\n", "nvme_options.timeout_admin_us: needs timeout_us too"),
            ("[nvme_options]\nio_queue_depth = 5\n", "nvme_options.io_queue_depth: unknown parameter; accepted: "),
            (
                "[[nvme_controller]]\nname = \"N\"\ntrtype = \"rdma\"\ntraddr = \"127.0.0.1\"\n",
                "nvme_controller[0].trtype: 'rdma' is not supported: PCIe or TCP",
            ),
            (
                "[[nvme_controller]]\nname = \"N\"\ntrtype = \"tcp\"\ntraddr = \"127.0.0.1\"\n",
                "nvme_controller[0].subnqn: required for trtype TCP",
            ),
            (
                "[[nvme_controller]]\nname = \"N\"\ntrtype = \"tcp\"\ntraddr = \"127.0.0.1\"\nsubnqn = \"nqn.a\"\ntrsvcid = 4420\n",
                "nvme_controller[0].trsvcid: expected a string",
            ),
            (
                "[[nvme_controller]]\nname = \"N\"\ntrtype = \"pcie\"\ntraddr = \"0000:00:04.0\"\nreconnect_delay_sec = 2\n",
                "nvme_controller[0].reconnect_delay_sec: must be 0 when ctrlr_loss_timeout_sec is 0",
            ),
        ];
        for (text, want) in cases {
            let e = apply(text).err().expect("refused");
            assert!(e.starts_with(want), "{e:?} does not start with {want:?}");
        }
    }

    #[test]
    fn crypto_keys_come_before_the_crypto_bdevs_and_need_an_owner_only_file() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let key_file = dir.path().join("tls.key");
        std::fs::write(&key_file, "secret").unwrap();
        std::fs::set_permissions(&key_file, std::fs::Permissions::from_mode(0o600)).unwrap();
        let text = format!(
            r#"
            [[bdev]]
            type = "malloc"
            name = "m0"
            num_blocks = 64
            block_size = 4096
            [[bdev]]
            type = "crypto"
            name = "c0"
            base_bdev_name = "m0"
            key_name = "k0"
            [[accel_crypto_key]]
            name = "k0"
            cipher = "AES_XTS"
            key = "00112233445566778899aabbccddeeff"
            key2 = "ffeeddccbbaa99887766554433221100"
            [[keyring_file_key]]
            name = "tls0"
            path = "{}"
            "#,
            key_file.display()
        );
        let calls: Vec<(String, &str)> =
            parse(&text).unwrap().calls().unwrap().into_iter().map(|c| (c.method, c.table)).collect();
        let methods: Vec<&str> = calls.iter().map(|(m, _)| m.as_str()).collect();
        assert_eq!(
            methods,
            ["keyring_file_add_key", "accel_crypto_key_create", "bdev_malloc_create", "bdev_crypto_create"]
        );
        let registry = apply(&text).unwrap();
        let b = registry.call("bdev_get_bdevs", Some(json!({"name": "c0"}))).unwrap();
        assert_eq!(b[0]["driver_specific"]["crypto"]["key_name"], "k0", "{b}");
        // A file holding keys must be owner-only; a bad key names its table and field, and
        // never shows the key.
        let file = dir.path().join("flashpath.toml");
        std::fs::write(&file, &text).unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = ConfigFile::load(&file).unwrap_err().to_string();
        assert!(e.starts_with("accel_crypto_key[0]: ") && e.contains("owner-only"), "{e}");
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(ConfigFile::load(&file).is_ok());
        let e = apply(&text.replace("ffeeddccbbaa99887766554433221100", "00112233445566778899aabbccddeeff"))
            .err()
            .unwrap();
        assert!(e.starts_with("accel_crypto_key[0].key2: "), "{e}");
        let e = apply(&text.replace("ffeeddccbbaa99887766554433221100", "ffeeddcc")).err().unwrap();
        assert!(e.starts_with("accel_crypto_key[0].key2: ") && !e.contains("ffeeddcc"), "{e}");
    }

    #[test]
    fn rbd_cluster_tables_become_calls_before_the_bdevs() {
        // Written after the bdev that names the cluster: the loader registers it first.
        let c = parse(
            r#"
            [[bdev]]
            type = "rbd"
            name = "vm1"
            pool_name = "rbd"
            rbd_name = "vm1"
            cluster_name = "ceph"
            [[rbd_cluster]]
            name = "ceph"
            user_id = "admin"
            config_file = "/etc/ceph/ceph.conf"
            key_file = "/etc/ceph/keyring"
            config_param = { rados_osd_op_timeout = "3", client_mount_timeout = "5" }
            [[rbd_cluster]]
            name = "other"
            "#,
        )
        .unwrap();
        let calls: Vec<(String, &str, usize, Value)> =
            c.calls().unwrap().into_iter().map(|c| (c.method, c.table, c.index, c.params)).collect();
        let want = vec![
            (
                "bdev_rbd_register_cluster".to_string(),
                "rbd_cluster",
                0,
                json!({
                    "name": "ceph", "user_id": "admin", "config_file": "/etc/ceph/ceph.conf",
                    "key_file": "/etc/ceph/keyring",
                    "config_param": {"rados_osd_op_timeout": "3", "client_mount_timeout": "5"},
                }),
            ),
            ("bdev_rbd_register_cluster".to_string(), "rbd_cluster", 1, json!({"name": "other"})),
            (
                "bdev_rbd_create".to_string(),
                "bdev",
                0,
                json!({"name": "vm1", "pool_name": "rbd", "rbd_name": "vm1", "cluster_name": "ceph"}),
            ),
        ];
        assert_eq!(calls, want);
    }

    #[test]
    fn rbd_entry_errors_name_table_index_and_field() {
        // None of these reaches a cluster: each is refused before connecting.
        let cases = [
            (
                "[[rbd_cluster]]\nconfig_file = \"/x\"\n",
                "rbd_cluster[0].name: required parameter missing (a string)",
            ),
            (
                "[[rbd_cluster]]\nname = \"c\"\nkeyfile = \"/x\"\n",
                "rbd_cluster[0].keyfile: unknown parameter; accepted: ",
            ),
            (
                "[[rbd_cluster]]\nname = \"c\"\nconfig_param = { rados_osd_op_timeout = [3] }\n",
                "rbd_cluster[0].config_param.rados_osd_op_timeout: expected a string, number or boolean",
            ),
            ("[[rbd_cluster]]\nname = \"c\"\nconfig_param = \"x\"\n", "rbd_cluster[0].config_param: "),
            ("[[rbd_cluster]]\nname = \"\"\n", "rbd_cluster[0].name: must be a non-empty name"),
            (
                "[[bdev]]\ntype = \"rbd\"\npool_name = \"rbd\"\nrbd_name = \"i\"\ncluster_name = \"nope\"\n",
                "bdev[1].cluster_name: no registered cluster 'nope'",
            ),
            (
                "[[bdev]]\ntype = \"rbd\"\nrbd_name = \"i\"\n",
                "bdev[1].pool_name: required parameter missing (a string)",
            ),
            (
                "[[bdev]]\ntype = \"rbd\"\npool_name = \"rbd\"\nrbd_name = \"i\"\nblock_size = \"4k\"\n",
                "bdev[1].block_size: ",
            ),
        ];
        assert_each_refused_in_one_line(NULL_DISK, &cases);
    }

    /// A monitor that does not answer stops the loader at the cluster's entry, after
    /// client_mount_timeout, naming the cluster; the bdevs after it are never created.
    #[test]
    fn an_unreachable_rbd_cluster_stops_the_file_at_its_entry() {
        let dir = tempfile::tempdir().unwrap();
        let methods = Registry::new(vec![], dir.path());
        // Port 9 (discard) on loopback: nothing listens, nothing leaves the machine.
        let config = parse(
            "[[rbd_cluster]]\nname = \"far\"\n\
             config_param = { mon_host = \"127.0.0.1:9\", client_mount_timeout = \"1\" }\n\
             [[bdev]]\ntype = \"null\"\nname = \"a\"\nnum_blocks = 8\nblock_size = 512\n",
        )
        .unwrap();
        let t0 = std::time::Instant::now();
        let e = config.apply(&methods).unwrap_err().to_string();
        assert!(e.starts_with("rbd_cluster[0]: ") && !e.contains('\n'), "{e}");
        // Without librbd (package librbd1) the module says so instead of connecting.
        if !e.contains("librbd1") {
            assert!(e.contains("'far'"), "the error names the cluster: {e}");
            assert!(t0.elapsed() < std::time::Duration::from_secs(8), "took {:?}", t0.elapsed());
        }
        assert_eq!(methods.call("bdev_get_bdevs", None).unwrap(), json!([]));
        assert_eq!(methods.call("bdev_rbd_get_clusters_info", None).unwrap(), json!([]));
    }

    /// Found by the config_file fuzz target: values quoted into errors kept their newlines.
    #[test]
    fn quoted_values_with_control_characters_stay_on_one_line() {
        let e = parse("[reactor]\ncpus = \"0\\n1\"\n").unwrap_err().to_string();
        assert_eq!(e.lines().count(), 1, "{e}");
        assert!(e.starts_with("reactor.cpus: ") && e.contains("\\n"), "{e}");
        let e = apply("[[bdev]]\ntype = \"mal\\nloc\\u001b[2J\"\nname = \"x\"\n").err().unwrap();
        assert_eq!(
            e,
            "bdev[0].type: 'mal\\nloc\\u{1b}[2J' is not one of null, malloc, uring, delay, error, crypto, raid, rbd, nbd_client"
        );
        // A controller over a bdev whose name holds a newline: the not-found error quotes it.
        let e = apply("[[vhost_blk]]\nctrlr = \"v0\"\nnum_queues = 1\ndev_name = \"no\\nsuch\"\n")
            .err()
            .expect("a missing bdev is refused");
        assert!(e.starts_with("vhost_blk[0]") && e.contains("no\\nsuch"), "{e}");
        assert_eq!(e.lines().count(), 1, "{e}");
    }
}
