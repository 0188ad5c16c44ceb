//! The owner: one control-plane thread per raid that alone changes its metadata and layout.
//!
//! It holds its own channels of the bases and the in-memory superblock, and does every
//! metadata write: the bitmap pages before guest writes may go (one pass, one flush per base,
//! serves every waiting write), the superblock when a base fails, joins, or a rebuild makes
//! progress, the lazy clearing of bits, and the rebuild copy ([`crate::rebuild`]). It parks when
//! idle; channels wake it ([`RaidShared::wake_owner`]). Control calls arrive as closures over a
//! channel and the caller waits for the reply, as lvol's owner does.
//!
//! Ordering rules (docs/raid-format.md): a superblock that takes a base out is durable on the
//! remaining bases before the layout without it is published; a joining base is published as
//! Rebuilding before its first chunk is copied; bitmap pages are flushed before their sequence
//! is declared durable.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fp_bdev::copy_share::CopyShare;
use fp_bdev::module::BackgroundStart;
use fp_bdev::Uuid;
use fp_bdev::{Bdev, BdevInfo};

use crate::format::{SlotRecord, Superblock};
use crate::intent::IntentMap;
use crate::meta_io::{self, BaseIo};
use crate::rebuild::{Copier, ProcessKind, SlotIo};
use crate::shared::{GuestRequests, RaidShared};
use crate::shared::{Layout, ProcessStats, RaidCounters, SlotView};
use crate::{RaidError, RaidLevel, SlotState};

/// Tunables of the owner (SPDK's `bdev_raid_set_options` plus flashpath's).
#[derive(Debug, Clone)]
pub struct OwnerOptions {
    /// How often the clearing pass runs (md's daemon sleep; a bit is cleared after two idle
    /// passes). 5 s by default; tests shorten it.
    pub clear_period: Duration,
    /// `process_window_size_kb` in bytes: copied per step.
    pub process_window_bytes: u64,
    /// `process_max_bandwidth_mb_sec`; 0: no limit.
    pub process_max_bandwidth_mb_sec: u64,
    /// `process_weight`: the copy's share beside the guest's requests.
    pub process_share: CopyShare,
    /// Where the rebuild's copies run: a reactor of the daemon, or (`None`, tests and the
    /// crash simulator) the owner's thread.
    pub reactors: Option<Reactors>,
    /// The rebuild checkpoint is persisted after this many bytes or this long, whichever first.
    pub checkpoint_bytes: u64,
    pub checkpoint_interval: Duration,
    /// The longest the owner parks with nothing to do.
    pub idle_park: Duration,
}

impl Default for OwnerOptions {
    fn default() -> OwnerOptions {
        OwnerOptions {
            clear_period: Duration::from_secs(5),
            process_window_bytes: 1 << 20,
            process_max_bandwidth_mb_sec: 0,
            process_share: CopyShare::default(),
            reactors: None,
            checkpoint_bytes: 64 << 20,
            checkpoint_interval: Duration::from_secs(1),
            idle_park: Duration::from_millis(100),
        }
    }
}

/// Starts a background job on one of the daemon's reactors (`ModuleHost::start_background`);
/// `false` when there is none.
#[derive(Clone)]
pub struct Reactors(pub Arc<dyn Fn(BackgroundStart) -> bool + Send + Sync>);

impl std::fmt::Debug for Reactors {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Reactors")
    }
}

/// How long the owner waits for the runner's copies in flight to end before it changes the
/// bases they go to (a removal, a failure, a stop).
const RUNNER_DRAIN: Duration = Duration::from_secs(30);

/// A base for a slot: its name as configured and the bdev.
#[derive(Clone)]
pub struct BaseSpec {
    pub name: String,
    pub bdev: Bdev,
}

/// A base as the owner holds it: the I/O path (a channel on the owner's thread, or a base in
/// memory for tests) and, for the layout, the bdev.
pub struct Member {
    pub name: String,
    pub bdev: Option<Bdev>,
    pub io: Box<dyn BaseIo>,
}

/// Builds the state a raid's channels and owner share from its (new or newest) superblock.
/// `info`: the raid bdev's description (its capacity is the superblock's size). The layout
/// is empty until the owner publishes its first.
pub fn new_shared(info: BdevInfo, sb: &Superblock, persistent: bool) -> Arc<RaidShared> {
    let bytes = sb.raid_bytes();
    let intent = (sb.level == RaidLevel::Raid1).then(|| {
        let chunk = if sb.bitmap_chunk_bytes > 0 {
            sb.bitmap_chunk_bytes
        } else {
            crate::format::bitmap_chunk_bytes(bytes)
        };
        IntentMap::new(bytes, chunk, persistent && sb.bitmap_pages > 0)
    });
    Arc::new(RaidShared {
        info,
        level: sb.level,
        strip_bytes: u64::from(sb.strip_size_kb) << 10,
        base_data_bytes: sb.slots.iter().map(|s| s.data_bytes).collect(),
        layout: arc_swap::ArcSwap::from_pointee(Layout { slots: Vec::new(), data_offset: sb.data_offset }),
        epoch: std::sync::atomic::AtomicU64::new(0),
        intent,
        failures: crossbeam_queue::ArrayQueue::new(256),
        owner_waker: arc_swap::ArcSwapOption::empty(),
        process: ProcessStats::default(),
        counters: RaidCounters::default(),
        channels: std::sync::Mutex::new(Vec::new()),
        channels_changed: std::sync::atomic::AtomicU64::new(0),
        leaving: std::sync::Mutex::new(Vec::new()),
        stopping: std::sync::Mutex::new(None),
    })
}

/// A fresh identity for a base joining a slot.
pub fn random_uuid() -> Uuid {
    let mut b: [u8; 16] = rand::random();
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    Uuid(b)
}

/// A process waiting to run, or running.
struct Planned {
    kind: ProcessKind,
    /// Rebuild: the target; resync: unused.
    target: usize,
    start: u64,
    /// A full rebuild resumed for a target that was away: below `start` it also copies the
    /// bitmap's chunks (the writes it missed meanwhile).
    catch_up: bool,
}

/// The owner's state; control closures get `&mut Owner` on the owner's thread.
pub struct Owner {
    shared: Arc<RaidShared>,
    members: Vec<Option<Member>>,
    /// The superblock as it is (or would be, without one) on the bases.
    sb: Superblock,
    /// Whether the raid has a superblock on its bases.
    persist: bool,
    options: OwnerOptions,
    process: Option<(Copier, Planned)>,
    queue: VecDeque<Planned>,
    /// Resync targets: Active in the superblock, published Rebuilding (not read from).
    resync_targets: Vec<usize>,
    last_clear: Instant,
    last_checkpoint: Instant,
    since_checkpoint: u64,
    throttled_until: Option<Instant>,
    /// The process's copies are on the runner and the owner waits for one to come back (the
    /// runner wakes it).
    waiting_runner: bool,
    /// The guest's requests, which a process on the owner's thread yields to.
    guest: GuestRequests,
}

impl Owner {
    /// An owner over `members` (by slot, as `sb.slots`). `sb.seq == 0`: a new raid whose
    /// bases are formatted by [`Owner::start`]; otherwise the newest superblock found.
    pub fn new(
        shared: Arc<RaidShared>,
        members: Vec<Option<Member>>,
        sb: Superblock,
        persist: bool,
        options: OwnerOptions,
    ) -> Owner {
        let guest = shared.guest_requests();
        Owner {
            shared,
            members,
            sb,
            persist,
            options,
            process: None,
            queue: VecDeque::new(),
            resync_targets: Vec::new(),
            last_clear: Instant::now(),
            last_checkpoint: Instant::now(),
            since_checkpoint: 0,
            throttled_until: None,
            waiting_runner: false,
            guest,
        }
    }

    /// The superblock as the owner holds it.
    pub fn superblock(&self) -> &Superblock {
        &self.sb
    }

    /// The shared state.
    pub fn shared(&self) -> &Arc<RaidShared> {
        &self.shared
    }

    /// Whether a rebuild or resync runs or waits.
    pub fn process_running(&self) -> bool {
        self.process.is_some() || !self.queue.is_empty()
    }

    /// The member in `slot` (tests: the simulator reaches its bases through it).
    pub fn member_mut(&mut self, slot: usize) -> Option<&mut Member> {
        self.members.get_mut(slot).and_then(Option::as_mut)
    }

    /// Changes the process options (`bdev_raid_set_options`); a running process follows.
    pub fn set_process_options(&mut self, window_bytes: u64, max_mb_sec: u64, share: CopyShare) {
        self.options.process_window_bytes = window_bytes;
        self.options.process_max_bandwidth_mb_sec = max_mb_sec;
        self.options.process_share = share;
        if let Some((c, _)) = self.process.as_mut() {
            c.set_options(window_bytes, max_mb_sec, share);
        }
        self.throttled_until = None;
    }

    fn intent(&self) -> Option<&IntentMap> {
        self.shared.intent.as_ref()
    }

    fn state(&self, slot: usize) -> SlotState {
        self.sb.slots[slot].state
    }

    fn present(&self, slot: usize) -> bool {
        self.members.get(slot).is_some_and(Option::is_some)
    }

    /// Brings the raid up: formats a new raid's bases, or, assembling, loads the bitmaps,
    /// plans the resync after an unclean stop and the rebuilds of returning bases, marks the
    /// raid unclean; then publishes the first layout.
    pub fn start(&mut self) -> Result<(), RaidError> {
        let fresh = self.sb.seq == 0;
        for slot in 0..self.sb.slots.len() {
            if !self.present(slot) && self.state(slot).takes_writes() {
                let rec = &self.sb.slots[slot];
                if rec.state == SlotState::Rebuilding && !rec.rebuild_partial {
                    // A full rebuild's target keeps its record (identity, checkpoint): when it
                    // comes back it resumes, and the bitmap, never cleared while it is away,
                    // covers what was written below the checkpoint meanwhile.
                    log::warn!(
                        "raid {}: slot {slot}'s base (a full rebuild's target) is missing: the rebuild \
                         resumes when it returns",
                        self.sb.name
                    );
                    continue;
                }
                // Listed in sync but not here: the raid runs degraded without it.
                log::warn!("raid {}: slot {slot}'s base is missing: marked failed", self.sb.name);
                self.mark_failed(slot);
            }
        }
        if !fresh && self.persist {
            self.load_bitmaps()?;
            if !self.sb.clean && self.sb.level == RaidLevel::Raid1 {
                self.plan_resync();
            }
            for slot in 0..self.sb.slots.len() {
                let rec = &self.sb.slots[slot];
                if !self.present(slot) {
                    continue;
                }
                match rec.state {
                    SlotState::Failed => {
                        self.sb.slots[slot].state = SlotState::Rebuilding;
                        self.sb.slots[slot].rebuild_partial = true;
                        self.sb.slots[slot].rebuild_offset = 0;
                        self.queue_rebuild(slot, true, 0);
                    }
                    SlotState::Rebuilding => {
                        let (partial, start) = (rec.rebuild_partial, rec.rebuild_offset);
                        self.queue_rebuild(slot, partial, start);
                    }
                    _ => {}
                }
            }
        }
        self.sb.clean = false;
        if self.persist {
            if fresh {
                self.sb.seq = 1;
                for slot in 0..self.members.len() {
                    let sb = Superblock { slot: slot as u8, ..self.sb.clone() };
                    if let Some(m) = self.members[slot].as_mut() {
                        meta_io::format_base(m.io.as_mut(), &sb, None).map_err(|e| {
                            RaidError::Metadata(format!("formatting base {}: {}", m.name, errno_text(e)))
                        })?;
                    }
                }
                self.shared
                    .counters
                    .superblock_writes
                    .fetch_add(self.members.len() as u64, Ordering::Relaxed);
            } else {
                // Returning bases get the current bitmap before they take writes.
                let joining: Vec<usize> = (0..self.sb.slots.len())
                    .filter(|&s| self.present(s) && self.state(s) == SlotState::Rebuilding)
                    .collect();
                self.sb.seq += 1;
                for slot in joining {
                    self.format_member(slot)?;
                }
                self.sb.seq -= 1;
                self.write_superblocks()?;
            }
        } else if self.sb.seq == 0 {
            self.sb.seq = 1;
        }
        self.publish();
        self.next_process();
        Ok(())
    }

    fn errno_of(&self, slot: usize, e: i32) -> RaidError {
        let name = self.members[slot].as_ref().map_or("?", |m| m.name.as_str());
        RaidError::Metadata(format!("base {name}: {}", errno_text(e)))
    }

    /// The union of the in-sync bases' bitmaps; a corrupt page counts as all dirty.
    fn load_bitmaps(&mut self) -> Result<(), RaidError> {
        let Some(map) = self.shared.intent.as_ref() else { return Ok(()) };
        if self.sb.bitmap_pages == 0 {
            return Ok(());
        }
        for slot in 0..self.sb.slots.len() {
            if self.sb.slots[slot].state != SlotState::Active {
                continue;
            }
            if let Some(m) = self.members[slot].as_mut() {
                let sb = Superblock { slot: slot as u8, ..self.sb.clone() };
                let corrupt = meta_io::load_bitmap(m.io.as_mut(), &sb, map)?;
                self.shared.counters.bitmap_pages_corrupt.fetch_add(corrupt, Ordering::Relaxed);
            }
        }
        Ok(())
    }

    /// After an unclean stop: copy the set chunks from the lowest in-sync base to the others
    /// (and to bases being rebuilt, whose copied part may have missed writes in flight).
    fn plan_resync(&mut self) {
        let takers: Vec<usize> =
            (0..self.sb.slots.len()).filter(|&s| self.present(s) && self.state(s).takes_writes()).collect();
        let Some(&source) = takers.iter().find(|&&s| self.state(s) == SlotState::Active) else { return };
        let targets: Vec<usize> = takers.into_iter().filter(|&s| s != source).collect();
        if targets.is_empty() || self.intent().is_none_or(|m| m.set_count() == 0) {
            return;
        }
        self.resync_targets = targets;
        self.queue.push_front(Planned {
            kind: ProcessKind::Resync,
            target: source,
            start: 0,
            catch_up: false,
        });
    }

    fn queue_rebuild(&mut self, slot: usize, partial: bool, start: u64) {
        let kind = if partial { ProcessKind::Partial } else { ProcessKind::Full };
        self.queue.push_back(Planned { kind, target: slot, start, catch_up: false });
    }

    /// Queues the full rebuild of a target that comes back after being away from an assembly:
    /// from its checkpoint, catching up below it from the bitmap.
    fn queue_resumed_rebuild(&mut self, slot: usize, start: u64) {
        self.queue.push_back(Planned { kind: ProcessKind::Full, target: slot, start, catch_up: true });
    }

    /// Writes a joining member's bitmap pages (the map now) and its superblock.
    fn format_member(&mut self, slot: usize) -> Result<(), RaidError> {
        let sb = Superblock { slot: slot as u8, ..self.sb.clone() };
        let map = self.shared.intent.as_ref().filter(|_| sb.bitmap_pages > 0);
        let m = self.members[slot].as_mut().expect("member present");
        meta_io::format_base(m.io.as_mut(), &sb, map).map_err(|e| self.errno_of(slot, e))?;
        self.shared.counters.bitmap_writes.fetch_add(sb.bitmap_pages, Ordering::Relaxed);
        self.shared.counters.superblock_writes.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Writes the superblock (sequence + 1) to every base that takes writes and flushes them.
    /// A base that fails is taken out and the write repeated for the others, so all the
    /// remaining bases agree. Err only when no base could be written.
    fn write_superblocks(&mut self) -> Result<(), RaidError> {
        if !self.persist {
            return Ok(());
        }
        loop {
            self.sb.seq += 1;
            let mut written = 0;
            let failed = self.each_writable_base(|m, sb| {
                meta_io::write_superblock(m.io.as_mut(), sb).and_then(|_| m.io.flush())?;
                written += 1;
                Ok(())
            });
            self.shared.counters.superblock_writes.fetch_add(written, Ordering::Relaxed);
            if failed.is_empty() {
                return Ok(());
            }
            for (slot, e) in failed {
                self.take_out_after(slot, "superblock write", e);
            }
            if written == 0 {
                return Err(RaidError::Metadata(format!(
                    "raid {}: no base took the superblock",
                    self.sb.name
                )));
            }
        }
    }

    /// Takes `slot`'s base out after its metadata I/O `what` failed with `errno`. A request
    /// given up because a removal marked the base leaving while it answered Busy
    /// ([`meta_io::GIVEN_UP`]) is no failure of the base: the user asked it out.
    fn take_out_after(&mut self, slot: usize, what: &str, errno: i32) {
        self.take_out(slot);
        if errno == meta_io::GIVEN_UP {
            self.shared.counters.base_failures.fetch_sub(1, Ordering::Relaxed);
            log::info!(
                "raid {}: slot {slot}'s base answered the {what} Busy while it was being removed or \
                 the raid stopping: taken out without it",
                self.sb.name
            );
        } else {
            log::error!("raid {}: {what} on slot {slot} failed: {}", self.sb.name, errno_text(errno));
        }
    }

    /// Takes a base out in memory (its superblock write follows): the slot Failed, the process
    /// adjusted (a lost target dropped, a lost source replaced from the checkpoint).
    fn take_out(&mut self, slot: usize) {
        self.stop_runner();
        self.mark_failed(slot);
        self.resync_targets.retain(|&s| s != slot);
        if let Some((mut copier, plan)) = self.process.take() {
            copier.targets.retain(|&s| s != slot);
            if copier.source == slot && plan.kind != ProcessKind::Resync {
                // Never copy from a base that stopped taking writes: start again from the
                // checkpoint with another source (`next_process` picks it).
                let start = self.shared.intent.as_ref().map_or(0, |m| copier.checkpoint(m));
                self.queue.push_front(Planned { start, ..plan });
            } else if copier.source == slot || copier.targets.is_empty() {
                // A resync without its source (or anything left to copy to) ends; its other
                // targets are readable again, as md leaves them.
                if plan.kind == ProcessKind::Resync {
                    self.resync_targets.clear();
                }
            } else {
                self.process = Some((copier, plan));
            }
        }
        self.queue.retain(|p| p.kind == ProcessKind::Resync || p.target != slot);
        self.shared.counters.base_failures.fetch_add(1, Ordering::Relaxed);
    }

    /// The slot's record as Failed. A full rebuild's target also gets a new identity: it has
    /// only part of the data, so it may come back only with a full rebuild.
    fn mark_failed(&mut self, slot: usize) {
        let rec = &mut self.sb.slots[slot];
        if rec.state == SlotState::Rebuilding && !rec.rebuild_partial {
            rec.uuid = random_uuid();
        }
        rec.state = SlotState::Failed;
        rec.rebuild_offset = 0;
        rec.rebuild_partial = false;
    }

    /// Publishes the layout from the superblock's slots.
    fn publish(&self) {
        let slots = (0..self.sb.slots.len())
            .map(|slot| {
                let rec = &self.sb.slots[slot];
                let m = self.members[slot].as_ref();
                let mut state = rec.state;
                if state == SlotState::Active && self.resync_targets.contains(&slot) {
                    state = SlotState::Rebuilding;
                }
                if m.is_none() && state != SlotState::Empty {
                    state = SlotState::Failed;
                }
                SlotView {
                    state,
                    name: m.map(|m| m.name.clone()),
                    bdev: m.and_then(|m| m.bdev.clone()),
                    uuid: rec.uuid,
                }
            })
            .collect();
        self.shared.publish(Layout { slots, data_offset: self.sb.data_offset });
    }

    /// Takes out the bases the channels reported failed: superblock first, then the layout.
    pub fn handle_failures(&mut self) {
        let mut any = false;
        while let Some(f) = self.shared.failures.pop() {
            if self.sb.level != RaidLevel::Raid1 {
                // raid0 and concat pass errors up; there is nothing to take out.
                continue;
            }
            if f.slot < self.sb.slots.len() && self.state(f.slot).takes_writes() {
                log::error!("raid {}: slot {} failed (errno {}): degraded", self.sb.name, f.slot, f.errno);
                self.take_out(f.slot);
                any = true;
            }
        }
        if any {
            if let Err(e) = self.write_superblocks() {
                log::error!("{e}");
            }
            self.publish();
            self.next_process();
        }
    }

    /// Writes the bitmap pages waiting, flushes, declares their sequence durable.
    pub fn persist_bitmap(&mut self) {
        let Some(batch) = self.intent().and_then(IntentMap::take_dirty) else { return };
        if self.sb.bitmap_pages == 0 {
            // No bitmap on the bases (a raid without a superblock): the map lives in memory
            // only, and page 0 of a base is the guest's data, not a bitmap page.
            self.intent().expect("a batch comes from the map").mark_durable(&batch);
            return;
        }
        let mut writes = 0;
        let failed = self.each_writable_base(|m, sb| {
            batch
                .pages
                .iter()
                .try_for_each(|(index, words)| meta_io::write_bitmap_page(m.io.as_mut(), sb, *index, words))
                .and_then(|_| m.io.flush())?;
            writes += batch.pages.len() as u64;
            Ok(())
        });
        self.shared.counters.bitmap_writes.fetch_add(writes, Ordering::Relaxed);
        self.fail_slots("bitmap write", failed);
        let map = self.intent().expect("a batch comes from the map");
        map.mark_durable(&batch);
    }

    /// The lazy clearing pass, when due and allowed: no base out of sync, no process.
    pub fn maybe_clear(&mut self, now: Instant) {
        if now.duration_since(self.last_clear) < self.options.clear_period {
            return;
        }
        self.last_clear = now;
        let all_in_sync =
            self.sb.slots.iter().all(|s| matches!(s.state, SlotState::Active | SlotState::Empty));
        if !all_in_sync || self.process_running() {
            return;
        }
        if self.intent().is_some_and(|m| m.clear_pass() > 0) && self.persist {
            // The writes of the chunks just cleared completed, but a base may still hold them
            // in a volatile cache: make them durable before a page without their bits lands.
            self.flush_all();
        }
    }

    /// Flushes every base that takes writes; one that fails is taken out.
    fn flush_all(&mut self) {
        let failed = self.each_writable_base(|m, _| m.io.flush());
        self.fail_slots("flush", failed);
    }

    /// Runs `io` on every base that takes writes, with its copy of the superblock (its own slot
    /// number in it); returns the slots whose I/O failed, with the errno.
    fn each_writable_base(
        &mut self,
        mut io: impl FnMut(&mut Member, &Superblock) -> Result<(), i32>,
    ) -> Vec<(usize, i32)> {
        let mut failed = Vec::new();
        for slot in 0..self.sb.slots.len() {
            if !self.state(slot).takes_writes() {
                continue;
            }
            let sb = Superblock { slot: slot as u8, ..self.sb.clone() };
            let Some(m) = self.members[slot].as_mut() else { continue };
            if let Err(e) = io(m, &sb) {
                failed.push((slot, e));
            }
        }
        failed
    }

    /// Takes out the bases whose metadata I/O failed: superblock, then layout.
    fn fail_slots(&mut self, what: &str, failed: Vec<(usize, i32)>) {
        if failed.is_empty() {
            return;
        }
        for (slot, e) in failed {
            self.take_out_after(slot, what, e);
        }
        if let Err(e) = self.write_superblocks() {
            log::error!("{e}");
        }
        self.publish();
        self.next_process();
    }

    /// Whether the owner has work it should do without parking.
    pub fn busy(&self) -> bool {
        self.intent().is_some_and(IntentMap::needs_persist)
            || !self.shared.failures.is_empty()
            || (self.process.is_some() && self.throttled_until.is_none() && !self.waiting_runner)
    }

    /// Everything due now, once: failures, bitmap persistence, clearing, a process window.
    pub fn tick(&mut self) {
        let now = Instant::now();
        self.handle_failures();
        self.persist_bitmap();
        self.maybe_clear(now);
        if self.process.is_none() && !self.queue.is_empty() {
            self.next_process();
        }
        self.step_process(now);
        // Bits a window's writes set are persisted before the next window, not after it.
        self.persist_bitmap();
    }

    /// Adds a base to a running raid1 (`bdev_raid_add_base_bdev`): a base that left this
    /// raid returns to its slot with a partial rebuild; any other takes an empty slot with a
    /// full rebuild. Returns the slot.
    pub fn add_base(&mut self, mut member: Member) -> Result<usize, RaidError> {
        let invalid = |reason: String| RaidError::InvalidParam { field: "base_bdev", reason };
        if self.sb.level != RaidLevel::Raid1 {
            return Err(RaidError::InvalidParam {
                field: "raid_bdev",
                reason: format!("a {} raid takes no base while online", self.sb.level.name()),
            });
        }
        let held = (0..self.members.len())
            .find(|&s| self.members[s].as_ref().is_some_and(|m| m.name == member.name));
        if held.is_some_and(|s| self.state(s) != SlotState::Failed) {
            return Err(invalid(format!("{} is already a base of this raid", member.name)));
        }
        let need = self.sb.data_offset.saturating_add(self.sb.raid_bytes());
        if member.io.size_bytes() < need {
            return Err(invalid(format!(
                "{} has {} bytes; the raid needs {need} (data offset {} + {} data)",
                member.name,
                member.io.size_bytes(),
                self.sb.data_offset,
                self.sb.raid_bytes()
            )));
        }
        let own = if self.persist { meta_io::read_superblock(member.io.as_mut())? } else { None };
        let mut partial_slot = None;
        if let Some(own) = &own {
            if own.raid_uuid != self.sb.raid_uuid {
                return Err(invalid(format!(
                    "{}: superblock from another raid ({})",
                    member.name, own.raid_uuid
                )));
            }
            let slot = own.slot as usize;
            let rec = self.sb.slots.get(slot);
            let same = rec.is_some_and(|r| own.slots.get(slot).is_some_and(|o| o.uuid == r.uuid));
            // A replica that left, or a full rebuild's target that was away (its record kept
            // at assembly, `start`): back to its slot.
            let returning = rec.is_some_and(|r| matches!(r.state, SlotState::Failed | SlotState::Rebuilding));
            if same && returning && own.seq <= self.sb.seq && !self.present(slot) {
                partial_slot = Some(slot);
            }
        }
        let slot = match partial_slot {
            // Its own slot; the failed base still held there (the same device coming back
            // under the same name, say) gives way.
            Some(slot) => slot,
            None => (0..self.sb.slots.len())
                .find(|&s| self.state(s) == SlotState::Empty)
                .or_else(|| {
                    (0..self.sb.slots.len()).find(|&s| self.state(s) == SlotState::Failed && !self.present(s))
                })
                .or(held)
                .ok_or_else(|| {
                    RaidError::Busy(format!(
                        "raid {}: no free slot (remove a failed base first)",
                        self.sb.name
                    ))
                })?,
        };
        self.members[slot] = None;
        let data_bytes = self.sb.raid_bytes();
        let rec = &mut self.sb.slots[slot];
        // A full rebuild's target resumes from its checkpoint (the copier also takes the
        // bitmap's chunks below it); any other returning base is rebuilt partially; a new one
        // in full, under a new identity.
        let resumed = partial_slot.is_some() && rec.state == SlotState::Rebuilding && !rec.rebuild_partial;
        let partial = partial_slot.is_some() && !resumed;
        let start = if resumed { rec.rebuild_offset } else { 0 };
        if partial_slot.is_none() {
            rec.uuid = random_uuid();
        }
        rec.state = SlotState::Rebuilding;
        rec.rebuild_partial = partial;
        rec.rebuild_offset = start;
        rec.data_bytes = data_bytes;
        member.bdev = member.bdev.take();
        self.members[slot] = Some(member);
        if self.persist {
            // The base's own bitmap and superblock first, then the others' superblocks: from
            // then on an assembly finds it Rebuilding.
            self.sb.seq += 1;
            let formatted = self.format_member(slot);
            self.sb.seq -= 1;
            if let Err(e) = formatted {
                self.members[slot] = None;
                self.sb.slots[slot] =
                    SlotRecord { state: SlotState::Empty, uuid: Uuid::NIL, ..self.sb.slots[slot].clone() };
                return Err(e);
            }
            self.write_superblocks()?;
        }
        // Published before the first copy: writes reach the new base from here on.
        self.publish();
        if resumed {
            self.queue_resumed_rebuild(slot, start);
        } else {
            self.queue_rebuild(slot, partial, 0);
        }
        self.next_process();
        Ok(slot)
    }

    /// Removes a base (`bdev_raid_remove_base_bdev`) and returns it. Its slot keeps its
    /// record as Failed, so the same base added again later is rebuilt partially; a different
    /// base added takes the slot with a full rebuild. Refused for raid0 and concat, and for the
    /// last in-sync base of a raid1.
    pub fn remove_base(&mut self, name: &str) -> Result<Member, RaidError> {
        let slot = (0..self.members.len())
            .find(|&s| self.members[s].as_ref().is_some_and(|m| m.name == name))
            .ok_or_else(|| RaidError::NotFound(format!("{name} is not a base of raid {}", self.sb.name)))?;
        if self.sb.level != RaidLevel::Raid1 {
            return Err(RaidError::InvalidParam {
                field: "name",
                reason: format!("a base of a {} raid cannot be removed", self.sb.level.name()),
            });
        }
        let active = |s: usize| self.state(s) == SlotState::Active && !self.resync_targets.contains(&s);
        if active(slot) && !(0..self.sb.slots.len()).any(|s| s != slot && active(s)) {
            return Err(RaidError::InvalidParam {
                field: "name",
                reason: format!("{name} is the last in-sync base of raid {}", self.sb.name),
            });
        }
        if self.state(slot).takes_writes() {
            self.take_out(slot);
            // Not a failure: the user asked.
            self.shared.counters.base_failures.fetch_sub(1, Ordering::Relaxed);
            self.write_superblocks()?;
        }
        let member = self.members[slot].take().expect("found above");
        self.publish();
        Ok(member)
    }

    /// An orderly stop (the caller drained the raid's I/O): bitmap out, the running rebuild's
    /// checkpoint kept, and the superblock marked clean so the next assembly needs no resync.
    pub fn stop(&mut self) -> Result<(), RaidError> {
        self.stop_runner();
        self.persist_bitmap();
        if let Some((copier, plan)) = self.process.take() {
            if plan.kind != ProcessKind::Resync {
                if let Some(map) = self.intent() {
                    self.sb.slots[plan.target].rebuild_offset = copier.checkpoint(map);
                }
            }
            if plan.kind == ProcessKind::Resync {
                // Not finished: the next assembly must resync again.
                self.publish();
                return Ok(());
            }
        }
        if !self.resync_targets.is_empty() || self.queue.iter().any(|p| p.kind == ProcessKind::Resync) {
            return Ok(());
        }
        self.sb.clean = true;
        self.write_superblocks()
    }

    /// `bdev_raid_delete`: stops, then erases the superblocks so the bases are not assembled
    /// into this raid again.
    /// Every base the raid holds is erased, a failed one included, even when the stop's clean
    /// mark could not be written (it is moot once erased). The error names each base whose
    /// superblock is still there. A slot without a base has nothing here to erase.
    pub fn delete(&mut self) -> Result<(), RaidError> {
        if let Err(e) = self.stop() {
            log::warn!("raid {}: stopping before erasing its superblocks: {e}", self.sb.name);
        }
        if !self.persist {
            return Ok(());
        }
        let mut not_erased = Vec::new();
        for m in self.members.iter_mut().flatten() {
            match meta_io::wipe_superblock(m.io.as_mut()) {
                Ok(()) => {}
                Err(meta_io::GIVEN_UP) => {
                    not_erased.push(format!("'{}' (it answered Busy while the raid was deleted)", m.name))
                }
                Err(e) => not_erased.push(format!("'{}' ({})", m.name, errno_text(e))),
            }
        }
        if not_erased.is_empty() {
            return Ok(());
        }
        Err(RaidError::NotErased(format!(
            "raid '{}': the superblock of {} was not erased",
            self.sb.name,
            not_erased.join(", ")
        )))
    }
}

impl SlotIo for Vec<Option<Member>> {
    fn slot_io(&mut self, slot: usize) -> Option<&mut dyn BaseIo> {
        match self.get_mut(slot) {
            Some(Some(m)) => Some(m.io.as_mut()),
            _ => None,
        }
    }
}

fn errno_text(errno: i32) -> String {
    std::io::Error::from_raw_os_error(errno).to_string()
}

mod handle;
mod process;

pub use handle::{CallWait, OwnerHandle, RemoveWait, StopWait, OWNER_WAIT};

#[cfg(test)]
mod tests;
