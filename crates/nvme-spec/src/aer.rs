//! Asynchronous Event Request completions (Base 5.2): dword 0's event type, information and log
//! page, and the Asynchronous Event Configuration feature's bits (Base 5.27.1.10) that enable
//! each notice.

/// Asynchronous Event Type 010b: Notice (Base Figure 146).
pub const TYPE_NOTICE: u8 = 0b010;
/// Notice information 00h: Namespace Attribute Changed (Base Figure 149).
pub const INFO_NS_ATTRIBUTE_CHANGED: u8 = 0x00;
/// Notice information 03h: Asymmetric Namespace Access Change.
pub const INFO_ANA_CHANGE: u8 = 0x03;
/// Notice information F0h: Discovery Log Page Change (Fabrics 5.1).
pub const INFO_DISCOVERY_CHANGE: u8 = 0xF0;

/// Asynchronous Event Configuration bit 8: Namespace Attribute Notices.
pub const AEC_NS_ATTRIBUTE: u32 = 1 << 8;
/// Asynchronous Event Configuration bit 11: Asymmetric Namespace Access Change Notices.
pub const AEC_ANA_CHANGE: u32 = 1 << 11;
/// Asynchronous Event Configuration bit 31: Discovery Log Page Change Notices.
pub const AEC_DISCOVERY_CHANGE: u32 = 1 << 31;

/// An Asynchronous Event Request completion's dword 0 (Base Figure 145).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AsyncEventInfo {
    /// Asynchronous Event Type, bits 2:0.
    pub kind: u8,
    /// Asynchronous Event Information, bits 15:8.
    pub info: u8,
    /// The log page to read to clear it, bits 23:16.
    pub log_page: u8,
}

impl AsyncEventInfo {
    /// A notice (type 010b) with its information and log page.
    pub const fn notice(info: u8, log_page: u8) -> AsyncEventInfo {
        AsyncEventInfo { kind: TYPE_NOTICE, info, log_page }
    }

    /// Dword 0 on the wire.
    pub const fn dw0(self) -> u32 {
        (self.kind as u32 & 0x7) | ((self.info as u32) << 8) | ((self.log_page as u32) << 16)
    }

    /// Reads dword 0.
    pub const fn from_dw0(dw0: u32) -> AsyncEventInfo {
        AsyncEventInfo { kind: (dw0 & 0x7) as u8, info: (dw0 >> 8) as u8, log_page: (dw0 >> 16) as u8 }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log_page::LID_ANA;

    #[test]
    fn ana_change_notice_dword_0() {
        let e = AsyncEventInfo::notice(INFO_ANA_CHANGE, LID_ANA);
        // Linux's NVME_AER_NOTICE_ANA: type 2, info 3, log page 0Ch.
        assert_eq!(e.dw0(), 0x000C_0302);
        assert_eq!(AsyncEventInfo::from_dw0(0x000C_0302), e);
    }
}
