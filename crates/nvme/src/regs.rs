//! Controller registers (NVMe Base 2.0, 3.1.4, Figure 33), the offsets both BAR0 (PCIe) and the
//! Fabrics properties (TCP) use, and the fields the driver reads or writes.

/// Controller Capabilities, 8 bytes.
pub const CAP: u32 = 0x00;
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
    cap & (1 << 37) != 0
}

/// CC.EN: enable.
pub const CC_EN: u32 = 1;
/// CC.CSS = 000b (NVM command set), CC.MPS = 0 (4 KiB pages), CC.AMS = round robin.
pub const CC_CSS_NVM: u32 = 0;
/// CC.SHN = 01b: normal shutdown (bits 15:14).
pub const CC_SHN_NORMAL: u32 = 1 << 14;
/// CC.SHN mask.
pub const CC_SHN_MASK: u32 = 3 << 14;
/// CC.IOSQES = 6 (64-byte entries, bits 19:16) and CC.IOCQES = 4 (16-byte entries, bits
/// 23:20).
pub const CC_IOQES: u32 = (6 << 16) | (4 << 20);

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
