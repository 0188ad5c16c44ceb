//! The packed virtqueue, device side (virtio 1.2 §2.8).
//!
//! One ring of 16-byte descriptors `{ le64 addr; le32 len; le16 id; le16 flags }` that both
//! sides write. A descriptor is available when its AVAIL bit equals the device's avail wrap
//! counter and its USED bit does not; the device takes lists in ring order (NEXT links the
//! following slot, the buffer id sits in the list's last descriptor) and writes one used
//! descriptor per list at its own used position, then skips as many slots as the list took.
//!
//! Batching: used descriptors are written as requests complete, except the first flags of a
//! batch, which [`PackedQueue::publish`] stores last with release ordering: the driver polls
//! only its next used slot, so everything behind it becomes visible at once (§2.8.6).
//!
//! Notifications (§2.8.10): the driver area says whether the driver wants a used-buffer
//! notification (enable, disable, or at a given descriptor with EVENT_IDX); the device area,
//! written here, says whether the device wants kicks.

use std::sync::atomic::{fence, AtomicU16, Ordering};

use crate::chain::{read_desc, Chain, Desc, WalkError};
use crate::log::RingLog;
use crate::mem::MemTable;
use crate::split::{ring_part, RingError, MAX_QUEUE_SIZE};
use crate::{DESC_F_AVAIL, DESC_F_INDIRECT, DESC_F_NEXT, DESC_F_USED, DESC_F_WRITE};

/// Event suppression flags (§2.8.10).
const EVENT_FLAGS_ENABLE: u16 = 0;
const EVENT_FLAGS_DISABLE: u16 = 1;
const EVENT_FLAGS_DESC: u16 = 2;
/// Offset of `flags` in a descriptor and in an event suppression structure.
const DESC_FLAGS_OFFSET: usize = 14;
const EVENT_FLAGS_OFFSET: usize = 2;

/// Where the device is in a packed ring: what `VHOST_USER_GET/SET_VRING_BASE` carry
/// (vhost-user.rst: bits 0-14 the next available index, bit 15 its wrap counter, bits 16-30 the
/// next used index, bit 31 its wrap counter).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PackedState {
    /// Ring slot the next available descriptor is read from.
    pub next_avail: u16,
    /// The driver's wrap counter expected at `next_avail`.
    pub avail_wrap: bool,
    /// Ring slot the next used descriptor is written to.
    pub next_used: u16,
    /// The device's wrap counter written at `next_used`.
    pub used_wrap: bool,
}

impl PackedState {
    /// A fresh ring: both positions 0, both wrap counters 1 (§2.8.1).
    pub const START: PackedState =
        PackedState { next_avail: 0, avail_wrap: true, next_used: 0, used_wrap: true };

    /// Decodes a SET_VRING_BASE value.
    pub fn from_vring_base(base: u32) -> PackedState {
        PackedState {
            next_avail: (base & 0x7fff) as u16,
            avail_wrap: base & (1 << 15) != 0,
            next_used: ((base >> 16) & 0x7fff) as u16,
            used_wrap: base & (1 << 31) != 0,
        }
    }

    /// Encodes the position as GET_VRING_BASE answers it.
    pub fn to_vring_base(self) -> u32 {
        u32::from(self.next_avail)
            | u32::from(self.avail_wrap) << 15
            | u32::from(self.next_used) << 16
            | u32::from(self.used_wrap) << 31
    }
}

/// A list taken from the ring: its buffer id and the ring slots it occupied.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PackedHead {
    /// Buffer id, returned in the used descriptor.
    pub id: u16,
    /// Ring slots the list took, which the used descriptor skips.
    pub slots: u16,
}

/// One packed-ring descriptor as the driver wrote it (flags as in the ring, AVAIL/USED included).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RawDesc {
    /// Guest physical address of the buffer (or indirect table).
    pub addr: u64,
    /// Buffer length in bytes.
    pub len: u32,
    /// Buffer id (meaningful in a list's last descriptor).
    pub id: u16,
    /// `DESC_F_*` flags.
    pub flags: u16,
}

/// Adds list descriptor `d` to `chain`, walking it if it is an indirect table (§2.8.7); `first`:
/// it is the list's first descriptor. Returns whether the list continues (NEXT).
#[inline(always)]
fn add_desc(mem: &MemTable, chain: &mut Chain, d: RawDesc, first: bool) -> Result<bool, WalkError> {
    if d.flags & DESC_F_INDIRECT != 0 {
        // An indirect descriptor is a list of its own (never linked by NEXT).
        if !first || d.flags & DESC_F_NEXT != 0 || d.len == 0 || d.len % 16 != 0 {
            return Err(WalkError::Broken);
        }
        let table = mem.translate(d.addr, u64::from(d.len)).ok_or(WalkError::Broken)?;
        for i in 0..d.len / 16 {
            // SAFETY: `i < len / 16` and the table's `len` bytes lie in one region.
            let (a, w) = unsafe { read_desc(table, i) };
            // Only WRITE is valid in an indirect table; other flags and ids are ignored.
            chain.add(mem, a, w as u32, (w >> 48) as u16 & DESC_F_WRITE != 0)?;
        }
        return Ok(false);
    }
    chain.add(mem, d.addr, d.len, d.flags & DESC_F_WRITE != 0)?;
    Ok(d.flags & DESC_F_NEXT != 0)
}

impl Chain {
    /// Walks a packed-ring list from copies of its ring descriptors (as [`PackedQueue::pop_with`]
    /// recorded them), with the ring walk's rules: NEXT on every descriptor but the last, an
    /// indirect table only alone. An indirect table is read from guest memory again: the driver
    /// keeps it until the list is used, unlike the ring slots.
    pub fn from_packed(mem: &MemTable, descs: &[RawDesc]) -> Result<Chain, WalkError> {
        let mut c = Chain::new();
        let mut more = true;
        for (i, &d) in descs.iter().enumerate() {
            if !more {
                return Err(WalkError::Broken);
            }
            more = add_desc(mem, &mut c, d, i == 0)?;
        }
        if more {
            return Err(WalkError::Broken);
        }
        Ok(c)
    }
}

/// One packed virtqueue, device side. See the module docs.
pub struct PackedQueue {
    ring: *mut u8,
    /// Driver event suppression (read here).
    driver: *const u8,
    /// Device event suppression (written here).
    device: *mut u8,
    size: u16,
    event_idx: bool,
    state: PackedState,
    /// First used slot of the unpublished batch and the flags it gets on publish.
    batch_first: (u16, u16),
    unpublished: u16,
    /// Used position (with wrap) when notifications were last decided.
    signalled: (u16, bool),
    /// While migrating: where the written-back descriptors and the device event area are
    /// logged. `None` costs one predictable branch per descriptor.
    log: Option<RingLog>,
}

impl PackedQueue {
    /// Resolves the ring at `desc` and the driver / device event areas (vhost-user's avail and
    /// used addresses) and continues at `state`.
    pub fn new(
        mem: &MemTable,
        desc: u64,
        driver_area: u64,
        device_area: u64,
        size: u16,
        event_idx: bool,
        state: PackedState,
    ) -> Result<PackedQueue, RingError> {
        if size == 0 || size > MAX_QUEUE_SIZE {
            return Err(RingError::BadSize(size));
        }
        if state.next_avail >= size || state.next_used >= size {
            return Err(RingError::BadPosition { avail: state.next_avail, used: state.next_used, size });
        }
        // §2.8.10.1: alignments 16, 4, 4.
        let ring = ring_part(mem, "descriptor ring", desc, 16 * u64::from(size), 16)?;
        let driver = ring_part(mem, "driver event area", driver_area, 4, 4)?;
        let device = ring_part(mem, "device event area", device_area, 4, 4)?;
        Ok(PackedQueue {
            ring,
            driver,
            device,
            size,
            event_idx,
            state,
            batch_first: (0, 0),
            unpublished: 0,
            signalled: (state.next_used, state.used_wrap),
            log: None,
        })
    }

    /// Starts (`Some`) or stops (`None`) logging what the device writes into the ring and its
    /// event area; takes effect with the next write.
    pub fn set_log(&mut self, log: Option<RingLog>) {
        self.log = log;
    }

    /// Pages the ring's writes marked in the log since the last call.
    pub fn take_logged_pages(&mut self) -> u64 {
        self.log.as_mut().map_or(0, RingLog::take_pages)
    }

    /// Number of entries in the ring.
    pub fn size(&self) -> u16 {
        self.size
    }

    /// The ring position (what GET_VRING_BASE reports once nothing is in flight).
    pub fn state(&self) -> PackedState {
        self.state
    }

    fn flags_at(&self, slot: u16) -> u16 {
        // SAFETY: `slot < size`: the 2-aligned flags field is inside the mapped ring.
        let f =
            unsafe { AtomicU16::from_ptr(self.ring.add(16 * usize::from(slot) + DESC_FLAGS_OFFSET).cast()) };
        // Acquire: the descriptor's other fields, written before its flags, are visible.
        u16::from_le(f.load(Ordering::Acquire))
    }

    fn is_avail(flags: u16, wrap: bool) -> bool {
        (flags & DESC_F_AVAIL != 0) == wrap && (flags & DESC_F_USED != 0) != wrap
    }

    fn advance(pos: &mut u16, wrap: &mut bool, by: u16, size: u16) {
        // `*pos < size` and `by <= size`, so one subtraction brings it back into the ring.
        let next = u32::from(*pos) + u32::from(by);
        if next >= u32::from(size) {
            *pos = (next - u32::from(size)) as u16;
            *wrap = !*wrap;
        } else {
            *pos = next as u16;
        }
    }

    /// Takes the next available list into `chain`. `Ok(None)`: nothing available. An error
    /// means a list that cannot be walked (the queue must fail; the position is unchanged).
    #[inline]
    pub fn pop(&mut self, mem: &MemTable, chain: &mut Chain) -> Result<Option<PackedHead>, WalkError> {
        self.pop_with(mem, chain, |_| {})
    }

    /// [`Self::pop`], handing every ring descriptor of the list to `record` as it is read (the
    /// one read the walk uses), so that a crash-safe record can keep the list: the driver may
    /// reuse these ring slots before the list is completed.
    ///
    /// A list of three direct, non-empty descriptors (the common virtio-blk request) takes a
    /// fast path that reads them once and stores them at once; any other list is walked by
    /// the general loop ([`Self::pop_general`]), with the same result.
    #[inline]
    pub fn pop_with(
        &mut self,
        mem: &MemTable,
        chain: &mut Chain,
        mut record: impl FnMut(RawDesc),
    ) -> Result<Option<PackedHead>, WalkError> {
        let (pos, wrap) = (self.state.next_avail, self.state.avail_wrap);
        if !Self::is_avail(self.flags_at(pos), wrap) {
            return Ok(None);
        }
        if let Some(head) = self.pop_three(mem, chain, &mut record) {
            return Ok(Some(head));
        }
        self.walk_list(mem, chain, record)
    }

    /// [`Self::pop`] without the fast path: every list through the general loop. Public so
    /// tests and fuzzing can compare the two.
    pub fn pop_general(
        &mut self,
        mem: &MemTable,
        chain: &mut Chain,
    ) -> Result<Option<PackedHead>, WalkError> {
        if !Self::is_avail(self.flags_at(self.state.next_avail), self.state.avail_wrap) {
            return Ok(None);
        }
        self.walk_list(mem, chain, |_| {})
    }

    /// The fast path of [`Self::pop_with`] for a list that is available: `Some` when it is
    /// exactly three direct, non-empty descriptors, then taken (recorded, stored in `chain`,
    /// the position advanced) as the general loop would take it. `None` changes nothing and
    /// records nothing (the general loop reads the descriptors again).
    ///
    /// The general loop's other checks cannot fail here: with at least three slots the list
    /// fits the ring; the byte total is checked; three is far below the chain's limit.
    #[inline(always)]
    fn pop_three(
        &mut self,
        mem: &MemTable,
        chain: &mut Chain,
        record: &mut impl FnMut(RawDesc),
    ) -> Option<PackedHead> {
        const END: u16 = DESC_F_NEXT | DESC_F_INDIRECT;
        if self.size < 3 {
            return None;
        }
        let (mut pos, mut wrap) = (self.state.next_avail, self.state.avail_wrap);
        let read = |pos: &mut u16, wrap: &mut bool| {
            // SAFETY: `pos < size`; the ring's `16 * size` bytes are mapped (checked in `new`).
            let (addr, w1) = unsafe { read_desc(self.ring, u32::from(*pos)) };
            Self::advance(pos, wrap, 1, self.size);
            RawDesc { addr, len: w1 as u32, id: (w1 >> 32) as u16, flags: (w1 >> 48) as u16 }
        };
        let d0 = read(&mut pos, &mut wrap);
        if d0.flags & END != DESC_F_NEXT {
            return None;
        }
        let d1 = read(&mut pos, &mut wrap);
        if d1.flags & END != DESC_F_NEXT {
            return None;
        }
        let d2 = read(&mut pos, &mut wrap);
        if d2.flags & END != 0 {
            return None;
        }
        let total = u64::from(d0.len) + u64::from(d1.len) + u64::from(d2.len);
        if d0.len == 0 || d1.len == 0 || d2.len == 0 || total > u64::from(u32::MAX) {
            return None;
        }
        let desc = |d: RawDesc| Desc {
            addr: d.addr,
            len: d.len,
            write: d.flags & DESC_F_WRITE != 0,
            host: mem.host_or_null(d.addr, u64::from(d.len)),
        };
        record(d0);
        record(d1);
        record(d2);
        chain.set_three([desc(d0), desc(d1), desc(d2)], total as u32);
        self.state.next_avail = pos;
        self.state.avail_wrap = wrap;
        Some(PackedHead { id: d2.id, slots: 3 })
    }

    /// Walks the available list at the current position into `chain` and takes it.
    #[inline(never)]
    fn walk_list(
        &mut self,
        mem: &MemTable,
        chain: &mut Chain,
        mut record: impl FnMut(RawDesc),
    ) -> Result<Option<PackedHead>, WalkError> {
        let (mut pos, mut wrap) = (self.state.next_avail, self.state.avail_wrap);
        chain.clear();
        let mut slots: u16 = 0;
        let id = loop {
            // SAFETY: `pos < size`; the ring's `16 * size` bytes are mapped (checked in `new`).
            let (addr, w1) = unsafe { read_desc(self.ring, u32::from(pos)) };
            let d = RawDesc { addr, len: w1 as u32, id: (w1 >> 32) as u16, flags: (w1 >> 48) as u16 };
            record(d);
            slots += 1;
            Self::advance(&mut pos, &mut wrap, 1, self.size);
            if !add_desc(mem, chain, d, slots == 1)? {
                break d.id;
            }
            // §2.8.11: a list is at most the queue size; a longer one has no end.
            if slots == self.size {
                return Err(WalkError::Broken);
            }
        };
        self.state.next_avail = pos;
        self.state.avail_wrap = wrap;
        Ok(Some(PackedHead { id, slots }))
    }

    /// Writes the used descriptor of a list that took `slots` ring slots (not yet visible).
    #[inline]
    pub fn push_used(&mut self, id: u16, len: u32, slots: u16) {
        let slot = self.state.next_used;
        let mut flags = if self.state.used_wrap { DESC_F_AVAIL | DESC_F_USED } else { 0 };
        if len > 0 {
            flags |= DESC_F_WRITE;
        }
        // SAFETY: `slot < size`: the 16-byte descriptor is inside the mapped ring. Volatile: the
        // driver reads it concurrently.
        unsafe {
            let d = self.ring.add(16 * usize::from(slot));
            std::ptr::write_volatile(d.add(8).cast::<u32>(), len.to_le());
            std::ptr::write_volatile(d.add(12).cast::<u16>(), id.to_le());
            if self.unpublished > 0 {
                // Hidden behind the batch's first flags, which `publish` stores last.
                std::ptr::write_volatile(d.add(DESC_FLAGS_OFFSET).cast::<u16>(), flags.to_le());
            }
        }
        if let Some(log) = &mut self.log {
            // len, id and flags: the last 8 bytes of the descriptor (the batch's first flags
            // are stored by `publish`, which marks them again after the store).
            log.desc(16 * u64::from(slot) + 8, 8);
        }
        if self.unpublished == 0 {
            self.batch_first = (slot, flags);
        }
        // A hostile id/slot count cannot move us out of the ring: `slots` came from `pop`.
        Self::advance(&mut self.state.next_used, &mut self.state.used_wrap, slots.min(self.size), self.size);
        self.unpublished += 1;
    }

    /// Makes the batch visible: the first used descriptor's flags, stored last. Returns how many
    /// used descriptors were published.
    #[inline]
    pub fn publish(&mut self) -> u16 {
        let n = self.unpublished;
        if n > 0 {
            let (slot, flags) = self.batch_first;
            // SAFETY: `slot < size`: the 2-aligned flags field is inside the mapped ring.
            let f = unsafe {
                AtomicU16::from_ptr(self.ring.add(16 * usize::from(slot) + DESC_FLAGS_OFFSET).cast())
            };
            // Release: every id, len and flags of the batch is visible before this store.
            f.store(flags.to_le(), Ordering::Release);
            // The batch's first flags, marked again now that they are written (a log sync
            // between `push_used`'s mark and this store would otherwise lose them).
            if let Some(log) = &mut self.log {
                log.desc(16 * u64::from(slot) + DESC_FLAGS_OFFSET as u64, 2);
            }
            self.unpublished = 0;
        }
        n
    }

    /// The driver's event suppression: `(off_wrap, flags)` (§2.8.14).
    #[inline]
    fn driver_event(&self) -> (u16, u16) {
        // SAFETY: the driver area's 4 bytes are mapped and 4-aligned (checked in `new`).
        unsafe {
            (
                u16::from_le(AtomicU16::from_ptr(self.driver as *mut u16).load(Ordering::Relaxed)),
                u16::from_le(
                    AtomicU16::from_ptr(self.driver.add(EVENT_FLAGS_OFFSET) as *mut u16)
                        .load(Ordering::Relaxed),
                ),
            )
        }
    }

    /// Whether the driver waits to be notified of the next used descriptor: its event
    /// suppression is enabled, or (EVENT_IDX) its event descriptor is the next one used. Reads
    /// the driver area, changes nothing.
    #[inline]
    pub fn driver_waits(&self) -> bool {
        let (off_wrap, flags) = self.driver_event();
        match flags & 3 {
            EVENT_FLAGS_DISABLE => false,
            EVENT_FLAGS_DESC if self.event_idx => {
                off_wrap == self.state.next_used | if self.state.used_wrap { 0x8000 } else { 0 }
            }
            _ => true,
        }
    }

    /// Whether the driver wants a notification for what was published since the last decision.
    #[inline]
    pub fn needs_notification(&mut self) -> bool {
        let new = (self.state.next_used, self.state.used_wrap);
        let old = std::mem::replace(&mut self.signalled, new);
        if new == old {
            return false;
        }
        // Our flags stores before the driver's suppression fields (§2.8.10).
        fence(Ordering::SeqCst);
        self.wants(new, old)
    }

    /// Whether the driver's event suppression, read now and without a fence, declines a
    /// notification for what was published since the last decision (true when there is nothing
    /// to notify). Changes nothing. As the split ring's `declines_for_now`: a `true` is
    /// provisional, the read may be older than our stores (§2.8.10), and the caller must ask
    /// again until [`PackedQueue::needs_notification`] decides.
    #[inline]
    pub fn declines_for_now(&self) -> bool {
        let (new, old) = ((self.state.next_used, self.state.used_wrap), self.signalled);
        new == old || !self.wants(new, old)
    }

    /// The driver's event suppression, read relaxed, against the used positions `[old, new)`.
    #[inline(always)]
    fn wants(&self, new: (u16, bool), old: (u16, bool)) -> bool {
        let (off_wrap, flags) = self.driver_event();
        match flags & 3 {
            EVENT_FLAGS_DISABLE => false,
            EVENT_FLAGS_DESC if self.event_idx => {
                // Positions as one counter over two laps (wrap 1 = first lap): notify when the
                // driver's event descriptor was used in [old, new).
                let n = u32::from(self.size);
                let lin = |pos: u16, wrap: bool| u32::from(pos) + if wrap { 0 } else { n };
                let event = lin(off_wrap & 0x7fff, off_wrap & 0x8000 != 0);
                let (o, w) = (lin(old.0, old.1), lin(new.0, new.1));
                let dist = |a: u32, b: u32| (b + 2 * n - a) % (2 * n);
                dist(o, event) < dist(o, w)
            }
            _ => true,
        }
    }

    fn write_device_event(&mut self, off_wrap: u16, flags: u16) {
        // SAFETY: the device area's 4 bytes are mapped and 4-aligned (checked in `new`).
        unsafe {
            AtomicU16::from_ptr(self.device.cast::<u16>()).store(off_wrap.to_le(), Ordering::Relaxed);
            AtomicU16::from_ptr(self.device.add(EVENT_FLAGS_OFFSET).cast::<u16>())
                .store(flags.to_le(), Ordering::Release);
        }
        if let Some(log) = &mut self.log {
            log.used(0, 4);
        }
    }

    /// Asks the driver not to kick while the device polls.
    pub fn disable_notification(&mut self) {
        self.write_device_event(0, EVENT_FLAGS_DISABLE);
    }

    /// Asks for a kick for the next list before the device sleeps. Returns whether a list
    /// became available meanwhile (then the device must not sleep).
    pub fn enable_notification(&mut self) -> bool {
        if self.event_idx {
            let off_wrap = self.state.next_avail | u16::from(self.state.avail_wrap) << 15;
            self.write_device_event(off_wrap, EVENT_FLAGS_DESC);
        } else {
            self.write_device_event(0, EVENT_FLAGS_ENABLE);
        }
        fence(Ordering::SeqCst);
        Self::is_avail(self.flags_at(self.state.next_avail), self.state.avail_wrap)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mem::GuestMemory;
    use std::sync::Arc;
    use vm_memory::{Bytes, GuestAddress};

    const RING: u64 = 0x0;
    const DRIVER: u64 = 0x1000;
    const DEVICE: u64 = 0x1004;
    const SIZE: u16 = 4;

    fn setup() -> (GuestMemory, MemTable) {
        let m = GuestMemory::from_ranges(&[(GuestAddress(0), 0x10000)]).unwrap();
        let t = MemTable::new(Arc::new(m.clone())).unwrap();
        (m, t)
    }

    /// Writes a driver descriptor at `slot` made available in lap `wrap`.
    fn offer(m: &GuestMemory, slot: u16, addr: u64, len: u32, id: u16, flags: u16, wrap: bool) {
        let avail = if wrap { DESC_F_AVAIL } else { DESC_F_USED };
        let at = RING + 16 * u64::from(slot);
        m.write_obj(addr, GuestAddress(at)).unwrap();
        m.write_obj(len, GuestAddress(at + 8)).unwrap();
        m.write_obj(id, GuestAddress(at + 12)).unwrap();
        m.write_obj(flags | avail, GuestAddress(at + 14)).unwrap();
    }

    fn desc(m: &GuestMemory, slot: u16) -> (u32, u16, u16) {
        let at = RING + 16 * u64::from(slot);
        (
            m.read_obj(GuestAddress(at + 8)).unwrap(),
            m.read_obj(GuestAddress(at + 12)).unwrap(),
            m.read_obj(GuestAddress(at + 14)).unwrap(),
        )
    }

    /// A chain's descriptors, field by field.
    type Fields = Vec<(u64, u32, bool, usize)>;

    /// Takes the next list with the fast path and with the general loop, each from its own
    /// queue over the same ring (recording what `pop_with` reads), and checks they agree.
    fn pop_both(
        fast: &mut PackedQueue,
        general: &mut PackedQueue,
        t: &MemTable,
    ) -> Result<Option<(PackedHead, Fields)>, WalkError> {
        let fields =
            |c: &Chain| c.descs().iter().map(|d| (d.addr, d.len, d.write, d.host as usize)).collect();
        let (mut a, mut b, mut recorded) = (Chain::new(), Chain::new(), Vec::new());
        let x = fast.pop_with(t, &mut a, |d| recorded.push(d)).map(|h| h.map(|h| (h, fields(&a))));
        let y = general.pop_general(t, &mut b).map(|h| h.map(|h| (h, fields(&b))));
        assert_eq!(x, y, "fast path and general loop differ");
        assert_eq!(fast.state(), general.state());
        if let Ok(Some((h, _))) = &x {
            assert_eq!(recorded.len(), usize::from(h.slots), "one record per ring slot");
            assert_eq!(
                Chain::from_packed(t, &recorded).map(|c| fields(&c)),
                Ok(x.clone().unwrap().unwrap().1)
            );
        }
        x
    }

    #[test]
    fn the_three_descriptor_fast_path_takes_lists_as_the_general_loop() {
        let (m, t) = setup();
        let q = || PackedQueue::new(&t, RING, DRIVER, DEVICE, SIZE, false, PackedState::START).unwrap();
        let (mut fast, mut general) = (q(), q());
        let (n, w) = (DESC_F_NEXT, DESC_F_WRITE);
        // Three descriptors across the wrap: slots 3 (lap 1), 0 and 1 (lap 2).
        for (slot, wrap) in [(0, true), (1, true), (2, true)] {
            offer(&m, slot, 0x2000, 1, 1, w, wrap);
        }
        for _ in 0..3 {
            assert_eq!(pop_both(&mut fast, &mut general, &t).unwrap().unwrap().0.slots, 1);
        }
        offer(&m, 3, 0x2000, 16, 0, n, true);
        offer(&m, 0, 0x3000, 4096, 0, n | w, false);
        offer(&m, 1, 0x4000, 1, 7, w, false);
        let (h, c) = pop_both(&mut fast, &mut general, &t).unwrap().unwrap();
        assert_eq!(h, PackedHead { id: 7, slots: 3 });
        assert_eq!(
            c.iter().map(|d| (d.0, d.1, d.2)).collect::<Vec<_>>(),
            [(0x2000, 16, false), (0x3000, 4096, true), (0x4000, 1, true)]
        );
        assert_eq!(fast.state().next_avail, 2);
        // Lists the fast path leaves to the general loop: an empty middle descriptor, a
        // fourth descriptor, an indirect middle one, more
        // than 4 GiB, a data buffer outside memory (stored untranslated, as the loop does).
        let cases: [&[(u64, u32, u16)]; 5] = [
            &[(0x2000, 16, n), (0x3000, 0, n | w), (0x4000, 1, w)],
            &[(0x2000, 16, n), (0x3000, 8, n | w), (0x3008, 8, n | w), (0x4000, 1, w)],
            &[(0x2000, 16, n), (0x6000, 32, n | crate::DESC_F_INDIRECT), (0x4000, 1, w)],
            &[(0x2000, 16, n), (0x3000, u32::MAX - 16, n | w), (0x4000, 1, w)],
            &[(0x2000, 16, n), (0xf_0000, 512, n | w), (0x4000, 1, w)],
        ];
        for list in cases {
            let (mut f, mut g) = (q(), q());
            for (slot, &(addr, len, flags)) in list.iter().enumerate().take(usize::from(SIZE)) {
                offer(&m, slot as u16, addr, len, 3, flags, true);
            }
            let _ = pop_both(&mut f, &mut g, &t);
        }
        // A ring of two slots cannot hold a list of three.
        let small = || PackedQueue::new(&t, RING, DRIVER, DEVICE, 2, false, PackedState::START).unwrap();
        offer(&m, 0, 0x2000, 16, 0, n, true);
        offer(&m, 1, 0x3000, 512, 0, n | w, true);
        assert_eq!(pop_both(&mut small(), &mut small(), &t), Err(WalkError::Broken));
    }

    #[test]
    fn vring_base_round_trips() {
        let s = PackedState { next_avail: 0x1234, avail_wrap: false, next_used: 0x7fff, used_wrap: true };
        assert_eq!(PackedState::from_vring_base(s.to_vring_base()), s);
        assert_eq!(PackedState::START.to_vring_base(), 0x8000_8000);
    }

    #[test]
    fn lists_are_taken_in_ring_order_across_the_wrap() {
        let (m, t) = setup();
        let mut q = PackedQueue::new(&t, RING, DRIVER, DEVICE, SIZE, false, PackedState::START).unwrap();
        let mut chain = Chain::new();
        assert_eq!(q.pop(&t, &mut chain), Ok(None), "zeroed ring: nothing available");
        // A 3-descriptor list; the id is read from its last descriptor.
        offer(&m, 0, 0x2000, 16, 9, DESC_F_NEXT, true);
        offer(&m, 1, 0x3000, 512, 9, DESC_F_NEXT | DESC_F_WRITE, true);
        offer(&m, 2, 0x4000, 1, 5, DESC_F_WRITE, true);
        assert_eq!(q.pop(&t, &mut chain), Ok(Some(PackedHead { id: 5, slots: 3 })));
        let d: Vec<(u64, u32, bool)> = chain.descs().iter().map(|d| (d.addr, d.len, d.write)).collect();
        assert_eq!(d, vec![(0x2000, 16, false), (0x3000, 512, true), (0x4000, 1, true)]);
        assert_eq!(q.pop(&t, &mut chain), Ok(None));
        // Complete it: one used descriptor at slot 0, flags hidden until publish.
        q.push_used(5, 513, 3);
        assert_eq!(desc(&m, 0).1, 5);
        assert_eq!(desc(&m, 0).2 & (DESC_F_USED | DESC_F_AVAIL), DESC_F_AVAIL, "still the driver's flags");
        assert_eq!(q.publish(), 1);
        assert_eq!(desc(&m, 0), (513, 5, DESC_F_AVAIL | DESC_F_USED | DESC_F_WRITE));
        // The next list wraps: slot 3 (lap 1) then slot 0 (lap 2, wrap 0).
        offer(&m, 0, 0x3000, 1, 0, DESC_F_WRITE, false);
        offer(&m, 3, 0x2000, 16, 0, DESC_F_NEXT, true);
        assert_eq!(q.pop(&t, &mut chain), Ok(Some(PackedHead { id: 0, slots: 2 })));
        assert_eq!(
            q.state(),
            PackedState { next_avail: 1, avail_wrap: false, next_used: 3, used_wrap: true }
        );
        q.push_used(0, 0, 2);
        q.publish();
        // Used at slot 3 in lap 1 (flags set), next used position 1 in lap 2.
        assert_eq!(desc(&m, 3).2, DESC_F_AVAIL | DESC_F_USED);
        assert_eq!(
            q.state(),
            PackedState { next_avail: 1, avail_wrap: false, next_used: 1, used_wrap: false }
        );
        // A descriptor marked for lap 1 at slot 1 is stale in lap 2.
        offer(&m, 1, 0x2000, 16, 0, 0, true);
        assert_eq!(q.pop(&t, &mut chain), Ok(None));
    }

    #[test]
    fn a_batch_becomes_visible_with_its_first_flags() {
        let (m, t) = setup();
        let mut q = PackedQueue::new(&t, RING, DRIVER, DEVICE, SIZE, false, PackedState::START).unwrap();
        let mut chain = Chain::new();
        for s in 0..3 {
            offer(&m, s, 0x2000, 16, s + 10, 0, true);
            assert!(q.pop(&t, &mut chain).unwrap().is_some());
        }
        // Completed out of order: ids 12, 10.
        q.push_used(12, 0, 1);
        q.push_used(10, 0, 1);
        assert_eq!(desc(&m, 0).2, DESC_F_AVAIL, "first of the batch: not yet used");
        assert_eq!(desc(&m, 1).2, DESC_F_AVAIL | DESC_F_USED, "behind the first: written");
        assert_eq!(q.publish(), 2);
        assert_eq!((desc(&m, 0).1, desc(&m, 0).2), (12, DESC_F_AVAIL | DESC_F_USED));
        assert_eq!(desc(&m, 1).1, 10);
    }

    #[test]
    fn lists_without_end_and_bad_indirect_descriptors_are_broken() {
        let (m, t) = setup();
        let mut q = PackedQueue::new(&t, RING, DRIVER, DEVICE, SIZE, false, PackedState::START).unwrap();
        let mut chain = Chain::new();
        for s in 0..SIZE {
            offer(&m, s, 0x2000, 16, 0, DESC_F_NEXT, true);
        }
        assert_eq!(q.pop(&t, &mut chain), Err(WalkError::Broken), "NEXT on every slot of the ring");
        assert_eq!(q.state(), PackedState::START, "position unchanged");
        offer(&m, 0, 0x2000, 24, 0, DESC_F_INDIRECT, true);
        assert_eq!(q.pop(&t, &mut chain), Err(WalkError::Broken), "table length not a multiple of 16");
        offer(&m, 0, 0xfff0, 32, 0, DESC_F_INDIRECT, true);
        assert_eq!(q.pop(&t, &mut chain), Err(WalkError::Broken), "table runs past memory");
    }

    #[test]
    fn recorded_lists_walk_like_the_ring_indirect_tables_included() {
        let (m, t) = setup();
        let mut q = PackedQueue::new(&t, RING, DRIVER, DEVICE, SIZE, false, PackedState::START).unwrap();
        let mut chain = Chain::new();
        let key = |c: &Chain| c.descs().iter().map(|d| (d.addr, d.len, d.write)).collect::<Vec<_>>();
        // A direct list of two, then an indirect table of two at 0x5000.
        offer(&m, 0, 0x2000, 16, 0, DESC_F_NEXT, true);
        offer(&m, 1, 0x3000, 512, 7, DESC_F_WRITE, true);
        m.write_obj(0x6000u64, GuestAddress(0x5000)).unwrap();
        m.write_obj(16u32, GuestAddress(0x5008)).unwrap();
        m.write_obj(0x7000u64, GuestAddress(0x5010)).unwrap();
        m.write_obj(1u32, GuestAddress(0x5018)).unwrap();
        m.write_obj(DESC_F_WRITE, GuestAddress(0x501e)).unwrap();
        offer(&m, 2, 0x5000, 32, 8, DESC_F_INDIRECT, true);
        let mut taken = Vec::new();
        for (want_id, want_len) in [(7, 2), (8, 1)] {
            let mut rec = Vec::new();
            let h = q.pop_with(&t, &mut chain, |d| rec.push(d)).unwrap().unwrap();
            assert_eq!((h.id, usize::from(h.slots)), (want_id, want_len));
            assert_eq!(rec.len(), want_len, "one record per ring slot");
            assert_eq!(rec.last().unwrap().id, want_id);
            taken.push((rec, key(&chain)));
        }
        assert_eq!(taken[1].1, vec![(0x6000, 16, false), (0x7000, 1, true)]);
        // The driver reuses the ring slots: the copies still walk to the same chains.
        for s in 0..3 {
            offer(&m, s, 0xdead000, 1, 99, 0, false);
        }
        for (rec, want) in &taken {
            assert_eq!(&key(&Chain::from_packed(&t, rec).unwrap()), want);
        }
        let d = |addr, len, flags| RawDesc { addr, len, id: 0, flags };
        for bad in [
            vec![],
            vec![d(0x2000, 16, DESC_F_NEXT)],
            vec![d(0x2000, 16, 0), d(0x3000, 16, 0)],
            vec![d(0x2000, 16, DESC_F_NEXT), d(0x5000, 32, DESC_F_INDIRECT)],
            vec![d(0x5000, 24, DESC_F_INDIRECT)],
        ] {
            assert_eq!(Chain::from_packed(&t, &bad).err(), Some(WalkError::Broken), "{bad:?}");
        }
    }

    #[test]
    fn notifications_follow_the_driver_area() {
        let (m, t) = setup();
        let mut q = PackedQueue::new(&t, RING, DRIVER, DEVICE, SIZE, true, PackedState::START).unwrap();
        let mut chain = Chain::new();
        let mut complete = |q: &mut PackedQueue, slot: u16, wrap: bool| {
            offer(&m, slot, 0x2000, 16, 0, 0, wrap);
            assert!(q.pop(&t, &mut chain).unwrap().is_some());
            q.push_used(0, 0, 1);
            q.publish();
        };
        assert!(!q.needs_notification(), "nothing used yet");
        assert!(q.declines_for_now(), "nothing used yet");
        complete(&mut q, 0, true);
        assert!(!q.declines_for_now(), "flags 0: enabled");
        assert!(!q.declines_for_now(), "asking again changes nothing");
        assert!(q.needs_notification(), "flags 0: enabled");
        m.write_obj(EVENT_FLAGS_DISABLE, GuestAddress(DRIVER + 2)).unwrap();
        complete(&mut q, 1, true);
        assert!(q.declines_for_now(), "disabled");
        assert!(!q.needs_notification(), "disabled");
        // EVENT_IDX: the driver wants to hear when slot 3 of lap 1 is used.
        m.write_obj(3u16 | 1 << 15, GuestAddress(DRIVER)).unwrap();
        m.write_obj(EVENT_FLAGS_DESC, GuestAddress(DRIVER + 2)).unwrap();
        complete(&mut q, 2, true);
        assert!(!q.needs_notification(), "slot 2 used, the event is slot 3");
        complete(&mut q, 3, true);
        assert!(q.needs_notification(), "slot 3 used");
        // Next event: slot 0 of lap 2 (wrap bit 0).
        m.write_obj(0u16, GuestAddress(DRIVER)).unwrap();
        complete(&mut q, 0, false);
        assert!(q.needs_notification(), "slot 0 of the second lap used");
        // The device area: disabled while polling, armed at the next available slot for sleep.
        q.disable_notification();
        assert_eq!(m.read_obj::<u16>(GuestAddress(DEVICE + 2)).unwrap(), EVENT_FLAGS_DISABLE);
        assert!(!q.enable_notification());
        assert_eq!(m.read_obj::<u16>(GuestAddress(DEVICE)).unwrap(), 1, "slot 1, wrap 0");
        assert_eq!(m.read_obj::<u16>(GuestAddress(DEVICE + 2)).unwrap(), EVENT_FLAGS_DESC);
        offer(&m, 1, 0x2000, 16, 0, 0, false);
        assert!(q.enable_notification(), "a list arrived while re-arming");
    }
}
