//! Large transfers reuse their buffers: commands above the size a slot keeps take a buffer
//! from the queue's pool instead of allocating (and zeroing) one each.

use std::time::Duration;

use fp_nvme_spec::tcp::*;
use fp_nvme_spec::*;

use super::api::ram;
use super::host::*;
use super::io::{pattern, NQN};
use crate::subsystem::lock;
use crate::tcp::qpair::QpairPoller;
use crate::testing::LoopbackTarget;
use crate::*;

on_each_sock_impl!(large_transfers_allocate_no_buffer_per_command);
fn large_transfers_allocate_no_buffer_per_command() {
    let tg =
        LoopbackTarget::start(&[0], TransportOptions { max_io_size: 4 << 20, ..Default::default() }).unwrap();
    tg.target().set_sock_impl(super::sock_impl());
    tg.add_subsystem(NQN, ram("ram0", 16384), "ram0").unwrap();
    let (t, port) = (tg.target(), tg.port());
    let admin = Host::admin(port, NQN, 0);
    let mut q = Host::io(port, NQN, admin.cntlid, 1, Digests::default());
    q.s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    for round in 0..6u8 {
        let data = pattern(round, 2 << 20);
        assert!(q.write(1, 0, &data, false).status.is_success());
        let (cqe, back) = q.read(1, 0, (2 << 20) / 512);
        assert!(cqe.status.is_success());
        assert!(back == data, "round {round}: read back what was written");
    }
    let qp = {
        let sub = lock(&t.inner.subsystems).get(NQN).cloned().unwrap();
        let st = lock(&sub.state);
        st.controllers.get(&admin.cntlid).unwrap().io.get(&1).cloned().unwrap()
    };
    let id = qp.id;
    let allocated = qp.reactor.call(move |r| r.poller_mut::<QpairPoller>(id).map(|p| p.buffer_allocations()));
    // Twelve 2 MiB commands one after the other: one buffer, taken again each time.
    assert_eq!(allocated.flatten(), Some(1), "data buffers allocated by the queue");
    // The queue ran on the socket implementation asked for: the engine of its reactor
    // carried its data (none exists on a reactor of posix queues).
    let engine = qp.reactor.call(|_| fp_conn::uring::stats()).flatten();
    match super::sock_impl() {
        SocketImpl::Posix => assert_eq!(engine, None),
        SocketImpl::Uring => {
            let st = engine.expect("the reactor's engine");
            assert!(st.recv_completions >= 12 * 16 && st.sends >= 12, "{st:?}");
        }
    }
}

on_each_sock_impl!(more_large_reads_than_large_buffers_wait_for_one_and_all_complete);
fn more_large_reads_than_large_buffers_wait_for_one_and_all_complete() {
    // 8 MiB transfers: the queue holds 4 large buffers (32 MiB).
    let tg =
        LoopbackTarget::start(&[0], TransportOptions { max_io_size: 8 << 20, ..Default::default() }).unwrap();
    tg.target().set_sock_impl(super::sock_impl());
    tg.add_subsystem(NQN, ram("ram0", 65536), "ram0").unwrap();
    let port = tg.port();
    let admin = Host::admin(port, NQN, 0);
    let mut q = Host::io(port, NQN, admin.cntlid, 1, Digests::default());
    q.s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let len = 4 << 20;
    let data = pattern(7, 8 * len);
    for k in 0..8 {
        assert!(q.write(1, (k * len / 512) as u64, &data[k * len..(k + 1) * len], false).status.is_success());
    }
    // Eight reads at once: four wait for a buffer.
    let mut cids = Vec::new();
    for k in 0..8 {
        let mut s = q.rw_sqe(NVM_READ, 1, (k * len / 512) as u64, (len / 512) as u32);
        set_sgl(&mut s, SGL_TRANSPORT, len as u32);
        q.send_capsule(&s, &[]);
        cids.push(s.cid());
    }
    let mut got: Vec<Vec<u8>> = vec![Vec::new(); 8];
    let mut done = 0;
    while done < 8 {
        let p = q.read_pdu().unwrap();
        assert_eq!(p.ch.pdu_type, PDU_C2H_DATA, "{p:?}");
        let h = DataHeader::parse(&p.header).unwrap();
        let k = cids.iter().position(|&c| c == h.cccid).expect("a read of ours");
        assert_eq!(h.offset as usize, got[k].len());
        got[k].extend_from_slice(&p.data);
        if p.ch.flags & FLAG_SUCCESS != 0 {
            done += 1;
        }
    }
    for k in 0..8 {
        assert!(got[k] == data[k * len..(k + 1) * len], "read {k} returned what was written");
    }
}
