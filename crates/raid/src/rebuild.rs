//! The copier: brings one or more bases in line with a source base, chunk by chunk, beside
//! guest writes. The owner thread drives it one window per step (between steps it persists
//! bitmap bits and serves control calls, so guests never wait behind a whole rebuild).
//!
//! * partial rebuild: only chunks whose intent bit is set (the writes the base missed);
//! * full rebuild: every chunk (a new or unknown base);
//! * resync after an unclean stop: the set chunks, from the lowest Active base to the others.
//!
//! Each chunk goes through the intent map's interlock: claimed only with no write in flight
//! ([`IntentMap::try_start_copy`]), skipped and retried while busy, copied again when a write
//! overlapped the copy. The checkpoint (the offset below which everything is copied) is what
//! the owner persists, so a restarted daemon resumes instead of starting over.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fp_bdev::copy_share::{CopyShare, CopyWindow};
use fp_bdev::AlignedBuf;

use crate::intent::IntentMap;
use crate::meta_io::BaseIo;
use crate::rebuild_io::{CopyLink, CopyOrder};

/// What a process copies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProcessKind {
    /// The bitmap's chunks, to a returning base.
    Partial,
    /// Everything, to a new base.
    Full,
    /// The bitmap's chunks, across the in-sync bases after an unclean stop.
    Resync,
}

impl ProcessKind {
    /// The code in [`crate::shared::ProcessStats::kind`].
    pub fn code(self) -> u64 {
        match self {
            ProcessKind::Partial => 1,
            ProcessKind::Full => 2,
            ProcessKind::Resync => 3,
        }
    }
}

/// The bases by slot, as the copier reaches them.
pub trait SlotIo {
    /// The base in `slot`, if there is one.
    fn slot_io(&mut self, slot: usize) -> Option<&mut dyn BaseIo>;
}

impl SlotIo for Vec<Option<Box<dyn BaseIo>>> {
    fn slot_io(&mut self, slot: usize) -> Option<&mut dyn BaseIo> {
        match self.get_mut(slot) {
            Some(Some(b)) => Some(b.as_mut()),
            _ => None,
        }
    }
}

/// What acting on one chunk did: `Some(n)` counted `n` against the step's budget, `None` the
/// chunk was busy; `Err((slot, errno))` a base failed.
type ChunkOutcome = Result<Option<u64>, (usize, i32)>;

/// What one step did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Copied (or skipped) some chunks; more to do.
    Working,
    /// Waiting for the speed limit until then.
    Throttled(Instant),
    /// Every chunk is copied and none is marked for a re-copy.
    Done,
    /// A base failed (`slot`, errno): the owner takes it out and decides what follows.
    Failed { slot: usize, errno: i32 },
    /// Orders are in flight on the runner and nothing else can start: the runner wakes the
    /// owner when one comes back.
    Waiting,
}

/// Where the copier's bytes go and how fast.
#[derive(Debug, Clone, Copy)]
pub struct CopyGeometry {
    /// Where data starts on every base.
    pub data_offset: u64,
    /// The data region's size.
    pub data_bytes: u64,
    /// Bytes copied per step at most (`process_window_size_kb`).
    pub window_bytes: u64,
    /// `process_max_bandwidth_mb_sec`; 0: no limit.
    pub max_mb_sec: u64,
    /// The copy's share beside the guest's requests (`process_weight`).
    pub share: CopyShare,
}

/// One running process.
pub struct Copier {
    pub kind: ProcessKind,
    pub source: usize,
    pub targets: Vec<usize>,
    geo: CopyGeometry,
    chunk_bytes: u64,
    chunks: u64,
    /// Next chunk the first pass looks at.
    cursor: u64,
    /// Full: the first chunk copied whatever the bitmap says (a resumed rebuild's checkpoint);
    /// below it only the bitmap's chunks, when the pass starts below it at all
    /// ([`Copier::catch_up_below_start`]).
    full_from: u64,
    /// Chunks below the cursor skipped because a write was in flight.
    retry: Vec<u64>,
    /// Bytes per request this step (the buffer, or one unit beside guest I/O).
    piece: u64,
    buf: AlignedBuf,
    /// Bytes copied, and since when (the speed limit).
    copied: u64,
    started: Instant,
    /// The runner the copies go to, when they run on a reactor ([`Copier::run_on`]).
    link: Option<Arc<CopyLink>>,
    /// Its buffers: orders in flight at most.
    runner_slots: usize,
    /// Chunks sent to the runner and not back yet (claimed: they hold the checkpoint).
    pub(crate) ordered: BTreeSet<u64>,
    /// A failure the runner sent back.
    failed: Option<(usize, i32)>,
}

/// Chunks the first pass looks at per step at most, copied or not (a partial rebuild of a
/// mostly clean bitmap skips quickly but still yields to the owner's other duties).
const SCAN_PER_STEP: u64 = 1 << 16;

/// The longest request of a copy beside guest I/O (the mirror's default chunk).
pub const SHARE_UNIT: u64 = 64 << 10;

impl Copier {
    /// A process from byte `start` of the data region (a checkpoint, or 0).
    pub fn new(
        kind: ProcessKind,
        source: usize,
        targets: Vec<usize>,
        start: u64,
        intent: &IntentMap,
        geo: CopyGeometry,
    ) -> Copier {
        let chunk_bytes = intent.chunk_bytes();
        let window = geo.window_bytes.clamp(4096, 16 << 20).next_multiple_of(4096);
        Copier {
            kind,
            source,
            targets,
            geo,
            chunk_bytes,
            chunks: geo.data_bytes.div_ceil(chunk_bytes),
            cursor: (start / chunk_bytes).min(geo.data_bytes.div_ceil(chunk_bytes)),
            full_from: match kind {
                ProcessKind::Full => start / chunk_bytes,
                _ => 0,
            },
            retry: Vec::new(),
            piece: window,
            buf: AlignedBuf::zeroed(window as usize),
            copied: 0,
            started: Instant::now(),
            link: None,
            runner_slots: 1,
            ordered: BTreeSet::new(),
            failed: None,
        }
    }

    /// A full rebuild resumed for a target that was away: the first pass starts at 0 and,
    /// below the checkpoint, copies the chunks the bitmap marks (every write since the target
    /// left, as no bit is cleared while a slot is out of sync).
    pub fn catch_up_below_start(&mut self) {
        self.cursor = 0;
    }

    /// Changes the window, the speed limit and the share (`bdev_raid_set_options`; a runner's
    /// buffers stay as they are, its share follows).
    pub fn set_options(&mut self, window_bytes: u64, max_mb_sec: u64, share: CopyShare) {
        if let Some(link) = &self.link {
            link.set_share(share);
        }
        let window = window_bytes.clamp(4096, 16 << 20).next_multiple_of(4096);
        if window as usize != self.buf.len() {
            self.buf = AlignedBuf::zeroed(window as usize);
        }
        self.geo.window_bytes = window;
        self.geo.max_mb_sec = max_mb_sec;
        self.geo.share = share;
        self.started = Instant::now();
        self.copied = 0;
    }

    /// Bytes of the data region walked past by the first pass.
    pub fn progress_bytes(&self) -> u64 {
        (self.cursor.max(self.full_from) * self.chunk_bytes).min(self.geo.data_bytes)
    }

    /// Whether the first pass reached the end (only busy or re-marked chunks are left).
    pub fn first_pass_done(&self) -> bool {
        self.cursor >= self.chunks
    }

    /// The offset to persist: every chunk below it is copied and not due again.
    pub fn checkpoint(&self, intent: &IntentMap) -> u64 {
        let mut c = self.cursor;
        if let Some(&r) = self.retry.iter().min() {
            c = c.min(r);
        }
        if let Some(&o) = self.ordered.first() {
            c = c.min(o);
        }
        if let Some(r) = intent.next_recopy(0) {
            c = c.min(r);
        }
        // Below `full_from` a resumed full rebuild needs only the bitmap's chunks, and their
        // bits stay set until every slot is in sync: a crash there resumes from `full_from`.
        (c.max(self.full_from) * self.chunk_bytes).min(self.geo.data_bytes)
    }

    fn wanted(&self, intent: &IntentMap, chunk: u64) -> bool {
        (self.kind == ProcessKind::Full && chunk >= self.full_from) || intent.is_set(chunk)
    }

    /// Copies one claimed chunk from the source to every target.
    fn copy_chunk(&mut self, bases: &mut dyn SlotIo, chunk: u64) -> Result<u64, (usize, i32)> {
        let start = chunk * self.chunk_bytes;
        let end = (start + self.chunk_bytes).min(self.geo.data_bytes);
        let mut at = start;
        while at < end {
            let n = (end - at).min(self.piece) as usize;
            let off = self.geo.data_offset + at;
            let src = bases.slot_io(self.source).ok_or((self.source, libc::ENODEV))?;
            src.read_at(off, &mut self.buf.as_mut_slice()[..n]).map_err(|e| (self.source, e))?;
            for &t in &self.targets {
                let dst = bases.slot_io(t).ok_or((t, libc::ENODEV))?;
                dst.write_at(off, &self.buf.as_slice()[..n]).map_err(|e| (t, e))?;
            }
            at += n as u64;
        }
        Ok(end - start)
    }

    /// Claims and copies `chunk`; `Ok(None)` when a write holds it.
    fn try_chunk(&mut self, bases: &mut dyn SlotIo, intent: &IntentMap, chunk: u64) -> ChunkOutcome {
        if !intent.try_start_copy(chunk) {
            return Ok(None);
        }
        let r = self.copy_chunk(bases, chunk);
        // A failed copy still releases the chunk; a write that overlapped marks it again.
        intent.end_copy(chunk);
        r.map(Some)
    }

    /// What one step on the owner's thread may copy beside `guest_bytes` of guest I/O: the
    /// whole window with none, else the share's requests of one unit each, counting the
    /// guest's bytes in units (`fp_bdev::copy_share`). The unit is the smaller of a chunk and
    /// [`SHARE_UNIT`].
    pub fn window(&self, guest_bytes: u64) -> CopyWindow {
        let unit = self.chunk_bytes.min(SHARE_UNIT).min(self.buf.len() as u64);
        let full = CopyWindow { requests: (self.buf.len() as u64 / unit) as usize, request_bytes: unit };
        let w = self.geo.share.window(full, unit, guest_bytes.div_ceil(unit));
        if w == full {
            CopyWindow { requests: 1, request_bytes: self.buf.len() as u64 }
        } else {
            w
        }
    }

    /// One window's worth of work beside `guest_in_flight` guest requests
    /// ([`Copier::window`]). `bases` are the owner's, by slot. Returns how many bytes were
    /// copied with the step's outcome. With a runner ([`Copier::run_on`]) the step sends
    /// orders instead of copying, and counts the bytes of the orders that came back.
    pub fn step(&mut self, bases: &mut dyn SlotIo, intent: &IntentMap, guest_in_flight: u64) -> (u64, Step) {
        // Chunks the limit lets the runner have now.
        let mut rate_room = u64::MAX;
        if self.geo.max_mb_sec > 0 {
            let allowed = self.geo.max_mb_sec * 1_000_000;
            // With a runner the orders out count as copied: the limit paces the orders as
            // they are sent, not a window of them at a time. Sent a window at once (the owner
            // woken as half of it came back), the rebuild held at half its speed took the
            // core in bursts of half a millisecond and left a QD32 guest 0.17 of its IOPS;
            // paced, 0.28 (one benchmark run each, same machine).
            let ahead = self.copied + self.ordered.len() as u64 * self.chunk_bytes;
            let due = Duration::from_secs_f64(ahead as f64 / allowed as f64);
            let now = Instant::now();
            if self.started + due > now {
                return (0, Step::Throttled(self.started + due));
            }
            let may = now.duration_since(self.started).as_secs_f64() * allowed as f64;
            rate_room = ((may - ahead as f64) / self.chunk_bytes as f64) as u64 + 1;
        }
        let window = self.window(guest_in_flight);
        self.piece = window.request_bytes;
        let Some(link) = self.link.clone() else {
            let budget = window.request_bytes * window.requests as u64;
            let (bytes, failed) = self.walk(intent, budget, &mut |me, c| me.try_chunk(bases, intent, c));
            self.copied += bytes;
            return (bytes, failed.map_or_else(|| self.outcome(intent), fail));
        };
        // On the runner: what came back, then orders up to the share's requests in flight
        // (the runner's buffers with no guest I/O).
        let bytes = self.reap_runner(&link);
        if let Some(f) = self.failed {
            return (bytes, fail(f));
        }
        // The runner keeps to the share itself, round by round: the owner keeps its buffers
        // supplied.
        let room = (self.runner_slots.saturating_sub(self.ordered.len()) as u64).min(rate_room);
        let (sent, _) = self.walk(intent, room, &mut |me, c| me.try_order(&link, intent, c));
        let step = self.outcome(intent);
        if step == Step::Working && sent == 0 && !self.ordered.is_empty() {
            return (bytes, Step::Waiting);
        }
        (bytes, step)
    }

    /// Takes what came back from the runner: releases the chunks, keeps the first failure;
    /// returns the bytes copied.
    fn reap_runner(&mut self, link: &CopyLink) -> u64 {
        let mut bytes = 0;
        while let Some(d) = link.reap() {
            self.ordered.remove(&d.chunk);
            // The runner released its claim (or, `busy`, never got it): a write held the
            // chunk, which waits for the pass's retries like one the owner found busy.
            if d.busy {
                self.retry.push(d.chunk);
                continue;
            }
            match d.failed {
                None => bytes += d.bytes,
                Some(f) => self.failed = self.failed.or(Some(f)),
            }
        }
        self.copied += bytes;
        bytes
    }

    /// Done, or more to do.
    fn outcome(&self, intent: &IntentMap) -> Step {
        if self.cursor >= self.chunks
            && self.retry.is_empty()
            && self.ordered.is_empty()
            && intent.next_recopy(0).is_none()
        {
            Step::Done
        } else {
            Step::Working
        }
    }

    /// Walks the chunks due, `act` on each (copy or order it; what it returns counts against
    /// `budget`), until the budget is spent. Returns what was counted and the first failure.
    fn walk(
        &mut self,
        intent: &IntentMap,
        budget: u64,
        act: &mut dyn FnMut(&mut Copier, u64) -> ChunkOutcome,
    ) -> (u64, Option<(usize, i32)>) {
        let mut bytes = 0;
        let mut scanned = 0;
        // First the chunks behind the cursor that were busy, and those a write overlapped:
        // they hold the checkpoint back, so they are not left until the end of the pass (a
        // guest writing one region throughout would pin the checkpoint there, and a restart
        // would copy everything again).
        let mut still = Vec::new();
        for c in std::mem::take(&mut self.retry) {
            if bytes >= budget {
                still.push(c);
                continue;
            }
            match act(self, c) {
                Ok(Some(n)) => bytes += n,
                Ok(None) => still.push(c),
                Err(e) => {
                    self.retry = still;
                    return (bytes, Some(e));
                }
            }
        }
        self.retry = still;
        let mut from = 0;
        while bytes < budget {
            let Some(c) = intent.next_recopy(from) else { break };
            from = c + 1;
            match act(self, c) {
                Ok(Some(n)) => bytes += n,
                Ok(None) => {}
                Err(e) => return (bytes, Some(e)),
            }
        }
        // Then the pass, from the cursor on.
        while self.cursor < self.chunks && bytes < budget && scanned < SCAN_PER_STEP {
            let c = self.cursor;
            self.cursor += 1;
            scanned += 1;
            if !self.wanted(intent, c) {
                continue;
            }
            match act(self, c) {
                Ok(Some(n)) => bytes += n,
                Ok(None) => self.retry.push(c),
                Err(e) => return (bytes, Some(e)),
            }
        }
        (bytes, None)
    }

    /// Claims `chunk` and sends it to the runner; `Ok(None)` when a write (or an order of
    /// ours still in flight) holds it. Counts one order.
    fn try_order(&mut self, link: &CopyLink, intent: &IntentMap, chunk: u64) -> ChunkOutcome {
        // The runner claims the chunk when it starts the copy, not here: an order may wait
        // for the share's credit, and a claim held meanwhile would make every guest write to
        // the chunk mark it for a copy again.
        if self.ordered.contains(&chunk) || intent.writers(chunk) > 0 {
            return Ok(None);
        }
        let start = chunk * self.chunk_bytes;
        let len = self.chunk_bytes.min(self.geo.data_bytes - start);
        if link.send(CopyOrder { chunk, offset: self.geo.data_offset + start, len }).is_err() {
            // More orders than the runner's buffers: never, as the walk's budget is its room.
            return Ok(None);
        }
        self.ordered.insert(chunk);
        Ok(Some(1))
    }

    /// From now on the copies run on the runner at the other end of `link`, with `slots`
    /// orders in flight at most (its buffers).
    pub fn run_on(&mut self, link: Arc<CopyLink>, slots: usize) {
        self.link = Some(link);
        self.runner_slots = slots.max(1);
    }

    /// The runner's link, if the copies run on one.
    pub fn link(&self) -> Option<&Arc<CopyLink>> {
        self.link.as_ref()
    }

    /// Stops the runner (if any) and waits up to `bound` for the orders in flight to end,
    /// releasing their chunks; from then on the copier copies on the owner's thread until it
    /// is given a runner again. Returns whether the runner ended (false: it still holds I/O
    /// after the bound; its chunks stay claimed) and the bytes of the orders that came back.
    pub fn stop_runner(&mut self, bound: Duration) -> (bool, u64) {
        let Some(link) = self.link.take() else { return (true, 0) };
        link.stop();
        let until = Instant::now() + bound;
        while !link.finished() && Instant::now() < until {
            std::thread::park_timeout(Duration::from_millis(1));
        }
        let bytes = self.reap_runner(&link);
        // Orders that never came back from a runner that ended (dropped with its reactor):
        // released, and looked at again by the pass (copying twice is harmless).
        let unfinished = !link.finished();
        if !unfinished {
            // Never claimed, or released by the runner as it ended.
            self.retry.extend(std::mem::take(&mut self.ordered));
        }
        self.failed = None;
        (!unfinished, bytes)
    }

    /// Bytes per bitmap chunk (the longest order).
    pub fn chunk_bytes(&self) -> u64 {
        self.chunk_bytes
    }

    /// Bytes per request on the runner: the unit of the share.
    pub fn runner_piece(&self) -> u64 {
        self.chunk_bytes.min(SHARE_UNIT).min(self.buf.len() as u64)
    }

    /// The runner's buffers for the window: the whole window in units.
    pub fn runner_slots_for_window(&self) -> usize {
        (self.buf.len() as u64 / self.runner_piece()).max(1) as usize
    }
}

impl Drop for Copier {
    /// A copier dropped with its runner (the owner gone): the runner ends once its copies in
    /// flight do.
    fn drop(&mut self) {
        if let Some(link) = &self.link {
            link.stop();
        }
    }
}

fn fail((slot, errno): (usize, i32)) -> Step {
    Step::Failed { slot, errno }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::meta_io::MemBase;

    const K64: u64 = 64 << 10;

    fn bases(n: usize, bytes: u64) -> Vec<Option<Box<dyn BaseIo>>> {
        (0..n).map(|_| Some(Box::new(MemBase::new(bytes)) as Box<dyn BaseIo>)).collect()
    }

    fn image(b: &mut Option<Box<dyn BaseIo>>, len: u64) -> Vec<u8> {
        let mut v = vec![0; len as usize];
        b.as_mut().unwrap().read_at(0, &mut v).unwrap();
        v
    }

    fn geo(bytes: u64) -> CopyGeometry {
        CopyGeometry {
            data_offset: 0,
            data_bytes: bytes,
            window_bytes: 256 << 10,
            max_mb_sec: 0,
            share: CopyShare::default(),
        }
    }

    fn run(c: &mut Copier, b: &mut Vec<Option<Box<dyn BaseIo>>>, m: &IntentMap) -> u64 {
        let mut total = 0;
        loop {
            let (n, s) = c.step(b, m, 0);
            total += n;
            match s {
                Step::Done => return total,
                Step::Working => {}
                s => panic!("{s:?}"),
            }
        }
    }

    #[test]
    fn partial_copies_only_marked_chunks_and_full_copies_everything() {
        let bytes = 4 << 20;
        let mut b = bases(2, bytes);
        b[0].as_mut().unwrap().write_at(0, &vec![7u8; bytes as usize]).unwrap();
        let m = IntentMap::new(bytes, K64, false);
        m.mark_chunks(3, 2);
        m.mark_chunks(40, 1);
        let mut c = Copier::new(ProcessKind::Partial, 0, vec![1], 0, &m, geo(bytes));
        assert_eq!(run(&mut c, &mut b, &m), 3 * K64);
        let img = image(&mut b[1], bytes);
        assert!(img[3 * K64 as usize..5 * K64 as usize].iter().all(|&x| x == 7));
        assert!(img[..3 * K64 as usize].iter().all(|&x| x == 0));
        let mut f = Copier::new(ProcessKind::Full, 0, vec![1], 0, &m, geo(bytes));
        assert_eq!(run(&mut f, &mut b, &m), bytes);
        assert_eq!(image(&mut b[0], bytes), image(&mut b[1], bytes));
    }

    #[test]
    fn busy_chunks_are_retried_and_a_failed_target_is_reported() {
        let bytes = 1 << 20;
        let mut b = bases(3, bytes);
        b[0].as_mut().unwrap().write_at(0, &vec![1u8; bytes as usize]).unwrap();
        let m = IntentMap::new(bytes, K64, false);
        let t = m.begin_write(2 * K64, 512);
        let mut c = Copier::new(ProcessKind::Full, 0, vec![1, 2], 0, &m, geo(bytes));
        for _ in 0..4 {
            assert_eq!(c.step(&mut b, &m, 0).1, Step::Working, "chunk 2 is busy");
        }
        assert_eq!(c.progress_bytes(), bytes);
        assert_eq!(c.checkpoint(&m), 2 * K64, "the busy chunk holds the checkpoint back");
        m.end_write(&t);
        assert_eq!(c.step(&mut b, &m, 0), (K64, Step::Done));
        assert_eq!(image(&mut b[0], bytes), image(&mut b[2], bytes));
        let mut c = Copier::new(ProcessKind::Full, 0, vec![1, 2], 0, &m, geo(bytes));
        b[2] = Some(Box::new(MemBase { fail: true, ..MemBase::new(bytes) }));
        assert_eq!(c.step(&mut b, &m, 0).1, Step::Failed { slot: 2, errno: libc::EIO });
        assert_eq!(m.writers(0), 0);
        assert!(m.try_start_copy(0), "a failed copy releases its chunk");
    }

    #[test]
    fn a_chunk_a_write_overlapped_is_copied_again_at_once_and_the_checkpoint_moves_on() {
        let bytes = 4 << 20;
        let mut b = bases(2, bytes);
        let m = IntentMap::new(bytes, K64, false);
        let mut c = Copier::new(ProcessKind::Full, 0, vec![1], 0, &m, geo(bytes));
        assert_eq!(c.step(&mut b, &m, 0), (4 * K64, Step::Working));
        // A write that overlapped the copy of chunk 1 (as if it had started mid-copy).
        assert!(m.try_start_copy(1));
        let t = m.begin_write(K64, 4096);
        assert!(t.remark);
        m.end_copy(1);
        m.end_write(&t);
        assert_eq!(m.next_recopy(0), Some(1));
        assert_eq!(c.checkpoint(&m), K64, "the re-marked chunk holds the checkpoint");
        // The next step copies it again before going on, and the checkpoint follows the cursor.
        assert_eq!(c.step(&mut b, &m, 0), (4 * K64, Step::Working));
        assert_eq!(m.next_recopy(0), None);
        assert_eq!(c.checkpoint(&m), 7 * K64);
    }

    #[test]
    fn beside_guest_requests_a_step_copies_its_share_in_units_and_the_whole_window_without() {
        let bytes = 4 << 20;
        let mut b = bases(2, bytes);
        let m = IntentMap::new(bytes, 16 << 10, false);
        let mut g = geo(bytes);
        g.window_bytes = 1 << 20;
        g.share = CopyShare::new(10).unwrap();
        let mut c = Copier::new(ProcessKind::Full, 0, vec![1], 0, &m, g);
        // A tenth of the requests beside 32 chunks of guest bytes: 3 chunks of 16 KiB.
        assert_eq!(c.window(32 << 14), CopyWindow { requests: 3, request_bytes: 16 << 10 });
        assert_eq!(c.step(&mut b, &m, 32 << 14), (3 * (16 << 10), Step::Working));
        assert_eq!(c.window(0), CopyWindow { requests: 1, request_bytes: 1 << 20 });
        assert_eq!(c.step(&mut b, &m, 0), (1 << 20, Step::Working));
        c.set_options(1 << 20, 0, CopyShare::new(100).unwrap());
        assert_eq!(c.step(&mut b, &m, 32 << 14), (1 << 20, Step::Working), "weight 100: no share");
        assert_eq!(c.checkpoint(&m), 3 * (16 << 10) + (2 << 20));
    }

    #[test]
    fn the_speed_limit_spaces_the_windows() {
        let bytes = 4 << 20;
        let mut b = bases(2, bytes);
        let m = IntentMap::new(bytes, K64, false);
        let mut g = geo(bytes);
        g.max_mb_sec = 1;
        let mut c = Copier::new(ProcessKind::Full, 0, vec![1], 0, &m, g);
        assert_eq!(c.step(&mut b, &m, 0), (256 << 10, Step::Working));
        match c.step(&mut b, &m, 0) {
            (0, Step::Throttled(until)) => {
                let wait = until - Instant::now();
                assert!(wait > Duration::from_millis(150) && wait < Duration::from_millis(300), "{wait:?}");
            }
            s => panic!("{s:?}"),
        }
    }
}
