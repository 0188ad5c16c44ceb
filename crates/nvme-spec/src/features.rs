//! Set Features and Get Features (Base 5.27 and 5.15): the feature identifiers and the fields of
//! the commands' dwords 10 and 11.

// Feature identifiers (Base 5.27.1, Figure 317).
/// Arbitration.
pub const FID_ARBITRATION: u8 = 0x01;
/// Power Management.
pub const FID_POWER_MANAGEMENT: u8 = 0x02;
/// Temperature Threshold.
pub const FID_TEMPERATURE_THRESHOLD: u8 = 0x04;
/// Error Recovery.
pub const FID_ERROR_RECOVERY: u8 = 0x05;
/// Volatile Write Cache.
pub const FID_VOLATILE_WRITE_CACHE: u8 = 0x06;
/// Number of Queues.
pub const FID_NUMBER_OF_QUEUES: u8 = 0x07;
/// Asynchronous Event Configuration.
pub const FID_ASYNC_EVENT_CONFIG: u8 = 0x0B;
/// Keep Alive Timer.
pub const FID_KEEP_ALIVE_TIMER: u8 = 0x0F;
/// Host Identifier.
pub const FID_HOST_IDENTIFIER: u8 = 0x81;

/// Set Features dword 10 bit 31: save the value across power cycles.
pub const SET_SV: u32 = 1 << 31;
/// Get Features dword 10 bits 10:8: which value (Base 5.15, Figure 190).
pub const SEL_SHIFT: u32 = 8;
/// SEL 000b: the current value.
pub const SEL_CURRENT: u32 = 0;
/// SEL 001b: the default value.
pub const SEL_DEFAULT: u32 = 1;
/// SEL 010b: the saved value.
pub const SEL_SAVED: u32 = 2;
/// SEL 011b: the supported capabilities, in dword 0.
pub const SEL_SUPPORTED: u32 = 3;
/// Capabilities bit 2: changeable (Base 5.15.1, Figure 193).
pub const CAP_CHANGEABLE: u32 = 1 << 2;
/// Capabilities bit 1: namespace specific.
pub const CAP_NAMESPACE_SPECIFIC: u32 = 1 << 1;
/// Temperature Threshold dword 11 TMPSEL (bits 19:16) 0: the composite temperature.
pub const TMPSEL_COMPOSITE: u32 = 0x0;
/// TMPSEL Fh: all temperature sensors.
pub const TMPSEL_ALL: u32 = 0xF;
/// Error Recovery dword 11 bit 16: DULBE, deallocated or unwritten logical block errors.
pub const ERROR_RECOVERY_DULBE: u32 = 1 << 16;
/// Host Identifier dword 11 bit 0: EXHID, the 128-bit identifier fabrics use.
pub const HOST_ID_EXHID: u32 = 1 << 0;
