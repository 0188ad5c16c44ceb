//! Asynchronous events (Base 5.2): Asynchronous Event Requests the host leaves outstanding,
//! events waiting for one, and the masking rule: once an event of a type is reported, that type
//! is not reported again until the host reads its log page with Retain Asynchronous Event
//! cleared (Base 5.2.1).

use std::collections::VecDeque;

use fp_nvme_spec::aer::{AEC_ANA_CHANGE, INFO_ANA_CHANGE};
use fp_nvme_spec::log_page::{LID_ANA, LID_CHANGED_NS, LID_DISCOVERY};
use fp_nvme_spec::{Cqe, Status};

use crate::identify::AERL;

/// Asynchronous Event Type 010b: Notice (Base 5.2, Figure 146).
const TYPE_NOTICE: u32 = 0b010;
/// Notice information (Base 5.2, Figure 149): Namespace Attribute Changed; Discovery Log Page
/// Change (Fabrics 5.1).
const INFO_NS_ATTRIBUTE_CHANGED: u32 = 0x00;
const INFO_DISCOVERY_CHANGE: u32 = 0xF0;
/// Generic status 08h: Command Aborted due to SQ Deletion (Base Figure 95): what a parked
/// request answers when its controller goes away.
pub const SC_ABORTED_SQ_DELETION: u8 = 0x08;

/// The events this controller reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AsyncEvent {
    /// A namespace was attached, detached or resized (Changed Namespace List, 04h).
    NamespaceAttribute,
    /// The discovery log changed (Discovery log page, 70h).
    DiscoveryChange,
    /// The ANA states the controller reports changed (Asymmetric Namespace Access, 0Ch).
    AnaChange,
}

impl AsyncEvent {
    const ALL: [AsyncEvent; 3] =
        [AsyncEvent::NamespaceAttribute, AsyncEvent::DiscoveryChange, AsyncEvent::AnaChange];

    fn flag(self) -> u8 {
        match self {
            AsyncEvent::NamespaceAttribute => 1 << 0,
            AsyncEvent::DiscoveryChange => 1 << 1,
            AsyncEvent::AnaChange => 1 << 2,
        }
    }

    /// Its bit in the Asynchronous Event Configuration feature (Base 5.27.1.10).
    pub fn config_bit(self) -> u32 {
        match self {
            AsyncEvent::NamespaceAttribute => 1 << 8,
            AsyncEvent::DiscoveryChange => 1 << 31,
            AsyncEvent::AnaChange => AEC_ANA_CHANGE,
        }
    }

    /// The log page that clears it.
    pub fn log_page(self) -> u8 {
        match self {
            AsyncEvent::NamespaceAttribute => LID_CHANGED_NS,
            AsyncEvent::DiscoveryChange => LID_DISCOVERY,
            AsyncEvent::AnaChange => LID_ANA,
        }
    }

    /// The AER completion's dword 0: type (bits 2:0), information (15:8), log page (23:16).
    pub fn dw0(self) -> u32 {
        let info = match self {
            AsyncEvent::NamespaceAttribute => INFO_NS_ATTRIBUTE_CHANGED,
            AsyncEvent::DiscoveryChange => INFO_DISCOVERY_CHANGE,
            AsyncEvent::AnaChange => u32::from(INFO_ANA_CHANGE),
        };
        TYPE_NOTICE | (info << 8) | (u32::from(self.log_page()) << 16)
    }
}

/// Outstanding requests and events of one controller.
#[derive(Debug, Clone)]
pub struct AsyncEvents {
    /// Command identifiers of parked requests, oldest first (at most AERL + 1).
    parked: VecDeque<u16>,
    /// Events that happened with no request parked, not yet reported.
    pending: u8,
    /// Events reported and not yet cleared by a log page read.
    masked: u8,
}

impl Default for AsyncEvents {
    fn default() -> Self {
        AsyncEvents { parked: VecDeque::with_capacity(usize::from(AERL) + 1), pending: 0, masked: 0 }
    }
}

/// The host sent more than AERL + 1 requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimitExceeded;

fn completion(cid: u16, event: AsyncEvent) -> Cqe {
    let mut cqe = Cqe::new(cid, Status::SUCCESS);
    cqe.dw0 = event.dw0();
    cqe
}

impl AsyncEvents {
    /// An Asynchronous Event Request: answered now if an event waits, else parked.
    pub fn request(&mut self, cid: u16) -> Result<Option<Cqe>, LimitExceeded> {
        if let Some(event) = AsyncEvent::ALL.into_iter().find(|e| self.pending & e.flag() != 0) {
            self.pending &= !event.flag();
            self.masked |= event.flag();
            return Ok(Some(completion(cid, event)));
        }
        if self.parked.len() > usize::from(AERL) {
            return Err(LimitExceeded);
        }
        self.parked.push_back(cid);
        Ok(None)
    }

    /// `event` happened; `enabled`: the host asked for it (Asynchronous Event Configuration).
    /// The completion of a parked request, if one reports it now.
    pub fn raise(&mut self, event: AsyncEvent, enabled: bool) -> Option<Cqe> {
        if !enabled || (self.masked | self.pending) & event.flag() != 0 {
            return None;
        }
        match self.parked.pop_front() {
            Some(cid) => {
                self.masked |= event.flag();
                Some(completion(cid, event))
            }
            None => {
                self.pending |= event.flag();
                None
            }
        }
    }

    /// The host read log page `lid` with RAE cleared: its event may be reported again, and one
    /// not yet reported is no longer news.
    pub fn log_read(&mut self, lid: u8) {
        for e in AsyncEvent::ALL {
            if e.log_page() == lid {
                self.masked &= !e.flag();
                self.pending &= !e.flag();
            }
        }
    }

    pub fn parked(&self) -> usize {
        self.parked.len()
    }

    /// Completions aborting every parked request (the controller is going away).
    pub fn take_parked(&mut self) -> Vec<Cqe> {
        self.parked.drain(..).map(|cid| Cqe::new(cid, Status::generic(SC_ABORTED_SQ_DELETION))).collect()
    }

    /// A controller reset: events waiting or masked are forgotten (Base 3.7.2). Parked
    /// requests stay: on a fabric the admin queue outlives the reset, and each parked request
    /// holds one of the engine's command slots until an event or `take_parked` answers it.
    pub fn reset(&mut self) {
        self.pending = 0;
        self.masked = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reported_once_until_the_log_is_read() {
        let mut a = AsyncEvents::default();
        assert_eq!(a.request(10), Ok(None));
        let cqe = a.raise(AsyncEvent::NamespaceAttribute, true).unwrap();
        assert_eq!((cqe.cid, cqe.dw0), (10, 0x0004_0002));
        assert_eq!(a.request(11), Ok(None));
        assert_eq!(a.raise(AsyncEvent::NamespaceAttribute, true), None, "masked");
        a.log_read(LID_CHANGED_NS);
        assert_eq!(a.raise(AsyncEvent::NamespaceAttribute, true).unwrap().cid, 11);
    }

    #[test]
    fn pending_without_request_then_answered() {
        let mut a = AsyncEvents::default();
        assert_eq!(a.raise(AsyncEvent::DiscoveryChange, true), None);
        let cqe = a.request(3).unwrap().unwrap();
        assert_eq!((cqe.cid, cqe.dw0), (3, 0x0070_F002));
        assert_eq!(a.request(4), Ok(None), "masked now: parks");
        assert_eq!(a.raise(AsyncEvent::DiscoveryChange, false), None);
    }

    #[test]
    fn ana_change_is_its_own_event() {
        let mut a = AsyncEvents::default();
        assert_eq!(a.request(1), Ok(None));
        assert_eq!(a.request(2), Ok(None));
        let cqe = a.raise(AsyncEvent::NamespaceAttribute, true).unwrap();
        assert_eq!(cqe.cid, 1);
        let cqe = a.raise(AsyncEvent::AnaChange, true).unwrap();
        assert_eq!((cqe.cid, cqe.dw0), (2, 0x000C_0302), "not masked by the namespace notice");
        assert_eq!(a.request(3), Ok(None));
        assert_eq!(a.raise(AsyncEvent::AnaChange, true), None, "masked until the ANA log is read");
        a.log_read(LID_ANA);
        assert_eq!(a.raise(AsyncEvent::AnaChange, true).unwrap().cid, 3);
    }

    #[test]
    fn disabled_events_are_not_kept() {
        let mut a = AsyncEvents::default();
        assert_eq!(a.raise(AsyncEvent::NamespaceAttribute, false), None);
        assert_eq!(a.request(1), Ok(None));
    }

    #[test]
    fn limit_and_abort_on_teardown() {
        let mut a = AsyncEvents::default();
        for cid in 0..=u16::from(AERL) {
            assert_eq!(a.request(cid), Ok(None));
        }
        assert_eq!(a.request(99), Err(LimitExceeded));
        let aborted = a.take_parked();
        assert_eq!(aborted.len(), usize::from(AERL) + 1);
        assert!(aborted.iter().all(|c| c.status == Status::generic(0x08)));
        assert_eq!(a.parked(), 0);
    }
}
