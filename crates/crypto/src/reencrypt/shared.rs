//! What a re-encryption job shares with the crypto bdev's channels: the boundary between the
//! new key and the old, the hotzone the job is rewriting, the epoch channels acknowledge, and
//! one slot per channel saying whether it has requests in flight.
//!
//! The protocol (docs/crypto.md, "Online re-encryption (engine)"):
//!
//! * The boundary and the hotzone's length are one atomic word, so a channel never sees the
//!   boundary of one step with the hotzone of another. Sectors below the boundary are under the
//!   new key, the others under the old; the hotzone starts at the boundary.
//! * A channel that goes from idle to busy sets its slot's `active` (SeqCst) *before* it reads
//!   the word; the job stores the word (SeqCst) *before* it reads `active`. So either the
//!   channel sees the new hotzone, or the job sees the channel busy and waits for its
//!   acknowledgement of the epoch, which the channel gives at a poll when none of its requests
//!   in flight overlaps the hotzone. An idle channel needs no poll to be passed over: its
//!   reactor may sleep.
//! * A request records the boundary it was submitted under and keeps those keys: the boundary
//!   moves only past a hotzone nobody has in flight.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use crate::CryptoKey;

/// Bits of the word that hold the hotzone's length in 512-byte sectors; the rest hold the
/// boundary in 512-byte sectors (up to 4 PiB).
const HOT_BITS: u32 = 21;
/// The longest hotzone the word holds, in bytes (just under 1 GiB).
pub(crate) const MAX_HOTZONE: u64 = ((1 << HOT_BITS) - 1) * 512;
/// The largest boundary the word holds, in bytes.
pub(crate) const MAX_BOUNDARY: u64 = (u64::MAX >> HOT_BITS) * 512;

/// One channel's slot: read by the job, written by the channel alone.
#[derive(Default)]
pub(crate) struct ChannelSlot {
    /// The channel may have requests in flight (set before it looks at the word).
    pub(crate) active: AtomicBool,
    /// The last epoch the channel acknowledged: none of its requests in flight then overlapped
    /// that epoch's hotzone.
    pub(crate) ack: AtomicU64,
}

/// The live channels' slots of one crypto bdev (kept whether or not a job ever runs: a job
/// attached later must know the channels opened before it).
#[derive(Default)]
pub(crate) struct Slots(Mutex<Vec<Weak<ChannelSlot>>>);

impl Slots {
    /// A slot for a channel being opened.
    pub(crate) fn register(&self) -> Arc<ChannelSlot> {
        let slot = Arc::new(ChannelSlot::default());
        let mut v = self.0.lock().unwrap_or_else(|p| p.into_inner());
        v.retain(|w| w.strong_count() > 0);
        v.push(Arc::downgrade(&slot));
        slot
    }

    /// Whether every live channel is idle or has acknowledged `epoch`. Call after the word
    /// that `epoch` announces was stored.
    pub(crate) fn quiet(&self, epoch: u64) -> bool {
        let v = self.0.lock().unwrap_or_else(|p| p.into_inner());
        v.iter()
            .filter_map(Weak::upgrade)
            .all(|s| !s.active.load(Ordering::SeqCst) || s.ack.load(Ordering::Acquire) >= epoch)
    }
}

/// A crypto bdev's re-encryption state, attached once (at creation, or by the first job) and
/// kept for the device's life.
pub(crate) struct ReencShared {
    pub(crate) new_key: Arc<CryptoKey>,
    /// `boundary / 512 << HOT_BITS | hotzone_len / 512`.
    word: AtomicU64,
    /// Bumped after each new hotzone is stored in `word`.
    epoch: AtomicU64,
    /// The job stopped inside the hotzone (a base error): its sectors are partly rewritten, so
    /// requests overlapping it fail with EIO instead of waiting for a job that will not come
    /// back; recovery (`recover_hotzone`) repairs it before the disk is served again.
    hot_failed: AtomicBool,
    /// A job runs on this state now.
    pub(crate) job_running: AtomicBool,
}

/// What a channel reads of the state per request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Window {
    /// Bytes below are under the new key.
    pub(crate) boundary: u64,
    /// The hotzone's length (from the boundary); 0 when none.
    pub(crate) hot_len: u64,
}

impl Window {
    /// Whether `[offset, offset + len)` overlaps the hotzone.
    #[inline]
    pub(crate) fn hot(&self, offset: u64, len: u64) -> bool {
        self.hot_len != 0 && offset < self.boundary + self.hot_len && offset + len.max(1) > self.boundary
    }
}

impl ReencShared {
    pub(crate) fn new(new_key: Arc<CryptoKey>, boundary: u64) -> ReencShared {
        let s = ReencShared {
            new_key,
            word: AtomicU64::new(0),
            epoch: AtomicU64::new(0),
            hot_failed: AtomicBool::new(false),
            job_running: AtomicBool::new(false),
        };
        s.word.store(pack(boundary, 0), Ordering::SeqCst);
        s
    }

    /// The boundary and hotzone now.
    #[inline]
    pub(crate) fn window(&self) -> Window {
        let w = self.word.load(Ordering::SeqCst);
        Window { boundary: (w >> HOT_BITS) * 512, hot_len: (w & ((1 << HOT_BITS) - 1)) * 512 }
    }

    /// The epoch now (a channel compares it with the one it acknowledged last).
    #[inline]
    pub(crate) fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    pub(crate) fn hot_failed(&self) -> bool {
        self.hot_failed.load(Ordering::Acquire)
    }

    /// Holds `[boundary, boundary + len)` from new requests; returns the epoch every busy
    /// channel must acknowledge before the job touches it.
    pub(crate) fn hold(&self, boundary: u64, len: u64) -> u64 {
        self.word.store(pack(boundary, len), Ordering::SeqCst);
        self.epoch.fetch_add(1, Ordering::SeqCst) + 1
    }

    /// Moves the boundary to `boundary` and ends the hold.
    pub(crate) fn publish(&self, boundary: u64) {
        self.word.store(pack(boundary, 0), Ordering::SeqCst);
    }

    /// Ends the hold without moving the boundary (a job cancelled or failed before it wrote).
    pub(crate) fn release(&self) {
        self.publish(self.window().boundary);
    }

    /// The job stopped while the hotzone is partly rewritten: requests overlapping it fail.
    pub(crate) fn poison(&self) {
        self.hot_failed.store(true, Ordering::Release);
    }
}

fn pack(boundary: u64, hot_len: u64) -> u64 {
    debug_assert!(boundary.is_multiple_of(512) && hot_len.is_multiple_of(512));
    debug_assert!(boundary <= MAX_BOUNDARY && hot_len <= MAX_HOTZONE);
    ((boundary / 512) << HOT_BITS) | (hot_len / 512)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_word_holds_the_boundary_and_hotzone_and_overlap_is_exact() {
        let key = Arc::new(CryptoKey::new("n", &[1; 32], &[2; 32]).unwrap());
        let s = ReencShared::new(key, 4096);
        assert_eq!(s.window(), Window { boundary: 4096, hot_len: 0 });
        assert!(!s.window().hot(4096, 512), "no hotzone, nothing held");
        let e = s.hold(1 << 40, MAX_HOTZONE);
        assert_eq!(e, 1);
        assert_eq!(s.window(), Window { boundary: 1 << 40, hot_len: MAX_HOTZONE });
        s.hold(8192, 4096);
        let w = s.window();
        assert!(!w.hot(4096, 4096), "ends where the hotzone starts");
        assert!(w.hot(4096, 4608), "one sector into it");
        assert!(w.hot(12288 - 512, 512), "its last sector");
        assert!(!w.hot(12288, 512), "just after it");
        assert!(w.hot(0, 1 << 20), "around it");
        s.publish(12288);
        assert_eq!(s.window(), Window { boundary: 12288, hot_len: 0 });
    }

    #[test]
    fn an_idle_channel_is_quiet_and_a_busy_one_until_it_acknowledges() {
        let slots = Slots::default();
        let a = slots.register();
        let b = slots.register();
        assert!(slots.quiet(1));
        a.active.store(true, Ordering::SeqCst);
        assert!(!slots.quiet(1));
        a.ack.store(1, Ordering::Release);
        assert!(slots.quiet(1));
        assert!(!slots.quiet(2));
        drop(a);
        assert!(slots.quiet(2), "a closed channel is not waited for");
        b.active.store(true, Ordering::SeqCst);
        assert!(!slots.quiet(2));
    }
}
