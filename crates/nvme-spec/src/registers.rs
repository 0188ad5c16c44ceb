//! Controller registers (Base 3.1.4, Figure 33): the offsets both BAR0 (PCIe) and the fabrics
//! properties (Property Get / Set, Fabrics 3.5 and 3.6) use, and the fields of CAP, CC and CSTS
//! that the host driver and the target read or write.

/// Controller Capabilities, 8 bytes.
pub const CAP: u32 = 0x00;
/// The high half of CAP, as a 4-byte read sees it.
pub const CAP_HIGH: u32 = 0x04;
/// Version, 4 bytes.
pub const VS: u32 = 0x08;
/// Interrupt Mask Set (PCIe only).
pub const INTMS: u32 = 0x0C;
/// Interrupt Mask Clear (PCIe only).
pub const INTMC: u32 = 0x10;
/// Controller Configuration, 4 bytes.
pub const CC: u32 = 0x14;
/// Controller Status, 4 bytes.
pub const CSTS: u32 = 0x1C;
/// Admin Queue Attributes (PCIe only): queue sizes minus one, SQ in 11:0, CQ in 27:16.
pub const AQA: u32 = 0x24;
/// Admin Submission Queue base address (PCIe only), 8 bytes.
pub const ASQ: u32 = 0x28;
/// Admin Completion Queue base address (PCIe only), 8 bytes.
pub const ACQ: u32 = 0x30;
/// Controller Memory Buffer Location (optional).
pub const CMBLOC: u32 = 0x38;
/// Controller Memory Buffer Size (optional).
pub const CMBSZ: u32 = 0x3C;
/// Boot Partition Information (optional).
pub const BPINFO: u32 = 0x40;
/// Persistent Memory Region Capabilities (optional).
pub const PMRCAP: u32 = 0xE00;
/// The first doorbell (PCIe only): SQ y tail at `DOORBELLS + (2y) * stride`, CQ y head at
/// `DOORBELLS + (2y + 1) * stride`, stride = 4 << CAP.DSTRD (Base 3.1.4.22).
pub const DOORBELLS: u32 = 0x1000;

/// CAP.MQES: maximum queue entries supported, minus one (bits 15:0).
pub fn cap_mqes(cap: u64) -> u16 {
    cap as u16
}
/// CAP.DSTRD: doorbell stride exponent (bits 35:32).
pub fn cap_dstrd(cap: u64) -> u32 {
    ((cap >> 32) & 0xf) as u32
}
/// CAP.MPSMIN: minimum memory page size, as 2^(12 + MPSMIN) (bits 51:48).
pub fn cap_mpsmin(cap: u64) -> u32 {
    ((cap >> 48) & 0xf) as u32
}
/// CAP.CSS bit 0: the NVM command set is supported (bits 44:37).
pub fn cap_css_nvm(cap: u64) -> bool {
    cap & CAP_CSS_NVM != 0
}
/// CAP.CQR: contiguous queues required (bit 16; Base 3.1.4.1, Figure 36).
pub const CAP_CQR: u64 = 1 << 16;
/// CAP.TO: worst-case time to ready, in 500 ms units (bits 31:24).
pub const CAP_TO_SHIFT: u32 = 24;
/// CAP.CSS bit 37: the NVM command set.
pub const CAP_CSS_NVM: u64 = 1 << 37;

// CC fields (Base 3.1.4.5, Figure 46).
/// CC.EN: enable.
pub const CC_EN: u32 = 1;
/// CC.CSS (bits 6:4): the I/O command set.
pub const CC_CSS_SHIFT: u32 = 4;
/// CC.MPS (bits 10:7): the memory page size as 2^(12 + MPS).
pub const CC_MPS_SHIFT: u32 = 7;
/// CC.AMS (bits 13:11): the arbitration mechanism.
pub const CC_AMS_SHIFT: u32 = 11;
/// CC.SHN (bits 15:14): shutdown notification.
pub const CC_SHN_SHIFT: u32 = 14;
/// CC.IOSQES (bits 19:16): the I/O submission queue entry size as a power of two.
pub const CC_IOSQES_SHIFT: u32 = 16;
/// CC.IOCQES (bits 23:20): the I/O completion queue entry size as a power of two.
pub const CC_IOCQES_SHIFT: u32 = 20;
/// CC.CSS = 000b (NVM command set), CC.MPS = 0 (4 KiB pages), CC.AMS = round robin.
pub const CC_CSS_NVM: u32 = 0;
/// CC.SHN = 01b: normal shutdown (bits 15:14).
pub const CC_SHN_NORMAL: u32 = 1 << CC_SHN_SHIFT;
/// CC.SHN mask.
pub const CC_SHN_MASK: u32 = 3 << CC_SHN_SHIFT;
/// The I/O submission queue entry size as a power of two: 64 bytes (SQES in Identify).
pub const IOSQES: u32 = 6;
/// The I/O completion queue entry size as a power of two: 16 bytes (CQES in Identify).
pub const IOCQES: u32 = 4;
/// CC.IOSQES = 6 (64-byte entries) and CC.IOCQES = 4 (16-byte entries).
pub const CC_IOQES: u32 = (IOSQES << CC_IOSQES_SHIFT) | (IOCQES << CC_IOCQES_SHIFT);

// CSTS fields (Base 3.1.4.6, Figure 47).
/// CSTS.RDY: ready.
pub const CSTS_RDY: u32 = 1;
/// CSTS.CFS: controller fatal status.
pub const CSTS_CFS: u32 = 1 << 1;
/// CSTS.SHST: shutdown status (bits 3:2); 10b is complete.
pub const CSTS_SHST_MASK: u32 = 3 << 2;
/// CSTS.SHST = 10b: shutdown processing complete.
pub const CSTS_SHST_COMPLETE: u32 = 2 << 2;

/// A register read that returns all ones: the device is gone (a PCIe read of a removed
/// function completes with all bits set).
pub fn is_gone(value: u32) -> bool {
    value == u32::MAX
}
