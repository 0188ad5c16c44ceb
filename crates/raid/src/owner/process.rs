//! The owner's background process (rebuild or resync): planning, the steps, and where its
//! copies run (a runner on a reactor, or the owner's thread).

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::{Owner, Planned, RUNNER_DRAIN};
use crate::rebuild::{Copier, CopyGeometry, ProcessKind, Step};
use crate::rebuild_io::{CopyLink, CopyRunner, RunnerSpec};
use crate::SlotState;

impl Owner {
    pub(super) fn geometry(&self) -> CopyGeometry {
        CopyGeometry {
            data_offset: self.sb.data_offset,
            data_bytes: self.sb.raid_bytes(),
            window_bytes: self.options.process_window_bytes,
            max_mb_sec: self.options.process_max_bandwidth_mb_sec,
            share: self.options.process_share,
        }
    }

    /// Starts the next planned process, if none runs.
    pub(super) fn next_process(&mut self) {
        if self.process.is_some() {
            return;
        }
        let Some(map) = self.shared.intent.as_ref() else {
            self.queue.clear();
            return;
        };
        while let Some(p) = self.queue.pop_front() {
            let (source, targets) = if p.kind == ProcessKind::Resync {
                (p.target, self.resync_targets.clone())
            } else {
                let source = (0..self.sb.slots.len()).find(|&s| {
                    self.present(s) && self.state(s) == SlotState::Active && !self.resync_targets.contains(&s)
                });
                match source {
                    Some(s) if self.present(p.target) && self.state(p.target) == SlotState::Rebuilding => {
                        (s, vec![p.target])
                    }
                    _ => continue,
                }
            };
            if targets.is_empty() {
                continue;
            }
            let stats = &self.shared.process;
            stats.kind.store(p.kind.code(), Ordering::Relaxed);
            stats.target_slot.store(targets[0] as u64 + 1, Ordering::Relaxed);
            stats.blocks_total.store(self.sb.raid_blocks, Ordering::Relaxed);
            stats.blocks_done.store(p.start / u64::from(self.sb.block_size), Ordering::Relaxed);
            log::info!(
                "raid {}: {:?} of slots {targets:?} from slot {source}, from byte {}",
                self.sb.name,
                p.kind,
                p.start
            );
            let mut copier = Copier::new(p.kind, source, targets, p.start, map, self.geometry());
            if p.catch_up {
                copier.catch_up_below_start();
            }
            self.process = Some((copier, p));
            self.last_checkpoint = Instant::now();
            self.since_checkpoint = 0;
            return;
        }
        let stats = &self.shared.process;
        stats.kind.store(0, Ordering::Relaxed);
        stats.target_slot.store(0, Ordering::Relaxed);
    }

    /// One window of the running process. Returns whether there is more to do right away.
    pub fn step_process(&mut self, now: Instant) -> bool {
        if self.throttled_until.is_some_and(|t| now < t) {
            return false;
        }
        self.throttled_until = None;
        self.waiting_runner = false;
        let Some((mut copier, plan)) = self.process.take() else { return false };
        let shared = self.shared.clone();
        let Some(map) = shared.intent.as_ref() else { return false };
        if copier.link().is_none() {
            self.attach_runner(&mut copier);
        }
        let guest = self.guest.bytes(&shared);
        let (bytes, step) = copier.step(&mut self.members, map, guest.window_bytes());
        if guest.active() && bytes > 0 && copier.link().is_none() {
            // The owner's thread shares the core with the reactors serving the guest: beside
            // guest I/O it also keeps to its share of the time, resting after a step for as
            // long as the step took times (100 - weight) / weight.
            let w = u32::from(self.options.process_share.weight());
            if w < 100 {
                let took = Instant::now().saturating_duration_since(now);
                self.throttled_until = Some(Instant::now() + took * (100 - w) / w);
            }
        }
        let c = &self.shared.counters;
        c.rebuild_bytes_copied.fetch_add(bytes * copier.targets.len() as u64, Ordering::Relaxed);
        if copier.link().is_some() {
            c.rebuild_bytes_on_reactor.fetch_add(bytes * copier.targets.len() as u64, Ordering::Relaxed);
        }
        self.shared
            .process
            .blocks_done
            .store(copier.progress_bytes() / u64::from(self.sb.block_size), Ordering::Relaxed);
        self.since_checkpoint += bytes;
        match step {
            Step::Working | Step::Waiting => {
                self.waiting_runner = step == Step::Waiting;
                if plan.kind != ProcessKind::Resync
                    && (self.since_checkpoint >= self.options.checkpoint_bytes
                        || now.duration_since(self.last_checkpoint) >= self.options.checkpoint_interval)
                {
                    self.sb.slots[plan.target].rebuild_offset = copier.checkpoint(map);
                    self.since_checkpoint = 0;
                    self.last_checkpoint = now;
                    self.process = Some((copier, plan));
                    if let Err(e) = self.write_superblocks() {
                        log::error!("{e}");
                    }
                    return true;
                }
                if step == Step::Working && bytes == 0 && copier.first_pass_done() {
                    // Only chunks with writes in flight are left: wait for them a little
                    // instead of spinning a core.
                    self.throttled_until = Some(now + Duration::from_millis(1));
                }
                self.process = Some((copier, plan));
                true
            }
            Step::Throttled(until) => {
                self.throttled_until = Some(until);
                self.process = Some((copier, plan));
                false
            }
            Step::Done => {
                // Nothing is in flight: the runner ends when the copier drops.
                self.finish(copier, plan);
                true
            }
            Step::Failed { slot, errno } => {
                let what = format!("{:?} copy", plan.kind);
                self.process = Some((copier, plan));
                self.take_out_after(slot, &what, errno);
                if let Err(e) = self.write_superblocks() {
                    log::error!("{e}");
                }
                self.publish();
                self.next_process();
                true
            }
        }
    }

    /// Moves the running process's copies onto a reactor when the daemon has one and every
    /// base it copies between is a bdev (not a base in memory).
    pub(super) fn attach_runner(&mut self, copier: &mut Copier) {
        let Some(reactors) = self.options.reactors.clone() else { return };
        let bdev = |slot: usize| self.members.get(slot)?.as_ref()?.bdev.clone();
        let Some(source) = bdev(copier.source) else { return };
        let mut targets = Vec::with_capacity(copier.targets.len());
        for &t in &copier.targets {
            let Some(b) = bdev(t) else { return };
            targets.push((t, b));
        }
        let slots = copier.runner_slots_for_window();
        let link = CopyLink::new(slots, self.options.process_share, self.shared.clone());
        let spec = RunnerSpec {
            source: (copier.source, source),
            targets,
            slots,
            piece: copier.runner_piece(),
            order_bytes: copier.chunk_bytes(),
        };
        let for_runner = link.clone();
        if (reactors.0)(Box::new(move || Box::new(CopyRunner::open(for_runner, spec)))) {
            copier.run_on(link, slots);
        } else {
            // No reactor (the daemon is stopping): the owner copies from now on.
            self.options.reactors = None;
        }
    }

    /// Stops the running process's runner and waits for its copies in flight, before the
    /// bases they go to change; the next step starts another.
    pub(super) fn stop_runner(&mut self) {
        let shared = self.shared.clone();
        if let Some((copier, _)) = self.process.as_mut() {
            let (ended, bytes) = copier.stop_runner(RUNNER_DRAIN);
            let copied = bytes * copier.targets.len() as u64;
            shared.counters.rebuild_bytes_copied.fetch_add(copied, Ordering::Relaxed);
            shared.counters.rebuild_bytes_on_reactor.fetch_add(copied, Ordering::Relaxed);
            if !ended {
                log::error!(
                    "raid {}: the rebuild's copies in flight did not end within {RUNNER_DRAIN:?}",
                    self.sb.name
                );
            }
        }
    }

    pub(super) fn finish(&mut self, copier: Copier, plan: Planned) {
        log::info!("raid {}: {:?} of slots {:?} done", self.sb.name, plan.kind, copier.targets);
        if plan.kind == ProcessKind::Resync {
            self.resync_targets.clear();
        } else {
            let rec = &mut self.sb.slots[plan.target];
            rec.state = SlotState::Active;
            rec.rebuild_offset = 0;
            rec.rebuild_partial = false;
            self.shared.counters.rebuilds_completed.fetch_add(1, Ordering::Relaxed);
            if let Err(e) = self.write_superblocks() {
                log::error!("{e}");
            }
        }
        self.publish();
        self.next_process();
    }
}
