//! A connection's requests: checked, submitted to the export's bdev (or answered at once), and
//! their replies built in their slots.

use fp_bdev::{IoOp, IoRequest, IoStatus, SubmitError};

use super::{ConnPoller, Phase, MAX_EXTENTS};
use crate::proto::*;

impl ConnPoller {
    /// Starts the ready requests, at most `budget` of them (taken from it); true when it
    /// started or answered any.
    pub(super) fn start_ready(&mut self, budget: &mut usize) -> bool {
        let mut moved = false;
        while let Some(&i) = self.ready.front() {
            if *budget == 0 {
                break;
            }
            *budget -= 1;
            match self.start(i) {
                Ok(()) => {
                    self.ready.pop_front();
                    moved = true;
                }
                Err(SubmitError::Busy) => break,
                Err(e) => {
                    self.ready.pop_front();
                    let err = if e == SubmitError::Unsupported { ENOTSUP } else { EINVAL };
                    self.reply(i, err, "the device refused the request");
                    moved = true;
                }
            }
        }
        moved
    }

    /// Checks a request and submits it, or answers it at once. `Err` only for what the channel
    /// refused.
    fn start(&mut self, i: u16) -> Result<(), SubmitError> {
        let info = self.export.bdev.info();
        let (io, readonly) = (info.io_types, self.export.readonly);
        let slot = &mut self.slots[i as usize];
        let r = slot.req;
        if slot.flush_due {
            return self.submit(i, IoOp::Flush, 0, 0);
        }
        let (offset, len) = (r.offset, u64::from(r.length));
        let in_range = info.check_range(offset, len).is_ok();
        let writes = matches!(r.command, CMD_WRITE | CMD_TRIM | CMD_WRITE_ZEROES);
        let allowed_flags = match r.command {
            CMD_READ => CMD_FLAG_DF,
            CMD_WRITE | CMD_TRIM => CMD_FLAG_FUA,
            CMD_WRITE_ZEROES => CMD_FLAG_FUA | CMD_FLAG_NO_HOLE | CMD_FLAG_FAST_ZERO,
            CMD_BLOCK_STATUS => CMD_FLAG_REQ_ONE,
            _ => 0,
        };
        let refuse = |this: &mut Self, err, why: &str| {
            this.reply(i, err, why);
            Ok(())
        };
        if r.flags & !allowed_flags != 0 {
            return refuse(self, EINVAL, "flags not valid for this command");
        }
        if writes && readonly {
            return refuse(self, EPERM, "the export is read-only");
        }
        if !matches!(r.command, CMD_FLUSH) && r.command <= CMD_BLOCK_STATUS && !in_range {
            // As QEMU's server: a write past the end is out of space, anything else invalid.
            let past_end = offset.checked_add(len).is_none_or(|end| end > info.size_bytes());
            if past_end && matches!(r.command, CMD_WRITE | CMD_WRITE_ZEROES) {
                return refuse(self, ENOSPC, "write past the end of the export");
            }
            return refuse(self, EINVAL, "request outside the export or not aligned to its block size");
        }
        match r.command {
            CMD_READ | CMD_WRITE | CMD_TRIM | CMD_WRITE_ZEROES if len == 0 => refuse(self, 0, ""),
            CMD_READ => {
                self.slots[i as usize].buffer(len as usize);
                self.submit(i, IoOp::Read, offset, len)
            }
            CMD_WRITE => self.submit(i, IoOp::Write, offset, len),
            CMD_FLUSH if !io.flush => refuse(self, 0, ""),
            CMD_FLUSH => self.submit(i, IoOp::Flush, 0, 0),
            CMD_TRIM if !io.unmap => refuse(self, EINVAL, "the device cannot trim"),
            CMD_TRIM => self.submit(i, IoOp::Discard, offset, len),
            CMD_WRITE_ZEROES if !io.write_zeroes => {
                let err = if r.flags & CMD_FLAG_FAST_ZERO != 0 { ENOTSUP } else { EINVAL };
                refuse(self, err, "the device cannot write zeroes")
            }
            CMD_WRITE_ZEROES => self.submit(i, IoOp::WriteZeroes, offset, len),
            // Nothing to warm: no backend keeps a cache of its own (files are opened O_DIRECT,
            // librbd's cache is off), so the range check above is all a CACHE needs.
            CMD_CACHE => refuse(self, 0, ""),
            CMD_BLOCK_STATUS if len == 0 => refuse(self, EINVAL, "block status of zero bytes"),
            CMD_BLOCK_STATUS => {
                self.block_status(i);
                Ok(())
            }
            _ => refuse(self, EINVAL, "unknown command"),
        }
    }

    fn submit(&mut self, i: u16, op: IoOp, offset: u64, len: u64) -> Result<(), SubmitError> {
        let slot = &mut self.slots[i as usize];
        let data = matches!(op, IoOp::Read | IoOp::Write);
        let req = IoRequest {
            tag: u32::from(i),
            op,
            offset,
            len,
            // The slot keeps its buffer, untouched, until this request's completion comes back
            // (BounceBuf's contract): a read's was made above, a write's holds its payload.
            iov: if data {
                slot.buf.as_mut().expect("a read or write has its buffer").iovecs(len as usize)
            } else {
                fp_bdev::Iovecs::NONE
            },
        };
        self.channel.submit(&req)?;
        slot.phase = if slot.flush_due { Phase::Flushing } else { Phase::Submitted };
        Ok(())
    }

    /// Answers a BLOCK_STATUS: one chunk per context the connection selected, in id order,
    /// the last one DONE. `base:allocation` comes from the device's allocation map, each
    /// `qemu:dirty-bitmap:` from its bitmap's live bits, read over the request's range only.
    fn block_status(&mut self, i: u16) {
        let r = self.slots[i as usize].req;
        if !self.allocation && self.bitmaps.is_empty() {
            return self.reply(i, EINVAL, "no metadata context was negotiated");
        }
        let (offset, end) = (r.offset, r.offset + u64::from(r.length));
        let want = if r.flags & CMD_FLAG_REQ_ONE != 0 { 1 } else { MAX_EXTENTS };
        let chunks = usize::from(self.allocation) + self.bitmaps.len();
        self.slots[i as usize].extra.clear();
        let mut written = 0;
        if self.allocation {
            self.extents.clear();
            if let Err(e) = self.export.bdev.block_status(offset, u64::from(r.length), &mut self.extents) {
                return self.reply(i, EIO, &format!("block status: {e}"));
            }
            let bs = u64::from(self.export.bdev.info().block_size);
            let extra = &mut self.slots[i as usize].extra;
            let at = begin_chunk(extra, BASE_ALLOCATION_ID);
            let mut covered = 0u64;
            for e in self.extents.iter().take(want) {
                // An extent's length is 32 bits on the wire; a longer one is cut at a block.
                let len = e.len.min(u64::from(u32::MAX) / bs * bs).min(u64::from(r.length) - covered);
                if len == 0 {
                    break;
                }
                let flags = if e.hole { STATE_HOLE } else { 0 } | if e.zero { STATE_ZERO } else { 0 };
                push_extent(extra, len, flags);
                covered += len;
                if len < e.len {
                    break;
                }
            }
            if covered == 0 {
                return self.reply(i, EIO, "the device described no extent");
            }
            written += 1;
            end_chunk(extra, at, written == chunks, r.cookie);
        }
        for &b in &self.bitmaps {
            let (bitmap, unit) = &self.export.bitmaps[b as usize];
            let extra = &mut self.slots[i as usize].extra;
            let at = begin_chunk(extra, FIRST_BITMAP_ID + b);
            // Runs alternate dirty and clean, each whole windows (so whole blocks) cut to the
            // request; the request's length is 32 bits, so every run fits an extent.
            let (mut pos, mut n) = (offset, 0);
            while pos < end && n < want {
                let (dirty, stop) = bitmap.bitmap.run_at(pos, end, *unit);
                push_extent(extra, stop - pos, if dirty { STATE_DIRTY } else { 0 });
                pos = stop;
                n += 1;
            }
            written += 1;
            end_chunk(extra, at, written == chunks, r.cookie);
        }
        self.counters.count(r.command, r.length, 0);
        self.counted = true;
        // The chunks, headers included, are all in `extra`.
        let slot = &mut self.slots[i as usize];
        slot.hdr_len = 0;
        slot.data_len = 0;
        self.queue_reply(i);
    }

    /// Builds the reply to a finished request (`err` 0 for success) and queues it.
    pub(super) fn reply(&mut self, i: u16, err: u32, why: &str) {
        let slot = &mut self.slots[i as usize];
        let r = slot.req;
        let data = if err == 0 && r.command == CMD_READ { r.length as usize } else { 0 };
        self.counters.count(r.command, r.length, err);
        self.counted = true;
        slot.extra.clear();
        if !self.structured {
            slot.hdr[..SIMPLE_REPLY_LEN].copy_from_slice(&simple_reply(err, r.cookie));
            slot.hdr_len = SIMPLE_REPLY_LEN;
        } else if err != 0 {
            slot.extra.extend_from_slice(&err.to_be_bytes());
            slot.extra.extend_from_slice(&(why.len() as u16).to_be_bytes());
            slot.extra.extend_from_slice(why.as_bytes());
            slot.set_chunk(REPLY_TYPE_ERROR, slot.extra.len() as u32);
        } else if data > 0 {
            slot.set_chunk(REPLY_TYPE_OFFSET_DATA, 8 + r.length);
            slot.hdr[CHUNK_HEADER_LEN..].copy_from_slice(&r.offset.to_be_bytes());
            slot.hdr_len = CHUNK_HEADER_LEN + 8;
        } else {
            slot.set_chunk(REPLY_TYPE_NONE, 0);
        }
        slot.data_len = data;
        if err != 0 && err != EINVAL && err != EPERM {
            log::debug!(
                "nbd export '{}': {}: {} failed: {why}",
                self.export.name,
                self.peer,
                command_name(r.command)
            );
        }
        self.queue_reply(i);
    }

    fn queue_reply(&mut self, i: u16) {
        if self.life.is_broken() {
            return self.release(i);
        }
        self.slots[i as usize].phase = Phase::Replying;
        self.tx.push(i);
    }

    /// Reaps completions; FUA requests go on to their flush.
    pub(super) fn reap(&mut self) -> usize {
        let mut done = std::mem::take(&mut self.completions);
        let n = self.channel.poll(&mut |tag: u32, status: IoStatus| done.push((tag, status)));
        for &(tag, status) in &done {
            let i = tag as u16;
            let slot = &mut self.slots[i as usize];
            // A device without a flush has no volatile cache: its writes are durable already.
            let fua = slot.req.flags & CMD_FLAG_FUA != 0
                && slot.phase == Phase::Submitted
                && self.export.bdev.info().io_types.flush;
            if status == IoStatus::Success && fua {
                slot.flush_due = true;
                slot.phase = Phase::Ready;
                self.ready.push_back(i);
                continue;
            }
            let (err, why) = match status {
                IoStatus::Success => (0, ""),
                IoStatus::Unsupported => (ENOTSUP, "the device does not support this operation"),
                IoStatus::Error(e) => (nbd_errno(e), "the device failed the request"),
            };
            self.reply(i, err, why);
        }
        done.clear();
        self.completions = done;
        n
    }
}

/// Maps a device's errno to the protocol's few values.
fn nbd_errno(e: i32) -> u32 {
    match e {
        libc::EPERM | libc::EROFS | libc::EACCES => EPERM,
        libc::ENOMEM => ENOMEM,
        libc::EINVAL => EINVAL,
        libc::ENOSPC | libc::EDQUOT => ENOSPC,
        libc::EOVERFLOW => EOVERFLOW,
        libc::ENOTSUP => ENOTSUP,
        libc::ESHUTDOWN => ESHUTDOWN,
        _ => EIO,
    }
}

/// Starts a block status chunk for context `id` in `out`: a header filled in by [`end_chunk`],
/// then the id. Returns where the header is.
fn begin_chunk(out: &mut Vec<u8>, id: u32) -> usize {
    let at = out.len();
    out.extend_from_slice(&[0; CHUNK_HEADER_LEN]);
    out.extend_from_slice(&id.to_be_bytes());
    at
}

fn push_extent(out: &mut Vec<u8>, len: u64, flags: u32) {
    out.extend_from_slice(&(len as u32).to_be_bytes());
    out.extend_from_slice(&flags.to_be_bytes());
}

/// Writes the header of the chunk begun at `at`, now that its length is known.
fn end_chunk(out: &mut [u8], at: usize, last: bool, cookie: u64) {
    let len = (out.len() - at - CHUNK_HEADER_LEN) as u32;
    let flags = if last { REPLY_FLAG_DONE } else { 0 };
    out[at..at + CHUNK_HEADER_LEN].copy_from_slice(&chunk_header(
        flags,
        REPLY_TYPE_BLOCK_STATUS,
        cookie,
        len,
    ));
}
