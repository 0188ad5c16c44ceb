//! Identify (Base 5.17): the CNS values, and the offsets and bits of the data structures both
//! sides read or write: Identify Controller (Base 5.17.2.1, Figure 275; the fabrics fields at
//! 1792.. are Fabrics 4.1 Figure 28), Identify Namespace (NVM 4.1.5.1, Figure 97), the Active
//! Namespace ID list and the Namespace Identification Descriptors. Every offset is named after
//! its field, so a test can check each against the figure it comes from.

/// Every Identify data structure is 4096 bytes (Base 5.17).
pub const IDENTIFY_LEN: usize = 4096;

// CNS values (Base 5.17.1, Figure 273).
/// Identify Namespace.
pub const CNS_NAMESPACE: u8 = 0x00;
/// Identify Controller.
pub const CNS_CONTROLLER: u8 = 0x01;
/// Active Namespace ID list.
pub const CNS_ACTIVE_NS_LIST: u8 = 0x02;
/// Namespace Identification Descriptor list.
pub const CNS_NS_DESCRIPTORS: u8 = 0x03;
/// The I/O Command Set specific Identify Controller data structure (Base 5.17.2.6): Linux asks
/// for the NVM command set's (CSI 0) of any controller reporting version 1.2 or later.
pub const CNS_IO_COMMAND_SET_CONTROLLER: u8 = 0x06;
/// Command Set Identifier 0: the NVM command set (dword 11 bits 31:24).
pub const CSI_NVM: u8 = 0x00;

// Identify Controller data structure offsets (Base 5.17.2.1, Figure 275).
/// PCI Vendor ID, 2 bytes.
pub const IDC_VID: usize = 0;
/// PCI Subsystem Vendor ID, 2 bytes.
pub const IDC_SSVID: usize = 2;
/// Serial Number, [`SN_LEN`] ASCII bytes.
pub const IDC_SN: usize = 4;
/// Model Number, [`MN_LEN`] ASCII bytes.
pub const IDC_MN: usize = 24;
/// Firmware Revision, [`FR_LEN`] ASCII bytes.
pub const IDC_FR: usize = 64;
/// Recommended Arbitration Burst.
pub const IDC_RAB: usize = 72;
/// IEEE OUI Identifier, 3 bytes.
pub const IDC_IEEE: usize = 73;
/// Controller Multi-Path I/O and Namespace Sharing Capabilities.
pub const IDC_CMIC: usize = 76;
/// Maximum Data Transfer Size, a power of two of CAP.MPSMIN pages (0: no limit).
pub const IDC_MDTS: usize = 77;
/// Controller ID, 2 bytes.
pub const IDC_CNTLID: usize = 78;
/// Version, 4 bytes (as the VS register).
pub const IDC_VER: usize = 80;
/// Optional Asynchronous Events Supported, 4 bytes.
pub const IDC_OAES: usize = 92;
/// Controller Attributes, 4 bytes.
pub const IDC_CTRATT: usize = 96;
/// Controller Type.
pub const IDC_CNTRLTYPE: usize = 111;
/// Optional Admin Command Support, 2 bytes.
pub const IDC_OACS: usize = 256;
/// Abort Command Limit, zero-based.
pub const IDC_ACL: usize = 258;
/// Asynchronous Event Request Limit, zero-based.
pub const IDC_AERL: usize = 259;
/// Firmware Updates.
pub const IDC_FRMW: usize = 260;
/// Log Page Attributes.
pub const IDC_LPA: usize = 261;
/// Error Log Page Entries, zero-based.
pub const IDC_ELPE: usize = 262;
/// Number of Power States Support, zero-based.
pub const IDC_NPSS: usize = 263;
/// Keep Alive Support: the timer's granularity in 100 ms units, 2 bytes.
pub const IDC_KAS: usize = 320;
/// ANA Transition Time: the longest an ANA group stays in ANA Change, in seconds.
pub const IDC_ANATT: usize = 342;
/// Asymmetric Namespace Access Capabilities.
pub const IDC_ANACAP: usize = 343;
/// ANA Group Identifier Maximum, 4 bytes.
pub const IDC_ANAGRPMAX: usize = 344;
/// Number of ANA Group Identifiers, 4 bytes.
pub const IDC_NANAGRPID: usize = 348;
/// Submission Queue Entry Size: maximum (bits 7:4) and required (3:0), powers of two.
pub const IDC_SQES: usize = 512;
/// Completion Queue Entry Size, as SQES.
pub const IDC_CQES: usize = 513;
/// Maximum Outstanding Commands, 2 bytes.
pub const IDC_MAXCMD: usize = 514;
/// Number of Namespaces, 4 bytes.
pub const IDC_NN: usize = 516;
/// Optional NVM Command Support, 2 bytes.
pub const IDC_ONCS: usize = 520;
/// Fused Operation Support, 2 bytes.
pub const IDC_FUSES: usize = 522;
/// Volatile Write Cache.
pub const IDC_VWC: usize = 525;
/// Maximum Number of Allowed Namespaces, 4 bytes (Linux's multipath refuses ANA without it).
pub const IDC_MNAN: usize = 540;
/// SGL Support, 4 bytes.
pub const IDC_SGLS: usize = 536;
/// NVM Subsystem NVMe Qualified Name, [`SUBNQN_LEN`] bytes, NUL-terminated.
pub const IDC_SUBNQN: usize = 768;
/// I/O Queue Command Capsule Supported Size, in 16-byte units, 4 bytes (Fabrics).
pub const IDC_IOCCSZ: usize = 1792;
/// I/O Queue Response Capsule Supported Size, in 16-byte units, 4 bytes (Fabrics).
pub const IDC_IORCSZ: usize = 1796;
/// In Capsule Data Offset, in 16-byte units, 2 bytes (Fabrics).
pub const IDC_ICDOFF: usize = 1800;
/// Fabrics Controller Attributes.
pub const IDC_FCATT: usize = 1802;
/// Maximum SGL Data Block Descriptors.
pub const IDC_MSDBD: usize = 1803;

/// Width of the SN field.
pub const SN_LEN: usize = 20;
/// Width of the MN field.
pub const MN_LEN: usize = 40;
/// Width of the FR field.
pub const FR_LEN: usize = 8;
/// Width of the SUBNQN field.
pub const SUBNQN_LEN: usize = 256;

/// CMIC bit 1: the subsystem may have two or more controllers.
pub const CMIC_MULTI_CONTROLLER: u8 = 1 << 1;
/// CMIC bit 3: Asymmetric Namespace Access Reporting.
pub const CMIC_ANA_REPORTING: u8 = 1 << 3;
/// ANACAP bit 0: reports ANA Optimized.
pub const ANACAP_OPTIMIZED: u8 = 1 << 0;
/// ANACAP bit 1: reports ANA Non-Optimized.
pub const ANACAP_NON_OPTIMIZED: u8 = 1 << 1;
/// ANACAP bit 2: reports ANA Inaccessible.
pub const ANACAP_INACCESSIBLE: u8 = 1 << 2;
/// ANACAP bit 3: reports ANA Persistent Loss.
pub const ANACAP_PERSISTENT_LOSS: u8 = 1 << 3;
/// ANACAP bit 4: reports ANA Change.
pub const ANACAP_CHANGE: u8 = 1 << 4;
/// ANACAP bit 6: a namespace's ANAGRPID does not change while it is attached.
pub const ANACAP_GRPID_FIXED: u8 = 1 << 6;
/// OAES bit 8: Namespace Attribute Notices.
pub const OAES_NS_ATTRIBUTE: u32 = 1 << 8;
/// OAES bit 11: Asymmetric Namespace Access Change Notices.
pub const OAES_ANA_CHANGE: u32 = 1 << 11;
/// OAES bit 31: Discovery Log Page Change Notifications (Fabrics 5.1).
pub const OAES_DISCOVERY_CHANGE: u32 = 1 << 31;
/// CTRATT bit 0: 128-bit host identifiers, which fabrics require (Fabrics 3.3).
pub const CTRATT_HOST_ID_128: u32 = 1 << 0;
/// CNTRLTYPE 1: an I/O controller.
pub const CNTRLTYPE_IO: u8 = 1;
/// CNTRLTYPE 2: a discovery controller.
pub const CNTRLTYPE_DISCOVERY: u8 = 2;
/// OACS bit 8: Doorbell Buffer Config.
pub const OACS_DOORBELL_BUFFER_CONFIG: u16 = 1 << 8;
/// LPA bit 2: extended data for Get Log Page (NUMDU and a 64-bit LPO).
pub const LPA_EXTENDED_DATA: u8 = 1 << 2;
/// ONCS bit 2: Dataset Management.
pub const ONCS_DSM: u16 = 1 << 2;
/// ONCS bit 3: Write Zeroes.
pub const ONCS_WRITE_ZEROES: u16 = 1 << 3;
/// VWC bit 0: a volatile write cache is present.
pub const VWC_PRESENT: u8 = 1 << 0;
/// SGLS bits 1:0 = 01b: SGLs supported, no alignment requirement.
pub const SGLS_SUPPORTED: u32 = 0b01;
/// SGLS bit 20: the address of an SGL data block descriptor may be an offset (in-capsule
/// data, TCP 3.3.3).
pub const SGLS_OFFSET: u32 = 1 << 20;
/// SGLS bit 21: the transport SGL data block descriptor (data moved by the transport's PDUs).
pub const SGLS_TRANSPORT_DATA_BLOCK: u32 = 1 << 21;

// Identify Namespace data structure offsets (NVM 4.1.5.1, Figure 97).
/// Namespace Size in logical blocks, 8 bytes.
pub const IDN_NSZE: usize = 0;
/// Namespace Capacity, 8 bytes.
pub const IDN_NCAP: usize = 8;
/// Namespace Utilization, 8 bytes.
pub const IDN_NUSE: usize = 16;
/// Namespace Features.
pub const IDN_NSFEAT: usize = 24;
/// Number of LBA Formats, zero-based.
pub const IDN_NLBAF: usize = 25;
/// Formatted LBA Size: bits 3:0 the format in use.
pub const IDN_FLBAS: usize = 26;
/// Namespace Multi-path I/O and Namespace Sharing Capabilities.
pub const IDN_NMIC: usize = 30;
/// Deallocate Logical Block Features.
pub const IDN_DLFEAT: usize = 33;
/// ANA Group Identifier, 4 bytes.
pub const IDN_ANAGRPID: usize = 92;
/// Namespace Attributes.
pub const IDN_NSATTR: usize = 99;
/// Namespace Globally Unique Identifier, 16 bytes.
pub const IDN_NGUID: usize = 104;
/// IEEE Extended Unique Identifier, 8 bytes.
pub const IDN_EUI64: usize = 120;
/// LBA Format 0 Support, 4 bytes; format n at `IDN_LBAF0 + 4 * n`.
pub const IDN_LBAF0: usize = 128;
/// NMIC bit 0: the namespace may be attached to two or more controllers.
pub const NMIC_SHARED: u8 = 1 << 0;
/// NSATTR bit 0: the namespace is write protected.
pub const NSATTR_WRITE_PROTECTED: u8 = 1 << 0;
/// LBA format bits 23:16: LBADS, the block size as a power of two.
pub const LBAF_LBADS_SHIFT: u32 = 16;

// Namespace Identification Descriptor types (Base 5.17.2.3, Figure 278).
/// IEEE Extended Unique Identifier, 8 bytes.
pub const NIDT_EUI64: u8 = 0x1;
/// Namespace Globally Unique Identifier, 16 bytes.
pub const NIDT_NGUID: u8 = 0x2;
/// Namespace UUID, 16 bytes.
pub const NIDT_UUID: u8 = 0x3;
/// Bytes before a descriptor's NID: NIDT, NIDL, two reserved.
pub const NID_HEADER: usize = 4;

/// The Active Namespace ID list holds at most 1024 NSIDs (Base 5.17.2.2).
pub const ACTIVE_LIST_MAX: usize = IDENTIFY_LEN / 4;
