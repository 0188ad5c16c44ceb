//! What an emulated controller is made of (namespaces, limits, features offered), the faults
//! it can be told to commit, and the counters it keeps.

/// One namespace of the emulated controller: `num_blocks` blocks of `block_size` bytes, in
/// RAM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EmuNamespace {
    /// Its namespace ID (1-based).
    pub nsid: u32,
    /// Bytes per logical block (a power of two, at least 512).
    pub block_size: u32,
    /// Logical blocks.
    pub num_blocks: u64,
}

/// The emulated controller's make-up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EmuConfig {
    /// Its namespaces (Identify Controller NN is the largest NSID, at least 1).
    pub namespaces: Vec<EmuNamespace>,
    /// MDTS: the largest transfer is 4 KiB << mdts (0: no limit).
    pub mdts: u8,
    /// CAP.MQES + 1: the most entries one queue may have.
    pub max_queue_entries: u16,
    /// Offer Doorbell Buffer Config (OACS bit 8).
    pub shadow_doorbells: bool,
    /// Offer SGLs (SGLS = 01b: any alignment).
    pub sgl: bool,
    /// I/O queue pairs it allows (Number of Queues).
    pub io_queues: u16,
}

impl Default for EmuConfig {
    /// One namespace of 2048 blocks of 512 bytes, 128 KiB transfers, 1024-entry queues,
    /// shadow doorbells and SGLs offered, 16 I/O queue pairs.
    fn default() -> Self {
        EmuConfig {
            namespaces: vec![EmuNamespace { nsid: 1, block_size: 512, num_blocks: 2048 }],
            mdts: 5,
            max_queue_entries: 1024,
            shadow_doorbells: true,
            sgl: true,
            io_queues: 16,
        }
    }
}

/// Something wrong the emulated controller does on purpose, to I/O queues unless said
/// otherwise, from the moment it is set until [`Fault::None`] is set again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Fault {
    /// Behaves.
    None,
    /// Completes commands with a command ID that is not in flight.
    UnknownCid,
    /// Completes each command twice.
    DuplicateCid,
    /// Posts completions with the wrong phase tag (the host never sees them).
    WrongPhase,
    /// Reports an SQ head beyond the tail it was given.
    SqHeadBeyondTail,
    /// Fetches commands and never completes them (Abort still finds them).
    StopAnswering,
    /// Disappears: BAR0 reads all ones from now on, nothing is processed (whole controller).
    Disappear,
    /// Sets CSTS.CFS and stops processing; a reset does not clear it (whole controller).
    FatalStatus,
    /// Leaves I/O queues alone: the fuzz target writes their completions
    /// ([`super::EmulatedController::inject_completion`]).
    Scripted,
}

impl Fault {
    pub(crate) fn from_u8(v: u8) -> Fault {
        const ALL: [Fault; 9] = [
            Fault::None,
            Fault::UnknownCid,
            Fault::DuplicateCid,
            Fault::WrongPhase,
            Fault::SqHeadBeyondTail,
            Fault::StopAnswering,
            Fault::Disappear,
            Fault::FatalStatus,
            Fault::Scripted,
        ];
        ALL.get(v as usize).copied().unwrap_or(Fault::None)
    }
}

/// What the emulated controller counted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EmuCounters {
    /// BAR0 writes of each queue's SQ tail doorbell, by queue ID (0: admin).
    pub sq_doorbells: Vec<u64>,
    /// BAR0 writes of each queue's CQ head doorbell, by queue ID.
    pub cq_doorbells: Vec<u64>,
    /// I/O commands executed (completed or held).
    pub io_commands: u64,
    /// Admin commands executed.
    pub admin_commands: u64,
    /// Keep Alive commands.
    pub keep_alives: u64,
    /// Abort commands that found their command.
    pub aborts: u64,
    /// Successful Doorbell Buffer Config commands.
    pub doorbell_buffer_configs: u64,
    /// Controller enables (CC.EN 0 to 1).
    pub enables: u64,
    /// Completions posted (all queues, injected ones too).
    pub completions: u64,
}
