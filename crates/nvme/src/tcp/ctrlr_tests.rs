//! The TCP transport under the controller code (`crate::ctrlr::attach`) against flashpath's
//! own target in process: a reset while 32 writes by R2T are in flight (new connections, every
//! write resubmitted). The conformance suite and resets between verified I/Os over TCP are
//! core's (`crate::tests::core_tcp`).

use std::sync::Arc;
use std::time::Duration;

use fp_bdev::conformance::{self, IoBuf};
use fp_bdev::{BlockDevice, IoOp, IoStatus};
use fp_nvmf::testing::LoopbackTarget;
use fp_nvmf::TransportOptions;

use super::tests::{target, transport};
use crate::ctrlr::{attach, Controller, GlobalOptions, NamespaceEvent};

fn attach_tcp(tg: &LoopbackTarget, name: &str) -> Arc<dyn Controller> {
    let global = GlobalOptions { keep_alive_timeout_ms: 2000, ..GlobalOptions::default() };
    let mut opts = global.controller_options(name);
    opts.io_queue_depth = 64;
    let events: Box<dyn Fn(NamespaceEvent) + Send + Sync> = Box::new(|_| {});
    attach(transport(tg.port(), false), opts, global, events).unwrap()
}

#[test]
fn reset_under_io_reconnects_and_resubmits() {
    let tg = target(TransportOptions::default());
    let c = attach_tcp(&tg, "tcp1");
    let ns = c.namespaces()[0].clone();
    assert_eq!(ns.info().name, "tcp1n1");
    let mut ch = ns.open_channel().unwrap();
    // 32 writes of 16 KiB (by R2T) in flight, then a reset, then all must complete and read
    // back.
    let mut bufs: Vec<IoBuf> = (0..32).map(|_| IoBuf::new(16384, true)).collect();
    for (i, b) in bufs.iter_mut().enumerate() {
        for (j, x) in b.bytes_mut().iter_mut().enumerate() {
            *x = (i * 7 + j) as u8;
        }
    }
    let iovs: Vec<libc::iovec> = bufs.iter_mut().map(|b| b.iovec()).collect();
    for (i, v) in iovs.iter().enumerate() {
        // SAFETY: the test keeps the buffers and their iovecs until the request completes.
        let req =
            unsafe { conformance::rw(i as u32, IoOp::Write, i as u64 * 16384, std::slice::from_ref(v)) };
        ch.submit(&req).unwrap();
    }
    let reset = {
        let c = c.clone();
        std::thread::spawn(move || c.reset())
    };
    let done = conformance::poll_until(&mut *ch, 32);
    assert!(done.iter().all(|d| d.1 == IoStatus::Success), "{done:?}");
    reset.join().unwrap().unwrap();
    for (i, b) in bufs.iter().enumerate() {
        let r = conformance::read_range(&mut *ch, i as u64 * 16384, 16384);
        assert_eq!(&r[..], b.bytes(), "request {i} after the reset");
    }
    drop(ch);
    c.detach();
    std::thread::sleep(Duration::from_millis(10));
}
