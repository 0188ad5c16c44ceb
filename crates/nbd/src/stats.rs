//! What an NBD export counts: requests by command, bytes moved, errors answered. Each
//! connection's reactor keeps its counts locally and publishes them once per busy round into
//! the connection's atomics (one writer: plain relaxed stores); the control plane sums the
//! live connections and those already closed (`export.rs`), so nothing on the data path
//! shares a cache line with another connection.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crate::proto::*;

/// How many counters an export keeps.
pub const COUNTERS: usize = 10;

/// The counters' names, as `nbd_get_disks` reports them.
pub const COUNTER_NAMES: [&str; COUNTERS] = [
    "read_ops",
    "write_ops",
    "flush_ops",
    "trim_ops",
    "write_zeroes_ops",
    "cache_ops",
    "block_status_ops",
    "bytes_read",
    "bytes_written",
    "errors",
];

const BYTES_READ: usize = 7;
const BYTES_WRITTEN: usize = 8;
const ERRORS: usize = 9;

/// An export's (or a connection's) counters, in the order of [`COUNTER_NAMES`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NbdStats(pub [u64; COUNTERS]);

impl NbdStats {
    /// Counts a request answered: its command, the bytes it moved (reads and writes that
    /// succeeded) and whether it failed (`err` is the NBD error sent, 0 for success).
    pub(crate) fn count(&mut self, command: u16, length: u32, err: u32) {
        let op = match command {
            CMD_READ => 0,
            CMD_WRITE => 1,
            CMD_FLUSH => 2,
            CMD_TRIM => 3,
            CMD_WRITE_ZEROES => 4,
            CMD_CACHE => 5,
            CMD_BLOCK_STATUS => 6,
            // Unknown commands are refused: counted as errors only.
            _ => {
                self.0[ERRORS] += 1;
                return;
            }
        };
        self.0[op] += 1;
        match (command, err) {
            (_, 1..) => self.0[ERRORS] += 1,
            (CMD_READ, 0) => self.0[BYTES_READ] += u64::from(length),
            (CMD_WRITE, 0) => self.0[BYTES_WRITTEN] += u64::from(length),
            _ => {}
        }
    }

    pub(crate) fn add(&mut self, other: &NbdStats) {
        for (a, b) in self.0.iter_mut().zip(other.0) {
            *a += b;
        }
    }

    /// Name and value of each counter.
    pub fn named(&self) -> impl Iterator<Item = (&'static str, u64)> + '_ {
        COUNTER_NAMES.iter().copied().zip(self.0)
    }
}

/// One connection's published counters, and whether it still runs.
#[derive(Debug, Default)]
pub(crate) struct ConnStats {
    values: [AtomicU64; COUNTERS],
    /// Cleared, with the counts folded into the export's closed total, when it ends.
    pub(crate) alive: AtomicBool,
}

impl ConnStats {
    pub(crate) fn new() -> ConnStats {
        ConnStats { alive: AtomicBool::new(true), ..ConnStats::default() }
    }

    /// Stores `s` (single writer: the connection's reactor).
    pub(crate) fn publish(&self, s: &NbdStats) {
        for (cell, v) in self.values.iter().zip(s.0) {
            cell.store(v, Ordering::Relaxed);
        }
    }

    pub(crate) fn load(&self) -> NbdStats {
        NbdStats(std::array::from_fn(|i| self.values[i].load(Ordering::Relaxed)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_command_counts_in_its_own_place() {
        let mut s = NbdStats::default();
        s.count(CMD_READ, 4096, 0);
        s.count(CMD_READ, 512, EIO);
        s.count(CMD_WRITE, 8192, 0);
        s.count(CMD_FLUSH, 0, 0);
        s.count(CMD_TRIM, 1 << 20, 0);
        s.count(CMD_WRITE_ZEROES, 1 << 20, 0);
        s.count(CMD_CACHE, 4096, 0);
        s.count(CMD_BLOCK_STATUS, 4096, 0);
        s.count(42, 0, EINVAL);
        let named: Vec<(&str, u64)> = s.named().collect();
        assert_eq!(
            named,
            [
                ("read_ops", 2),
                ("write_ops", 1),
                ("flush_ops", 1),
                ("trim_ops", 1),
                ("write_zeroes_ops", 1),
                ("cache_ops", 1),
                ("block_status_ops", 1),
                ("bytes_read", 4096),
                ("bytes_written", 8192),
                ("errors", 2),
            ]
        );
        let c = ConnStats::new();
        c.publish(&s);
        let mut total = c.load();
        total.add(&s);
        assert_eq!(total.0[BYTES_WRITTEN], 16384);
    }
}
