//! The point-in-time bdev: read-only, reads each run of chunks from the base (not yet copied,
//! a reader counted on each chunk until the read completes) or from the target (copied).
//! Writes, write-zeroes and discards fail with EROFS; a flush succeeds (nothing to flush).

use std::any::Any;
use std::collections::VecDeque;
use std::sync::Arc;

use super::shared::FleeceShared;
use crate::{
    BdevError, BdevInfo, BlockDevice, Capacity, DoneList, IoChannel, IoOp, IoRequest, IoStatus, IoTypes,
    IovCursor, IovSlices, SubmitError,
};

/// The point-in-time bdev of a fleece.
pub struct FleeceDevice {
    info: BdevInfo,
    shared: Arc<FleeceShared>,
}

impl FleeceDevice {
    /// The view of `shared`, as large as the base was at its creation.
    pub fn new(shared: Arc<FleeceShared>) -> FleeceDevice {
        let b = shared.base.info();
        let info = BdevInfo {
            name: shared.name.clone(),
            product_name: "fleece".into(),
            block_size: b.block_size,
            // Its own: the view keeps the size the base had at the point in time.
            capacity: Capacity::new(shared.len / u64::from(b.block_size)),
            io_types: IoTypes { read: true, write: false, flush: true, unmap: false, write_zeroes: false },
            driver: "fleece",
            driver_specific: None,
        };
        FleeceDevice { info, shared }
    }

    /// The fleece's shared state.
    pub fn shared(&self) -> &Arc<FleeceShared> {
        &self.shared
    }
}

impl BlockDevice for FleeceDevice {
    fn info(&self) -> &BdevInfo {
        &self.info
    }

    fn open_channel(&self) -> Result<Box<dyn IoChannel>, BdevError> {
        Ok(Box::new(FleeceChannel {
            shared: self.shared.clone(),
            base: self.shared.base.open_channel()?,
            target: self.shared.target.open_channel()?,
            done: DoneList::new(),
            parents: Vec::new(),
            free_parents: Vec::new(),
            pieces: Vec::new(),
            free_pieces: Vec::new(),
            queued: VecDeque::new(),
            in_flight: 0,
            finished: Vec::new(),
        }))
    }

    fn as_any(&self) -> Option<&dyn Any> {
        Some(self)
    }

    fn read_only(&self) -> bool {
        true
    }
}

/// A read of the view as its caller sent it: done when its pieces are.
struct Parent {
    tag: u32,
    left: u32,
    status: IoStatus,
}

/// A run of chunks read from one device.
struct Piece {
    parent: u32,
    /// Read from the base: these chunks each count this read until it completes.
    base_chunks: Option<(u64, u64)>,
    req: IoRequest,
    /// The piece's iovecs (cut from the parent's), kept until it completes.
    _slices: IovSlices,
}

struct FleeceChannel {
    shared: Arc<FleeceShared>,
    base: Box<dyn IoChannel>,
    target: Box<dyn IoChannel>,
    done: DoneList,
    parents: Vec<Parent>,
    free_parents: Vec<u32>,
    pieces: Vec<Option<Piece>>,
    free_pieces: Vec<u32>,
    /// Pieces a device answered Busy: sent again at the next poll.
    queued: VecDeque<u32>,
    in_flight: usize,
    /// The pieces one poll completed (kept: a poll allocates nothing once it has grown).
    finished: Vec<(u32, IoStatus)>,
}

/// The worse of two statuses (the first error wins).
fn worse(a: IoStatus, b: IoStatus) -> IoStatus {
    if a == IoStatus::Success {
        b
    } else {
        a
    }
}

impl FleeceChannel {
    fn read(&mut self, req: &IoRequest) {
        let sh = self.shared.clone();
        let chunks = sh.map.chunks(req.offset, req.len);
        let parent = match self.free_parents.pop() {
            Some(i) => i,
            None => {
                self.parents.push(Parent { tag: 0, left: 0, status: IoStatus::Success });
                (self.parents.len() - 1) as u32
            }
        };
        self.parents[parent as usize] = Parent { tag: req.tag, left: 0, status: IoStatus::Success };
        self.in_flight += 1;
        // Runs of chunks with the same source; the reader counts are taken as the run is built,
        // so a chunk seen uncopied stays readable on the base until the piece completes.
        let mut run: Option<(u64, bool)> = None;
        for c in chunks.clone() {
            let on_base = sh.map.start_base_read(c);
            match run {
                Some((_, b)) if b == on_base => {}
                Some((first, b)) => {
                    self.add_piece(parent, req, first, c, b);
                    run = Some((c, on_base));
                }
                None => run = Some((c, on_base)),
            }
        }
        if let Some((first, b)) = run {
            self.add_piece(parent, req, first, chunks.end, b);
        }
        if self.parents[parent as usize].left == 0 {
            self.finish_parent(parent);
        }
    }

    /// Sends chunks `first..end` of `req` (cut to it) to the base or the target.
    fn add_piece(&mut self, parent: u32, req: &IoRequest, first: u64, end: u64, on_base: bool) {
        let g = self.shared.granularity;
        let start = (first * g).max(req.offset);
        let stop = (end * g).min(req.offset + req.len);
        let mut slices = IovSlices::new(req.iov.count().max(1) as usize);
        let mut cursor = IovCursor::at(&req.iov, start - req.offset);
        let Some(iov) = slices.slice(0, &req.iov, &mut cursor, stop - start) else {
            if on_base {
                for c in first..end {
                    self.shared.map.end_base_read(c);
                }
            }
            let p = &mut self.parents[parent as usize];
            p.status = worse(p.status, IoStatus::Error(libc::EINVAL));
            return;
        };
        let piece = Piece {
            parent,
            base_chunks: on_base.then_some((first, end)),
            req: IoRequest { tag: 0, op: IoOp::Read, offset: start, len: stop - start, iov },
            _slices: slices,
        };
        let idx = match self.free_pieces.pop() {
            Some(i) => i,
            None => {
                self.pieces.push(None);
                (self.pieces.len() - 1) as u32
            }
        };
        let mut piece = piece;
        piece.req.tag = idx;
        self.pieces[idx as usize] = Some(piece);
        self.parents[parent as usize].left += 1;
        self.send(idx);
    }

    fn send(&mut self, idx: u32) {
        let Some(p) = self.pieces[idx as usize].as_ref() else { return };
        let dev = if p.base_chunks.is_some() { &mut self.base } else { &mut self.target };
        match dev.submit(&p.req) {
            Ok(()) => {}
            Err(SubmitError::Busy) => self.queued.push_back(idx),
            Err(_) => self.piece_done(idx, IoStatus::Error(libc::EIO)),
        }
    }

    fn piece_done(&mut self, idx: u32, status: IoStatus) {
        let Some(p) = self.pieces[idx as usize].take() else { return };
        self.free_pieces.push(idx);
        if let Some((first, end)) = p.base_chunks {
            for c in first..end {
                self.shared.map.end_base_read(c);
            }
        }
        let parent = &mut self.parents[p.parent as usize];
        parent.status = worse(parent.status, status);
        parent.left -= 1;
        if parent.left == 0 {
            self.finish_parent(p.parent);
        }
    }

    fn finish_parent(&mut self, i: u32) {
        let p = &self.parents[i as usize];
        // Broken (or deleted) while it was in flight: what it read may be newer than the
        // point in time.
        let status =
            if self.shared.broken() || self.shared.ended() { IoStatus::Error(libc::EIO) } else { p.status };
        self.done.push(p.tag, status);
        self.free_parents.push(i);
        self.in_flight -= 1;
    }
}

impl IoChannel for FleeceChannel {
    fn submit(&mut self, req: &IoRequest) -> Result<(), SubmitError> {
        match req.op {
            IoOp::Read => {
                let bs = u64::from(self.shared.base.info().block_size);
                let misaligned = !req.offset.is_multiple_of(bs) || !req.len.is_multiple_of(bs);
                if misaligned || req.offset.checked_add(req.len).is_none_or(|e| e > self.shared.len) {
                    return Err(SubmitError::OutOfRange);
                }
                if self.shared.broken() || self.shared.ended() {
                    self.done.push(req.tag, IoStatus::Error(libc::EIO));
                } else {
                    self.read(req);
                }
            }
            IoOp::Flush => self.done.push(req.tag, IoStatus::Success),
            _ => self.done.push(req.tag, IoStatus::Error(libc::EROFS)),
        }
        Ok(())
    }

    fn poll(&mut self, done: &mut dyn FnMut(u32, IoStatus)) -> usize {
        let mut finished = std::mem::take(&mut self.finished);
        self.base.poll(&mut |tag, status| finished.push((tag, status)));
        self.target.poll(&mut |tag, status| finished.push((tag, status)));
        for &(tag, status) in &finished {
            self.piece_done(tag, status);
        }
        finished.clear();
        self.finished = finished;
        for _ in 0..self.queued.len() {
            if let Some(idx) = self.queued.pop_front() {
                self.send(idx);
            }
        }
        self.done.deliver(done)
    }

    fn in_flight(&self) -> usize {
        self.in_flight + self.done.len()
    }

    fn sleeps_in_flight(&self) -> bool {
        false
    }
}
