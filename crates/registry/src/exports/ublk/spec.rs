//! What `ublk_start_disk`'s parameters become ([`UblkStartSpec`]): below the kind and its methods.

/// What `ublk_start_disk` asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UblkStartSpec {
    pub bdev_name: String,
    pub ublk_id: u32,
    pub num_queues: Option<u16>,
    pub queue_depth: Option<u16>,
    /// flashpath's: require (true) or refuse (false) user recovery; by default used when the
    /// kernel offers it.
    pub user_recovery: Option<bool>,
}
