//! Opcodes: the admin commands (Base 5), the fabrics commands (Fabrics 6) and the NVM command
//! set's I/O commands (NVM 3).

// Admin command opcodes (Base 5, Figure 138).
/// Delete I/O Submission Queue (Base 5.7).
pub const ADMIN_DELETE_IO_SQ: u8 = 0x00;
/// Create I/O Submission Queue (Base 5.5).
pub const ADMIN_CREATE_IO_SQ: u8 = 0x01;
/// Get Log Page (Base 5.16).
pub const ADMIN_GET_LOG_PAGE: u8 = 0x02;
/// Delete I/O Completion Queue (Base 5.6).
pub const ADMIN_DELETE_IO_CQ: u8 = 0x04;
/// Create I/O Completion Queue (Base 5.4).
pub const ADMIN_CREATE_IO_CQ: u8 = 0x05;
/// Identify (Base 5.17).
pub const ADMIN_IDENTIFY: u8 = 0x06;
/// Abort (Base 5.1).
pub const ADMIN_ABORT: u8 = 0x08;
/// Set Features (Base 5.27).
pub const ADMIN_SET_FEATURES: u8 = 0x09;
/// Get Features (Base 5.15).
pub const ADMIN_GET_FEATURES: u8 = 0x0A;
/// Asynchronous Event Request (Base 5.2).
pub const ADMIN_ASYNC_EVENT_REQUEST: u8 = 0x0C;
/// Keep Alive (Base 5.25).
pub const ADMIN_KEEP_ALIVE: u8 = 0x18;
/// Doorbell Buffer Config (shadow doorbells, Base 5.8).
pub const ADMIN_DOORBELL_BUFFER_CONFIG: u8 = 0x7C;

/// The fabrics command opcode (Fabrics 6.1); [`crate::Sqe::fctype`] says which one.
pub const OPC_FABRICS: u8 = 0x7F;
// Fabrics command types (Fabrics 6, Figure 16).
/// Property Set (Fabrics 3.5).
pub const FCTYPE_PROPERTY_SET: u8 = 0x00;
/// Connect (Fabrics 3.3).
pub const FCTYPE_CONNECT: u8 = 0x01;
/// Property Get (Fabrics 3.6).
pub const FCTYPE_PROPERTY_GET: u8 = 0x04;
/// Authentication Send.
pub const FCTYPE_AUTHENTICATION_SEND: u8 = 0x05;
/// Authentication Receive.
pub const FCTYPE_AUTHENTICATION_RECEIVE: u8 = 0x06;
/// Disconnect.
pub const FCTYPE_DISCONNECT: u8 = 0x08;

// NVM command set I/O opcodes (NVM 3, Figure 18).
/// Flush (Base 7.1).
pub const NVM_FLUSH: u8 = 0x00;
/// Write (NVM 3.2.6).
pub const NVM_WRITE: u8 = 0x01;
/// Read (NVM 3.2.4).
pub const NVM_READ: u8 = 0x02;
/// Write Zeroes (NVM 3.2.8).
pub const NVM_WRITE_ZEROES: u8 = 0x08;
/// Dataset Management (NVM 3.2.3).
pub const NVM_DATASET_MANAGEMENT: u8 = 0x09;
