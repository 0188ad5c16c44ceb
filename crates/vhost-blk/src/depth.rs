//! The driver's queue depth, estimated from what it has out (or, on a packed ring, from the
//! request heads it uses), which sizes the first part of a round (docs/architecture.md,
//! "Guest notifications").
//!
//! The first part exists so that a waiting driver's wake-up overlaps our work on the rest of
//! its batch. How much of the batch that should be depends on the driver's depth: at QD 32 a
//! first part of 8 signals more often than the driver can use, and 16 of 32 gives it as much
//! overlap with fewer signals. Below 8 the first part stays 8: a smaller one gained IOPS for
//! one interrupt-driven driver at QD 4–12 but doubled the signals of 16 VMs at QD 8 on one
//! reactor, where the other queues' work already overlaps each driver's wake-up, and cost that
//! case 28 % of its IOPS (docs/bench/history.md). A driver never says its depth, but a split
//! ring counts what it has out: the available index less the used index published. Read
//! before a round publishes anything, that count is the driver's depth whenever it had every
//! request out when the index was read, which a driver at its depth does round after round:
//! the largest count over a window of rounds is the depth it runs at. A packed ring has no
//! index to count with; there the depth shows in the heads the driver uses, since it reuses
//! the heads of completed requests (a fixed slot per request, as fp-load, or the last freed
//! descriptor first, as Linux): the number of distinct heads over the window.

/// When the driver waits for its next completion, the first part of a new batch is taken,
/// completed as far as the back-end can at once, published and signalled before the rest (see
/// the queue's `poll`): the driver's wake-up then overlaps our work on the rest. Its size is half the
/// driver's depth ([`DriverDepth`]), from this many to `MAX_FIRST_PART`; this many until a
/// window of rounds has shown the depth.
pub(crate) const FIRST_SIGNAL_BATCH: usize = 8;
/// The largest first part, half of QD 32: deeper drivers gained nothing from more (QD 64 at
/// the host's slow speed, docs/bench/history.md).
pub(crate) const MAX_FIRST_PART: usize = 16;

/// Rounds that took two requests or more, over which the gauge gathers before the estimate is
/// renewed: with at least 128 requests in a window, a driver at QD 32 shows every head it uses
/// whatever order it takes them in, and has all its requests out at some round's start.
/// Rounds of one request are not counted: at QD 1 the estimate is never needed (a batch of one
/// is one part).
const WINDOW_ROUNDS: u32 = 64;

/// The gauge over the current window: the most requests the split ring counted out at the
/// end of a round's taking, and the heads a packed ring's driver used, folded into 64 flags
/// (head mod 64; two heads that share a flag count once, so at depths near 64 the estimate is
/// low, which only matters below 2 × `MAX_FIRST_PART`). The split ring's count costs a few
/// instructions a round, not a store per request: under callgrind at QD32, where a round
/// takes about 29 requests, the head flags cost 3 instructions per I/O (docs/bench/history.md).
pub(crate) struct DriverDepth {
    most_out: u16,
    heads: [u8; 64],
    rounds: u32,
    first_part: usize,
}

impl Default for DriverDepth {
    fn default() -> Self {
        DriverDepth { most_out: 0, heads: [0; 64], rounds: 0, first_part: FIRST_SIGNAL_BATCH }
    }
}

impl DriverDepth {
    /// Notes a head taken from a packed ring.
    #[inline(always)]
    pub(crate) fn saw(&mut self, head: u16) {
        self.heads[usize::from(head & 63)] = 1;
    }

    /// Ends a round that took `took` requests, `outstanding` giving what the split ring counts
    /// out before the round publishes anything (0 for a packed ring); renews the estimate once
    /// a window is full. Rounds of one request are not counted: at QD 1 the estimate is never
    /// needed (a batch of one is one part), and the count is not asked for.
    #[inline(always)]
    pub(crate) fn end_round(&mut self, took: usize, outstanding: impl FnOnce() -> u16) {
        if took >= 2 {
            self.most_out = self.most_out.max(outstanding());
            self.rounds += 1;
            if self.rounds == WINDOW_ROUNDS {
                self.renew();
            }
        }
    }

    #[cold]
    fn renew(&mut self) {
        let heads: usize = self.heads.iter().map(|&h| usize::from(h)).sum();
        let depth = heads.max(usize::from(self.most_out));
        self.first_part = (depth / 2).clamp(FIRST_SIGNAL_BATCH, MAX_FIRST_PART);
        (self.most_out, self.heads, self.rounds) = (0, [0; 64], 0);
    }

    /// How many requests a round's first part takes when the driver waits: half the depth
    /// last estimated, from `FIRST_SIGNAL_BATCH` to `MAX_FIRST_PART`; `FIRST_SIGNAL_BATCH`
    /// until a window is full.
    #[inline(always)]
    pub(crate) fn first_part(&self) -> usize {
        self.first_part
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `rounds` rounds of `batch` requests from a packed ring, with heads `3 * i` for i in
    /// 0..depth in turn (three descriptors a request, a fixed slot each, as fp-load).
    fn run(d: &mut DriverDepth, depth: u16, batch: usize, rounds: u32) {
        let mut next = 0u16;
        for _ in 0..rounds {
            for _ in 0..batch {
                d.saw(3 * next);
                next = (next + 1) % depth;
            }
            d.end_round(batch, || 0);
        }
    }

    /// `rounds` rounds of `batch` requests from a split ring whose driver runs at `depth`: it
    /// has all its requests out at every fourth round's end of taking, and `batch` at the others
    /// (it was still reaping the last completions).
    fn run_split(d: &mut DriverDepth, depth: u16, batch: usize, rounds: u32) {
        for r in 0..rounds {
            d.end_round(batch, || if r % 4 == 3 { depth } else { batch as u16 });
        }
    }

    #[test]
    fn half_the_depth_once_a_window_is_full() {
        for (depth, batch, want) in
            [(8, 8, 8), (16, 5, 8), (20, 3, 10), (24, 7, 12), (32, 9, 16), (64, 20, 16)]
        {
            for split in [false, true] {
                let mut d = DriverDepth::default();
                let run = if split { run_split } else { run };
                run(&mut d, depth, batch, WINDOW_ROUNDS - 1);
                assert_eq!(
                    d.first_part(),
                    FIRST_SIGNAL_BATCH,
                    "depth {depth}: not before the window is full"
                );
                run(&mut d, depth, batch, 1);
                assert_eq!(d.first_part(), want, "depth {depth}, {batch} a round, split {split}");
            }
        }
    }

    #[test]
    fn a_shallow_driver_keeps_the_default_and_rounds_of_one_do_not_count() {
        for split in [false, true] {
            let run = if split { run_split } else { run };
            let mut d = DriverDepth::default();
            run(&mut d, 4, 4, WINDOW_ROUNDS);
            assert_eq!(d.first_part(), FIRST_SIGNAL_BATCH);
            let mut d = DriverDepth::default();
            run(&mut d, 16, 1, 10 * WINDOW_ROUNDS);
            assert_eq!(d.first_part(), FIRST_SIGNAL_BATCH, "QD 1 rounds never renew it");
        }
        // Nor is the split ring asked for its count in them.
        let mut d = DriverDepth::default();
        d.end_round(1, || unreachable!("a round of one request asks for no count"));
        d.end_round(0, || unreachable!("an empty round asks for no count"));
    }

    #[test]
    fn each_window_starts_afresh_so_a_driver_that_goes_shallower_is_followed() {
        for split in [false, true] {
            let run = if split { run_split } else { run };
            let mut d = DriverDepth::default();
            run(&mut d, 32, 8, WINDOW_ROUNDS);
            assert_eq!(d.first_part(), 16);
            run(&mut d, 24, 8, WINDOW_ROUNDS);
            assert_eq!(d.first_part(), 12);
            run(&mut d, 8, 8, WINDOW_ROUNDS);
            assert_eq!(d.first_part(), FIRST_SIGNAL_BATCH);
        }
    }
}
