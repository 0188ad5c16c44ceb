//! The store's metadata owner: one thread per lvstore holding the [`Store`], a channel of the
//! base bdev, and the volumes' published maps.
//!
//! Everything that changes metadata runs here, one thing at a time: allocations and
//! copy-on-write for the channels' first writes (batched: every request waiting is served, then
//! one flush for the copied data, one commit), discards and write-zeroes, and the control
//! operations (create, snapshot, resize, ...) sent by the RPC thread as closures. A write waits
//! for the commit mapping its cluster to be durable before it goes to the base, so an
//! acknowledged write never depends on metadata a crash could lose.
//!
//! Why a thread and not a reactor: a commit is a few synchronous page writes and flushes, a COW
//! copy is megabytes; neither belongs on a core that polls guests' queues. Reactors only send
//! it messages, and only on the rare paths.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fp_bdev::iov::BounceBuf;
use fp_bdev::{sync_io, Bdev, IoChannel, IoOp, IoRequest, IoStatus, Iovecs};

use super::shared::Geometry;
use super::shared::{ChannelShared, Layer, Piece, Reply, View, VolumeShared};
use crate::{
    DeviceError, LvolError, MetaDevice, Page, ReadSource, Store, Uuid, WriteTarget, PAGE_SIZE, UNALLOCATED,
};

/// What the owner is sent.
pub(crate) enum Msg {
    /// A write piece to a cluster the volume does not own (yet, as far as the channel saw).
    Write {
        vol: Uuid,
        piece: Piece,
        chan: Arc<ChannelShared>,
    },
    /// A discard or write-zeroes piece.
    Zero {
        vol: Uuid,
        piece: ZeroPiece,
    },
    /// A read piece of a cluster only the chain's external parent holds: the owner reads it
    /// from that bdev straight into the piece's buffers.
    ExternalRead {
        vol: Uuid,
        piece: Piece,
        chan: Arc<ChannelShared>,
    },
    /// A control operation.
    Call(Box<dyn FnOnce(&mut Owner) + Send>),
    Stop,
}

/// A discard or write-zeroes piece of a channel's request.
pub(crate) struct ZeroPiece {
    pub(crate) slot: u32,
    /// The volume's cluster, and the range inside it.
    pub(crate) index: u64,
    pub(crate) within: u64,
    pub(crate) len: u64,
    pub(crate) discard: bool,
    pub(crate) chan: Arc<ChannelShared>,
}

/// The longest a structural change waits for a volume's writes to drain.
const QUIESCE_LIMIT: Duration = Duration::from_secs(30);

/// Bytes the owner moves per base request when copying or zeroing clusters.
const CHUNK: usize = 1 << 20;

/// Synchronous I/O on the owner's channel of the base bdev.
pub(crate) struct BaseIo {
    bdev: Bdev,
    chan: Box<dyn IoChannel>,
    buf: BounceBuf,
    zeroes: BounceBuf,
}

impl BaseIo {
    pub(crate) fn open(bdev: Bdev) -> Result<BaseIo, LvolError> {
        let chan = bdev.open_channel().map_err(|e| {
            LvolError::Device(DeviceError {
                op: "open",
                page: 0,
                reason: format!("cannot open a channel of the base bdev: {e}"),
            })
        })?;
        Ok(BaseIo { bdev, chan, buf: BounceBuf::zeroed(CHUNK), zeroes: BounceBuf::zeroed(CHUNK) })
    }

    pub(crate) fn size_bytes(&self) -> u64 {
        self.bdev.info().size_bytes()
    }

    /// A request with buffers its maker vouched for (this value's own, or a channel's piece
    /// whose request waits for this one), waited for; Busy is retried.
    fn run(&mut self, op: IoOp, offset: u64, len: u64, iov: Iovecs) -> Result<(), i32> {
        let req = IoRequest { tag: 0, op, offset, len, iov };
        sync_io::run(self.chan.as_mut(), &req, &mut || false)
    }

    fn read_into_buf(&mut self, offset: u64, len: usize) -> Result<(), i32> {
        let iov = self.buf.iovecs(len);
        self.run(IoOp::Read, offset, len as u64, iov)
    }

    fn write_from_buf(&mut self, offset: u64, len: usize) -> Result<(), i32> {
        let iov = self.buf.iovecs(len);
        self.run(IoOp::Write, offset, len as u64, iov)
    }

    pub(crate) fn flush(&mut self) -> Result<(), i32> {
        self.run(IoOp::Flush, 0, 0, Iovecs::NONE)
    }

    /// Copies `len` bytes (a cluster) from `from` to `to`.
    pub(crate) fn copy(&mut self, from: u64, to: u64, len: u64) -> Result<(), i32> {
        let mut done = 0;
        while done < len {
            let n = (len - done).min(CHUNK as u64) as usize;
            self.read_into_buf(from + done, n)?;
            self.write_from_buf(to + done, n)?;
            done += n as u64;
        }
        Ok(())
    }

    /// Reads into a channel's piece (its own buffers) at `offset`.
    fn read_piece(&mut self, piece: &Piece, offset: u64) -> Result<(), i32> {
        self.run(piece.req.op, offset, piece.req.len, piece.req.iov)
    }

    /// Copies `len` bytes at `from` to `to` on another device (a shallow copy's destination).
    pub(crate) fn copy_to(&mut self, from: u64, dst: &mut BaseIo, to: u64, len: u64) -> Result<(), i32> {
        let mut done = 0;
        while done < len {
            let n = (len - done).min(CHUNK as u64) as usize;
            self.read_into_buf(from + done, n)?;
            let iov = self.buf.iovecs(n);
            dst.run(IoOp::Write, to + done, n as u64, iov)?;
            done += n as u64;
        }
        Ok(())
    }

    /// Makes `len` bytes at `offset` read back as zeroes.
    pub(crate) fn zero(&mut self, offset: u64, len: u64) -> Result<(), i32> {
        if self.bdev.info().io_types.write_zeroes {
            match self.run(IoOp::WriteZeroes, offset, len, Iovecs::NONE) {
                Err(libc::EOPNOTSUPP) => {}
                r => return r,
            }
        }
        let mut done = 0;
        while done < len {
            let n = (len - done).min(CHUNK as u64);
            let iov = self.zeroes.iovecs(n as usize);
            self.run(IoOp::Write, offset + done, n, iov)?;
            done += n;
        }
        Ok(())
    }

    /// Deallocates a range when the base can; nothing otherwise (a discard promises nothing).
    pub(crate) fn discard(&mut self, offset: u64, len: u64) -> Result<(), i32> {
        if !self.bdev.info().io_types.unmap {
            return Ok(());
        }
        match self.run(IoOp::Discard, offset, len, Iovecs::NONE) {
            Err(libc::EOPNOTSUPP) => Ok(()),
            r => r,
        }
    }
}

fn device_error(op: &'static str, page: u64, errno: i32) -> DeviceError {
    DeviceError { op, page, reason: std::io::Error::from_raw_os_error(errno).to_string() }
}

impl MetaDevice for BaseIo {
    fn size_pages(&self) -> u64 {
        self.size_bytes() / PAGE_SIZE as u64
    }

    fn read_page(&mut self, page: u64, buf: &mut Page) -> Result<(), DeviceError> {
        self.read_into_buf(page * PAGE_SIZE as u64, PAGE_SIZE).map_err(|e| device_error("read", page, e))?;
        buf.copy_from_slice(&self.buf.bytes()[..PAGE_SIZE]);
        Ok(())
    }

    fn write_page(&mut self, page: u64, buf: &Page) -> Result<(), DeviceError> {
        self.buf.bytes_mut()[..PAGE_SIZE].copy_from_slice(buf);
        self.write_from_buf(page * PAGE_SIZE as u64, PAGE_SIZE).map_err(|e| device_error("write", page, e))
    }

    fn flush(&mut self) -> Result<(), DeviceError> {
        BaseIo::flush(self).map_err(|e| device_error("flush", 0, e))
    }
}

/// The owner's state; control operations get it as `&mut Owner` (see `LvStore::call`).
pub(crate) struct Owner {
    pub(crate) store: Store,
    pub(crate) io: BaseIo,
    pub(crate) vols: HashMap<Uuid, Arc<VolumeShared>>,
    pub(crate) geo: Geometry,
    rx: Receiver<Msg>,
    /// Messages that arrived while a quiesce served only I/O.
    deferred: VecDeque<Msg>,
    /// Set when a commit failed: what is durable is no longer known, so every later change is
    /// refused (the store must be reloaded).
    pub(crate) broken: Option<String>,
    /// The external parents present, by name (a missing one's reads fail until it appears).
    pub(crate) externals: HashMap<String, BaseIo>,
}

/// The published view of volume `uuid`, from the store's maps and its parent's view.
pub(crate) fn build_view(store: &Store, vols: &HashMap<Uuid, Arc<VolumeShared>>, uuid: &Uuid) -> View {
    let v = store.volume(uuid).expect("the volume exists");
    let mut layers = vec![Layer::from_map(&v.map)];
    let mut external = v.external.as_ref().map_or(0, |e| e.clusters);
    if let Some(parent) = v.parent.and_then(|p| vols.get(&p)) {
        let pv = parent.view.load();
        layers.extend(pv.layers.iter().cloned());
        external = pv.external;
    }
    View { layers, external }
}

impl Owner {
    pub(crate) fn new(store: Store, io: BaseIo, rx: Receiver<Msg>) -> Owner {
        let geo = Geometry::of(&store);
        let mut vols = HashMap::new();
        // Parents come before their clones in the store's list.
        for v in store.volumes() {
            let view = build_view(&store, &vols, &v.uuid);
            vols.insert(v.uuid, VolumeShared::new(view, v.read_only));
        }
        Owner { store, io, vols, geo, rx, deferred: VecDeque::new(), broken: None, externals: HashMap::new() }
    }

    pub(crate) fn run(mut self) {
        loop {
            let msg = match self.deferred.pop_front() {
                Some(m) => m,
                None => match self.rx.recv() {
                    Ok(m) => m,
                    Err(_) => return,
                },
            };
            let mut io = Vec::new();
            match msg {
                Msg::Call(f) => {
                    f(&mut self);
                    continue;
                }
                Msg::Stop => return,
                m => io.push(m),
            }
            while let Ok(m) = self.rx.try_recv() {
                match m {
                    Msg::Write { .. } | Msg::Zero { .. } | Msg::ExternalRead { .. } => io.push(m),
                    other => self.deferred.push_back(other),
                }
            }
            self.serve_io(io);
        }
    }

    /// Republishes the view of `uuid` and of every volume below it (their views include its
    /// layer), parents first.
    pub(crate) fn publish_tree(&mut self, uuid: &Uuid) {
        let order: Vec<Uuid> = self.store.volumes().iter().map(|v| v.uuid).collect();
        let mut touched = std::collections::HashSet::new();
        touched.insert(*uuid);
        for u in order {
            let v = self.store.volume(&u).expect("listed");
            if u != *uuid && !v.parent.is_some_and(|p| touched.contains(&p)) {
                continue;
            }
            touched.insert(u);
            let view = build_view(&self.store, &self.vols, &u);
            match self.vols.get(&u) {
                Some(shared) => shared.view.store(Arc::new(view)),
                None => {
                    let ro = v.read_only;
                    self.vols.insert(u, VolumeShared::new(view, ro));
                }
            }
        }
    }

    /// Holds new writes to `uuid` and waits for those in flight, serving allocations meanwhile.
    pub(crate) fn quiesce(&mut self, uuid: &Uuid) -> Result<(), LvolError> {
        let shared = self.vols.get(uuid).cloned().expect("the volume exists");
        shared.frozen.store(true, Ordering::SeqCst);
        let start = Instant::now();
        loop {
            // Allocations are served (the writes waiting for them count as in flight); anything
            // else waits for the change being made.
            let mut io = Vec::new();
            while let Ok(m) = self.rx.try_recv() {
                match m {
                    Msg::Write { .. } => io.push(m),
                    other => self.deferred.push_back(other),
                }
            }
            if !io.is_empty() {
                self.serve_io(io);
            }
            if shared.writes_in_flight() == 0 {
                return Ok(());
            }
            if start.elapsed() > QUIESCE_LIMIT {
                shared.frozen.store(false, Ordering::SeqCst);
                return Err(LvolError::State {
                    field: "name",
                    reason: format!("the volume's writes did not drain within {QUIESCE_LIMIT:?}"),
                });
            }
            std::thread::sleep(Duration::from_micros(50));
        }
    }

    /// A structural change to volume `vol` with its writes held: `change` edits the store (and
    /// may move data), then the commit, then the maps are republished from `root` down, then
    /// the writes go on.
    pub(crate) fn change_held(
        &mut self,
        vol: &Uuid,
        root: &Uuid,
        change: impl FnOnce(&mut Owner) -> Result<(), LvolError>,
    ) -> Result<(), LvolError> {
        self.check_usable()?;
        if !self.vols.contains_key(vol) {
            return Err(LvolError::NotFound { field: "name", value: vol.to_string() });
        }
        self.quiesce(vol)?;
        let r = change(self).and_then(|()| self.commit());
        if r.is_ok() {
            self.publish_tree(root);
        }
        self.thaw(vol);
        r
    }

    /// Runs a store operation on volume `vol` that hands out new clusters (inflate, decouple)
    /// and fills each (copy from the store or the external parent, or zeroes), then flushes:
    /// their data is durable before the commit maps them. Refused, changing nothing, when the
    /// volume's external parent is missing.
    pub(crate) fn fill(
        &mut self,
        vol: &Uuid,
        op: impl FnOnce(&mut Store) -> Result<Vec<crate::NewCluster>, LvolError>,
    ) -> Result<(), LvolError> {
        let external = self.store.chain_external(vol).map(|e| e.name.clone());
        if let Some(name) = external.as_ref().filter(|n| !self.externals.contains_key(*n)) {
            return Err(LvolError::State {
                field: "lvol",
                reason: format!("its external snapshot '{name}' is missing"),
            });
        }
        let new = op(&mut self.store)?;
        let cs = self.geo.cluster_size();
        for (index, cluster, from) in new {
            let to = self.geo.phys(cluster);
            let r = match from {
                ReadSource::Cluster(src) => self.io.copy(self.geo.phys(src), to, cs),
                ReadSource::Zeroes => self.io.zero(to, cs),
                ReadSource::External => match external.as_ref().and_then(|n| self.externals.get_mut(n)) {
                    Some(ext) => ext.copy_to(index * cs, &mut self.io, to, cs),
                    None => Err(libc::EIO),
                },
            };
            if let Err(e) = r {
                let why = format!("filling cluster {cluster} failed: errno {e}");
                self.broken = Some(why.clone());
                return Err(LvolError::Device(crate::DeviceError { op: "write", page: 0, reason: why }));
            }
        }
        self.io.flush().map_err(|e| {
            let why = format!("flushing filled clusters failed: errno {e}");
            self.broken = Some(why.clone());
            LvolError::Device(crate::DeviceError { op: "flush", page: 0, reason: why })
        })
    }

    pub(crate) fn thaw(&self, uuid: &Uuid) {
        if let Some(s) = self.vols.get(uuid) {
            s.frozen.store(false, Ordering::SeqCst);
        }
    }

    /// Commits the store's changes (data written before must already be flushed). A failure
    /// breaks the store: its memory no longer matches anything durable.
    pub(crate) fn commit(&mut self) -> Result<(), LvolError> {
        if let Some(why) = &self.broken {
            return Err(LvolError::State { field: "lvs", reason: format!("the store is broken: {why}") });
        }
        match self.store.commit(&mut self.io) {
            Ok(_) => Ok(()),
            Err(e) => {
                log::error!("lvstore '{}': metadata commit failed: {e}", self.store.name());
                self.broken = Some(e.to_string());
                Err(e)
            }
        }
    }

    /// Refuses a change on a broken store.
    pub(crate) fn check_usable(&self) -> Result<(), LvolError> {
        match &self.broken {
            Some(why) => {
                Err(LvolError::State { field: "lvs", reason: format!("the store is broken: {why}") })
            }
            None => Ok(()),
        }
    }

    /// Refuses a change that could give the volume's clusters away while a shallow copy reads
    /// them.
    pub(crate) fn check_not_copying(&self, vol: &Uuid) -> Result<(), LvolError> {
        match self.vols.get(vol) {
            Some(s) if s.busy.load(Ordering::SeqCst) > 0 => Err(LvolError::State {
                field: "name",
                reason: "a shallow copy of the volume is in progress".into(),
            }),
            _ => Ok(()),
        }
    }

    /// The cluster a write to the volume's cluster `index` goes to, allocating (and copying or
    /// zeroing) it when needed: `(cluster, newly allocated)`. `whole`: the caller overwrites all
    /// of it, so no copy is needed.
    fn cluster_for_write(&mut self, vol: &Uuid, index: u64, whole: bool) -> Result<(u32, bool), i32> {
        // A copy from a missing external parent fails before anything is allocated.
        if !whole && matches!(self.store.read_source(vol, index), Ok(ReadSource::External)) {
            self.external_of(vol)?;
        }
        match self.store.allocate_for_write(vol, index) {
            Ok(WriteTarget::Mapped(c)) => Ok((c, false)),
            Ok(WriteTarget::Allocated { cluster, copy_from }) => {
                let to = self.geo.phys(cluster);
                let cs = self.geo.cluster_size();
                let r = match copy_from {
                    Some(src) if !whole => self.io.copy(self.geo.phys(src), to, cs),
                    _ => self.io.zero(to, cs),
                };
                if let Err(e) = r {
                    // The base failed one write: the cluster goes back unmapped (no commit has
                    // mapped it, so nothing durable changed) and only this write fails. Breaking
                    // the store here would turn one transient error into a store that refuses
                    // every change until it is reloaded.
                    log::warn!("lvol {vol}: preparing cluster {cluster} for cluster {index}: errno {e}");
                    self.store.undo_allocation(vol, index);
                    return Err(e);
                }
                Ok((cluster, true))
            }
            Ok(WriteTarget::AllocatedFromExternal { cluster }) => {
                let (to, cs) = (self.geo.phys(cluster), self.geo.cluster_size());
                // `whole`: a write-zeroes of the whole cluster, which the zeroing is.
                let r = match whole {
                    true => self.io.zero(to, cs),
                    false => match self.store.chain_external(vol).map(|e| e.name.clone()) {
                        Some(name) => match self.externals.get_mut(&name) {
                            Some(ext) => ext.copy_to(index * cs, &mut self.io, to, cs),
                            None => Err(libc::EIO),
                        },
                        None => Err(libc::EIO),
                    },
                };
                if let Err(e) = r {
                    // The external bdev failed, not the store: the cluster goes back unmapped
                    // (never durable, so nothing else changed) and the write fails.
                    log::warn!("lvol {vol}: copying cluster {index} from its external parent: errno {e}");
                    self.store.undo_allocation(vol, index);
                    return Err(libc::EIO);
                }
                Ok((cluster, true))
            }
            Err(LvolError::NoSpace { .. }) => Err(libc::ENOSPC),
            Err(e) => {
                log::warn!("lvol {vol}: cluster {index}: {e}");
                Err(libc::EIO)
            }
        }
    }

    /// The present external parent of the volume's chain; EIO when it has none or it is
    /// missing.
    fn external_of(&mut self, vol: &Uuid) -> Result<&mut BaseIo, i32> {
        let name = self.store.chain_external(vol).map(|e| e.name.clone()).ok_or(libc::EIO)?;
        self.externals.get_mut(&name).ok_or(libc::EIO)
    }

    /// A read piece from the external parent (its own offsets: the volume's cluster `index`).
    fn external_read(&mut self, vol: &Uuid, piece: &Piece) -> IoStatus {
        let offset = (piece.index << self.geo.cluster_shift) + piece.req.offset;
        match self.external_of(vol).and_then(|ext| ext.read_piece(piece, offset)) {
            Ok(()) => IoStatus::Success,
            Err(e) => IoStatus::Error(e),
        }
    }

    /// Frees the whole clusters that discards and write-zeroes cover on a thin volume, with the
    /// volume's writes held from before the release until the commit is durable and the maps
    /// are published: a write still in flight to a freed cluster could otherwise land after the
    /// cluster went to another volume. Returns the pieces that freed nothing, for
    /// [`Owner::zero_piece`].
    fn release_whole(
        &mut self,
        vol: Uuid,
        pieces: Vec<ZeroPiece>,
        replies: &mut Vec<(Arc<ChannelShared>, Reply)>,
    ) -> Vec<ZeroPiece> {
        if self.quiesce(&vol).is_err() {
            for p in pieces {
                replies.push((p.chan, Reply::Done { slot: p.slot, status: IoStatus::Error(libc::EBUSY) }));
            }
            return Vec::new();
        }
        let mut rest = Vec::new();
        let mut freed = Vec::new();
        for p in pieces {
            match self.store.release_cluster(&vol, p.index) {
                Ok(true) => freed.push(p),
                Ok(false) => rest.push(p),
                Err(_) => {
                    replies.push((p.chan, Reply::Done { slot: p.slot, status: IoStatus::Error(libc::EIO) }))
                }
            }
        }
        let status = if freed.is_empty() || self.commit().is_ok() {
            if let Some(s) = self.vols.get(&vol) {
                let layer = s.own_layer();
                for p in &freed {
                    layer.set(p.index, UNALLOCATED);
                }
            }
            IoStatus::Success
        } else {
            IoStatus::Error(libc::EIO)
        };
        self.thaw(&vol);
        for p in freed {
            replies.push((p.chan, Reply::Done { slot: p.slot, status }));
        }
        rest
    }

    /// A discard or write-zeroes piece that frees nothing; records clusters it allocates, to
    /// publish after the commit.
    fn zero_piece(&mut self, vol: &Uuid, p: &ZeroPiece, publish: &mut Vec<(Uuid, u64, u32)>) -> IoStatus {
        let status = |r: Result<(), i32>| match r {
            Ok(()) => IoStatus::Success,
            Err(e) => IoStatus::Error(e),
        };
        let (index, within, len) = (p.index, p.within, p.len);
        let whole = within == 0 && len == self.geo.cluster_size();
        let own =
            self.store.volume(vol).and_then(|v| v.map.get(index as usize).copied()).unwrap_or(UNALLOCATED);
        if p.discard {
            if own == UNALLOCATED {
                return IoStatus::Success;
            }
            return status(self.io.discard(self.geo.phys(own) + within, len));
        }
        if own == UNALLOCATED && matches!(self.store.read_source(vol, index), Ok(ReadSource::Zeroes)) {
            // Reads zeroes already.
            return IoStatus::Success;
        }
        match self.cluster_for_write(vol, index, whole) {
            Ok((c, new)) => {
                if new {
                    publish.push((*vol, index, c));
                    if whole {
                        return IoStatus::Success;
                    }
                }
                status(self.io.zero(self.geo.phys(c) + within, len))
            }
            Err(e) => IoStatus::Error(e),
        }
    }

    /// Serves the channels' requests: allocations first, then one flush of the copied data, one
    /// commit, and only then the answers.
    fn serve_io(&mut self, msgs: Vec<Msg>) {
        let mut replies: Vec<(Arc<ChannelShared>, Reply)> = Vec::with_capacity(msgs.len());
        let mut publish: Vec<(Uuid, u64, u32)> = Vec::new();
        let mut writes = Vec::new();
        let mut zeroes: Vec<(Uuid, ZeroPiece)> = Vec::new();
        for m in msgs {
            match m {
                // Reads change nothing: a broken store still serves them.
                Msg::ExternalRead { vol, piece, chan } => {
                    let status = self.external_read(&vol, &piece);
                    replies.push((chan, Reply::Done { slot: piece.slot, status }));
                }
                _ if self.broken.is_some() => {
                    let (chan, slot) = match m {
                        Msg::Write { piece, chan, .. } => (chan, piece.slot),
                        Msg::Zero { piece, .. } => (piece.chan, piece.slot),
                        _ => continue,
                    };
                    replies.push((chan, Reply::Done { slot, status: IoStatus::Error(libc::EIO) }));
                }
                Msg::Write { vol, piece, chan } => writes.push((vol, piece, chan)),
                Msg::Zero { vol, piece } => zeroes.push((vol, piece)),
                _ => {}
            }
        }
        // The writes first: a quiesce below waits for them.
        for (vol, piece, chan) in writes {
            match self.cluster_for_write(&vol, piece.index, false) {
                Ok((cluster, new)) => {
                    if new {
                        publish.push((vol, piece.index, cluster));
                    }
                    replies.push((chan, Reply::Mapped { piece, cluster }));
                }
                Err(e) => replies.push((chan, Reply::Done { slot: piece.slot, status: IoStatus::Error(e) })),
            }
        }
        self.answer(replies, publish);
        if zeroes.is_empty() {
            return;
        }
        // Whole clusters, a volume at a time (each with its writes held briefly).
        let mut replies = Vec::new();
        let cs = self.geo.cluster_size();
        let mut rest = Vec::new();
        while let Some((vol, _)) = zeroes.iter().find(|(_, p)| p.within == 0 && p.len == cs) {
            let vol = *vol;
            let (mine, others): (Vec<_>, Vec<_>) =
                zeroes.into_iter().partition(|(v, p)| *v == vol && p.within == 0 && p.len == cs);
            zeroes = others;
            let pieces = mine.into_iter().map(|(_, p)| p).collect();
            rest.extend(self.release_whole(vol, pieces, &mut replies).into_iter().map(|p| (vol, p)));
        }
        zeroes.extend(rest);
        let mut publish = Vec::new();
        for (vol, p) in zeroes {
            let status = self.zero_piece(&vol, &p, &mut publish);
            replies.push((p.chan, Reply::Done { slot: p.slot, status }));
        }
        self.answer(replies, publish);
    }

    /// Makes the clusters allocated for `replies` durable (one flush of their data, then the
    /// commit), publishes them, and only then answers.
    fn answer(&mut self, replies: Vec<(Arc<ChannelShared>, Reply)>, publish: Vec<(Uuid, u64, u32)>) {
        if !publish.is_empty() {
            // Data before metadata: the copies and zeroes must be durable before the commit
            // that maps them.
            let durable = match self.io.flush() {
                Ok(()) => self.commit().is_ok(),
                Err(e) => {
                    // Nothing was committed: the round's new clusters go back unmapped and only
                    // its writes fail, as when preparing one cluster fails.
                    log::warn!("lvstore '{}': flushing new clusters failed: errno {e}", self.store.name());
                    for (vol, index, _) in &publish {
                        self.store.undo_allocation(vol, *index);
                    }
                    false
                }
            };
            if !durable {
                for (chan, r) in replies {
                    let slot = match r {
                        Reply::Mapped { piece, .. } => piece.slot,
                        Reply::Done { slot, .. } => slot,
                    };
                    chan.replies.push(Reply::Done { slot, status: IoStatus::Error(libc::EIO) });
                }
                return;
            }
            for (vol, index, cluster) in publish {
                if let Some(s) = self.vols.get(&vol) {
                    s.own_layer().set(index, cluster);
                }
            }
        }
        for (chan, r) in replies {
            chan.replies.push(r);
        }
    }
}

/// Starts the owner of `store` on its own thread.
pub(crate) fn spawn(
    name: String,
    bdev: Bdev,
    open: impl FnOnce(&mut BaseIo) -> Result<Store, LvolError> + Send + 'static,
) -> Result<(Sender<Msg>, std::thread::JoinHandle<()>, OwnerStart), LvolError> {
    let (tx, rx) = std::sync::mpsc::channel();
    let (started_tx, started_rx) = std::sync::mpsc::sync_channel(1);
    let thread = std::thread::Builder::new()
        .name(format!("lvs-{name}"))
        .spawn(move || {
            let mut io = match BaseIo::open(bdev) {
                Ok(io) => io,
                Err(e) => {
                    let _ = started_tx.send(Err(e));
                    return;
                }
            };
            let store = match open(&mut io) {
                Ok(s) => s,
                Err(e) => {
                    let _ = started_tx.send(Err(e));
                    return;
                }
            };
            let owner = Owner::new(store, io, rx);
            let start = OwnerStart::of(&owner);
            if started_tx.send(Ok(start)).is_err() {
                return;
            }
            owner.run();
        })
        .map_err(|e| LvolError::Invalid {
            field: "lvs_name",
            reason: format!("cannot start a thread: {e}"),
        })?;
    match started_rx.recv() {
        Ok(Ok(start)) => Ok((tx, thread, start)),
        Ok(Err(e)) => {
            let _ = thread.join();
            Err(e)
        }
        Err(_) => {
            let _ = thread.join();
            Err(LvolError::Corrupt("the store's owner stopped while opening it".into()))
        }
    }
}

/// What the owner reports once the store is open.
pub(crate) struct OwnerStart {
    pub(crate) uuid: Uuid,
    pub(crate) geo: Geometry,
    pub(crate) volumes: Vec<(Uuid, Arc<VolumeShared>, u64)>,
}

impl OwnerStart {
    fn of(owner: &Owner) -> OwnerStart {
        OwnerStart {
            uuid: owner.store.uuid(),
            geo: owner.geo,
            volumes: owner
                .store
                .volumes()
                .iter()
                .map(|v| (v.uuid, owner.vols[&v.uuid].clone(), v.size_clusters() * owner.geo.cluster_size()))
                .collect(),
        }
    }
}
