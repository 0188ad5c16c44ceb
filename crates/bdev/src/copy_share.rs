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

/// What a copy sees of the guest's I/O at one of its rounds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GuestBytes {
    /// Bytes of the guest's requests completed since the copy's last round: a rate, what
    /// earns the copy its share.
    pub completed: u64,
    /// Bytes of the guest's requests in flight at its channels' last polls: a level. A guest
    /// waiting on its device is busy, not idle, but its waiting requests earn nothing: counted
    /// again every round they would earn the copy credit at the rate of the rounds, not of the
    /// guest (a mirror beside a guest whose writes waited on an NBD target copied at full
    /// speed and left it 0.12x of its IOPS).
    pub in_flight: u64,
}

impl GuestBytes {
    /// Whether the guest has I/O completing or in flight.
    pub fn active(self) -> bool {
        self.completed > 0 || self.in_flight > 0
    }

    /// The larger of the two, for a window of requests in flight ([`CopyShare::window`]).
    pub fn window_bytes(self) -> u64 {
        self.completed.max(self.in_flight)
    }
}

/// A copy's bytes per round beside the guest, for a copy polled every round of a reactor (the
/// mirror's copier, a raid's rebuild runner): each round the bytes the guest completed since
/// the last one earn the copy `weight / (100 - weight)` as many bytes of credit, saved up to
/// one copy request's length, and at least one request's length every [`FLOOR_ROUNDS`] rounds
/// (a guest request stuck on its device would otherwise stop the copy for as long); a copy
/// request spends its length. With the guest idle there is
/// no limit: idle means [`QUIET_ROUNDS`] rounds in a row with nothing of the guest's in
/// flight or completed, as a guest that sleeps on its completions (a VM's virtio driver
/// waiting for an interrupt) leaves rounds without any between its batches.
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

/// Beside a busy guest the copy earns at least one request's length every so many rounds,
/// whatever the guest completes: it always progresses, a little.
pub const FLOOR_ROUNDS: u64 = 1024;

impl CopyBudget {
    /// A new round beside `guest_bytes`: the bytes the copy may start now, `None` for no limit
    /// (no guest I/O, or a weight of 100). `cap`: the longest copy request.
    pub fn round(&mut self, share: CopyShare, guest: GuestBytes, cap: u64) -> Option<u64> {
        if !guest.active() {
            self.quiet = self.quiet.saturating_add(1);
        } else {
            self.quiet = 0;
        }
        if self.quiet >= QUIET_ROUNDS || share.weight >= MAX_COPY_WEIGHT {
            self.credit = cap;
            return None;
        }
        let w = u64::from(share.weight);
        let earned = (guest.completed.saturating_mul(w) / (100 - w)).max(cap / FLOOR_ROUNDS);
        // What was saved is capped before this round's earnings, so none of them is lost.
        self.credit = self.credit.min(cap).saturating_add(earned);
        Some(self.credit)
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
    fn the_budget_earns_the_share_of_the_bytes_the_guest_completed_per_round_up_to_one_request() {
        let mut b = CopyBudget::default();
        let s = CopyShare::default();
        let idle = GuestBytes::default();
        let done = |completed| GuestBytes { completed, in_flight: 0 };
        assert_eq!(b.round(s, idle, 65536), None, "starting beside an idle guest: no limit");
        assert!(b.round(s, done(4096), 65536).is_some(), "the guest wakes");
        for _ in 1..QUIET_ROUNDS {
            assert!(b.round(s, idle, 65536).is_some(), "a pause between the guest's batches");
        }
        assert_eq!(b.round(s, idle, 65536), None, "an idle guest: no limit");
        b.spend(65536);
        // Requests in flight and none completing: busy, and only the floor earned, one
        // request every FLOOR_ROUNDS rounds, however many rounds they wait.
        let waiting = GuestBytes { completed: 0, in_flight: 128 << 10 };
        let mut started = 0;
        for _ in 0..4 * FLOOR_ROUNDS {
            if b.round(s, waiting, 65536).unwrap() >= 65536 {
                b.spend(65536);
                started += 1;
            }
        }
        assert_eq!(started, 4, "waiting requests earn the floor alone");
        // 128 KiB of guest I/O completed per round at 10 %: 14563 bytes of credit per round.
        let mut started = 0;
        for _ in 0..90 {
            let credit = b.round(s, done(128 << 10), 65536).unwrap();
            if credit >= 65536 {
                b.spend(65536);
                started += 1;
            }
        }
        // 90 rounds earn 1.31 MB: 19 requests of 64 KiB and most of a 20th (a tenth of the
        // bytes beside the guest's 11.8 MB; the floor is less than the share here).
        assert_eq!(started, 19);
        assert_eq!(b.round(CopyShare::new(100).unwrap(), done(128 << 10), 65536), None);
    }

    #[test]
    fn weights_outside_one_to_a_hundred_are_refused() {
        assert_eq!(CopyShare::new(0), Err(CopyWeightError(0)));
        assert_eq!(CopyShare::new(101), Err(CopyWeightError(101)));
        assert_eq!(CopyShare::new(1 << 40), Err(CopyWeightError(1 << 40)));
        assert_eq!(CopyShare::new(100).unwrap().weight(), 100);
    }
}
