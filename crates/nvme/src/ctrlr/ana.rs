//! Asymmetric Namespace Access on the host (Base 8.1.3): what one controller says of each of
//! its namespaces' ANA states, kept where the channels read it cheaply.
//!
//! The controller thread reads the ANA log page (at every bring-up, on the ANA change notice,
//! and when a channel saw an I/O fail with an ANA path status) and publishes each namespace's
//! state as one byte ([`AnaWord`]); a channel loads that byte at its sweeps, not per I/O. A
//! channel whose I/O failed with an ANA status marks the byte "updating" (the path takes no new
//! I/O until the thread has read the page again) and asks for the re-read, once per batch of
//! failures ([`AnaTable::ask`]).
//!
//! ANATT (Identify Controller's ANA Transition Time) bounds how long a namespace may stay
//! inaccessible or in change before the path is no longer waited for ([`ANA_TIMED_OUT`]), as
//! SPDK's `ana_transition_timedout`.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

pub use fp_nvme_spec::log_page::AnaState;
use fp_nvme_spec::log_page::{AnaLogPage, ANA_DESC_LEN, ANA_HEADER_LEN};

/// Flag of an [`AnaWord`]: an I/O failed with an ANA status; the page is being read again and
/// the path takes no new I/O meanwhile.
pub(crate) const ANA_UPDATING: u8 = 1 << 6;
/// Flag of an [`AnaWord`]: inaccessible or in change for longer than ANATT: the path is no
/// longer waited for.
pub(crate) const ANA_TIMED_OUT: u8 = 1 << 7;
/// The bytes of the ANA log page read at most: a controller that claims more groups than fit
/// is read up to here (and its page refused as cut short) rather than allocated for.
pub(crate) const ANA_PAGE_MAX: usize = 1 << 20;
/// The transition time assumed for a controller that reports an ANATT of 0.
pub(crate) const UNREPORTED_ANATT_SECS: u64 = 10;

/// One namespace's ANA state through one controller: the state's code (bits 3:0, as on the
/// wire) and the flags [`ANA_UPDATING`] and [`ANA_TIMED_OUT`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct AnaWord(pub(crate) u8);

impl AnaWord {
    /// What a controller without ANA reporting is taken to be: optimized, for good.
    pub(crate) const OPTIMIZED: AnaWord = AnaWord(AnaState::Optimized as u8);

    /// The state last read (optimized for a code that is not one: never published).
    pub(crate) fn state(self) -> AnaState {
        AnaState::from_code(self.0 & 0xf).unwrap_or(AnaState::Optimized)
    }

    /// I/O may be sent: optimized or non-optimized, and not being read again.
    #[inline]
    pub(crate) fn accessible(self) -> bool {
        self.0 & ANA_UPDATING == 0 && matches!(self.state(), AnaState::Optimized | AnaState::NonOptimized)
    }

    /// Optimized and not being read again.
    #[inline]
    pub(crate) fn optimized(self) -> bool {
        self.0 & ANA_UPDATING == 0 && self.state() == AnaState::Optimized
    }

    /// Not accessible now, but it may become so: being read again, or inaccessible or in
    /// change within ANATT.
    pub(crate) fn may_become_accessible(self) -> bool {
        if self.0 & ANA_TIMED_OUT != 0 {
            return false;
        }
        self.0 & ANA_UPDATING != 0 || matches!(self.state(), AnaState::Inaccessible | AnaState::Change)
    }

    /// Persistent loss: the namespace is gone through this controller.
    pub(crate) fn lost(self) -> bool {
        self.0 & ANA_UPDATING == 0 && self.state() == AnaState::PersistentLoss
    }
}

/// One namespace's entry: the word the channels read, and (the thread's own) since when it
/// has been inaccessible or in change.
struct Entry {
    word: Arc<AtomicU8>,
    since: Option<Instant>,
}

/// One controller's ANA states, by namespace ID.
#[derive(Default)]
pub(crate) struct AnaTable {
    /// A re-read was asked and the thread has not started it yet.
    asked: AtomicBool,
    entries: Mutex<BTreeMap<u32, Entry>>,
}

impl AnaTable {
    fn lock(&self) -> MutexGuard<'_, BTreeMap<u32, Entry>> {
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Namespace `nsid`'s word (optimized until a page says otherwise).
    pub(crate) fn word(&self, nsid: u32) -> Arc<AtomicU8> {
        self.lock()
            .entry(nsid)
            .or_insert_with(|| Entry { word: Arc::new(AtomicU8::new(AnaWord::OPTIMIZED.0)), since: None })
            .word
            .clone()
    }

    /// Namespace `nsid`'s state now.
    pub(crate) fn get(&self, nsid: u32) -> AnaWord {
        AnaWord(self.lock().get(&nsid).map_or(AnaWord::OPTIMIZED.0, |e| e.word.load(Ordering::Relaxed)))
    }

    /// A channel saw an ANA path status on `word`'s namespace: the path takes no new I/O until
    /// the page is read again, which `send` asks of the controller thread unless a request is
    /// already on its way.
    pub(crate) fn ask(&self, word: &AtomicU8, send: impl FnOnce() -> bool) {
        word.fetch_or(ANA_UPDATING, Ordering::Relaxed);
        if !self.asked.swap(true, Ordering::AcqRel) && !send() {
            self.asked.store(false, Ordering::Release);
        }
    }

    /// The thread starts a re-read: failures seen from now on ask again.
    pub(crate) fn start_read(&self) {
        self.asked.store(false, Ordering::Release);
    }

    /// Publishes `page` for the namespaces `nsids` (with their Identify ANAGRPID): each takes
    /// the state of the group whose NSID list names it, else of the group its ANAGRPID names;
    /// one in neither keeps its state. Returns the earliest ANATT deadline to watch.
    pub(crate) fn publish(
        &self,
        page: &AnaLogPage,
        nsids: &[(u32, u32)],
        anatt: Duration,
        now: Instant,
    ) -> Option<Instant> {
        let mut entries = self.lock();
        for &(nsid, anagrpid) in nsids {
            let group = page
                .groups
                .iter()
                .find(|g| g.nsids.contains(&nsid))
                .or_else(|| page.groups.iter().find(|g| anagrpid != 0 && g.grpid == anagrpid));
            let entry = entries.entry(nsid).or_insert_with(|| Entry {
                word: Arc::new(AtomicU8::new(AnaWord::OPTIMIZED.0)),
                since: None,
            });
            let Some(group) = group else {
                // Not in the page: what it had stands (not being read any more).
                entry.word.fetch_and(!ANA_UPDATING, Ordering::Relaxed);
                continue;
            };
            let waiting = matches!(group.state, AnaState::Inaccessible | AnaState::Change);
            let mut word = group.state.code();
            if waiting {
                let since = *entry.since.get_or_insert(now);
                if now >= since + anatt {
                    word |= ANA_TIMED_OUT;
                }
            } else {
                entry.since = None;
            }
            entry.word.store(word, Ordering::Relaxed);
        }
        next_deadline(&entries, anatt)
    }

    /// A re-read failed: every namespace keeps the state it had (no longer marked updating).
    pub(crate) fn keep(&self) {
        for e in self.lock().values() {
            e.word.fetch_and(!ANA_UPDATING, Ordering::Relaxed);
        }
    }

    /// Marks the namespaces inaccessible or in change for longer than `anatt` at `now` as
    /// timed out; returns the next deadline.
    pub(crate) fn expire(&self, anatt: Duration, now: Instant) -> Option<Instant> {
        let entries = self.lock();
        for e in entries.values() {
            if e.since.is_some_and(|s| now >= s + anatt) {
                e.word.fetch_or(ANA_TIMED_OUT, Ordering::Relaxed);
            }
        }
        next_deadline(&entries, anatt)
    }
}

fn next_deadline(entries: &BTreeMap<u32, Entry>, anatt: Duration) -> Option<Instant> {
    entries
        .values()
        .filter(|e| e.word.load(Ordering::Relaxed) & ANA_TIMED_OUT == 0)
        .filter_map(|e| e.since.map(|s| s + anatt))
        .min()
}

/// The ANA transition time of a controller reporting `anatt` seconds.
pub(crate) fn anatt(anatt: u8) -> Duration {
    Duration::from_secs(if anatt == 0 { UNREPORTED_ANATT_SECS } else { u64::from(anatt) })
}

/// The bytes of the whole ANA log page of a controller with `nanagrpid` groups and `namespaces`
/// active namespaces (each in one group's NSID list), bounded by [`ANA_PAGE_MAX`], in whole
/// dwords.
pub(crate) fn page_len(nanagrpid: u32, namespaces: usize) -> usize {
    let len = ANA_HEADER_LEN
        .saturating_add((nanagrpid as usize).saturating_mul(ANA_DESC_LEN))
        .saturating_add(namespaces.saturating_mul(4));
    len.min(ANA_PAGE_MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use fp_nvme_spec::log_page::AnaGroupDescriptor;

    fn page(states: &[(u32, AnaState, &[u32])]) -> AnaLogPage {
        AnaLogPage {
            change_count: 1,
            groups: states
                .iter()
                .map(|&(grpid, state, nsids)| AnaGroupDescriptor {
                    grpid,
                    change_count: 0,
                    state,
                    nsids: nsids.to_vec(),
                })
                .collect(),
        }
    }

    #[test]
    fn namespaces_take_their_groups_state_by_nsid_list_then_by_anagrpid() {
        let t = AnaTable::default();
        let now = Instant::now();
        let p = page(&[(1, AnaState::NonOptimized, &[1]), (2, AnaState::Inaccessible, &[])]);
        let next = t.publish(&p, &[(1, 2), (2, 2), (3, 9)], Duration::from_secs(10), now);
        assert_eq!(t.get(1).state(), AnaState::NonOptimized, "the NSID list wins over ANAGRPID");
        assert!(t.get(1).accessible() && !t.get(1).optimized());
        assert_eq!(t.get(2).state(), AnaState::Inaccessible, "by ANAGRPID");
        assert!(!t.get(2).accessible() && t.get(2).may_become_accessible());
        assert_eq!(t.get(3), AnaWord::OPTIMIZED, "in no group: as it was");
        assert_eq!(next, Some(now + Duration::from_secs(10)), "ANATT watched for the inaccessible one");

        // ANATT passes: no longer waited for; a new state clears it.
        assert_eq!(t.expire(Duration::from_secs(10), now + Duration::from_secs(10)), None);
        assert!(!t.get(2).may_become_accessible() && !t.get(2).accessible());
        let p = page(&[(2, AnaState::Optimized, &[2])]);
        assert_eq!(t.publish(&p, &[(2, 2)], Duration::from_secs(10), now), None);
        assert!(t.get(2).optimized());
    }

    #[test]
    fn a_failure_marks_the_path_updating_and_asks_once() {
        let t = AnaTable::default();
        let w = t.word(1);
        let mut sent = 0;
        t.ask(&w, || {
            sent += 1;
            true
        });
        t.ask(&w, || {
            sent += 1;
            true
        });
        assert_eq!(sent, 1, "one re-read asked for two failures");
        let word = t.get(1);
        assert!(!word.accessible() && word.may_become_accessible() && !word.lost());
        assert_eq!(word.state(), AnaState::Optimized, "the state shown is the last read");
        t.keep();
        assert!(t.get(1).accessible(), "a failed re-read keeps the state it had");
        t.start_read();
        t.ask(&w, || {
            sent += 1;
            true
        });
        assert_eq!(sent, 2, "after the thread started reading, a new failure asks again");
        let p = page(&[(1, AnaState::PersistentLoss, &[1])]);
        t.publish(&p, &[(1, 1)], Duration::from_secs(1), Instant::now());
        assert!(t.get(1).lost() && !t.get(1).may_become_accessible());
    }

    #[test]
    fn the_page_is_sized_from_the_groups_and_namespaces_and_bounded() {
        assert_eq!(page_len(2, 3), 16 + 64 + 12);
        assert_eq!(page_len(u32::MAX, usize::MAX), ANA_PAGE_MAX);
        assert_eq!(anatt(0), Duration::from_secs(UNREPORTED_ANATT_SECS));
        assert_eq!(anatt(3), Duration::from_secs(3));
    }
}
