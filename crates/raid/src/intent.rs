//! The write-intent map of a raid1: one state word per chunk of the data region, shared by the
//! channels (every write) and the owner (persisting bits, clearing them, rebuilding).
//!
//! Semantics (docs/raid.md, "Write-intent bitmap"; Linux md's bitmap is the anchor):
//! * a chunk's bit is durable on every in-sync base *before* any write to the chunk is
//!   submitted; a channel whose write finds the bit not yet durable parks the write until
//!   [`IntentMap::is_durable`] says so (the owner writes the bitmap pages, flushes, then
//!   advances the durable sequence);
//! * bits are cleared only by the owner, lazily (a chunk with no write in flight and none for
//!   a whole clearing period), and never while any slot is not Active: so after an outage the
//!   bits cover every write the returning replica missed;
//! * the same word carries the rebuild's interlock, as the mirror's does: writers in flight
//!   (count) and `COPYING`. A copy starts on a chunk only with no writer in it; a write that
//!   starts while a copy is in flight re-marks the chunk for copying when it ends.
//!
//! Memory order: a channel calls [`IntentMap::begin_write`] *before* it loads the layout for
//! that write (SeqCst), and the owner publishes a new rebuild target *before* its first
//! [`IntentMap::try_start_copy`]; so a write that did not see the target either holds the
//! chunk (the copy waits) or marks it again.
//!
//! (placeholder API: the meta helper fills in the bodies; signatures are the contract.)

/// A write's registration in the map, from `begin_write` to `end_write`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriteTicket {
    /// First and last chunk the write touches.
    pub first: u64,
    pub last: u64,
    /// The durable sequence the write must wait for before it is submitted; 0: none.
    pub wait_seq: u64,
    /// A copy was in flight on one of its chunks when it started: mark them again at the end.
    pub remark: bool,
}

/// The shared map. `Send + Sync`; every operation is lock free.
pub struct IntentMap {
    _private: (),
}

impl IntentMap {
    /// A map of `data_bytes` bytes in chunks of `chunk_bytes` (a power of two).
    /// `persistent`: bits must be durable before writes go (a raid with a superblock); without
    /// it bits are kept in memory only (still used for the rebuild interlock).
    pub fn new(data_bytes: u64, chunk_bytes: u64, persistent: bool) -> IntentMap {
        let _ = (data_bytes, chunk_bytes, persistent);
        todo!("meta helper")
    }

    /// Bytes per chunk.
    pub fn chunk_bytes(&self) -> u64 {
        todo!("meta helper")
    }

    /// Number of chunks.
    pub fn chunks(&self) -> u64 {
        todo!("meta helper")
    }

    /// Registers a write (or discard, write-zeroes) of `[offset, offset + len)` of the data
    /// region: counts it in its chunks, sets bits that are not set (asking the owner to persist
    /// them: the caller then calls [`crate::shared::RaidShared::wake_owner`] once per poll
    /// round when any ticket has `wait_seq != 0`).
    pub fn begin_write(&self, offset: u64, len: u64) -> WriteTicket {
        let _ = (offset, len);
        todo!("meta helper")
    }

    /// Whether a ticket's bits are durable, so its write may be submitted. One load.
    #[inline]
    pub fn is_durable(&self, ticket: &WriteTicket) -> bool {
        let _ = ticket;
        todo!("meta helper")
    }

    /// Ends a write registered by `begin_write` (after every base answered).
    pub fn end_write(&self, ticket: &WriteTicket) {
        let _ = ticket;
        todo!("meta helper")
    }
}
