//! A running export ([`Export`]): what differs between kinds, as the registry's state holds it.

use std::any::Any;

/// A running export: only what differs between kinds. Its name, kind, bdev and claim are the
/// registry's, given once to [`Registry::add_export`](crate::Registry::add_export).
pub trait Export: Send + Sync {
    /// Its bdev changed size (now `size_bytes`): offer the new size to its clients and tell
    /// them if the protocol can.
    fn resized(&self, size_bytes: u64);

    /// Disconnects its clients and releases what it holds; waits for in-flight requests.
    fn stop(self: Box<Self>);

    /// [`Export::stop`] as the daemon shuts down, every export at once ([`Registry::shutdown`](crate::Registry::shutdown)):
    /// what it waits for ends by `bound`, the daemon's stop bound, and what is left then is
    /// logged, naming the export. By default `stop`, for kinds whose stop has its own bound (a
    /// vhost-user queue's `stop_timeout_ms`, the NVMe-oF target's drain timeout).
    fn stop_at_shutdown(self: Box<Self>, bound: std::time::Duration) {
        let _ = bound;
        self.stop();
    }

    /// For the kind's own methods ([`Registry::with_export`](crate::Registry::with_export)).
    fn as_any(&self) -> &dyn Any;
}
