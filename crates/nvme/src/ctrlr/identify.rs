//! What the driver reads from Identify (Base 2.0 5.17.2.1, Identify Controller; NVM Command
//! Set 1.0 4.1.5.1, Identify Namespace): the fields that decide transfer sizes, supported
//! commands, shadow doorbells, keep-alive and asynchronous events, and each namespace's
//! geometry. The offsets and bits are `fp_nvme_spec::identify`'s (the target writes the same structures).

use fp_nvme_spec::identify::{
    self as id, CMIC_ANA_REPORTING, NSATTR_WRITE_PROTECTED, OACS_DOORBELL_BUFFER_CONFIG, OAES_ANA_CHANGE,
    OAES_NS_ATTRIBUTE, ONCS_DSM, ONCS_WRITE_ZEROES,
};

fn le16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("four bytes"))
}

fn le64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("eight bytes"))
}

/// An ASCII field with its padding (spaces, NULs) cut off.
fn text(b: &[u8], at: usize, len: usize) -> String {
    String::from_utf8_lossy(&b[at..at + len]).trim_end_matches([' ', '\0']).to_string()
}

/// Identify Controller, the fields the driver uses.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct ControllerData {
    /// PCI vendor ID.
    pub vid: u16,
    /// Serial number.
    pub sn: String,
    /// Model number.
    pub mn: String,
    /// Firmware revision.
    pub fr: String,
    /// Maximum Data Transfer Size: 2^MDTS minimum pages (CAP.MPSMIN); 0 no limit.
    pub mdts: u8,
    /// Controller ID.
    pub cntlid: u16,
    /// Version (as VS).
    pub ver: u32,
    /// Optional Asynchronous Events Supported.
    pub oaes: u32,
    /// Optional Admin Command Support.
    pub oacs: u16,
    /// Abort Command Limit (zero-based).
    pub acl: u8,
    /// Asynchronous Event Request Limit (zero-based).
    pub aerl: u8,
    /// Keep Alive Support: granularity in 100 ms units; 0 unsupported.
    pub kas: u16,
    /// Number of Namespaces (the largest NSID).
    pub nn: u32,
    /// Optional NVM Command Support.
    pub oncs: u16,
    /// Volatile Write Cache (bit 0: present).
    pub vwc: u8,
    /// SGL Support.
    pub sgls: u32,
    /// NVM Subsystem NQN.
    pub subnqn: String,
    /// Command Quiesce Time (CQT), in milliseconds: the controller's worst case for quiescing
    /// its commands after a keep-alive timeout or another loss of communication; 0 when not
    /// reported. Multipath waits for it before retrying a lost path's commands elsewhere.
    pub cqt: u16,
    /// Controller Multi-Path I/O and Namespace Sharing Capabilities (bit 3: ANA reporting).
    pub cmic: u8,
    /// ANA Transition Time: the longest a group stays in ANA Change, in seconds.
    pub anatt: u8,
    /// ANA Capabilities: the states the controller reports.
    pub anacap: u8,
    /// Number of ANA Group Identifiers: the most descriptors the ANA log page holds.
    pub nanagrpid: u32,
    /// Maximum Number of Allowed Namespaces (0: not reported).
    pub mnan: u32,
}

/// Identify Controller's CQT (NVMe Base 2.1, Identify Controller data structure, bytes
/// 387:386), kept here until the shared layout names it.
const IDC_CQT: usize = 386;

impl ControllerData {
    /// Parses the 4096-byte structure.
    pub fn parse(b: &[u8]) -> ControllerData {
        assert!(b.len() >= id::IDENTIFY_LEN, "Identify data is 4096 bytes");
        ControllerData {
            vid: le16(b, id::IDC_VID),
            sn: text(b, id::IDC_SN, 20),
            mn: text(b, id::IDC_MN, 40),
            fr: text(b, id::IDC_FR, 8),
            mdts: b[id::IDC_MDTS],
            cntlid: le16(b, id::IDC_CNTLID),
            ver: le32(b, id::IDC_VER),
            oaes: le32(b, id::IDC_OAES),
            oacs: le16(b, id::IDC_OACS),
            acl: b[id::IDC_ACL],
            aerl: b[id::IDC_AERL],
            kas: le16(b, id::IDC_KAS),
            nn: le32(b, id::IDC_NN),
            oncs: le16(b, id::IDC_ONCS),
            vwc: b[id::IDC_VWC],
            sgls: le32(b, id::IDC_SGLS),
            subnqn: text(b, id::IDC_SUBNQN, 256),
            cqt: le16(b, IDC_CQT),
            cmic: b[id::IDC_CMIC],
            anatt: b[id::IDC_ANATT],
            anacap: b[id::IDC_ANACAP],
            nanagrpid: le32(b, id::IDC_NANAGRPID),
            mnan: le32(b, id::IDC_MNAN),
        }
    }

    /// Dataset Management (deallocate) is supported.
    pub fn dsm(&self) -> bool {
        self.oncs & ONCS_DSM != 0
    }

    /// Write Zeroes is supported.
    pub fn write_zeroes(&self) -> bool {
        self.oncs & ONCS_WRITE_ZEROES != 0
    }

    /// A volatile write cache is present (Flush does something).
    pub fn volatile_write_cache(&self) -> bool {
        self.vwc & 1 != 0
    }

    /// Doorbell Buffer Config (shadow doorbells) is supported.
    pub fn doorbell_buffer_config(&self) -> bool {
        self.oacs & OACS_DOORBELL_BUFFER_CONFIG != 0
    }

    /// SGLs are supported for NVM commands (SGLS bits 1:0 non-zero).
    pub fn sgl(&self) -> bool {
        self.sgls & 0b11 != 0
    }

    /// Namespace Attribute Notices (Changed Namespace List events) are supported.
    pub fn namespace_notices(&self) -> bool {
        self.oaes & OAES_NS_ATTRIBUTE != 0
    }

    /// The controller reports Asymmetric Namespace Access (CMIC bit 3): its namespaces' ANA
    /// states are read from the ANA log page.
    pub fn ana_reporting(&self) -> bool {
        self.cmic & CMIC_ANA_REPORTING != 0
    }

    /// ANA Change Notices are supported (OAES bit 11).
    pub fn ana_notices(&self) -> bool {
        self.oaes & OAES_ANA_CHANGE != 0
    }

    /// The transfer limit in bytes for a controller whose smallest page is `page` bytes
    /// (CAP.MPSMIN); `None` when MDTS says no limit.
    pub fn max_transfer(&self, page: u32) -> Option<u32> {
        (self.mdts != 0)
            .then(|| page.saturating_mul(1u32.checked_shl(u32::from(self.mdts)).unwrap_or(u32::MAX)))
    }
}

/// Identify Namespace, the fields the driver uses.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct NamespaceData {
    /// Namespace Size in blocks; 0 when the NSID is not active.
    pub nsze: u64,
    /// Namespace Capacity in blocks.
    pub ncap: u64,
    /// The logical block size of the format in use, in bytes.
    pub block_size: u32,
    /// Metadata bytes per block of the format in use (the driver takes only 0).
    pub metadata_size: u16,
    /// Write protected (NSATTR bit 0).
    pub write_protected: bool,
    /// IEEE Extended Unique Identifier.
    pub eui64: [u8; 8],
    /// Namespace Globally Unique Identifier.
    pub nguid: [u8; 16],
    /// ANA Group Identifier (0: none reported).
    pub anagrpid: u32,
}

impl NamespaceData {
    /// Parses the 4096-byte structure; `None` when the format's block size is not one the
    /// block layer takes (a power of two from 512 to 64 KiB), described in the log.
    pub fn parse(b: &[u8]) -> NamespaceData {
        assert!(b.len() >= id::IDENTIFY_LEN, "Identify data is 4096 bytes");
        let flbas = b[id::IDN_FLBAS];
        // FLBAS bits 3:0 and, above 16 formats, bits 6:5 (NVM 1.0 Figure 97).
        let format = usize::from(flbas & 0xf) | (usize::from((flbas >> 5) & 0x3) << 4);
        let lbaf = le32(b, id::IDN_LBAF0 + 4 * format.min(63));
        let lbads = (lbaf >> 16) & 0xff;
        NamespaceData {
            nsze: le64(b, id::IDN_NSZE),
            ncap: le64(b, id::IDN_NCAP),
            block_size: if (9..=16).contains(&lbads) { 1 << lbads } else { 0 },
            metadata_size: lbaf as u16,
            write_protected: b[id::IDN_NSATTR] & NSATTR_WRITE_PROTECTED != 0,
            eui64: b[id::IDN_EUI64..id::IDN_EUI64 + 8].try_into().expect("eight bytes"),
            nguid: b[id::IDN_NGUID..id::IDN_NGUID + 16].try_into().expect("sixteen bytes"),
            anagrpid: le32(b, id::IDN_ANAGRPID),
        }
    }

    /// Whether the driver can make a bdev of it: active, a block size the block layer takes,
    /// no metadata; otherwise why not.
    pub fn usable(&self) -> Result<(), String> {
        if self.nsze == 0 {
            return Err("not active (size 0)".into());
        }
        if self.block_size == 0 {
            return Err("its LBA format's block size is not a power of two from 512 to 64 KiB".into());
        }
        if self.metadata_size != 0 {
            return Err(format!("its LBA format has {} bytes of metadata per block", self.metadata_size));
        }
        Ok(())
    }
}

/// Parses an Active Namespace ID list (CNS 02h) or a Changed Namespace List log page: NSIDs
/// in increasing order, ended by a zero.
pub fn nsid_list(b: &[u8]) -> Vec<u32> {
    b.chunks_exact(4)
        .map(|c| u32::from_le_bytes(c.try_into().expect("four bytes")))
        .take_while(|&n| n != 0)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controller_and_namespace_fields_parse() {
        let mut c = vec![0u8; 4096];
        c[id::IDC_SN..id::IDC_SN + 4].copy_from_slice(b"SN01");
        c[id::IDC_SN + 4..id::IDC_SN + 20].fill(b' ');
        c[id::IDC_MDTS] = 5;
        c[id::IDC_ONCS] = 0b1100;
        c[id::IDC_VWC] = 1;
        c[id::IDC_OACS + 1] = 1;
        c[386..388].copy_from_slice(&1500u16.to_le_bytes());
        let d = ControllerData::parse(&c);
        assert_eq!(d.sn, "SN01");
        assert_eq!(d.cqt, 1500);
        assert_eq!(d.max_transfer(4096), Some(128 * 1024));
        assert!(d.dsm() && d.write_zeroes() && d.volatile_write_cache() && d.doorbell_buffer_config());
        assert!(!d.sgl());
        assert!(!d.ana_reporting());
        c[id::IDC_CMIC] = id::CMIC_ANA_REPORTING;
        c[id::IDC_ANATT] = 10;
        c[id::IDC_NANAGRPID..id::IDC_NANAGRPID + 4].copy_from_slice(&32u32.to_le_bytes());
        let d = ControllerData::parse(&c);
        assert!(d.ana_reporting());
        assert_eq!((d.anatt, d.nanagrpid), (10, 32));

        let mut n = vec![0u8; 4096];
        n[id::IDN_NSZE..id::IDN_NSZE + 8].copy_from_slice(&1000u64.to_le_bytes());
        n[id::IDN_FLBAS] = 1;
        n[id::IDN_LBAF0 + 4..id::IDN_LBAF0 + 8].copy_from_slice(&(12u32 << 16).to_le_bytes());
        let ns = NamespaceData::parse(&n);
        assert_eq!((ns.nsze, ns.block_size, ns.anagrpid), (1000, 4096, 0));
        n[id::IDN_ANAGRPID] = 3;
        assert_eq!(NamespaceData::parse(&n).anagrpid, 3);
        assert!(ns.usable().is_ok());
        n[id::IDN_LBAF0 + 4] = 8;
        assert!(NamespaceData::parse(&n).usable().is_err());

        let mut l = vec![0u8; 16];
        l[0] = 1;
        l[4] = 3;
        assert_eq!(nsid_list(&l), vec![1, 3]);
    }
}
