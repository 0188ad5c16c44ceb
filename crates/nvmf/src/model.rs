//! Plain descriptions of what a controller reports about its subsystem: the namespaces with
//! their geometry and identifiers, and for the discovery subsystem the log's entries. The
//! control plane builds a [`SubsystemView`] whenever a subsystem changes; a controller answers
//! Identify and Get Log Page from the one it is given, and never reaches into the bdevs.

pub use fp_nvme_spec::log_page::AnaState;

/// One namespace as the host sees it (Identify Namespace, Base 5.17.2.1 and the NVM Command
/// Set's Figure 97; the descriptors of Base 5.17.2.3).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamespaceInfo {
    /// 1-based, unique in its subsystem.
    pub nsid: u32,
    /// The logical block size in bytes (a power of two, 512 or more).
    pub block_size: u32,
    /// The size in logical blocks (NSZE = NCAP = NUSE).
    pub num_blocks: u64,
    pub uuid: [u8; 16],
    pub nguid: [u8; 16],
    pub eui64: [u8; 8],
    /// Writes fail with "namespace is write protected".
    pub read_only: bool,
    /// The bdev has a volatile cache: Flush means something (VWC in Identify Controller is the
    /// OR over namespaces).
    pub volatile_cache: bool,
    /// The bdev can deallocate (Dataset Management with AD; ONCS bit 2).
    pub deallocate: bool,
    /// The bdev writes zeroes without a data buffer (ONCS bit 3).
    pub write_zeroes: bool,
    /// Its ANA group (ANAGRPID in Identify Namespace, when the subsystem reports ANA).
    pub anagrpid: u32,
}

/// The ANA states of one listener's controllers, one per ANA group (Base 8.1.3): the
/// controllers whose queues came in on it report these.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AnaStates {
    /// Bumped on every change (the ANA log page's Change Count).
    pub change_count: u64,
    /// Group `g`'s state at index `g - 1`, one per possible group (ANAGRPMAX).
    pub states: Vec<AnaState>,
}

impl AnaStates {
    /// `groups` groups, each in `state`.
    pub fn new(groups: u32, state: AnaState) -> AnaStates {
        AnaStates { change_count: 0, states: vec![state; groups as usize] }
    }

    /// Group `grpid`'s state; a group past ANAGRPMAX (there is none) reads optimized.
    pub fn get(&self, grpid: u32) -> AnaState {
        grpid.checked_sub(1).and_then(|i| self.states.get(i as usize)).copied().unwrap_or(AnaState::Optimized)
    }
}

/// What a subsystem is (Base 4.5, Fabrics 5).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SubsystemKind {
    /// An NVM subsystem with namespaces.
    Nvme,
    /// The discovery subsystem: its controllers only serve the discovery log page.
    Discovery,
}

/// One entry of the discovery log page (Fabrics 5.3, Figure 38): a subsystem reachable at one
/// listener.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiscoveryEntry {
    /// 1 = IPv4, 2 = IPv6 (ADRFAM).
    pub adrfam: u8,
    /// 1 = a referral to another discovery service, 2 = an NVM subsystem, 3 = the current
    /// discovery subsystem (SUBTYPE).
    pub subtype: u8,
    /// The listener's port ID (PORTID).
    pub port_id: u16,
    pub traddr: String,
    pub trsvcid: String,
    pub subnqn: String,
}

/// A subsystem as its controllers describe it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubsystemView {
    pub kind: SubsystemKind,
    pub nqn: String,
    /// Serial number (SN, at most 20 ASCII characters).
    pub serial: String,
    /// Model number (MN, at most 40 ASCII characters).
    pub model: String,
    /// The largest namespace ID it may hold (NN in Identify Controller).
    pub max_namespaces: u32,
    /// Its namespaces in NSID order.
    pub namespaces: Vec<NamespaceInfo>,
    /// For [`SubsystemKind::Discovery`]: the discovery log's entries in the order reported.
    pub discovery_log: Vec<DiscoveryEntry>,
    /// Bumped on every change to `discovery_log` (GENCTR).
    pub generation: u64,
    /// The subsystem reports ANA (CMIC bit 3, the ANA log page, its notices).
    pub ana_reporting: bool,
    /// The ANA states of the listener the controller's queues came in on (empty in the
    /// subsystem-wide view).
    pub ana: AnaStates,
}

impl SubsystemView {
    /// The namespace with ID `nsid`, if it is attached.
    pub fn namespace(&self, nsid: u32) -> Option<&NamespaceInfo> {
        self.namespaces.binary_search_by_key(&nsid, |n| n.nsid).ok().map(|i| &self.namespaces[i])
    }
}

/// What a controller is set up with at Connect (admin queue, Fabrics 3.3).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControllerConfig {
    pub cntlid: u16,
    pub kind: SubsystemKind,
    pub subnqn: String,
    pub hostnqn: String,
    pub hostid: [u8; 16],
    /// I/O queue depth (the transport's max_queue_depth); CAP.MQES = this - 1.
    pub max_queue_entries: u32,
    /// The transport's max_aq_depth (ASQSZ in the discovery log).
    pub max_admin_queue_entries: u32,
    /// The transport's max_io_qpairs_per_ctrlr.
    pub max_io_queues: u16,
    /// IOCCSZ = (64 + this) / 16.
    pub in_capsule_data_size: u32,
    /// MDTS, in 4 KiB pages as a power of two (rounded down, at least 8 KiB).
    pub max_transfer_bytes: u32,
    /// Connect's KATO; 0 = no keep-alive timer.
    pub kato_ms: u32,
}
