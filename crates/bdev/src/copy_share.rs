//! The share rule of background copies (a mirror's copier, a raid's rebuild): how much a copy
//! may keep in flight beside the guest's I/O on the same device.
//!
//! A copy runs on a reactor next to the guests it serves; each request it keeps in flight costs
//! that reactor a round's work (with RAM-backed or fast devices, a memory copy of its length).
//! With no guest request in flight the copy uses its whole window, so an idle disk copies at
//! full speed. While guest requests are in flight it keeps at most a `weight` percent share of
//! the requests in flight, each no longer than its small unit (a chunk), and at least one, so it
//! always converges. The weight is the operator's; the default leaves the guest most rounds.
//! A copy polled every round ([`CopyBudget`]) counts the guest's completed bytes instead, and
//! charges its own bytes at what they cost the reactor ([`COPY_BYTE_COST`]).

/// The default weight: a fifth of the requests in flight (or of the core's work, for a
/// [`CopyBudget`]) while the guest has any (guest first). Chosen on the bench's raid1 full
/// rebuild beside a QD32 guest (one core, RAM disks, the load outlasting every copy): 20
/// left the guest 0.77 to 0.79 of its IOPS and gave the rebuild 0.26 to 0.28 of its idle
/// speed, 10 left the guest the same and the rebuild less, 40 took the guest to 0.65.
pub const DEFAULT_COPY_WEIGHT: u8 = 20;

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
/// the last one earn the copy `weight / (100 - weight)` as many bytes of credit, divided by
/// what a copied byte costs against a guest's ([`COPY_BYTE_COST`]), saved up to one copy
/// request's length; a copy request spends its length. When the credit has stayed short of a
/// request for [`FLOOR_ROUNDS`] rounds in a row it is raised to one (a guest request stuck on
/// its device would otherwise stop the copy for as long). With the guest idle there is no
/// limit: idle means [`QUIET_ROUNDS`] rounds in a row with nothing of the guest's in flight or
/// completed, as a guest that sleeps on its completions (a VM's virtio driver waiting for an
/// interrupt) leaves rounds without any between its batches.
#[derive(Debug)]
pub struct CopyBudget {
    credit: u64,
    /// Rounds in a row without guest bytes.
    quiet: u32,
    /// Rounds in a row with the credit short of a request.
    short: u64,
}

impl Default for CopyBudget {
    /// A copy that starts beside an idle guest runs at once.
    fn default() -> CopyBudget {
        CopyBudget { credit: 0, quiet: LONG_QUIET_ROUNDS, short: 0 }
    }
}

/// Rounds in a row without guest bytes after which the guest counts as idle: a few
/// milliseconds of a reactor's rounds, longer than a guest sleeping on its completions (or a
/// client starved of its CPU) takes between batches. 1024 let the copies flood those gaps:
/// the bench's mirror left its source 0.22x of its IOPS with it, 0.45x with this.
pub const QUIET_ROUNDS: u32 = 16384;

/// Rounds in a row without guest bytes after which a copy beside an idle guest also takes its
/// longest requests (a mirror's runs of 1 MiB); before, it keeps its whole window of requests
/// of one chunk each. A guest that comes back from a pause finds the copy's requests in flight
/// ahead of its own: 16 runs of 1 MiB are 10 to 20 ms of a core's memory copies, 16 chunks of
/// 64 KiB a millisecond. The bench's guest (a QD32 client on a core shared with other work)
/// paused long enough to be taken for idle often: a rebuild beside it started half its bytes
/// with no limit (`rebuild_bytes_unshared`), and the mirror's 1 MiB runs left the guest 0.24 to
/// 0.42 of its IOPS.
pub const LONG_QUIET_ROUNDS: u32 = 16 * QUIET_ROUNDS;

/// Beside a busy guest the copy gets one request's length of credit after so many rounds in
/// a row short of one, whatever the guest completes: it always progresses, a little. A floor
/// that accrued a share of a request every round instead paid the copy by the reactor's
/// rounds, and a reactor with a copy in flight turns 1.3 to 1.8 million rounds a second: the
/// bench's rebuild beside a QD32 guest took 90 MB/s from it, as much as its share, whatever
/// the weight (3 % and 10 % left the same pair).
pub const FLOOR_ROUNDS: u64 = 1024;

/// What a copied byte costs the reactor, in bytes of the guest's requests: the copy's credit
/// is the guest's bytes divided by this, so that the weight shares the core, not the bytes.
/// A copied byte is read into a buffer and written out (with RAM devices two memory copies,
/// and on a new target the page it lands on), a guest's byte once; the bench's full copies
/// and rebuilds of RAM disks measured 0.9 to 1.9 reactor-busy ns per byte against 0.25 to 0.6
/// for the guest's 4 KiB reads (1.0 to 2.6 µs per request), 2.0 to 3.6 times, 3 at the median.
pub const COPY_BYTE_COST: u64 = 3;

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
            self.short = 0;
            return None;
        }
        let w = u64::from(share.weight);
        let earned = guest.completed.saturating_mul(w) / (100 - w) / COPY_BYTE_COST;
        // What was saved is capped before this round's earnings, so none of them is lost.
        self.credit = self.credit.min(cap).saturating_add(earned);
        if self.credit >= cap {
            self.short = 0;
        } else {
            self.short += 1;
            if self.short >= FLOOR_ROUNDS {
                self.credit = cap;
                self.short = 0;
            }
        }
        Some(self.credit)
    }

    /// Whether the copy may take its longest requests: the guest idle for
    /// [`LONG_QUIET_ROUNDS`] rounds (a copy that starts beside an idle guest may at once), or a
    /// weight of 100.
    pub fn long_requests(&self, share: CopyShare) -> bool {
        self.quiet >= LONG_QUIET_ROUNDS || share.weight >= MAX_COPY_WEIGHT
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
        let s = CopyShare::new(10).unwrap();
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
        let s = CopyShare::new(10).unwrap();
        let idle = GuestBytes::default();
        let done = |completed| GuestBytes { completed, in_flight: 0 };
        assert_eq!(b.round(s, idle, 65536), None, "starting beside an idle guest: no limit");
        assert!(b.round(s, done(4096), 65536).is_some(), "the guest wakes");
        for _ in 1..QUIET_ROUNDS {
            assert!(b.round(s, idle, 65536).is_some(), "a pause between the guest's batches");
        }
        assert_eq!(b.round(s, idle, 65536), None, "an idle guest: no limit");
        b.spend(65536);
        // Requests in flight and none completing: busy, and only the floor given, one
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
        // 128 KiB of guest I/O completed per round at 10 %, a copied byte costing three of the
        // guest's: 4854 bytes of credit per round.
        let mut started = 0;
        for _ in 0..90 {
            let credit = b.round(s, done(128 << 10), 65536).unwrap();
            if credit >= 65536 {
                b.spend(65536);
                started += 1;
            }
        }
        // 90 rounds earn 437 KB: 6 requests of 64 KiB and most of a 7th (a tenth of the
        // guest's 11.8 MB in cost, a third of that in bytes).
        assert_eq!(started, 6);
        assert_eq!(b.round(CopyShare::new(100).unwrap(), done(128 << 10), 65536), None);
    }

    /// A guest completing 4 KiB in one round of every 64 (as a QD32 guest beside a fast
    /// reactor does: most rounds complete nothing) earns the copy its share of those bytes at
    /// their cost, and the floor adds nothing while the share keeps the copy going: the copy's
    /// bytes are within one request of `weight / (100 - weight)` of the guest's, divided by
    /// `COPY_BYTE_COST`.
    #[test]
    fn beside_a_guest_completing_in_few_rounds_the_copy_keeps_to_its_share_of_the_cost() {
        const CAP: u64 = 65536;
        const ROUNDS: u64 = 64 * 4096;
        let mut b = CopyBudget::default();
        let s = CopyShare::default();
        let mut copied = 0;
        let mut guest = 0;
        for r in 0..ROUNDS {
            let completed = if r % 64 == 0 { 32 * 4096 } else { 0 };
            guest += completed;
            if b.round(s, GuestBytes { completed, in_flight: 32 * 4096 }, CAP).unwrap() >= CAP {
                b.spend(CAP);
                copied += CAP;
            }
        }
        let w = u64::from(DEFAULT_COPY_WEIGHT);
        let share = guest * w / (100 - w) / COPY_BYTE_COST;
        assert!(copied <= share + CAP, "copied {copied} bytes beside {guest} of the guest's: share {share}");
        assert!(copied + CAP >= share, "copied {copied} bytes, short of the share {share}");
    }

    /// A guest with requests in flight that complete nothing: the floor gives the copy one
    /// request every `FLOOR_ROUNDS` rounds, no more.
    #[test]
    fn beside_a_stuck_guest_the_floor_gives_one_request_per_floor_rounds() {
        const CAP: u64 = 65536;
        let mut b = CopyBudget::default();
        let s = CopyShare::default();
        let waiting = GuestBytes { completed: 0, in_flight: 4096 };
        let mut started = 0;
        for _ in 0..10 * FLOOR_ROUNDS {
            if b.round(s, waiting, CAP).unwrap() >= CAP {
                b.spend(CAP);
                started += 1;
            }
        }
        assert_eq!(started, 10);
    }

    /// Idle after `QUIET_ROUNDS` rounds (no limit), long idle after `LONG_QUIET_ROUNDS`; any
    /// guest I/O ends both. A weight of 100 always takes the longest requests.
    #[test]
    fn a_guest_idle_for_long_quiet_rounds_leaves_the_copy_its_longest_requests() {
        let mut b = CopyBudget::default();
        let s = CopyShare::default();
        let idle = GuestBytes::default();
        assert!(b.long_requests(s), "a copy starting beside an idle guest");
        assert!(b.round(s, GuestBytes { completed: 4096, in_flight: 0 }, 65536).is_some());
        assert!(!b.long_requests(s));
        assert!(b.long_requests(CopyShare::new(100).unwrap()), "a weight of 100");
        for _ in 0..QUIET_ROUNDS {
            b.round(s, idle, 65536);
        }
        assert_eq!(b.round(s, idle, 65536), None, "idle: no limit");
        assert!(!b.long_requests(s), "idle, not yet for long");
        for _ in QUIET_ROUNDS + 2..LONG_QUIET_ROUNDS {
            assert_eq!(b.round(s, idle, 65536), None);
            assert!(!b.long_requests(s));
        }
        assert_eq!(b.round(s, idle, 65536), None);
        assert!(b.long_requests(s), "idle for LONG_QUIET_ROUNDS rounds");
        b.round(s, GuestBytes { completed: 0, in_flight: 4096 }, 65536);
        assert!(!b.long_requests(s), "a request in flight ends it");
    }

    #[test]
    fn weights_outside_one_to_a_hundred_are_refused() {
        assert_eq!(CopyShare::new(0), Err(CopyWeightError(0)));
        assert_eq!(CopyShare::new(101), Err(CopyWeightError(101)));
        assert_eq!(CopyShare::new(1 << 40), Err(CopyWeightError(1 << 40)));
        assert_eq!(CopyShare::new(100).unwrap().weight(), 100);
    }
}
