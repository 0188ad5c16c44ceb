//! Bdev modules: what a backend adds besides its device.
//!
//! A module ([`BdevModule`]) has a name (the `driver` of its bdevs, the `type` of a `[[bdev]]`
//! configuration table), its JSON-RPC methods with their parameter decoding, and how it reports
//! its bdevs in `bdev_get_bdevs`. Its methods do their work through a [`ModuleHost`], which the
//! registry implements: look a bdev up, claim a base, check the configured limits and export
//! directories, add and delete bdevs. A module therefore never sees the registry's internals,
//! and one from another crate (Ceph RBD, say) is added with one line in the registry's module
//! list, like the built-in ones (`crates/bdev/src/modules/<name>/`). A module with
//! daemon-wide options or its own objects declares their configuration file tables
//! ([`BdevModule::config_tables`]), and one with counters of its own its metric families
//! ([`BdevModule::metrics`]): the daemon finds both here, as it does an export kind's.

use std::any::Any;
use std::fs::File;
use std::path::Path;
use std::sync::{Arc, Weak};

use fp_rpc::{ParamError, Params};
use serde_json::{Map, Value};

use crate::metrics::{Family, MetricsCall};
use crate::{Bdev, BdevError, BdevInfo, BlockDevice};

/// How a bdev is claimed by whoever builds on it (an export, a stacked bdev). SPDK's claim
/// types, of which flashpath needs two so far (SPDK's `read_many_write_one` would be a writer
/// beside non-claiming readers, which flashpath does not have).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimType {
    /// The holder writes and nobody else may claim the bdev (a writable export, a delay bdev).
    ExclusiveWrite,
    /// The holder only reads; any number of such claims may share the bdev, no writer may
    /// join them (read-only exports; snapshots and volumes later).
    ReadManyWriteNone,
}

impl ClaimType {
    /// SPDK's name, as `bdev_get_bdevs` reports it in `claim_type`.
    pub fn name(self) -> &'static str {
        match self {
            ClaimType::ExclusiveWrite => "exclusive_write",
            ClaimType::ReadManyWriteNone => "read_many_write_none",
        }
    }

    /// Whether a claim of this type may be added to a bdev already carrying `held` claims.
    pub fn compatible_with(self, held: &[ClaimType]) -> bool {
        held.iter().all(|&h| h == ClaimType::ReadManyWriteNone && self == ClaimType::ReadManyWriteNone)
    }
}

/// Why a module's method failed.
#[derive(Debug, thiserror::Error)]
pub enum ModuleError {
    #[error(transparent)]
    /// The RPC parameters were refused.
    Param(#[from] ParamError),
    #[error(transparent)]
    /// The device could not be made.
    Bdev(#[from] BdevError),
    /// The host refused (a name taken, a base missing or claimed, a limit): its own error, which
    /// it takes back, with its errno, when the method returns.
    #[error(transparent)]
    Host(Box<dyn std::error::Error + Send + Sync>),
    /// The module's own failure (a controller that timed out, a raid without its bases), with
    /// the negative errno the JSON-RPC error reports for it: the host passes both on without
    /// knowing the module's error type.
    #[error("{source}")]
    Module {
        /// A negative errno (`-libc::ETIMEDOUT`), SPDK's JSON-RPC error code for it.
        errno: i32,
        /// What failed; its message is the JSON-RPC error's.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

impl ModuleError {
    /// The module's own error `source`, reported as `errno` (negative, as SPDK's codes are).
    pub fn module(errno: i32, source: impl std::error::Error + Send + Sync + 'static) -> ModuleError {
        ModuleError::Module { errno, source: Box::new(source) }
    }
}

/// A configuration file table that stands for calls of one method: a bdev module's
/// (`[raid_options]`, `[[nvme_controller]]`) or an export kind's (`[[nbd_disk]]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConfigTable {
    /// The table's name (`nbd_disk` for `[[nbd_disk]]`).
    pub table: &'static str,
    /// The method each table is the parameters of (`nbd_start_disk`).
    pub method: &'static str,
    /// A single table (`[raid_options]`: the module's daemon-wide options, set once) rather than
    /// an array of tables (one object each).
    pub single: bool,
    /// It holds key material: a file with such a table is refused unless only its owner may
    /// read it.
    pub secret: bool,
    /// Its calls come after the `[[bdev]]` tables (and the mirrors), before the exports: its
    /// objects build on bdevs the file declares (a live restore's base).
    pub after_bdevs: bool,
}

impl ConfigTable {
    /// An array of tables, `[[table]]`: one call of `method` each.
    pub const fn array(table: &'static str, method: &'static str) -> ConfigTable {
        ConfigTable { table, method, single: false, secret: false, after_bdevs: false }
    }

    /// A single table, `[table]`: one call of `method`.
    pub const fn single(table: &'static str, method: &'static str) -> ConfigTable {
        ConfigTable { table, method, single: true, secret: false, after_bdevs: false }
    }

    /// The same, holding key material ([`ConfigTable::secret`]).
    pub const fn secret(self) -> ConfigTable {
        ConfigTable { secret: true, ..self }
    }

    /// The same, applied after the bdevs ([`ConfigTable::after_bdevs`]).
    pub const fn after_bdevs(self) -> ConfigTable {
        ConfigTable { after_bdevs: true, ..self }
    }
}

/// A bdev a module hands to [`ModuleHost::add_bdev`].
pub struct NewBdev {
    /// The device, as a [`Bdev`].
    pub bdev: Bdev,
    /// The same device, for the module's own methods to get back typed
    /// ([`ModuleHost::module_device`]).
    pub device: Arc<dyn Any + Send + Sync>,
    /// The bdevs it builds on and how it claims them; taken with the insertion, released when
    /// it is deleted.
    pub claims: Vec<(String, ClaimType)>,
    /// Other names it answers to (SPDK's aliases), unique among bdev names and aliases.
    pub aliases: Vec<String>,
}

impl NewBdev {
    /// Wraps a device for the registry.
    pub fn new<D: BlockDevice + 'static>(device: Arc<D>) -> NewBdev {
        NewBdev { bdev: device.clone(), device, claims: Vec::new(), aliases: Vec::new() }
    }

    /// The same, also answering to `alias`.
    pub fn alias(mut self, alias: String) -> NewBdev {
        self.aliases.push(alias);
        self
    }

    /// The same, claiming `base`.
    pub fn claiming(mut self, base: &str, claim: ClaimType) -> NewBdev {
        self.claims.push((base.to_string(), claim));
        self
    }
}

/// Opens the file of a file-backed bdev, with or without O_DIRECT (what
/// [`crate::UringDevice::open_with`] takes).
pub type FileOpener = Box<dyn Fn(bool) -> std::io::Result<File>>;

/// What a module's job on a reactor did in one round ([`BackgroundJob::poll`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackgroundPoll {
    /// It moved something.
    Busy,
    /// Nothing to do this round.
    Idle,
    /// It is over: the reactor drops it.
    Finished,
}

/// Work a module runs on a reactor beside the exports' I/O (a raid's rebuild copies), as
/// ordinary channel I/O: polled every round until it reports [`BackgroundPoll::Finished`].
pub trait BackgroundJob {
    /// One round.
    fn poll(&mut self) -> BackgroundPoll;
    /// Whether the reactor should keep polling without sleeping (I/O in flight, or work
    /// queued by another thread that does not wake the reactor).
    fn has_pending(&self) -> bool;
}

/// Makes a [`BackgroundJob`] on the reactor's thread, which opens its channels there.
pub type BackgroundStart = Box<dyn FnOnce() -> Box<dyn BackgroundJob> + Send>;

/// What the modules' methods call: the registry.
pub trait ModuleHost {
    /// Refuses early when `name` is taken or the bdev limit is reached, which spares building a
    /// device for nothing. [`ModuleHost::add_bdev`] checks again.
    fn check_new_bdev(&self, name: &str) -> Result<(), ModuleError>;

    /// Adds a bdev built by `module` and takes its claims, all or nothing; returns its name.
    fn add_bdev(&self, module: &'static str, new: NewBdev) -> Result<String, ModuleError>;

    /// The bdev `name`, which is to be claimed as `claim`: refuses a missing bdev or one whose
    /// claims exclude it. The claim itself is taken by [`ModuleHost::add_bdev`].
    fn claimable(&self, name: &str, claim: ClaimType) -> Result<Bdev, ModuleError>;

    /// Whether a bdev of this name (or alias) exists.
    fn bdev_exists(&self, name: &str) -> bool;

    /// The name of the bdev called `name` (its name, or one of its aliases).
    fn bdev_name(&self, name: &str) -> Option<String>;

    /// Replaces the aliases of the bdev `name` (a renamed logical volume); refuses an alias that
    /// another bdev has as name or alias, changing nothing.
    fn set_aliases(&self, name: &str, aliases: Vec<String>) -> Result<(), ModuleError>;

    /// The bdev `name` with its driver, for a module examining a new bdev; claims nothing.
    fn bdev(&self, name: &str) -> Option<(Bdev, &'static str)>;

    /// Claims the bdev `name` for a holder that is not a bdev (an lvstore, `holder_kind`
    /// "lvstore"), now; [`ModuleHost::release_claim`] gives it back.
    fn claim(
        &self,
        name: &str,
        holder_kind: &'static str,
        holder: &str,
        claim: ClaimType,
    ) -> Result<Bdev, ModuleError>;

    /// Gives back a claim [`ModuleHost::claim`] took.
    fn release_claim(&self, name: &str, holder_kind: &'static str, holder: &str);

    /// The module's own state (one per registry), made by `init` on first use.
    fn module_state(
        &self,
        module: &'static str,
        init: &dyn Fn() -> Arc<dyn Any + Send + Sync>,
    ) -> Arc<dyn Any + Send + Sync>;

    /// The block size of the bdev `name`.
    fn block_size(&self, name: &str) -> Result<u32, ModuleError>;

    /// The device of a bdev of `module`, as given to [`NewBdev::device`]; `kind` names it in
    /// the "does not exist" error ("delay bdev").
    fn module_device(
        &self,
        name: &str,
        module: &'static str,
        kind: &'static str,
    ) -> Result<Arc<dyn Any + Send + Sync>, ModuleError>;

    /// Resizes a bdev of `module` to `num_blocks` ([`crate::BlockDevice::resize`]) and tells
    /// whoever holds it, and whoever holds a bdev stacked on it whose size changed with it.
    /// A bdev in use may grow but not shrink (its users' data would be cut off), as in SPDK.
    fn resize_bdev(&self, name: &str, module: &'static str, num_blocks: u64) -> Result<(), ModuleError>;

    /// Deletes a bdev of `module` (SPDK's `bdev_null_delete` does not delete a malloc bdev).
    /// Refused while the bdev is claimed.
    fn delete_bdev(&self, name: &str, module: &'static str) -> Result<(), ModuleError>;

    /// While the daemon shuts down, the instant by which the whole shutdown is to end: a
    /// module's [`BdevModule::shutdown`] waits for nothing past it (what is still under way
    /// then is logged and left to end alone). `None` outside a shutdown, or for a host without
    /// one.
    fn shutdown_deadline(&self) -> Option<std::time::Instant> {
        None
    }

    /// The most bytes one RAM-backed bdev may hold (`limits.max_malloc_bytes`).
    fn memory_limit(&self) -> u64;

    /// Refuses a RAM-backed bdev of this geometry above the configured memory limit.
    fn check_memory_size(&self, name: &str, block_size: u32, num_blocks: u64) -> Result<(), ModuleError>;

    /// The host itself as a weak, owned handle, for a module whose own threads must reach it
    /// later, outside any method call: an NVMe controller's thread reporting that a namespace
    /// was resized or removed. Weak, so that what the module keeps in its state does not keep
    /// the host alive; `None` from a host that cannot give one (the module then only logs).
    fn weak_handle(&self) -> Option<Weak<dyn ModuleHost + Send + Sync>> {
        None
    }

    /// How to open `filename` for a file-backed bdev; refuses it when it is outside the
    /// configured export directories.
    fn file_opener(&self, filename: &Path) -> Result<FileOpener, ModuleError>;

    /// The daemon's state directory (`serve --state-dir`, `state_dir`), where a module keeps
    /// what must survive a restart; `None` when none was chosen.
    fn state_dir(&self) -> Option<std::path::PathBuf> {
        None
    }

    /// Runs the job `start` makes on a reactor (the daemon's last, where mirror copiers run).
    /// `false` from a host without reactors: the module then does the work on its own thread.
    fn start_background(&self, start: BackgroundStart) -> bool {
        drop(start);
        false
    }
}

/// A JSON-RPC method of a module.
pub type ModuleMethodFn = fn(&dyn ModuleHost, Params) -> Result<Value, ModuleError>;

/// A bdev module. See the module docs.
pub trait BdevModule: Send + Sync {
    /// "null", "malloc", ...: its bdevs' `driver`, its configuration tables' `type`.
    fn name(&self) -> &'static str;

    /// Its JSON-RPC methods; `bdev_<name>_create` is the one a `[[bdev]]` table calls.
    fn methods(&self) -> &'static [(&'static str, ModuleMethodFn)];

    /// The configuration file's tables for its daemon-wide options and its objects that are
    /// not bdevs (`[raid_options]`, `[[rbd_cluster]]`), in the order the file applies them:
    /// every module's, in the module list's order, after `[bdev_options]` and before the
    /// `[[bdev]]` tables. Its bdevs themselves are `[[bdev]]` tables (`type` its name, the rest
    /// `bdev_<name>_create`'s parameters) when it is [`BdevModule::configurable`].
    fn config_tables(&self) -> &'static [ConfigTable] {
        &[]
    }

    /// Its metric families for one scrape, read through `call` (a method and its parameters),
    /// the same methods the RPC answers, so the endpoint and the RPC cannot disagree. None by
    /// default: every bdev's I/O counters are the disk layer's (`bdev_get_iostat`).
    fn metrics(&self, call: MetricsCall<'_>) -> Vec<Family> {
        let _ = call;
        Vec::new()
    }

    /// Whether a `[[bdev]]` table of the configuration file may name it: false for a module
    /// whose bdevs persist on their base and come back by examine (logical volumes), where
    /// creating them again at each start would fail.
    fn configurable(&self) -> bool {
        true
    }

    /// `bdev_get_bdevs`' `driver_specific.<name>` for one of its bdevs; `device` is the one it
    /// gave to [`NewBdev::device`]. By default the device's own detail.
    fn driver_specific(&self, info: &BdevInfo, device: &(dyn Any + Send + Sync)) -> Map<String, Value> {
        let _ = device;
        info.driver_specific.iter().map(|(k, v)| (k.clone(), Value::from(v.as_str()))).collect()
    }

    /// A bdev `name` (of module `driver`) was just added: a module that finds its own metadata
    /// on it takes it (SPDK's examine: an lvstore loads its volumes). Errors are the module's to
    /// log; the new bdev stays either way.
    fn examine(&self, host: &dyn ModuleHost, name: &str, driver: &'static str) {
        let _ = (host, name, driver);
    }

    /// The daemon is stopping: close what the module holds open.
    fn shutdown(&self, host: &dyn ModuleHost) {
        let _ = host;
    }
}

/// `bdev_<module>_delete`: SPDK's shape, `name` only.
pub fn delete_method(
    host: &dyn ModuleHost,
    mut p: Params,
    module: &'static str,
) -> Result<Value, ModuleError> {
    let name = p.required_str("name")?;
    p.finish()?;
    host.delete_bdev(&name, module)?;
    Ok(Value::Bool(true))
}

/// `bdev_<module>_resize`: SPDK's `name` and `new_size` (MiB), or flashpath's `new_size_bytes`
/// (exactly one of the two; bytes must be whole blocks). Returns `true`.
pub fn resize_method(
    host: &dyn ModuleHost,
    mut p: Params,
    module: &'static str,
    kind: &'static str,
) -> Result<Value, ModuleError> {
    const MIB: u64 = 1 << 20;
    let name = p.required_str("name")?;
    let mib = p.optional_uint("new_size", u64::MAX / MIB)?;
    let bytes = p.optional_uint("new_size_bytes", u64::MAX)?;
    p.finish()?;
    let (field, bytes) = match (mib, bytes) {
        (Some(m), None) => ("new_size", m * MIB),
        (None, Some(b)) => ("new_size_bytes", b),
        (Some(_), Some(_)) => {
            return Err(ParamError::new(
                "new_size_bytes",
                "give either new_size (MiB) or new_size_bytes, not both",
            )
            .into())
        }
        (None, None) => {
            return Err(ParamError::new("new_size", "required (in MiB; or new_size_bytes)").into())
        }
    };
    // Only a bdev of this module: `bdev_null_resize` does not resize a malloc bdev.
    host.module_device(&name, module, kind)?;
    let block_size = host.block_size(&name)?;
    if bytes == 0 || !bytes.is_multiple_of(u64::from(block_size)) {
        return Err(ParamError::new(
            field,
            format!("{bytes} bytes is not a non-zero multiple of the block size {block_size}"),
        )
        .into());
    }
    host.resize_bdev(&name, module, bytes / u64::from(block_size))?;
    Ok(Value::Bool(true))
}

/// Block sizes are `u32` in the devices; decoders bound them to that.
pub const U32_MAX: u64 = u32::MAX as u64;
