//! The module's side of a raid's control calls: start and stop the raid's owner, change a
//! slot (a base joins or leaves), and the owner's duties the data path cannot wait for.
//!
//! Interim, until owner.rs (the meta helper's) lands: a small thread per raid that takes the
//! channels' failure reports out of the layout and persists the write-intent bits, and the
//! slot changes made on the calling thread; each superblock change is written to every base
//! that takes writes (seq + 1), flushed, and only then published. No rebuild copier and no bit
//! clearing here: a base added stays Rebuilding until the owner's copier runs.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::device::RaidDevice;
use crate::format::Superblock;
use crate::meta_io::{self, BaseIo, ChannelIo};
use crate::shared::{Failure, Layout, RaidShared, SlotView};
use crate::{RaidError, SlotState};

/// A running raid's owner.
pub struct OwnerLink {
    shared: Arc<RaidShared>,
    /// The newest superblock (raids with one), under the lock every superblock write takes.
    sb: Mutex<Option<Superblock>>,
    stop: AtomicBool,
    thread: Mutex<Option<JoinHandle<()>>>,
}

/// How long the owner sleeps when nothing wakes it.
const IDLE: Duration = Duration::from_millis(50);

impl OwnerLink {
    /// Starts the owner of `dev`, whose bases carry `sb` (`None`: no superblock).
    pub fn start(dev: &RaidDevice, sb: Option<Superblock>) -> Arc<OwnerLink> {
        let link = Arc::new(OwnerLink {
            shared: dev.shared().clone(),
            sb: Mutex::new(sb),
            stop: AtomicBool::new(false),
            thread: Mutex::new(None),
        });
        let me = link.clone();
        let name = format!("raid-{}", dev.shared().info.name);
        let t = std::thread::Builder::new().name(name).spawn(move || me.run());
        match t {
            Ok(t) => {
                link.shared.owner_waker.store(Some(Arc::new(t.thread().clone())));
                *link.thread.lock().unwrap_or_else(|p| p.into_inner()) = Some(t);
            }
            Err(e) => log::error!("raid '{}': cannot start its owner thread: {e}", dev.shared().info.name),
        }
        link
    }

    /// Stops the owner thread and waits for it.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
        self.shared.wake_owner();
        if let Some(t) = self.thread.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = t.join();
        }
        self.shared.owner_waker.store(None);
    }

    fn run(&self) {
        // Metadata channels of this thread, per slot and device.
        let mut ios: Vec<Option<(usize, ChannelIo)>> = Vec::new();
        while !self.stop.load(Ordering::SeqCst) {
            while let Some(f) = self.shared.failures.pop() {
                self.take_out(f);
            }
            self.persist_bits(&mut ios);
            std::thread::park_timeout(IDLE);
        }
    }

    /// A channel reported `f`: the slot leaves the layout (Failed), durably, then published.
    fn take_out(&self, f: Failure) {
        let name = self.shared.info.name.clone();
        let r = self.change(|l| {
            let s = &mut l.slots[f.slot];
            if !s.state.takes_writes() {
                return false;
            }
            log::warn!("raid '{name}': slot {} ({:?}) failed (errno {}): taken out", f.slot, s.name, f.errno);
            s.state = SlotState::Failed;
            true
        });
        match r {
            Ok(true) => {
                self.shared.counters.base_failures.fetch_add(1, Ordering::Relaxed);
            }
            Ok(false) => {}
            Err(e) => {
                log::error!("raid '{name}': slot {} failed but the superblocks cannot say so: {e}", f.slot)
            }
        }
    }

    /// Writes the bitmap pages the channels wait for to every base taking writes.
    fn persist_bits(&self, ios: &mut Vec<Option<(usize, ChannelIo)>>) {
        let Some(intent) = self.shared.intent.as_ref() else { return };
        if !intent.persistent() || !intent.needs_persist() {
            return;
        }
        let sb = self.sb.lock().unwrap_or_else(|p| p.into_inner());
        let Some(sb) = sb.as_ref() else { return };
        let Some(batch) = intent.take_dirty() else { return };
        let layout = self.shared.layout();
        ios.resize_with(layout.slots.len(), || None);
        for (slot, view) in layout.slots.iter().enumerate() {
            let Some(b) = view.bdev.as_ref().filter(|_| view.state.takes_writes()) else { continue };
            let id = Arc::as_ptr(b) as *const () as usize;
            if ios[slot].as_ref().is_none_or(|(d, _)| *d != id) {
                ios[slot] = ChannelIo::open(b.clone()).ok().map(|io| (id, io));
            }
            let written = match ios[slot].as_mut() {
                Some((_, io)) => batch
                    .pages
                    .iter()
                    .try_for_each(|(page, words)| meta_io::write_bitmap_page(io, sb, *page, words))
                    .and_then(|()| io.flush()),
                None => Err(libc::EIO),
            };
            if let Err(errno) = written {
                // That base fails; the batch is written again once it is out.
                intent.requeue(&batch);
                let _ = self.shared.failures.push(Failure { slot, errno });
                self.shared.wake_owner();
                return;
            }
            self.shared.counters.bitmap_writes.fetch_add(batch.pages.len() as u64, Ordering::Relaxed);
        }
        intent.mark_durable(&batch);
    }

    /// Changes the layout with `f` (false: nothing to change); with a superblock, the new one
    /// is written and flushed to every base that takes writes first. Returns what `f` said.
    pub fn change(&self, f: impl FnOnce(&mut Layout) -> bool) -> Result<bool, RaidError> {
        self.change_rebuild(f, None)
    }

    /// [`OwnerLink::change`], recording `rebuild = (slot, partial)` for a slot that starts
    /// rebuilding.
    fn change_rebuild(
        &self,
        f: impl FnOnce(&mut Layout) -> bool,
        rebuild: Option<(usize, bool)>,
    ) -> Result<bool, RaidError> {
        let mut sb = self.sb.lock().unwrap_or_else(|p| p.into_inner());
        let mut layout: Layout = (*self.shared.layout()).clone();
        if !f(&mut layout) {
            return Ok(false);
        }
        if let Some(sb) = sb.as_mut() {
            let mut next = sb.clone();
            next.seq += 1;
            for (rec, view) in next.slots.iter_mut().zip(&layout.slots) {
                rec.state = view.state;
                rec.uuid = view.uuid;
                if view.state != SlotState::Rebuilding {
                    rec.rebuild_offset = 0;
                    rec.rebuild_partial = false;
                }
            }
            if let Some((slot, partial)) = rebuild {
                next.slots[slot].rebuild_offset = 0;
                next.slots[slot].rebuild_partial = partial;
            }
            let mut written = 0;
            for (slot, view) in layout.slots.iter().enumerate() {
                let Some(b) = view.bdev.as_ref().filter(|_| view.state.takes_writes()) else { continue };
                next.slot = slot as u8;
                let r = ChannelIo::open(b.clone()).and_then(|mut io| {
                    meta_io::write_superblock(&mut io, &next).and_then(|()| io.flush()).map_err(|e| {
                        RaidError::Metadata(format!("superblock write to slot {slot}: errno {e}"))
                    })
                });
                match r {
                    Ok(()) => written += 1,
                    Err(e) => log::warn!("raid '{}': {e}", self.shared.info.name),
                }
            }
            if written == 0 {
                return Err(RaidError::Metadata("no base took the new superblock".into()));
            }
            self.shared.counters.superblock_writes.fetch_add(written, Ordering::Relaxed);
            *sb = next;
        }
        self.shared.publish(layout);
        Ok(true)
    }

    /// The superblock now (raids with one).
    pub fn superblock(&self) -> Option<Superblock> {
        self.sb.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// A base joins `slot` as `view` (Rebuilding); `partial`: only the bitmap's chunks need copying.
pub(crate) fn add_base(
    link: &OwnerLink,
    slot: usize,
    view: SlotView,
    partial: bool,
) -> Result<(), RaidError> {
    link.change_rebuild(
        |l| {
            l.slots[slot] = view;
            true
        },
        Some((slot, partial)),
    )
    .map(|_| ())
}

/// The base of `slot` leaves it: the slot stays Failed with the base's identity (a partial
/// rebuild when it comes back), without a device.
pub(crate) fn remove_base(link: &OwnerLink, slot: usize) -> Result<(), RaidError> {
    link.change(|l| {
        let s = &mut l.slots[slot];
        s.state = if s.state == SlotState::Empty { SlotState::Empty } else { SlotState::Failed };
        s.bdev = None;
        s.name = None;
        true
    })
    .map(|_| ())
}
