//! The share rule of background copies (a mirror's copier, a raid's rebuild): how much a copy
//! may keep in flight beside the guest's I/O on the same device.
//!
//! A copy runs on a reactor next to the guests it serves; each request it keeps in flight costs
//! that reactor a round's work (with RAM-backed or fast devices, a memory copy of its length).
//! With no guest request in flight the copy uses its whole window, so an idle disk copies at
//! full speed. While guest requests are in flight it keeps at most a `weight` percent share of
//! the requests in flight, each no longer than its small unit (a chunk), and at least one, so it
//! always converges. The weight is the operator's; the default leaves the guest most rounds.

/// The default weight: a tenth of the requests in flight while the guest has any (guest first).
pub const DEFAULT_COPY_WEIGHT: u8 = 10;

/// The largest weight: the copy takes its whole window whatever the guest does.
pub const MAX_COPY_WEIGHT: u8 = 100;

/// A weight outside 1 to 100.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the copy weight {0} is out of range: 1 to 100 (percent of the requests in flight the copy may keep while the guest has some)")]
pub struct CopyWeightError(pub u64);

/// How many requests of how many bytes a copy may keep in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CopyWindow {
    /// Requests in flight at most.
    pub requests: usize,
    /// Bytes per request at most.
    pub request_bytes: u64,
}

/// A copy's share of its device beside guest I/O (see the module's description).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CopyShare {
    weight: u8,
}

impl Default for CopyShare {
    fn default() -> CopyShare {
        CopyShare { weight: DEFAULT_COPY_WEIGHT }
    }
}

impl CopyShare {
    /// A share of `weight` percent (1 to 100).
    pub fn new(weight: u64) -> Result<CopyShare, CopyWeightError> {
        match u8::try_from(weight) {
            Ok(w @ 1..=MAX_COPY_WEIGHT) => Ok(CopyShare { weight: w }),
            _ => Err(CopyWeightError(weight)),
        }
    }

    /// The weight, in percent.
    pub fn weight(self) -> u8 {
        self.weight
    }

    /// What the copy may keep in flight now: `full` with no guest request in flight (or a weight
    /// of 100), else its share of the requests in flight beside the `guest_in_flight` guest
    /// ones (at least one), each at most `unit` bytes.
    pub fn window(self, full: CopyWindow, unit: u64, guest_in_flight: u64) -> CopyWindow {
        if guest_in_flight == 0 || self.weight >= MAX_COPY_WEIGHT {
            return full;
        }
        let w = u64::from(self.weight);
        // copy / (copy + guest) <= w / 100, so copy <= guest * w / (100 - w).
        let share = guest_in_flight.saturating_mul(w) / (100 - w);
        CopyWindow {
            requests: (share.max(1).min(full.requests as u64) as usize).max(1),
            request_bytes: unit.clamp(1, full.request_bytes.max(1)),
        }
    }
}

/// A copy's bytes per round beside the guest, for a copy polled every round of a reactor (the
/// mirror's copier, a raid's rebuild runner): each round the guest's bytes (its requests in
/// flight, or completed since the last round) earn the copy `weight / (100 - weight)` as many
/// bytes of credit, saved up to one copy request's length so that the copy always progresses
/// (one request every few rounds beside a busy guest); a copy request spends its length. With
/// the guest idle there is no limit: idle means [`QUIET_ROUNDS`] rounds in a row without guest
/// bytes, as a guest that sleeps on its completions (a VM's virtio driver waiting for an
/// interrupt) leaves rounds without any between its batches.
#[derive(Debug)]
pub struct CopyBudget {
    credit: u64,
    /// Rounds in a row without guest bytes.
    quiet: u32,
}

impl Default for CopyBudget {
    /// A copy that starts beside an idle guest runs at once.
    fn default() -> CopyBudget {
        CopyBudget { credit: 0, quiet: QUIET_ROUNDS }
    }
}

/// Rounds in a row without guest bytes after which the guest counts as idle: a few
/// milliseconds of a reactor's rounds, longer than a guest sleeping on its completions (or a
/// client starved of its CPU) takes between batches. 1024 let the copies flood those gaps:
/// the bench's mirror left its source 0.22x of its IOPS with it, 0.45x with this.
pub const QUIET_ROUNDS: u32 = 16384;

impl CopyBudget {
    /// A new round beside `guest_bytes`: the bytes the copy may start now, `None` for no limit
    /// (no guest I/O, or a weight of 100). `cap`: the longest copy request.
    pub fn round(&mut self, share: CopyShare, guest_bytes: u64, cap: u64) -> Option<u64> {
        if guest_bytes == 0 {
            self.quiet = self.quiet.saturating_add(1);
        } else {
            self.quiet = 0;
        }
        if self.quiet >= QUIET_ROUNDS || share.weight >= MAX_COPY_WEIGHT {
            self.credit = cap;
            return None;
        }
        let w = u64::from(share.weight);
        let earned = guest_bytes.saturating_mul(w) / (100 - w);
        // What was saved is capped before this round's earnings, so none of them is lost.
        self.credit = self.credit.min(cap).saturating_add(earned);
        Some(self.credit)
    }

    /// Credit earned outright, beside the share: a mirror earns the chunks the guest dirtied
    /// since its last round, so that it never falls behind and still converges.
    pub fn earn(&mut self, bytes: u64) {
        self.credit = self.credit.saturating_add(bytes);
    }

    /// The copy started `bytes`.
    pub fn spend(&mut self, bytes: u64) {
        self.credit = self.credit.saturating_sub(bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FULL: CopyWindow = CopyWindow { requests: 16, request_bytes: 1 << 20 };

    #[test]
    fn an_idle_guest_leaves_the_copy_its_whole_window() {
        for w in [1, 10, 50, 100] {
            assert_eq!(CopyShare::new(w).unwrap().window(FULL, 65536, 0), FULL);
        }
    }

    #[test]
    fn a_busy_guest_keeps_the_copy_to_its_share_but_never_to_nothing() {
        let s = CopyShare::default();
        // 32 guest requests at 10 %: 3 copies (3 / 35 < 10 %), of one unit each.
        assert_eq!(s.window(FULL, 65536, 32), CopyWindow { requests: 3, request_bytes: 65536 });
        // One guest request still leaves the copy one.
        assert_eq!(s.window(FULL, 65536, 1).requests, 1);
        // Half: as many as the guest, up to the window.
        let half = CopyShare::new(50).unwrap();
        assert_eq!(half.window(FULL, 65536, 8).requests, 8);
        assert_eq!(half.window(FULL, 65536, 1000).requests, 16);
        assert_eq!(CopyShare::new(100).unwrap().window(FULL, 65536, 32), FULL);
        // A unit larger than the window's requests is cut to them.
        assert_eq!(s.window(FULL, 4 << 20, 32).request_bytes, 1 << 20);
    }

    #[test]
    fn the_budget_earns_the_share_of_the_guest_bytes_per_round_up_to_one_request() {
        let mut b = CopyBudget::default();
        let s = CopyShare::default();
        assert_eq!(b.round(s, 0, 65536), None, "starting beside an idle guest: no limit");
        assert!(b.round(s, 4096, 65536).is_some(), "the guest wakes");
        for _ in 1..QUIET_ROUNDS {
            assert!(b.round(s, 0, 65536).is_some(), "a pause between the guest's batches");
        }
        assert_eq!(b.round(s, 0, 65536), None, "an idle guest: no limit");
        b.spend(65536);
        // 128 KiB of guest I/O per round at 10 %: 14563 bytes of credit per round.
        let mut started = 0;
        for _ in 0..90 {
            let credit = b.round(s, 128 << 10, 65536).unwrap();
            if credit >= 65536 {
                b.spend(65536);
                started += 1;
            }
        }
        // 90 rounds earn 1.31 MB: 19 requests of 64 KiB and most of a 20th (a tenth of the
        // bytes beside the guest's 11.8 MB).
        assert_eq!(started, 19);
        assert_eq!(b.round(CopyShare::new(100).unwrap(), 128 << 10, 65536), None);
    }

    #[test]
    fn weights_outside_one_to_a_hundred_are_refused() {
        assert_eq!(CopyShare::new(0), Err(CopyWeightError(0)));
        assert_eq!(CopyShare::new(101), Err(CopyWeightError(101)));
        assert_eq!(CopyShare::new(1 << 40), Err(CopyWeightError(1 << 40)));
        assert_eq!(CopyShare::new(100).unwrap().weight(), 100);
    }
}
