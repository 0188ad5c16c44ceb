//! Which chunks of a live restore are where: one atomic byte per chunk, read by every channel
//! on its reactor without a lock and changed by the channels (absent -> fetching, once) and the
//! restore's worker thread (the rest).
//!
//! ```text
//!  ABSENT --(a channel's read/write, or the copier)--> FETCHING --(written to the base)--> RESTORED
//!     ^                                                   |                                  |
//!     +---(the copier's retry)--- FAILED <--(fetch or write failed)                (base flushed,
//!                                                                             state file renamed)
//!                                                                                         v
//!                                                                                      DURABLE
//! ```
//!
//! A read may go to the base once its chunks are RESTORED (their bytes are there); a write,
//! write-zeroes or discard only once they are DURABLE, so that a crash never brings back a
//! state file that calls the chunk absent after the guest wrote to it (a restart would fetch
//! it again over the guest's write).

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};

/// Not on the base yet.
pub const ABSENT: u8 = 0;
/// Asked of the store; exactly one fetch is under way.
pub const FETCHING: u8 = 1;
/// On the base; the state file does not say so yet.
pub const RESTORED: u8 = 2;
/// On the base, and the state file on disk says so.
pub const DURABLE: u8 = 3;
/// Its fetch failed (verification or the store, after fp-backup's retries): reads of it fail
/// with EIO until the copier's next try restores it.
pub const FAILED: u8 = 4;

/// What a request needs of the chunks it touches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// A read: the bytes on the base.
    Restored,
    /// A write, write-zeroes or discard: the bytes on the base and the fact on disk.
    Durable,
}

/// Whether a request may go to the base now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Every chunk it touches is as it needs.
    Go,
    /// It waits for a chunk (one fetch is under way or was just asked for).
    Wait,
    /// A chunk it touches failed: the request fails with EIO.
    Fail,
}

/// The chunk states of one restore, and a generation the worker bumps after each change
/// channels wait for.
pub struct ChunkStates {
    states: Box<[AtomicU8]>,
    chunk_size: u64,
    generation: AtomicU64,
}

impl ChunkStates {
    /// `count` chunks of `chunk_size` bytes, those `durable` says already restored (a state
    /// file's) DURABLE, the others ABSENT.
    pub fn new(count: u64, chunk_size: u64, durable: impl Fn(u64) -> bool) -> ChunkStates {
        let states = (0..count).map(|i| AtomicU8::new(if durable(i) { DURABLE } else { ABSENT })).collect();
        ChunkStates { states, chunk_size, generation: AtomicU64::new(0) }
    }

    /// The number of chunks.
    pub fn count(&self) -> u64 {
        self.states.len() as u64
    }

    /// Chunk `i`'s state.
    pub fn get(&self, i: u64) -> u8 {
        self.states[i as usize].load(Ordering::Acquire)
    }

    /// Sets chunk `i` (the worker's moves).
    pub fn set(&self, i: u64, state: u8) {
        self.states[i as usize].store(state, Ordering::Release);
    }

    /// Moves chunk `i` from ABSENT to FETCHING; true for the one caller that did (and so
    /// asks for the fetch): two requests for one absent chunk share one fetch.
    pub fn claim_fetch(&self, i: u64) -> bool {
        self.states[i as usize]
            .compare_exchange(ABSENT, FETCHING, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// The chunks the bytes `[offset, offset + len)` touch (len > 0).
    pub fn span(&self, offset: u64, len: u64) -> std::ops::RangeInclusive<u64> {
        let last = (offset + len.max(1) - 1) / self.chunk_size;
        (offset / self.chunk_size)..=last.min(self.count().saturating_sub(1))
    }

    /// Whether a request over `[offset, offset + len)` needing `need` may go; `ask(i)` is
    /// called for each absent chunk this call moved to FETCHING.
    pub fn verdict(&self, offset: u64, len: u64, need: Need, ask: &mut dyn FnMut(u64)) -> Verdict {
        let mut verdict = Verdict::Go;
        for i in self.span(offset, len) {
            let state = self.get(i);
            let ok = match (state, need) {
                (FAILED, _) => return Verdict::Fail,
                (DURABLE, _) | (RESTORED, Need::Restored) => true,
                (ABSENT, _) => {
                    if self.claim_fetch(i) {
                        ask(i);
                    }
                    false
                }
                _ => false,
            };
            if !ok {
                verdict = Verdict::Wait;
            }
        }
        verdict
    }

    /// The generation now (a channel compares it with the one it last looked at).
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Tells the channels something changed.
    pub fn bump(&self) {
        self.generation.fetch_add(1, Ordering::AcqRel);
    }

    /// How many chunks are DURABLE.
    pub fn durable(&self) -> u64 {
        self.states.iter().filter(|s| s.load(Ordering::Acquire) == DURABLE).count() as u64
    }

    /// The durable set as a bitmap, bit `i % 8` of byte `i / 8` (the state file's).
    pub fn durable_bitmap(&self, also: &[u64]) -> Vec<u8> {
        let mut map = vec![0u8; self.states.len().div_ceil(8)];
        for (i, s) in self.states.iter().enumerate() {
            if s.load(Ordering::Acquire) == DURABLE {
                map[i / 8] |= 1 << (i % 8);
            }
        }
        for &i in also {
            map[i as usize / 8] |= 1 << (i % 8);
        }
        map
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const C: u64 = 65536;

    fn asked(states: &ChunkStates, offset: u64, len: u64, need: Need) -> (Verdict, Vec<u64>) {
        let mut asked = Vec::new();
        let v = states.verdict(offset, len, need, &mut |i| asked.push(i));
        (v, asked)
    }

    #[test]
    fn an_absent_chunk_is_fetched_once_for_two_requests() {
        let s = ChunkStates::new(4, C, |_| false);
        assert_eq!(asked(&s, 0, 512, Need::Restored), (Verdict::Wait, vec![0]));
        assert_eq!(asked(&s, 4096, 512, Need::Durable), (Verdict::Wait, vec![]));
        assert_eq!(s.get(0), FETCHING);
    }

    #[test]
    fn a_read_goes_once_restored_a_write_once_durable() {
        let s = ChunkStates::new(4, C, |_| false);
        assert!(s.claim_fetch(1));
        s.set(1, RESTORED);
        assert_eq!(asked(&s, C, C, Need::Restored), (Verdict::Go, vec![]));
        assert_eq!(asked(&s, C, C, Need::Durable), (Verdict::Wait, vec![]));
        s.set(1, DURABLE);
        assert_eq!(asked(&s, C, C, Need::Durable), (Verdict::Go, vec![]));
    }

    #[test]
    fn a_request_spanning_chunks_asks_for_each_absent_one_and_fails_on_a_failed_one() {
        let s = ChunkStates::new(4, C, |i| i == 1);
        assert_eq!(asked(&s, C / 2, 2 * C, Need::Durable), (Verdict::Wait, vec![0, 2]));
        s.set(2, FAILED);
        assert_eq!(asked(&s, C / 2, 2 * C, Need::Restored), (Verdict::Fail, vec![]));
        // The other chunks are untouched by the failure.
        s.set(0, DURABLE);
        assert_eq!(asked(&s, 0, C, Need::Restored), (Verdict::Go, vec![]));
    }

    #[test]
    fn a_loaded_state_is_durable_and_the_bitmap_says_so() {
        let s = ChunkStates::new(10, C, |i| i % 3 == 0);
        assert_eq!(s.durable(), 4);
        assert_eq!(s.durable_bitmap(&[]), vec![0b0100_1001, 0b10]);
        assert_eq!(s.durable_bitmap(&[1]), vec![0b0100_1011, 0b10]);
        assert_eq!(s.span(9 * C, C), 9..=9);
        assert_eq!(asked(&s, 9 * C, C, Need::Durable), (Verdict::Go, vec![]));
    }
}
