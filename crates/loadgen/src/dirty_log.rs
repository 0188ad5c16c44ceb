//! What the vhost-user frontend's dirty log saw during a run ([`LoadSpec::dirty_log`]): the
//! sync thread's scans of the log, as QEMU's `vhost_log_sync` scans it during migration, and
//! the distinct pages it found dirty, by what they hold.
//!
//! [`LoadSpec::dirty_log`]: crate::LoadSpec::dirty_log

/// The dirty log's side of a run with [`LoadSpec::dirty_log`].
///
/// Pages are 4 KiB of the frontend's memory (its one region, guest-physical address 0 up).
/// `bits_seen` counts every set bit each scan cleared, so a page dirtied again after a scan
/// counts again; the `*_pages` fields count each page once over the whole run (the union of
/// all scans), split by what the page holds.
///
/// [`LoadSpec::dirty_log`]: crate::LoadSpec::dirty_log
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DirtyLogReport {
    /// Size of the log (one bit per page of the region), in bytes.
    pub log_bytes: u64,
    /// Pages of memory the log covers.
    pub memory_pages: u64,
    /// Scans of the log (one every `interval_ms`, and one after the last request completed).
    pub syncs: u64,
    pub interval_ms: u64,
    /// Set bits the scans found and cleared, summed over the scans.
    pub bits_seen: u64,
    /// Time the sync thread spent scanning, in ns.
    pub sync_ns: u64,
    /// Distinct pages of the request buffers found dirty: exactly the pages reads write into.
    pub data_pages: u64,
    /// The request buffers' pages reads write into: every slot's buffer for a pattern that
    /// reads, none for one that only writes. `data_pages` should equal it.
    pub data_pages_expected: u64,
    /// Distinct pages of request headers and status bytes found dirty (status bytes are
    /// written by the device for every request).
    pub header_pages: u64,
    /// Distinct pages of the rings found dirty (used rings, logged through `log_guest_addr`).
    pub ring_pages: u64,
    /// Dirty pages nothing of the run's lies in: should be 0.
    pub other_pages: u64,
}

impl DirtyLogReport {
    /// The report as a JSON object.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "log_bytes": self.log_bytes,
            "memory_pages": self.memory_pages,
            "syncs": self.syncs,
            "interval_ms": self.interval_ms,
            "bits_seen": self.bits_seen,
            "sync_ns": self.sync_ns,
            "data_pages": self.data_pages,
            "data_pages_expected": self.data_pages_expected,
            "header_pages": self.header_pages,
            "ring_pages": self.ring_pages,
            "other_pages": self.other_pages,
        })
    }
}
