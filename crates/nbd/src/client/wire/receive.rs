//! The receive side of a [`Wire`]: reply headers into its [`RecvBuf`](fp_conn::RecvBuf), a
//! read's data straight into the caller's buffers (with the next header in the same call), and
//! every byte the server sends checked.

use std::io::IoSliceMut;

use fp_bdev::iov;
use fp_bdev::iov_io::with_slices_mut;
use fp_bdev::IoStatus;
use fp_conn::Recv;

use super::{violation, Rx, State, Transport, Wire, HDR_BATCH, READS_PER_POLL};
use crate::proto::*;

impl<T: Transport> Wire<T> {
    /// With nothing due, reads anyway: a readable socket then holds either the end of the
    /// stream (the server went away) or bytes nobody asked for, and either kills the
    /// connection now rather than at the next request. Called before the caller sleeps on
    /// the socket, which would otherwise wake it again and again.
    pub fn probe(&mut self) {
        let room = SIMPLE_REPLY_LEN.saturating_sub(self.hdr.len());
        if self.dead.is_some() || self.awaiting > 0 || self.rx != Rx::Header || room == 0 {
            return;
        }
        self.hdr.reserve(SIMPLE_REPLY_LEN);
        let io = &mut self.io;
        let why = match self.hdr.fill(|spare| read(io, &mut [IoSliceMut::new(&mut spare[..room])])) {
            Recv::Data(_) => match self.parse_headers() {
                Ok(()) if !self.hdr.is_empty() => {
                    violation(format!("{} bytes nobody asked for", self.hdr.len()))
                }
                Ok(()) => return,
                Err(e) => e,
            },
            Recv::WouldBlock => return,
            Recv::Eof => "the server closed the connection".to_string(),
            Recv::Failed(e) => format!("read from the server failed: {e}"),
        };
        self.die(why);
    }

    /// Reads replies until the socket is empty (or this poll's share is used).
    pub(super) fn receive(&mut self) -> Result<(), String> {
        for _ in 0..READS_PER_POLL {
            if self.rx == Rx::Header && self.hdr.is_empty() && self.awaiting == 0 {
                // Nothing can arrive but a violation; it is found when something is due.
                return Ok(());
            }
            let io = &mut self.io;
            let got = match self.rx {
                Rx::Header => {
                    // With no read answered yet, the stream holds only headers: take many.
                    let want = if self.reads_sent == 0 {
                        (self.awaiting * SIMPLE_REPLY_LEN)
                            .clamp(SIMPLE_REPLY_LEN, SIMPLE_REPLY_LEN * HDR_BATCH)
                    } else {
                        SIMPLE_REPLY_LEN
                    };
                    let room = want.saturating_sub(self.hdr.len());
                    self.hdr.reserve(want);
                    self.hdr.fill(|spare| read(io, &mut [IoSliceMut::new(&mut spare[..room])]))
                }
                Rx::Data { slot, done, len } => {
                    // The rest of the read's data straight into its buffers, and the next
                    // reply's header in the same call when it fits (the buffer is empty here:
                    // what followed the read's header was its data).
                    let s = &self.slots[slot];
                    self.hdr.reserve(SIMPLE_REPLY_LEN);
                    let tail = &mut self.hdr.spare_mut()[..SIMPLE_REPLY_LEN];
                    with_slices_mut(&s.iov, s.start + done, len - done, tail, |bufs| read(io, bufs))
                }
            };
            let n = match got {
                Recv::Data(n) => n,
                Recv::WouldBlock => return Ok(()),
                Recv::Eof => return Err("the server closed the connection".into()),
                Recv::Failed(e) => return Err(format!("read from the server failed: {e}")),
            };
            if let Rx::Data { slot, done, len } = self.rx {
                let data = n.min(len - done);
                if done + data < len {
                    self.rx = Rx::Data { slot, done: done + data, len };
                    continue;
                }
                self.hdr.filled(n - data);
                self.rx = Rx::Header;
                self.complete(slot, IoStatus::Success);
            }
            self.parse_headers()?;
        }
        Ok(())
    }

    /// Handles every whole header received; a read's data that came with its header is copied
    /// out, and the rest of that read's data is then received in place.
    fn parse_headers(&mut self) -> Result<(), String> {
        while self.rx == Rx::Header && self.hdr.len() >= SIMPLE_REPLY_LEN {
            let h: [u8; SIMPLE_REPLY_LEN] = self.hdr.data()[..SIMPLE_REPLY_LEN].try_into().expect("16 bytes");
            self.hdr.consume(SIMPLE_REPLY_LEN);
            let reply = parse_reply(&h).map_err(violation)?;
            let index = self.lookup(reply.cookie)?;
            let slot = &self.slots[index];
            if reply.error != 0 || slot.command != CMD_READ {
                let status =
                    if reply.error == 0 { IoStatus::Success } else { IoStatus::Error(errno(reply.error)) };
                self.complete(index, status);
                continue;
            }
            // A read's data follows: first what the buffer already holds.
            let len = slot.payload;
            let have = self.hdr.len().min(len);
            iov::copy_from_slice(&slot.iov, slot.start as u64, &self.hdr.data()[..have]);
            self.hdr.consume(have);
            if have == len {
                self.complete(index, IoStatus::Success);
            } else {
                self.rx = Rx::Data { slot: index, done: have, len };
            }
        }
        Ok(())
    }

    /// The slot a reply's cookie names: one whose request went out whole and is unanswered.
    fn lookup(&self, cookie: u64) -> Result<usize, String> {
        let index = (cookie & 0xffff_ffff) as usize;
        match self.slots.get(index) {
            Some(s) if s.state == State::Sent && u64::from(s.generation) == cookie >> 32 => Ok(index),
            _ => Err(violation(format!(
                "a reply with cookie {cookie:#x}, which names no request awaiting one"
            ))),
        }
    }
}

/// A reply header's fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reply {
    pub error: u32,
    pub cookie: u64,
}

/// Parses a simple reply header. A structured reply chunk is refused: this client never asks
/// for them, so a server sending one breaks the protocol.
pub fn parse_reply(b: &[u8; SIMPLE_REPLY_LEN]) -> Result<Reply, String> {
    match u32::from_be_bytes(b[0..4].try_into().expect("4 bytes")) {
        SIMPLE_REPLY_MAGIC => Ok(Reply {
            error: u32::from_be_bytes(b[4..8].try_into().expect("4 bytes")),
            cookie: u64::from_be_bytes(b[8..16].try_into().expect("8 bytes")),
        }),
        STRUCTURED_REPLY_MAGIC => Err("a structured reply, which was not negotiated".into()),
        m => Err(format!("reply magic {m:#010x}")),
    }
}

/// The errno for an NBD error value: the protocol's values are Linux's; anything else is `EIO`
/// (proto.md: "a client SHOULD treat unknown error values as EINVAL"... but a write that failed
/// for an unknown reason is an I/O error to whoever issued it).
pub fn errno(nbd: u32) -> i32 {
    match nbd {
        EPERM | EIO | ENOMEM | EINVAL | ENOSPC | EOVERFLOW | ENOTSUP | ESHUTDOWN => nbd as i32,
        _ => libc::EIO,
    }
}

/// One receive through `io`, as a [`Recv`].
fn read<T: Transport>(io: &mut T, bufs: &mut [IoSliceMut<'_>]) -> Recv {
    Recv::from_result(io.readv(bufs))
}
