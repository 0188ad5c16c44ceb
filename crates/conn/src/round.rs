//! A server connection's round on its reactor: the read round (at most so many socket reads,
//! each either continuing a payload that goes straight into a request's buffer or filling the
//! receive buffer, whose complete messages are taken out between reads; it ends at a receive
//! that would block, or after a short one where the connection says so), where the peer's end
//! of the stream came (between messages or in the middle of one), and what the connection
//! leaves pending for the poller's `has_pending`.

use crate::{Life, Recv, SendQueue};

/// Where the peer's end of the stream came.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerClosed {
    /// Between messages: an orderly close.
    Clean,
    /// In the middle of a message header (the receive buffer holds part of one).
    MidHeader,
    /// In the middle of a payload being received straight into a request's buffer.
    MidPayload,
}

impl PeerClosed {
    /// Whether the peer broke the protocol by closing there.
    #[inline]
    pub fn misbehaved(self) -> bool {
        self != PeerClosed::Clean
    }
}

/// What a connection gives its read round.
pub trait Reader {
    /// Whether the connection is closing (it reads nothing more).
    fn closing(&self) -> bool;
    /// Receives into the payload being received straight into a request's buffer, if one is,
    /// and counts what arrived (ending the payload when it is all there).
    fn recv_payload(&mut self) -> Option<Recv>;
    /// Takes the complete messages out of the receive buffer (a message may start a payload).
    /// False when it stopped for lack of room (a request slot) to take the next.
    fn parse(&mut self) -> bool;
    /// Whether a payload is being received.
    fn receiving(&self) -> bool;
    /// Compacts the receive buffer and receives more into it.
    fn recv_more(&mut self) -> Recv;
    /// Whether the receive buffer holds bytes not taken (part of a message).
    fn buffered(&self) -> bool;
    /// Whether the last [`Reader::recv_more`] took less than the room it had: the socket held
    /// nothing more at that moment, so the round ends after taking what came instead of
    /// spending one more system call to hear that the socket is empty (the next round's
    /// receive gets whatever arrived since). On a request-response connection at queue depth 1
    /// that call sits between the request and its reply. By default never: the round reads
    /// until a receive would block.
    fn drained(&self) -> bool {
        false
    }
    /// The peer closed its side (the connection closes).
    fn peer_closed(&mut self, at: PeerClosed);
    /// The socket failed; why (the connection closes, nothing more is sent).
    fn failed(&mut self, why: String);
}

/// What a read round did and left.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ReadRound {
    /// It read or took anything.
    pub moved: bool,
    /// It stopped for lack of room for the next message.
    pub stalled: bool,
    /// It stopped at its read limit with the socket maybe still readable, or with what its
    /// last receive brought not yet taken.
    pub more: bool,
}

impl ReadRound {
    /// Whether there is more to read now, given room (the poller is not idle then).
    #[inline]
    pub fn unfinished(&self) -> bool {
        self.stalled || self.more
    }
}

/// The connection's part of a stream poller's `has_pending` (work without a wake-up): replies
/// the socket may take now, more to read with room for it (`can_accept`), or a closing
/// connection with nothing left (`drained`: it ends at the next poll).
#[inline]
pub fn connection_pending<T: Copy>(
    tx: &SendQueue<T>,
    life: &Life,
    read: ReadRound,
    can_accept: impl FnOnce() -> bool,
    drained: impl FnOnce() -> bool,
) -> bool {
    (!tx.is_empty() && !tx.is_blocked() && !life.is_broken())
        || (read.unfinished() && can_accept())
        || (life.is_closing() && drained())
}

/// Runs one read round of at most `reads` receives on `conn`.
#[inline]
pub fn read_round<R: Reader>(conn: &mut R, reads: usize) -> ReadRound {
    let mut round = ReadRound::default();
    let mut drained = false;
    for _ in 0..reads {
        if conn.closing() {
            return round;
        }
        match conn.recv_payload() {
            None => {}
            Some(Recv::Data(_)) => {
                round.moved = true;
                continue;
            }
            Some(Recv::WouldBlock) => return round,
            Some(Recv::Eof) => {
                conn.peer_closed(PeerClosed::MidPayload);
                round.moved = true;
                return round;
            }
            Some(Recv::Failed(e)) => {
                conn.failed(e);
                round.moved = true;
                return round;
            }
        }
        if !conn.parse() {
            round.stalled = true;
            return round;
        }
        // What came is taken; a payload it started has not arrived yet either.
        if drained {
            return round;
        }
        if conn.receiving() || conn.closing() {
            round.moved = true;
            continue;
        }
        match conn.recv_more() {
            Recv::Data(_) => {
                round.moved = true;
                drained = conn.drained();
            }
            Recv::WouldBlock => return round,
            Recv::Eof => {
                let at = if conn.buffered() { PeerClosed::MidHeader } else { PeerClosed::Clean };
                conn.peer_closed(at);
                round.moved = true;
                return round;
            }
            Recv::Failed(e) => {
                conn.failed(e);
                round.moved = true;
                return round;
            }
        }
    }
    // Even after a short receive: what it brought is not parsed yet.
    round.more = true;
    round
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;

    use super::*;

    /// A connection whose receives give what `script` says; messages are 4 bytes, a message
    /// starting with `P` is followed by a 4-byte payload received on its own.
    #[derive(Default)]
    struct Fake {
        script: VecDeque<Recv>,
        buffered: usize,
        payload_left: usize,
        slots: usize,
        taken: usize,
        closed: Option<PeerClosed>,
        failed: Option<String>,
        next_is_payload: bool,
        /// The room each receive into the buffer has (`None`: unbounded, never short).
        room: Option<usize>,
        last_recv: usize,
        recvs: usize,
    }

    impl Reader for Fake {
        fn closing(&self) -> bool {
            self.closed.is_some() || self.failed.is_some()
        }
        fn recv_payload(&mut self) -> Option<Recv> {
            if self.payload_left == 0 {
                return None;
            }
            let r = self.script.pop_front().unwrap_or(Recv::WouldBlock);
            if let Recv::Data(n) = r {
                self.payload_left -= n.min(self.payload_left);
            }
            Some(r)
        }
        fn parse(&mut self) -> bool {
            while self.buffered >= 4 && self.payload_left == 0 {
                if self.taken == self.slots {
                    return false;
                }
                self.buffered -= 4;
                self.taken += 1;
                if std::mem::take(&mut self.next_is_payload) {
                    self.payload_left = 4;
                }
            }
            true
        }
        fn receiving(&self) -> bool {
            self.payload_left > 0
        }
        fn recv_more(&mut self) -> Recv {
            self.recvs += 1;
            let r = self.script.pop_front().unwrap_or(Recv::WouldBlock);
            self.last_recv = 0;
            if let Recv::Data(n) = r {
                self.buffered += n;
                self.last_recv = n;
            }
            r
        }
        fn drained(&self) -> bool {
            self.room.is_some_and(|room| self.last_recv < room)
        }
        fn buffered(&self) -> bool {
            self.buffered > 0
        }
        fn peer_closed(&mut self, at: PeerClosed) {
            self.closed = Some(at);
        }
        fn failed(&mut self, why: String) {
            self.failed = Some(why);
        }
    }

    fn fake(script: Vec<Recv>, slots: usize) -> Fake {
        Fake { script: script.into(), slots, ..Fake::default() }
    }

    #[test]
    fn reads_until_the_socket_is_empty() {
        let mut c = fake(vec![Recv::Data(8), Recv::Data(4)], 10);
        let r = read_round(&mut c, 8);
        assert_eq!(r, ReadRound { moved: true, stalled: false, more: false });
        assert_eq!(c.taken, 3);
        let idle = read_round(&mut c, 8);
        assert_eq!(idle, ReadRound::default());
        assert!(!idle.unfinished());
    }

    #[test]
    fn a_short_receive_ends_the_round_without_asking_again() {
        let mut c = fake(vec![Recv::Data(8), Recv::Data(4), Recv::Data(4)], 10);
        c.room = Some(8);
        let r = read_round(&mut c, 8);
        assert_eq!(r, ReadRound { moved: true, stalled: false, more: false });
        assert_eq!((c.taken, c.recvs), (3, 2), "a full receive, then a short one, and no third");
        let next = read_round(&mut c, 8);
        assert!(next.moved && !next.unfinished(), "the next round gets what came since");
        assert_eq!((c.taken, c.recvs), (4, 3));
        let idle = read_round(&mut c, 8);
        assert_eq!(idle, ReadRound::default());
        assert_eq!(c.recvs, 4, "an empty socket costs one receive");
        let mut c = fake(vec![Recv::Data(4)], 10);
        c.room = Some(8);
        assert!(read_round(&mut c, 1).more, "at the read limit what came is not parsed yet");
        assert_eq!(c.taken, 0);
    }

    #[test]
    fn a_short_receive_leaves_a_started_payload_to_the_next_round() {
        let mut c = fake(vec![Recv::Data(4), Recv::Data(4)], 10);
        (c.room, c.next_is_payload) = (Some(8), true);
        let r = read_round(&mut c, 8);
        assert!(r.moved && !r.unfinished());
        assert_eq!((c.taken, c.payload_left, c.script.len()), (1, 4, 1), "its payload not asked for yet");
        read_round(&mut c, 8);
        assert_eq!((c.payload_left, c.script.len()), (0, 0));
    }

    #[test]
    fn stops_at_its_read_limit_or_for_room() {
        let mut c = fake((0..5).map(|_| Recv::Data(4)).collect(), 10);
        let r = read_round(&mut c, 3);
        assert!(r.more && r.moved && r.unfinished());
        assert_eq!(c.taken, 2, "the third read's message waits for the next round's parse");
        let mut c = fake(vec![Recv::Data(12)], 2);
        let r = read_round(&mut c, 8);
        assert!(r.stalled && r.unfinished());
        assert_eq!((c.taken, c.buffered), (2, 4));
    }

    #[test]
    fn a_payload_is_received_on_its_own() {
        let mut c = fake(vec![Recv::Data(4), Recv::Data(3), Recv::Data(1), Recv::Data(4)], 10);
        c.next_is_payload = true;
        let r = read_round(&mut c, 8);
        assert!(r.moved && !r.unfinished());
        assert_eq!((c.taken, c.payload_left, c.buffered), (2, 0, 0));
    }

    #[test]
    fn what_a_connection_leaves_pending() {
        let (tx, mut life) = (SendQueue::<u16>::with_capacity(4), Life::new());
        let idle = ReadRound::default();
        assert!(!connection_pending(&tx, &life, idle, || true, || true));
        let more = ReadRound { more: true, ..idle };
        assert!(connection_pending(&tx, &life, more, || true, || false));
        assert!(!connection_pending(&tx, &life, more, || false, || false), "no room to read into");
        let mut queued = SendQueue::<u16>::with_capacity(4);
        queued.push(1);
        assert!(connection_pending(&queued, &life, idle, || false, || false));
        queued.set_blocked(true);
        assert!(!connection_pending(&queued, &life, idle, || false, || false), "the socket is full");
        life.close("test", std::time::Duration::ZERO);
        assert!(connection_pending(&tx, &life, idle, || false, || true));
        assert!(!connection_pending(&tx, &life, idle, || false, || false));
    }

    #[test]
    fn where_the_peer_closed_and_failures() {
        let mut c = fake(vec![Recv::Data(4), Recv::Eof], 10);
        assert!(read_round(&mut c, 8).moved);
        assert_eq!(c.closed, Some(PeerClosed::Clean));
        assert!(!PeerClosed::Clean.misbehaved());

        let mut c = fake(vec![Recv::Data(6), Recv::Eof], 10);
        read_round(&mut c, 8);
        assert_eq!(c.closed, Some(PeerClosed::MidHeader));
        assert!(PeerClosed::MidHeader.misbehaved());

        let mut c = fake(vec![Recv::Data(4), Recv::Data(2), Recv::Eof], 10);
        c.next_is_payload = true;
        read_round(&mut c, 8);
        assert_eq!(c.closed, Some(PeerClosed::MidPayload));

        let mut c = fake(vec![Recv::Failed("reset".into())], 10);
        assert!(read_round(&mut c, 8).moved);
        assert_eq!(c.failed.as_deref(), Some("reset"));
        assert_eq!(read_round(&mut c, 8), ReadRound::default(), "a closing connection reads nothing");
    }
}
