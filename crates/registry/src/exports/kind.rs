//! The plug-in contract of an export kind ([`ExportKind`]): what the daemon finds in each, below
//! the kinds that implement it and the list of them.

use std::any::Any;
use std::sync::Arc;
use std::time::Duration;

pub use fp_bdev::ConfigTable;

use super::options::{KindOption, OptionValues};
use crate::methods::MethodFn;
use crate::metrics::{Family, MetricsCall};
use crate::Registry;

/// A kind of export, as the daemon sees it beside its running exports: a bdev module's
/// counterpart ([`fp_bdev::BdevModule`]).
pub trait ExportKind: Sync {
    /// "vhost-blk", "nbd": the kind of its exports, the claim holder's kind in
    /// `bdev_get_bdevs`.
    fn name(&self) -> &'static str;

    /// Its JSON-RPC methods.
    fn methods(&self) -> &'static [(&'static str, MethodFn)];

    /// The configuration file's arrays of tables for it (`vhost_blk` for `[[vhost_blk]]`) and
    /// the method whose parameters each table holds, in the order the file applies them (the
    /// NVMe-oF kind has one per object: transport, subsystem, listener, host, namespace).
    fn config_tables(&self) -> &'static [ConfigTable];

    /// Its daemon-wide options (bounds, switches), each a key of a configuration table and
    /// most a flag of `flashpath serve`, which builds and reads them from this list; its
    /// [`ExportKind::init`] gets their values by key ([`KindInit::options`]).
    fn options(&self) -> &'static [KindOption] {
        &[]
    }

    /// Its metric families for one scrape, read through `call` (a method and its parameters),
    /// the same methods the RPC answers, so the endpoint and the RPC cannot disagree.
    fn metrics(&self, call: MetricsCall<'_>) -> Vec<Family>;

    /// Makes the kind's daemon-wide state (a server with its listeners, a target with its
    /// subsystems) as the registry is made, from its options; its methods find it
    /// again with [`Registry::kind_state`]. `None` (the default) for a kind with no state
    /// beyond its exports.
    fn init(&self, init: &KindInit<'_>) -> Option<Arc<dyn Any + Send + Sync>> {
        let _ = init;
        None
    }

    /// The daemon is stopping, before its exports stop: close what would let new clients in
    /// (listeners) and disconnect the ones the kind holds beside its exports.
    fn shutdown(&self, registry: &Registry) {
        let _ = registry;
    }

    /// The longest the stop of one of its exports may take at shutdown (a vhost-user queue's
    /// default stop bound, an NVMe-oF namespace's drain): the exports' shutdown deadline,
    /// [`Registry::export_stop_bound`], is the longest of the kinds', the daemon's stop bound,
    /// [`Registry::daemon_stop_bound`], the shortest.
    fn stop_bound(&self, registry: &Registry) -> Option<Duration> {
        let _ = registry;
        None
    }
}

/// What an export kind's [`ExportKind::init`] builds its state from.
pub struct KindInit<'a> {
    /// The daemon's reactors, where its connections run.
    pub reactors: &'a [fp_reactor::ReactorHandle],
    /// The kind's own options ([`ExportKind::options`]), by key.
    pub options: OptionValues<'a>,
}
