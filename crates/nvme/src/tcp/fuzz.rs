//! The receive path of a host I/O queue fed arbitrary bytes as the controller's stream: what
//! the fuzz target `nvme_tcp_host` runs (public for the fuzz crate, not an API); and the
//! host's DH-HMAC-CHAP transaction fed arbitrary controller messages ([`auth_host`], the
//! target `nvme_auth_host`).
//!
//! Input: byte 0 sets header digests (bit 0), data digests (bit 1), in-capsule data off (bit
//! 2; writes then go by R2T), and MAXH2CDATA 4 KiB or 8 KiB (bit 3); the rest is the stream,
//! delivered in pieces between polls. Four commands are in flight: command 0 a 4 KiB read,
//! 1 an 8 KiB write, 2 a Flush, 3 a 1 KiB read in two iovecs; every buffer sits between guard
//! bytes. Checked: no panic, the guards intact, a dead queue stays dead, and drain gives back
//! exactly the commands that did not complete.

use std::io::Write;
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;

use fp_bdev::iov::BounceBuf;
use fp_bdev::{IovCursor, IovSlices, Iovecs};
use fp_nvme_spec::tcp::Digests;
use fp_nvme_spec::Status;

use super::queue::{Params, TcpQueue};
use crate::cmd;
use crate::transport::IoQueue;

const GUARD: usize = 64;
const FILL: u8 = 0xA5;

/// Runs one input; panics on a violated check. Returns how many commands completed.
pub fn receive_path(input: &[u8]) -> usize {
    let Some((&setup, stream)) = input.split_first() else { return 0 };
    let (host, mut peer) = UnixStream::pair().expect("socketpair");
    peer.set_nonblocking(true).expect("nonblocking");
    let p = Params {
        qid: 1,
        digests: Digests { header: setup & 1 != 0, data: setup & 2 != 0 },
        cpda: 0,
        maxh2cdata: if setup & 8 != 0 { 8192 } else { 4096 },
        icd: if setup & 4 != 0 { 0 } else { 8192 },
        slots: 8,
        strict_reads: true,
    };
    let mut q = TcpQueue::new(OwnedFd::from(host), p, None);
    // One arena: [guard][read 4096][guard][write 8192][guard][read 512][guard][read 512][guard].
    let sizes = [4096usize, 8192, 512, 512];
    let total = GUARD + sizes.iter().map(|s| s + GUARD).sum::<usize>();
    let mut arena = BounceBuf::zeroed(total);
    arena.bytes_mut().fill(FILL);
    let whole = arena.iovecs(total);
    let mut slices = IovSlices::new(sizes.len() + 2);
    let mut at = GUARD;
    let mut bufs = Vec::new();
    for (i, s) in sizes.into_iter().enumerate() {
        let mut cursor = IovCursor::at(&whole, at as u64);
        bufs.push(slices.slice(i, &whole, &mut cursor, s as u64).expect("an entry per buffer"));
        at += s + GUARD;
    }
    let two = slices.joined(sizes.len(), &bufs[2..4]).expect("two entries for the last read");
    let cmds = [
        (cmd::read_write(false, 1, 0, 8, false), bufs[0]),
        (cmd::read_write(true, 1, 8, 16, false), bufs[1]),
        (cmd::flush(1), Iovecs::NONE),
        (cmd::read_write(false, 1, 24, 2, false), two),
    ];
    // `arena` and `slices` outlive the queue (dropped at the end of this function, after `q`).
    for (tag, (sqe, v)) in cmds.iter().enumerate() {
        q.submit(sqe, *v, tag as u32).expect("room for four commands");
    }
    q.flush();
    let mut done: Vec<(u32, Status)> = Vec::new();
    let mut sink = [0u8; 4096];
    let mut pos = 0;
    let mut closed = 0;
    // Pieces of varying size, so headers and data split across receives.
    let mut piece = 1 + usize::from(setup >> 4) * 97;
    loop {
        if pos < stream.len() {
            let n = piece.min(stream.len() - pos);
            if let Ok(w) = peer.write(&stream[pos..pos + n]) {
                pos += w;
            }
            piece = piece % 1500 + 331;
        } else if closed == 0 {
            // The end of the input is the end of the connection.
            let _ = peer.shutdown(std::net::Shutdown::Write);
            closed = 1;
        } else {
            closed += 1;
            // The end of the stream is seen at the first receive after it.
            assert!(closed < 100, "the queue did not see the end of the stream");
        }
        // What the host sends (capsules, H2CData) is read and dropped.
        while matches!(std::io::Read::read(&mut peer, &mut sink), Ok(n) if n > 0) {}
        q.flush();
        if q.poll(&mut done).is_err() {
            assert!(q.poll(&mut done).is_err(), "a dead queue stays dead");
            break;
        }
        if closed > 0 && q.in_flight() == 0 {
            break;
        }
    }
    let mut drained = Vec::new();
    q.drain(&mut drained);
    let mut all: Vec<u32> = done.iter().map(|d| d.0).chain(drained.iter().copied()).collect();
    all.sort_unstable();
    assert_eq!(all, [0, 1, 2, 3], "each command completes or is drained, once");
    drop(q);
    let arena = arena.bytes();
    let mut at = 0;
    for s in sizes {
        assert!(arena[at..at + GUARD].iter().all(|&b| b == FILL), "a guard was written");
        at += GUARD + s;
    }
    assert!(arena[at..].iter().all(|&b| b == FILL), "the last guard was written");
    done.len()
}

/// The host's side of a DH-HMAC-CHAP transaction (`auth::HostTransaction`) fed arbitrary
/// controller messages. Input: byte 0 bit 0 asks the controller to authenticate itself
/// (a controller key); bytes 1-2 (little-endian) the Challenge's length, cut to what follows;
/// then the Challenge, then the rest as Success1. The host offers every hash and the null
/// group and ffdhe2048 (the larger groups' key generation would only slow the fuzzer).
/// Checked: no panic; what the host answers is a message of its own transaction that parses
/// again and fits an Authentication Receive's buffer; a refusal has a reason for the
/// controller unless the controller itself refused. Returns the messages the host sent and
/// whether it ended authenticated.
pub fn auth_host(input: &[u8]) -> (usize, bool) {
    use fp_crypto::dhchap::DhchapSecret;
    use fp_nvme_spec::auth::{AuthMessage, DhGroupId, HashId, MAX_DHCHAP_MESSAGE_LEN};

    use super::auth::{DhchapHost, DhchapOffer, HostTransaction, QueueAuth};

    let Some((&setup, rest)) = input.split_first() else { return (0, false) };
    let Some((len, rest)) = rest.split_first_chunk::<2>() else { return (0, false) };
    let (challenge, success1) = rest.split_at(usize::from(u16::from_le_bytes(*len)).min(rest.len()));
    let secret = |fill: u8| DhchapSecret::new(Some(HashId::Sha256), &[fill; 32]).expect("a 32-byte key");
    let host = DhchapHost {
        key: Some(secret(1)),
        ctrlr_key: (setup & 1 != 0).then(|| secret(2)),
        offer: DhchapOffer::new(HashId::ALL, &[DhGroupId::Null, DhGroupId::Ffdhe2048]),
    };
    let q = QueueAuth {
        qid: 1,
        t_id: 7,
        hostnqn: "nqn.2014-08.org.nvmexpress:uuid:f1a5c0de-0000-4000-8000-000000000001",
        subnqn: "nqn.2016-06.io.flashpath:fuzz",
        timeout: std::time::Duration::ZERO,
    };
    let key = host.key.as_ref().expect("a host key");
    let mut t = HostTransaction::new(key, &host, &q);
    let sent = |b: &[u8]| {
        assert!(b.len() <= MAX_DHCHAP_MESSAGE_LEN, "a host message of {} bytes", b.len());
        let m = AuthMessage::parse(b).expect("the host's message parses");
        assert_eq!(m.t_id(), 7, "{m:?}");
        m
    };
    sent(&t.negotiate());
    let mut count = 1;
    let judged = match t.challenge(challenge) {
        Ok(reply) => {
            assert!(matches!(sent(&reply), AuthMessage::Reply(_)));
            count += 1;
            t.success1(success1).map(|s2| {
                if let Some(s2) = s2 {
                    assert!(matches!(sent(&s2), AuthMessage::Success2(_)));
                    count += 1;
                }
            })
        }
        Err(r) => Err(r),
    };
    if let Err(r) = &judged {
        let controller_refused = r.error.to_string().contains("AUTH_Failure1");
        assert!(r.failure2.is_some() || controller_refused, "{}", r.error);
    }
    (count, judged.is_ok())
}

#[cfg(test)]
mod tests {
    use fp_nvme_spec::tcp::*;
    use fp_nvme_spec::Cqe;

    use super::*;

    fn resp(cid: u16) -> Vec<u8> {
        let mut b = [0u8; HEADER_ROOM];
        let n = write_capsule_resp(&mut b, &Cqe::new(cid, Status::SUCCESS), Digests::default());
        b[..n].to_vec()
    }

    fn c2h(cid: u16, offset: u32, data: &[u8], flags: u8) -> Vec<u8> {
        let mut b = [0u8; HEADER_ROOM];
        let h = DataHeader { cccid: cid, ttag: 0, offset, length: data.len() as u32 };
        let n = write_c2h_data(&mut b, &h, flags, Digests::default(), 0);
        let mut v = b[..n].to_vec();
        v.extend_from_slice(data);
        v
    }

    #[test]
    fn a_well_formed_stream_completes_everything() {
        // In-capsule writes (bit 2 clear): the write completes by a response alone.
        let mut s = vec![0u8];
        s.extend(c2h(0, 0, &[1; 2048], 0));
        s.extend(c2h(0, 2048, &[2; 2048], FLAG_LAST_PDU | FLAG_SUCCESS));
        s.extend(resp(1));
        s.extend(resp(2));
        s.extend(c2h(3, 0, &[3; 1024], FLAG_LAST_PDU));
        s.extend(resp(3));
        assert_eq!(receive_path(&s), 4);
        for setup in 0..=255u8 {
            s[0] = setup;
            let _ = receive_path(&s);
        }
    }

    #[test]
    fn arbitrary_bytes_never_break_the_checks() {
        let mut x = 0x9e37_79b9u32;
        for len in [0usize, 1, 7, 8, 30, 100, 700, 5000] {
            for _ in 0..20 {
                let v: Vec<u8> = (0..len)
                    .map(|_| {
                        x ^= x << 13;
                        x ^= x >> 17;
                        x ^= x << 5;
                        x as u8
                    })
                    .collect();
                let _ = receive_path(&v);
            }
        }
        // Valid headers with hostile fields: R2T for the write, past its end.
        let mut s = vec![4u8];
        let mut b = [0u8; HEADER_ROOM];
        let n =
            write_r2t(&mut b, &DataHeader { cccid: 1, ttag: 3, offset: 0, length: 8192 }, Digests::default());
        s.extend_from_slice(&b[..n]);
        let n =
            write_r2t(&mut b, &DataHeader { cccid: 1, ttag: 3, offset: 8192, length: 8 }, Digests::default());
        s.extend_from_slice(&b[..n]);
        assert_eq!(receive_path(&s), 0);
    }

    #[test]
    fn the_fuzz_seeds_do_what_they_say() {
        let dir =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/regressions/nvme_tcp_host");
        let seed = |name: &str| std::fs::read(dir.join(name)).unwrap();
        assert_eq!(receive_path(&seed("seed-complete")), 4);
        assert_eq!(receive_path(&seed("seed-digests-r2t")), 4);
        assert_eq!(receive_path(&seed("seed-hostile")), 0);
        for e in std::fs::read_dir(&dir).unwrap() {
            let _ = receive_path(&std::fs::read(e.unwrap().path()).unwrap());
        }
    }

    #[test]
    fn the_auth_host_seeds_do_what_they_say() {
        let dir =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/regressions/nvme_auth_host");
        let seed = |name: &str| auth_host(&std::fs::read(dir.join(name)).unwrap());
        // Negotiate and Reply, and done: no controller response asked.
        assert_eq!(seed("seed-null-unidirectional"), (2, true));
        // The controller's response cannot match: refused after the Reply.
        assert_eq!(seed("seed-null-bidirectional"), (2, false));
        assert_eq!(seed("seed-2048-bidirectional"), (2, false));
        assert_eq!(seed("seed-failure1"), (2, false));
        // A Challenge of another transaction gets no Reply.
        assert_eq!(seed("seed-other-transaction"), (1, false));
        for e in std::fs::read_dir(&dir).unwrap() {
            let _ = auth_host(&std::fs::read(e.unwrap().path()).unwrap());
        }
    }
}
