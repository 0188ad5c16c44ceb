//! A controller's namespaces as its handle and its thread share them, and the events the
//! thread reports about them: plain types both sides name, kept below both.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use crate::bdev::NvmeNamespace;

/// A change of a controller's namespaces, found by an asynchronous event (Changed Namespace
/// List) or after a reset. The module turns them into registry calls: `Added` a new bdev,
/// `Resized` the registry's resize (which calls [`NvmeNamespace`]'s `resize`), `Removed` a
/// delete. The callback runs on the controller thread: it must not call back into the
/// controller synchronously (reset, detach).
#[derive(Debug)]
pub enum NamespaceEvent {
    /// A namespace appeared (bdev `<name>n<nsid>`).
    Added(Arc<NvmeNamespace>),
    /// A namespace's size changed to `num_blocks`.
    Resized {
        /// The namespace.
        nsid: u32,
        /// Its size now, in blocks.
        num_blocks: u64,
    },
    /// A namespace went away (or the whole controller was given up).
    Removed {
        /// The namespace.
        nsid: u32,
    },
}

/// The namespaces of a controller, shared with its handle.
pub(crate) type NsMap = Arc<Mutex<BTreeMap<u32, Arc<NvmeNamespace>>>>;

/// Locks a namespace map (a panicked holder left it consistent: entries are whole).
pub(crate) fn lock_ns(map: &NsMap) -> std::sync::MutexGuard<'_, BTreeMap<u32, Arc<NvmeNamespace>>> {
    map.lock().unwrap_or_else(|e| e.into_inner())
}

/// The namespace-event callback.
pub(crate) type Events = Box<dyn Fn(NamespaceEvent) + Send + Sync>;
