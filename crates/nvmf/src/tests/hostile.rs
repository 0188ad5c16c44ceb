//! Hostile hosts from raw sockets: each case asserts the termination request or the closed
//! connection, and that another host's I/O still works afterwards.

use std::io::Write;
use std::net::TcpStream;
use std::time::Duration;

use fp_nvme_spec::fabrics::CNTLID_DYNAMIC;
use fp_nvme_spec::fabrics::{CONNECT_DATA_LEN, DISCOVERY_NQN};
use fp_nvme_spec::tcp::*;
use fp_nvme_spec::*;

use super::host::*;
use super::io::{pattern, target, wait_for, Target, NQN};
use crate::*;

/// A well-behaved host still connects and its data reads back.
fn healthy(tg: &Target) {
    let admin = Host::admin(tg.port, NQN, 0);
    let mut q = Host::io(tg.port, NQN, admin.cntlid, 1, Digests::default());
    let data = pattern(0x5A, 8192);
    assert!(q.write(1, 4000, &data, false).status.is_success());
    assert_eq!(q.read(1, 4000, 16).1, data);
}

fn term_then_close(h: &mut Host) -> TermReq {
    let (closed, term) = h.closed();
    assert!(closed, "the target closed the connection");
    term.expect("a C2HTermReq before the close")
}

fn raw(port: u16) -> TcpStream {
    let s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s
}

fn as_host(s: TcpStream) -> Host {
    Host::wrap(s, Digests::default())
}

on_each_sock_impl!(handshake_abuse);
fn handshake_abuse() {
    let tg = target();
    // A capsule before the ICReq.
    let mut s = raw(tg.port);
    let mut b = [0u8; HEADER_ROOM];
    let n = write_capsule_cmd(&mut b, &sqe(NVM_READ, 1, 1), 0, Digests::default(), 0);
    s.write_all(&b[..n]).unwrap();
    let t = term_then_close(&mut as_host(s));
    assert_eq!(t.fes, FES_PDU_SEQUENCE_ERROR);
    healthy(&tg);

    // An ICReq with a wrong HLEN, one with another PDU format version.
    let mut s = raw(tg.port);
    let mut ic = [0u8; IC_LEN];
    IcReq { pfv: 0, hpda: 0, digests: Digests::default(), maxr2t: 0 }.write(&mut ic);
    ic[2] = 100;
    s.write_all(&ic).unwrap();
    let t = term_then_close(&mut as_host(s));
    assert_eq!((t.fes, t.fei), (FES_INVALID_HEADER_FIELD, 2));
    let mut s = raw(tg.port);
    IcReq { pfv: 1, hpda: 0, digests: Digests::default(), maxr2t: 0 }.write(&mut ic);
    s.write_all(&ic).unwrap();
    assert_eq!(term_then_close(&mut as_host(s)).fes, FES_UNSUPPORTED_PARAMETER);

    // A truncated ICReq, then the host goes.
    let mut s = raw(tg.port);
    s.write_all(&ic[..40]).unwrap();
    drop(s);
    healthy(&tg);

    // A command before Connect.
    let mut h = Host::open(tg.port, Digests::default());
    let mut get = sqe(OPC_FABRICS, 9, 0);
    get.0[4] = FCTYPE_PROPERTY_GET;
    h.send_capsule(&get, &[]);
    let cqe = h.response();
    assert_eq!((cqe.cid, cqe.status), (9, Status::generic(SC_COMMAND_SEQUENCE_ERROR)));
    assert!(h.closed().0);
    healthy(&tg);
}

on_each_sock_impl!(connect_refusals);
fn connect_refusals() {
    let tg = target();
    // An unknown subsystem: Invalid Parameters pointing at SUBNQN in the data.
    let (mut h, cqe) = Host::connect_raw(
        tg.port,
        Digests::default(),
        0,
        "nqn.2016-06.io.flashpath:nope",
        HOSTNQN,
        CNTLID_DYNAMIC,
        0,
    );
    assert_eq!(cqe.status, Status::command_specific(SC_CONNECT_INVALID_PARAMETERS));
    assert_eq!(cqe.dw0, 0x1_0100);
    assert!(h.closed().0);

    // A host not on a subsystem's list.
    let locked = "nqn.2016-06.io.flashpath:locked";
    tg.t.create_subsystem(SubsystemSpec { nqn: locked.into(), ..Default::default() }).unwrap();
    tg.t.add_listener(locked, super::api::listen(tg.port)).unwrap();
    let (_, cqe) = Host::connect_raw(tg.port, Digests::default(), 0, locked, HOSTNQN, CNTLID_DYNAMIC, 0);
    assert_eq!(cqe.status, Status::command_specific(SC_CONNECT_INVALID_HOST));
    tg.t.add_host(locked, HOSTNQN).unwrap();
    let (mut h1, cqe) = Host::connect_raw(tg.port, Digests::default(), 0, locked, HOSTNQN, CNTLID_DYNAMIC, 0);
    assert!(cqe.status.is_success());
    // Removing the host disconnects its controller.
    let (mut h, cqe) = Host::connect_raw(tg.port, Digests::default(), 0, locked, HOSTNQN, CNTLID_DYNAMIC, 0);
    assert!(cqe.status.is_success());
    assert!(wait_for(|| tg.t.controllers(locked).unwrap().len() == 2));
    tg.t.remove_host(locked, HOSTNQN).unwrap();
    assert!(h.closed().0);
    assert!(h1.closed().0);
    assert!(wait_for(|| tg.t.controllers(locked).unwrap().is_empty()));

    // I/O queues: before the controller is enabled, of another controller, of another host.
    let (admin, cqe) = Host::connect_raw(tg.port, Digests::default(), 0, NQN, HOSTNQN, CNTLID_DYNAMIC, 0);
    assert!(cqe.status.is_success());
    let (_, cqe) = Host::connect_raw(tg.port, Digests::default(), 1, NQN, HOSTNQN, admin.cntlid, 0);
    assert_eq!(cqe.status, Status::generic(SC_COMMAND_SEQUENCE_ERROR));
    let (_, cqe) = Host::connect_raw(tg.port, Digests::default(), 1, NQN, HOSTNQN, admin.cntlid + 100, 0);
    assert_eq!((cqe.status.sc, cqe.dw0), (SC_CONNECT_INVALID_PARAMETERS, 0x1_0010));
    let mut admin = admin;
    admin.enable();
    let other = "nqn.2014-08.org.nvmexpress:uuid:someone-else";
    let (_, cqe) = Host::connect_raw(tg.port, Digests::default(), 1, NQN, other, admin.cntlid, 0);
    assert_eq!(cqe.status.sc, SC_CONNECT_INVALID_PARAMETERS);
    // A queue ID past what the controller allows.
    let (_, cqe) = Host::connect_raw(tg.port, Digests::default(), 1000, NQN, HOSTNQN, admin.cntlid, 0);
    assert_eq!((cqe.status.sc, cqe.dw0), (SC_CONNECT_INVALID_PARAMETERS, 42));
    // The discovery subsystem is reachable on the listener.
    let (_, cqe) =
        Host::connect_raw(tg.port, Digests::default(), 0, DISCOVERY_NQN, HOSTNQN, CNTLID_DYNAMIC, 0);
    assert!(cqe.status.is_success());
    healthy(&tg);
}

/// An enabled controller's I/O queue with digests on both ways.
fn digest_queue(tg: &Target) -> (Host, Host) {
    let admin = Host::admin(tg.port, NQN, 0);
    let q = Host::io(tg.port, NQN, admin.cntlid, 1, Digests { header: true, data: true });
    (admin, q)
}

on_each_sock_impl!(bad_digests_and_malformed_pdus);
fn bad_digests_and_malformed_pdus() {
    let tg = target();
    // A header digest that does not match.
    let (_a, mut q) = digest_queue(&tg);
    let mut b = [0u8; HEADER_ROOM];
    let mut s = q.rw_sqe(NVM_READ, 1, 0, 1);
    set_sgl(&mut s, SGL_TRANSPORT, 512);
    let n = write_capsule_cmd(&mut b, &s, 0, q.digests, 0);
    b[n - 1] ^= 0xFF;
    q.s.write_all(&b[..n]).unwrap();
    assert_eq!(term_then_close(&mut q).fes, FES_HEADER_DIGEST_ERROR);
    healthy(&tg);

    // A data digest that does not match: the connection closes.
    let (_a, mut q) = digest_queue(&tg);
    let mut s = q.rw_sqe(NVM_WRITE, 1, 0, 1);
    set_sgl(&mut s, SGL_IN_CAPSULE, 512);
    let n = write_capsule_cmd(&mut b, &s, 512, q.digests, 0);
    let mut v = b[..n].to_vec();
    v.extend_from_slice(&[7u8; 512]);
    v.extend_from_slice(&[0, 0, 0, 0]);
    q.s.write_all(&v).unwrap();
    assert!(q.closed().0);
    healthy(&tg);

    // An unknown PDU type, a PDU a host may not send (R2T), a wrong HLEN, a PLEN over the limit.
    for bad in [
        vec![0x0Bu8, 0, 24, 0, 24, 0, 0, 0],
        vec![PDU_R2T, 0, 24, 0, 24, 0, 0, 0],
        vec![PDU_CAPSULE_CMD, 0, 71, 0, 71, 0, 0, 0],
        vec![PDU_CAPSULE_CMD, 0, 72, 72, 0, 0, 0x10, 0],
    ] {
        let admin = Host::admin(tg.port, NQN, 0);
        let mut q = Host::io(tg.port, NQN, admin.cntlid, 1, Digests::default());
        let mut pdu = bad.clone();
        pdu.resize(200, 0);
        q.s.write_all(&pdu).unwrap();
        let t = term_then_close(&mut q);
        assert!(
            t.fes == FES_INVALID_HEADER_FIELD
                || t.fes == FES_PDU_SEQUENCE_ERROR
                || t.fes == FES_DATA_LIMIT_EXCEEDED,
            "{t:?}"
        );
        healthy(&tg);
    }

    // Half a capsule, then the host goes.
    let admin = Host::admin(tg.port, NQN, 0);
    let mut q = Host::io(tg.port, NQN, admin.cntlid, 1, Digests::default());
    let s = q.rw_sqe(NVM_WRITE, 1, 0, 8);
    let n = write_capsule_cmd(&mut b, &s, 4096, Digests::default(), 0);
    q.s.write_all(&b[..n]).unwrap();
    q.s.write_all(&[1u8; 1000]).unwrap();
    drop(q);
    healthy(&tg);
}

/// Makes a bad H2CData header out of the R2T it answers.
type Forge = fn(&DataHeader) -> DataHeader;

on_each_sock_impl!(r2t_abuse);
fn r2t_abuse() {
    let tg = target();
    let cases: [(&str, Forge, u16); 4] = [
        ("wrong transfer tag", |r| DataHeader { ttag: r.ttag + 7, ..*r }, FES_INVALID_HEADER_FIELD),
        ("wrong command", |r| DataHeader { cccid: r.cccid + 1, ..*r }, FES_INVALID_HEADER_FIELD),
        (
            "offset past the transfer",
            |r| DataHeader { offset: r.length, length: 512, ..*r },
            FES_DATA_OUT_OF_RANGE,
        ),
        ("longer than asked", |r| DataHeader { length: r.length + 512, ..*r }, FES_DATA_OUT_OF_RANGE),
    ];
    for (what, forge, fes) in cases {
        let admin = Host::admin(tg.port, NQN, 0);
        let mut q = Host::io(tg.port, NQN, admin.cntlid, 1, Digests::default());
        let mut s = q.rw_sqe(NVM_WRITE, 1, 0, 16);
        set_sgl(&mut s, SGL_TRANSPORT, 8192);
        q.send_capsule(&s, &[]);
        let p = q.read_pdu().unwrap();
        assert_eq!(p.ch.pdu_type, PDU_R2T);
        let r = DataHeader::parse(&p.header).unwrap();
        assert_eq!((r.offset, r.length), (0, 8192));
        let h = forge(&r);
        q.send_h2c(&h, &vec![0xEE; h.length as usize], true);
        let t = term_then_close(&mut q);
        assert_eq!(t.fes, fes, "{what}");
        healthy(&tg);
    }
    // H2CData that guesses the transfer tag, sent with its command before any R2T could
    // have reached the host.
    let admin = Host::admin(tg.port, NQN, 0);
    let mut q = Host::io(tg.port, NQN, admin.cntlid, 1, Digests::default());
    let mut s = q.rw_sqe(NVM_WRITE, 1, 0, 8);
    set_sgl(&mut s, SGL_TRANSPORT, 4096);
    let mut b = [0u8; HEADER_ROOM];
    let n = write_capsule_cmd(&mut b, &s, 0, Digests::default(), 0);
    let mut v = b[..n].to_vec();
    // Tag 0: the slot a fresh queue gives its first command (the right guess).
    let h = DataHeader { cccid: s.cid(), ttag: 0, offset: 0, length: 4096 };
    let n = write_h2c_data(&mut b, &h, true, Digests::default(), 0);
    v.extend_from_slice(&b[..n]);
    v.extend_from_slice(&[0xAB; 4096]);
    q.s.write_all(&v).unwrap();
    assert_eq!(term_then_close(&mut q).fes, FES_INVALID_HEADER_FIELD);
    healthy(&tg);

    // H2CData with no R2T at all.
    let admin = Host::admin(tg.port, NQN, 0);
    let mut q = Host::io(tg.port, NQN, admin.cntlid, 1, Digests::default());
    q.send_h2c(&DataHeader { cccid: 1, ttag: 0, offset: 0, length: 512 }, &[0; 512], true);
    assert_eq!(term_then_close(&mut q).fes, FES_INVALID_HEADER_FIELD);
    healthy(&tg);
}

on_each_sock_impl!(idle_flood_and_a_host_that_stops_reading);
fn idle_flood_and_a_host_that_stops_reading() {
    let tg = target();
    // More silent connections than handshakes may run: real hosts still get in.
    let idle: Vec<TcpStream> = (0..80).map(|_| raw(tg.port)).collect();
    std::thread::sleep(Duration::from_millis(100));
    healthy(&tg);
    drop(idle);

    // A host that sends reads and never takes the data: its queue stops, others go on.
    let admin = Host::admin(tg.port, NQN, 0);
    let mut stuck = Host::io(tg.port, NQN, admin.cntlid, 1, Digests::default());
    let mut all = Vec::new();
    for _ in 0..32 {
        let mut s = stuck.rw_sqe(NVM_READ, 1, 0, 256);
        set_sgl(&mut s, SGL_TRANSPORT, 128 << 10);
        let mut b = [0u8; HEADER_ROOM];
        let n = write_capsule_cmd(&mut b, &s, 0, Digests::default(), 0);
        all.extend_from_slice(&b[..n]);
    }
    stuck.s.write_all(&all).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let other = Host::admin(tg.port, NQN, 0);
    let mut q = Host::io(tg.port, NQN, other.cntlid, 1, Digests::default());
    for i in 0..20 {
        let data = pattern(i, 4096);
        assert!(q.write(1, 64 + u64::from(i) * 8, &data, false).status.is_success());
        assert_eq!(q.read(1, 64 + u64::from(i) * 8, 8).1, data);
    }
    // The stuck host still gets everything once it reads.
    for _ in 0..32 {
        let p = stuck.read_pdu().unwrap();
        assert_eq!(p.ch.pdu_type, PDU_C2H_DATA);
        assert_eq!(p.data.len(), 128 << 10);
    }
}

on_each_sock_impl!(a_host_that_stops_reading_is_dropped);
fn a_host_that_stops_reading_is_dropped() {
    let tg = target();
    let admin = Host::admin(tg.port, NQN, 0);
    // An I/O queue over a socket whose window stays tiny.
    let s = Host::small_window(tg.port);
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut stuck = Host::wrap(s, Digests::default());
    let mut ic = [0u8; IC_LEN];
    IcReq { pfv: 0, hpda: 0, digests: Digests::default(), maxr2t: 0 }.write(&mut ic);
    stuck.s.write_all(&ic).unwrap();
    let p = stuck.read_pdu().unwrap();
    assert_eq!(p.ch.pdu_type, PDU_IC_RESP);
    let c = fp_nvme_spec::fabrics::Connect {
        cid: 0,
        qid: 1,
        sq_entries: 32,
        cattr: 0,
        kato_ms: 0,
        hostid: HOSTID,
        cntlid: admin.cntlid,
        subnqn: NQN.into(),
        hostnqn: HOSTNQN.into(),
    };
    let mut sqe = Sqe([0; SQE_LEN]);
    let mut d = [0u8; CONNECT_DATA_LEN];
    c.write(&mut sqe, &mut d);
    stuck.send_capsule(&sqe, &d);
    assert!(stuck.response().status.is_success());
    // 128 reads of 128 KiB (16 MiB: more than the target's socket buffer of up to 8 MiB),
    // never read back.
    let mut all = Vec::new();
    for _ in 0..128 {
        let mut s = stuck.rw_sqe(NVM_READ, 1, 0, 256);
        set_sgl(&mut s, SGL_TRANSPORT, 128 << 10);
        let mut b = [0u8; HEADER_ROOM];
        let n = write_capsule_cmd(&mut b, &s, 0, Digests::default(), 0);
        all.extend_from_slice(&b[..n]);
    }
    stuck.s.write_all(&all).unwrap();
    // Dropped after the send timeout (3 s under test), while others carry on.
    assert!(wait_for(|| tg.t.qpairs(NQN).unwrap().len() == 2));
    let start = std::time::Instant::now();
    let end = start + Duration::from_secs(15);
    while tg.t.qpairs(NQN).unwrap().len() > 1 {
        assert!(std::time::Instant::now() < end, "the stuck queue was never dropped");
        healthy_quick(&tg);
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(start.elapsed() >= Duration::from_secs(2), "dropped after {:?}", start.elapsed());
}

/// One write and read on a fresh controller.
fn healthy_quick(tg: &Target) {
    let admin = Host::admin(tg.port, NQN, 0);
    let mut q = Host::io(tg.port, NQN, admin.cntlid, 1, Digests::default());
    let data = pattern(0x3C, 512);
    assert!(q.write(1, 3000, &data, false).status.is_success());
    assert_eq!(q.read(1, 3000, 1).1, data);
}

on_each_sock_impl!(a_bad_data_digest_on_h2c_data);
/// H2CData whose data digest does not match: the connection closes (as Linux's target does;
/// the data never reaches the disk), and other hosts go on.
fn a_bad_data_digest_on_h2c_data() {
    let tg = target();
    let (_a, mut q) = digest_queue(&tg);
    let before = pattern(0x11, 8192);
    let (_a2, mut good) = digest_queue(&tg);
    assert!(good.write(1, 100, &before, false).status.is_success());
    // A write too big for the capsule: the target asks for it by R2T.
    let mut s = q.rw_sqe(NVM_WRITE, 1, 100, 16);
    set_sgl(&mut s, SGL_TRANSPORT, 8192);
    q.send_capsule(&s, &[]);
    let p = q.read_pdu().unwrap();
    assert_eq!(p.ch.pdu_type, PDU_R2T);
    let r = DataHeader::parse(&p.header).unwrap();
    let mut b = [0u8; HEADER_ROOM];
    let h = DataHeader { cccid: s.cid(), ttag: r.ttag, offset: 0, length: 8192 };
    let n = write_h2c_data(&mut b, &h, true, q.digests, 0);
    let mut v = b[..n].to_vec();
    let bad = pattern(0x99, 8192);
    v.extend_from_slice(&bad);
    v.extend_from_slice(&(crc32c(&bad) ^ 1).to_le_bytes());
    q.s.write_all(&v).unwrap();
    assert!(q.closed().0, "the target closed the connection");
    // The disk still holds what was there.
    assert_eq!(good.read(1, 100, 16).1, before);
    healthy(&tg);
}

on_each_sock_impl!(transfers_up_to_max_io_size);
/// The transfer limit (MDTS from max_io_size, 128 KiB by default): a read of exactly that
/// size runs, one block more is refused with Invalid Field in Command (what the base
/// specification's MDTS says a command over the limit gets), and the queue goes on.
fn transfers_up_to_max_io_size() {
    let tg = target();
    let admin = Host::admin(tg.port, NQN, 0);
    let mut q = Host::io(tg.port, NQN, admin.cntlid, 1, Digests::default());
    let max_blocks = TransportOptions::default().max_io_size / 512;
    let (cqe, data) = q.read(1, 0, max_blocks);
    assert!(cqe.status.is_success(), "{cqe:?}");
    assert_eq!(data.len(), max_blocks as usize * 512);
    let s = q.rw_sqe(NVM_READ, 1, 0, max_blocks + 1);
    let (cqe, data) = q.run(s, &[], (max_blocks as usize + 1) * 512);
    assert_eq!(cqe.status, Status::generic(SC_INVALID_FIELD), "{cqe:?}");
    assert!(data.is_empty());
    healthy_quick(&tg);
}
