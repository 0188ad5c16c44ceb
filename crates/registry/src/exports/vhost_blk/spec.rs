//! What `vhost_create_blk_controller`'s parameters become ([`VhostBlkSpec`]) and their bounds:
//! below the kind and its methods.

/// What to build for `vhost_create_blk_controller`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VhostBlkSpec {
    /// Controller name; the socket is `<vhost_dir>/<ctrlr>`.
    pub ctrlr: String,
    /// The bdev to export.
    pub dev_name: String,
    /// Reactor cores its queues may run on (SPDK's cpumask); `None` means all reactors.
    pub cpus: Option<Vec<usize>>,
    /// Read-only: the bdev is claimed shared (`read_many_write_none`), so several read-only
    /// controllers may serve it; a writable one claims it exclusively.
    pub readonly: bool,
    /// The most queues a frontend may start (GET_QUEUE_NUM, the config space's `num_queues`);
    /// `None` means [`fp_vhost_blk::MAX_QUEUES`], whatever the number of reactors in the mask.
    pub num_queues: Option<u16>,
    /// The export of the same bdev this controller takes over in a live migration within this
    /// daemon (a vhost-blk controller, or the NBD export a mirror writes through); the two
    /// share the bdev and, between controllers, the rule of [`fp_vhost_blk::HandOff`].
    pub migrate_from: Option<String>,
    /// How long stopping one of its queues may take (GET_VRING_BASE, a memory change, a
    /// disconnect); `None` means the kind's option `[vhost] stop_timeout_ms`
    /// ([`VhostBlkKind`](super::VhostBlkKind)'s options).
    pub stop_timeout: Option<std::time::Duration>,
}

/// The longest stop bound a controller accepts (`stop_timeout_ms`): a front-end waiting on
/// GET_VRING_BASE longer than this has given up on us anyway.
pub const MAX_STOP_TIMEOUT_MS: u64 = 600_000;
