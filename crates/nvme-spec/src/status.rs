//! A completion's status (Base 4.6.1): the status code type, the status code and Do Not Retry,
//! and the codes both sides use.

/// A completion's status field without its phase bit (Base 4.6.1, Figure 93): status code
/// type, status code, and Do Not Retry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Status {
    /// Status Code Type ([`SCT_GENERIC`], ...).
    pub sct: u8,
    /// Status Code, read against its type.
    pub sc: u8,
    /// Do Not Retry: the same command would fail again.
    pub dnr: bool,
}

impl Status {
    /// Success, with Do Not Retry cleared: a host reads any nonzero status field of an admin
    /// command as a failure (Linux's `__nvme_submit_sync_cmd` returns it as the error).
    pub const SUCCESS: Status = Status { sct: SCT_GENERIC, sc: 0x00, dnr: false };

    /// A generic command status (SCT 0) that the host should not retry.
    #[inline]
    pub const fn generic(sc: u8) -> Status {
        Status { sct: SCT_GENERIC, sc, dnr: true }
    }

    /// A command-specific status (SCT 1) that the host should not retry.
    #[inline]
    pub const fn command_specific(sc: u8) -> Status {
        Status { sct: SCT_COMMAND_SPECIFIC, sc, dnr: true }
    }

    /// A media or data integrity error (SCT 2).
    #[inline]
    pub const fn media(sc: u8) -> Status {
        Status { sct: SCT_MEDIA, sc, dnr: false }
    }

    /// The same status with Do Not Retry cleared: the host may try again.
    #[inline]
    pub const fn retryable(self) -> Status {
        Status { dnr: false, ..self }
    }

    /// Generic status 0: the command succeeded.
    #[inline]
    pub fn is_success(&self) -> bool {
        self.sct == SCT_GENERIC && self.sc == 0
    }

    /// The 15 bits above the phase bit.
    #[inline]
    pub fn field(&self) -> u16 {
        (u16::from(self.sc) << 1) | (u16::from(self.sct & 0x7) << 9) | (u16::from(self.dnr) << 15)
    }

    /// The status in a completion's bits 31:16 of dword 3 (`field`), whose bit 0 is the phase
    /// tag (ignored). CRD and More (bits 12:11 and 13 of the field) are not kept.
    #[inline]
    pub fn from_field(field: u16) -> Status {
        Status { sc: (field >> 1) as u8, sct: ((field >> 9) & 0x7) as u8, dnr: field & (1 << 15) != 0 }
    }
}

// Status code types (Base 4.6.1.2, Figure 94).
/// Generic command status.
pub const SCT_GENERIC: u8 = 0x0;
/// Command specific status.
pub const SCT_COMMAND_SPECIFIC: u8 = 0x1;
/// Media and data integrity errors.
pub const SCT_MEDIA: u8 = 0x2;
/// Path related status.
pub const SCT_PATH: u8 = 0x3;

// Generic command status (Base 4.6.1.2.1, Figure 95).
/// Invalid Command Opcode.
pub const SC_INVALID_OPCODE: u8 = 0x01;
/// Invalid Field in Command.
pub const SC_INVALID_FIELD: u8 = 0x02;
/// Data Transfer Error.
pub const SC_DATA_TRANSFER_ERROR: u8 = 0x04;
/// Internal Error.
pub const SC_INTERNAL_ERROR: u8 = 0x06;
/// Command Abort Requested.
pub const SC_ABORT_REQUESTED: u8 = 0x07;
/// Command Aborted due to SQ Deletion.
pub const SC_ABORTED_SQ_DELETION: u8 = 0x08;
/// Invalid Namespace or Format.
pub const SC_INVALID_NAMESPACE: u8 = 0x0B;
/// Command Sequence Error.
pub const SC_COMMAND_SEQUENCE_ERROR: u8 = 0x0C;
/// Data SGL Length Invalid.
pub const SC_SGL_DATA_LENGTH_INVALID: u8 = 0x0F;
/// SGL Descriptor Type Invalid.
pub const SC_SGL_DESCRIPTOR_TYPE_INVALID: u8 = 0x11;
/// SGL Offset Invalid.
pub const SC_SGL_OFFSET_INVALID: u8 = 0x16;
/// Namespace is Write Protected.
pub const SC_NAMESPACE_WRITE_PROTECTED: u8 = 0x20;
/// Command Interrupted.
pub const SC_COMMAND_INTERRUPTED: u8 = 0x21;
/// Transient Transport Error.
pub const SC_TRANSIENT_TRANSPORT_ERROR: u8 = 0x22;
// Generic command status, NVM command set (Base 4.6.1.2.1, Figure 96).
/// LBA Out of Range.
pub const SC_LBA_OUT_OF_RANGE: u8 = 0x80;
/// Capacity Exceeded.
pub const SC_CAPACITY_EXCEEDED: u8 = 0x81;
/// Namespace Not Ready.
pub const SC_NAMESPACE_NOT_READY: u8 = 0x82;

// Command specific status (Base 4.6.1.2.2, Figure 97; Fabrics 3.4 Figure 8 for Connect).
/// Completion Queue Invalid (Create I/O Submission Queue).
pub const SC_COMPLETION_QUEUE_INVALID: u8 = 0x00;
/// Invalid Queue Identifier.
pub const SC_INVALID_QUEUE_IDENTIFIER: u8 = 0x01;
/// Invalid Queue Size.
pub const SC_INVALID_QUEUE_SIZE: u8 = 0x02;
/// Asynchronous Event Request Limit Exceeded.
pub const SC_ASYNC_EVENT_LIMIT_EXCEEDED: u8 = 0x05;
/// Invalid Log Page.
pub const SC_INVALID_LOG_PAGE: u8 = 0x09;
/// Invalid Queue Deletion (Delete I/O Completion Queue of a queue still in use).
pub const SC_INVALID_QUEUE_DELETION: u8 = 0x0C;
/// Feature Identifier Not Saveable.
pub const SC_FEATURE_NOT_SAVEABLE: u8 = 0x0D;
/// Feature Not Changeable.
pub const SC_FEATURE_NOT_CHANGEABLE: u8 = 0x0E;
/// Connect: Incompatible Format.
pub const SC_CONNECT_INCOMPATIBLE_FORMAT: u8 = 0x80;
/// Connect: Controller Busy.
pub const SC_CONNECT_CONTROLLER_BUSY: u8 = 0x81;
/// Connect: Invalid Parameters (dword 0 names the field, [`crate::fabrics::ConnectRefusal`]).
pub const SC_CONNECT_INVALID_PARAMETERS: u8 = 0x82;
/// Connect: Restart Discovery.
pub const SC_CONNECT_RESTART_DISCOVERY: u8 = 0x83;
/// Connect: Invalid Host.
pub const SC_CONNECT_INVALID_HOST: u8 = 0x84;

// Media and data integrity errors (Base 4.6.1.2.3, Figure 100).
/// Write Fault.
pub const SC_WRITE_FAULT: u8 = 0x80;
/// Unrecovered Read Error.
pub const SC_UNRECOVERED_READ_ERROR: u8 = 0x81;
/// Access Denied.
pub const SC_ACCESS_DENIED: u8 = 0x86;

// Path related status (Base 4.6.1.2.4, Figure 101).
/// Internal Path Error.
pub const SC_INTERNAL_PATH_ERROR: u8 = 0x00;
/// Asymmetric Access Persistent Loss: the namespace's ANA group is in Persistent Loss.
pub const SC_ANA_PERSISTENT_LOSS: u8 = 0x01;
/// Asymmetric Access Inaccessible: the namespace's ANA group is Inaccessible.
pub const SC_ANA_INACCESSIBLE: u8 = 0x02;
/// Asymmetric Access Transition: the namespace's ANA group is changing state.
pub const SC_ANA_TRANSITION: u8 = 0x03;
