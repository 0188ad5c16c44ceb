//! The controller's properties as Property Get / Property Set reach them (Fabrics 3.5 and 6.5,
//! Base 3.1.3 Figure 33): CAP, VS, CC and CSTS. On a fabric these replace the PCIe registers;
//! the admin queue's base and size properties (AQA, ASQ, ACQ) are reserved (Fabrics 3.5), so
//! only the four the host's bring-up and shutdown use exist here.

use fp_nvme_spec::fabrics::PropertyAccess;
use fp_nvme_spec::registers::*;

/// Optional capabilities this controller lacks, read as 0 ("not supported") rather than
/// refused, because SPDK's host reads them to print them.
const PROPS_ABSENT: [u32; 4] = [CMBLOC, CMBSZ, BPINFO, PMRCAP];

/// The version the controller reports: NVMe 1.3.0. Linux (drivers/nvme/host) reads the
/// namespace descriptor list (CNS 03h) and the subsystem NQN from Identify from 1.2.1 / 1.3 on,
/// and SPDK's host accepts any 1.x; 1.3 claims nothing (CNS 05h+, command set profiles, TBKAS)
/// that 2.0 would oblige the controller to answer and this one does not.
pub const VERSION_1_3: u32 = 0x0001_0300;

/// CAP.TO in 500 ms units: enabling and shutting down complete within the Property Set, so the
/// host never waits; 1 s only leaves room for a slow admin queue. CAP.MPSMIN (bits 51:48) and
/// CAP.MPSMAX (55:52) are both 0: memory pages of 4 KiB only.
const CAP_TO_500MS: u64 = 2;

/// What a Property Set did, beyond storing the value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PropertyEffect {
    None,
    /// CC.EN went from 1 to 0: a controller reset (Base 3.7.2).
    Reset,
    /// CC.EN went from 0 to 1 and the controller is ready.
    Enabled,
    /// CC.SHN asked for a shutdown, which is complete (CSTS.SHST = 10b).
    Shutdown,
}

/// Why a Property Get or Set is refused (answered with Invalid Field in Command).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PropertyError {
    #[error("no property at offset {0:#x} with that size")]
    Unknown(u32),
    #[error("property at offset {0:#x} is read only")]
    ReadOnly(u32),
    #[error("controller configuration {0:#x} asks for what the controller does not do")]
    BadConfiguration(u32),
}

/// CAP, VS, CC and CSTS of one controller.
#[derive(Debug, Clone)]
pub struct Properties {
    cap: u64,
    cc: u32,
    csts: u32,
    /// A discovery controller has no I/O queues, so CC's queue entry sizes may stay 0.
    io_queues: bool,
}

impl Properties {
    /// `max_queue_entries` is the largest I/O queue (CAP.MQES is zero-based).
    pub fn new(max_queue_entries: u32, io_queues: bool) -> Properties {
        let mqes = u64::from(max_queue_entries.clamp(2, 0x1_0000) - 1);
        let cap = mqes | CAP_CQR | (CAP_TO_500MS << CAP_TO_SHIFT) | CAP_CSS_NVM;
        Properties { cap, cc: 0, csts: 0, io_queues }
    }

    pub fn cap(&self) -> u64 {
        self.cap
    }

    pub fn cc(&self) -> u32 {
        self.cc
    }

    pub fn csts(&self) -> u32 {
        self.csts
    }

    /// CC.EN = 1: the controller takes admin commands beyond the fabrics ones.
    pub fn enabled(&self) -> bool {
        self.cc & CC_EN != 0
    }

    /// CC.EN = 1 and CSTS.RDY = 1, and no shutdown asked for.
    pub fn ready(&self) -> bool {
        self.cc & CC_EN != 0 && self.csts & CSTS_RDY != 0 && self.cc & CC_SHN_MASK == 0
    }

    /// Property Get: the value (the high half is zero for 4-byte properties).
    pub fn get(&self, access: &PropertyAccess) -> Result<u64, PropertyError> {
        match (access.offset, access.eight_bytes) {
            (CAP, true) => Ok(self.cap),
            // CAP's halves read as two 4-byte properties, as a PCIe host would read them.
            (CAP, false) => Ok(self.cap & 0xFFFF_FFFF),
            (CAP_HIGH, false) => Ok(self.cap >> 32),
            (VS, false) => Ok(u64::from(VERSION_1_3)),
            (CC, false) => Ok(u64::from(self.cc)),
            (CSTS, false) => Ok(u64::from(self.csts)),
            (offset, false) if PROPS_ABSENT.contains(&offset) => Ok(0),
            (offset, _) => Err(PropertyError::Unknown(offset)),
        }
    }

    /// Property Set: CC is the only writable property (Base 3.1.3 Figure 33; NSSR is absent,
    /// CAP.NSSRS = 0).
    pub fn set(&mut self, access: &PropertyAccess) -> Result<PropertyEffect, PropertyError> {
        match (access.offset, access.eight_bytes) {
            (CC, false) => self.set_cc(access.value as u32),
            (CAP | CAP_HIGH | VS | CSTS, _) => Err(PropertyError::ReadOnly(access.offset)),
            (offset, _) => Err(PropertyError::Unknown(offset)),
        }
    }

    fn set_cc(&mut self, new: u32) -> Result<PropertyEffect, PropertyError> {
        let was_enabled = self.cc & CC_EN != 0;
        let enable = new & CC_EN != 0;
        let shn = new & CC_SHN_MASK;
        if enable && !was_enabled {
            self.check_enable(new)?;
        }
        self.cc = new;
        if was_enabled && !enable {
            // A reset clears CSTS (RDY and SHST) (Base 3.7.2).
            self.csts = 0;
            return Ok(PropertyEffect::Reset);
        }
        if shn != 0 && enable {
            // Nothing is cached here: the bdevs complete what they acknowledged, so the
            // shutdown is complete as soon as it is asked for (Base 3.6.2).
            self.csts = (self.csts & !CSTS_SHST_MASK) | CSTS_SHST_COMPLETE;
            return Ok(PropertyEffect::Shutdown);
        }
        if enable && !was_enabled {
            self.csts = CSTS_RDY;
            return Ok(PropertyEffect::Enabled);
        }
        Ok(PropertyEffect::None)
    }

    /// What CC must say when EN goes to 1 (Base 3.1.3.5): the NVM command set, 4 KiB pages,
    /// round robin arbitration, and for controllers with I/O queues 64- and 16-byte entries.
    fn check_enable(&self, cc: u32) -> Result<(), PropertyError> {
        let css = (cc >> CC_CSS_SHIFT) & 0x7;
        let mps = (cc >> CC_MPS_SHIFT) & 0xF;
        let ams = (cc >> CC_AMS_SHIFT) & 0x7;
        let iosqes = (cc >> CC_IOSQES_SHIFT) & 0xF;
        let iocqes = (cc >> CC_IOCQES_SHIFT) & 0xF;
        let entries_ok = if self.io_queues {
            iosqes == IOSQES && iocqes == IOCQES
        } else {
            matches!(iosqes, 0 | IOSQES) && matches!(iocqes, 0 | IOCQES)
        };
        if css != 0 || mps != 0 || ams != 0 || !entries_ok {
            return Err(PropertyError::BadConfiguration(cc));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CC_ENABLE_LINUX: u32 = CC_EN | (IOSQES << CC_IOSQES_SHIFT) | (IOCQES << CC_IOCQES_SHIFT);

    fn access(offset: u32, eight_bytes: bool, value: u64) -> PropertyAccess {
        PropertyAccess { eight_bytes, offset, value }
    }

    #[test]
    fn cap_fields_per_figure_36() {
        let p = Properties::new(128, true);
        let cap = p.get(&access(CAP, true, 0)).unwrap();
        assert_eq!(cap & 0xFFFF, 127, "MQES is zero-based");
        assert_eq!((cap >> 16) & 1, 1, "CQR");
        assert_eq!((cap >> 24) & 0xFF, 2, "TO");
        assert_eq!((cap >> 37) & 0xFF, 1, "CSS: NVM only");
        assert_eq!((cap >> 48) & 0xFF, 0, "MPSMIN = MPSMAX = 4 KiB");
        assert_eq!(p.get(&access(CAP, false, 0)).unwrap(), cap & 0xFFFF_FFFF);
        assert_eq!(p.get(&access(0x04, false, 0)).unwrap(), cap >> 32);
        assert_eq!(p.get(&access(VS, false, 0)).unwrap(), 0x0001_0300);
        assert_eq!(p.get(&access(VS, true, 0)), Err(PropertyError::Unknown(VS)));
        assert_eq!(p.get(&access(0x24, false, 0)), Err(PropertyError::Unknown(0x24)), "AQA is reserved");
        assert_eq!(p.get(&access(0x3C, false, 0)), Ok(0), "no controller memory buffer");
        assert_eq!(p.get(&access(0xE00, false, 0)), Ok(0), "no persistent memory region");
    }

    #[test]
    fn enable_then_shutdown_then_reset() {
        let mut p = Properties::new(128, true);
        assert!(!p.ready());
        assert_eq!(p.set(&access(CC, false, u64::from(CC_ENABLE_LINUX))), Ok(PropertyEffect::Enabled));
        assert!(p.ready());
        assert_eq!(p.get(&access(CSTS, false, 0)).unwrap(), 1);
        let shn_normal = CC_ENABLE_LINUX | (0b01 << CC_SHN_SHIFT);
        assert_eq!(p.set(&access(CC, false, u64::from(shn_normal))), Ok(PropertyEffect::Shutdown));
        assert_eq!((p.csts() >> 2) & 3, 0b10, "SHST complete");
        assert!(!p.ready());
        assert_eq!(p.set(&access(CC, false, 0)), Ok(PropertyEffect::Reset));
        assert_eq!(p.csts(), 0);
    }

    #[test]
    fn enable_checks_entry_sizes_and_page_size() {
        let mut p = Properties::new(128, true);
        let bad_sqes = CC_EN | (7 << CC_IOSQES_SHIFT) | (IOCQES << CC_IOCQES_SHIFT);
        assert!(matches!(
            p.set(&access(CC, false, u64::from(bad_sqes))),
            Err(PropertyError::BadConfiguration(_))
        ));
        assert!(p.set(&access(CC, false, u64::from(CC_EN))).is_err(), "I/O controller needs sizes");
        let bad_mps = CC_ENABLE_LINUX | (1 << CC_MPS_SHIFT);
        assert!(p.set(&access(CC, false, u64::from(bad_mps))).is_err());
        assert!(!p.ready());
        // A discovery controller may leave the I/O entry sizes at 0.
        let mut d = Properties::new(128, false);
        assert_eq!(d.set(&access(CC, false, u64::from(CC_EN))), Ok(PropertyEffect::Enabled));
    }

    #[test]
    fn read_only_properties_refuse_writes() {
        let mut p = Properties::new(32, true);
        assert_eq!(p.set(&access(CAP, true, 0)), Err(PropertyError::ReadOnly(CAP)));
        assert_eq!(p.set(&access(CSTS, false, 1)), Err(PropertyError::ReadOnly(CSTS)));
        assert_eq!(p.set(&access(0x40, false, 1)), Err(PropertyError::Unknown(0x40)));
    }
}
