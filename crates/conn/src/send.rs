//! The send side of a connection: a queue of entries (a reply, a PDU, a piece of one) whose
//! bytes go out in gathered writes, with the bytes a partial write took counted against the
//! entry at the front.

use std::collections::VecDeque;
use std::io::{self, IoSlice};

/// Buffers gathered into one vectored write.
pub const IOV_PER_WRITE: usize = 64;

/// What one gathered write did.
#[derive(Debug)]
pub enum Sent {
    /// It took this many bytes.
    Bytes(usize),
    /// It took nothing now: wait until the socket is writable.
    Blocked,
    /// The socket failed.
    Failed(io::Error),
}

/// Entries waiting to be sent, in order; `T` names one (a slot index, a piece).
pub struct SendQueue<T> {
    queue: VecDeque<T>,
    /// Bytes of the queue's front sent already (by writes that did not take whole entries).
    sent: usize,
    blocked: bool,
}

impl<T: Copy> SendQueue<T> {
    /// A queue with room for `n` entries (it grows past that only if they come).
    pub fn with_capacity(n: usize) -> SendQueue<T> {
        SendQueue { queue: VecDeque::with_capacity(n), sent: 0, blocked: false }
    }

    /// Queues `t` after what is queued.
    #[inline]
    pub fn push(&mut self, t: T) {
        self.queue.push_back(t);
    }

    /// Entries queued.
    #[inline]
    pub fn len(&self) -> usize {
        self.queue.len()
    }

    /// Whether nothing is queued.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// The last write took nothing: wait until the socket is writable.
    #[inline]
    pub fn is_blocked(&self) -> bool {
        self.blocked
    }

    /// Says whether the layer below (a TLS session's own buffer) could not send either.
    #[inline]
    pub fn set_blocked(&mut self, yes: bool) {
        self.blocked = yes;
    }

    /// Whether the front entry went out in part (a write of something else now would land
    /// in the middle of it).
    #[inline]
    pub fn mid_entry(&self) -> bool {
        self.sent > 0
    }

    /// The queued entries, front first.
    pub fn iter(&self) -> impl Iterator<Item = &T> {
        self.queue.iter()
    }

    /// One gathered write of the queued entries' bytes (`pieces_of` gives an entry's pieces,
    /// in order) past those sent already, with `send` (which answers a full socket with
    /// `Ok(0)` or `WouldBlock`). Entries sent whole come out of [`SendQueue::pop_sent`].
    #[inline]
    pub fn write<'a, P>(
        &mut self,
        pieces_of: impl Fn(T) -> P,
        send: impl FnOnce(&[IoSlice<'a>]) -> io::Result<usize>,
    ) -> Sent
    where
        P: IntoIterator<Item = &'a [u8]>,
    {
        let mut iov = [IoSlice::new(&[]); IOV_PER_WRITE];
        let n = self.gather(pieces_of, &mut iov);
        match send(&iov[..n]) {
            Ok(0) if n > 0 => {
                self.blocked = true;
                Sent::Blocked
            }
            Ok(sent) => {
                self.blocked = false;
                self.took(sent);
                Sent::Bytes(sent)
            }
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted) => {
                self.blocked = e.kind() == io::ErrorKind::WouldBlock;
                if self.blocked {
                    Sent::Blocked
                } else {
                    Sent::Bytes(0)
                }
            }
            Err(e) => {
                self.blocked = false;
                Sent::Failed(e)
            }
        }
    }

    /// Fills `iov` with the queued entries' bytes past those sent already, for a write made
    /// elsewhere (a send submitted to io_uring, whose result [`SendQueue::took`] counts);
    /// how many it filled.
    #[inline]
    pub fn gather<'a, P>(&self, pieces_of: impl Fn(T) -> P, iov: &mut [IoSlice<'a>]) -> usize
    where
        P: IntoIterator<Item = &'a [u8]>,
    {
        fp_sys::gather(self.queue.iter().flat_map(|&t| pieces_of(t)), self.sent, iov)
    }

    /// A write took `n` more bytes of the queue.
    #[inline]
    pub fn took(&mut self, n: usize) {
        self.sent += n;
    }

    /// The front entry, when the writes took all of it (`len_of` gives an entry's length).
    #[inline]
    pub fn pop_sent(&mut self, len_of: impl Fn(T) -> usize) -> Option<T> {
        let &front = self.queue.front()?;
        let len = len_of(front);
        if self.sent < len {
            return None;
        }
        self.sent -= len;
        self.queue.pop_front()
    }

    /// Takes the front entry off unsent (the stream is being given up).
    #[inline]
    pub fn drop_front(&mut self) -> Option<T> {
        self.sent = 0;
        self.blocked = false;
        self.queue.pop_front()
    }
}
