//! Drives one NVMe/TCP controller with the TCP transport alone (no controller thread, no bdev):
//! connect, enable, Identify, a write/read-verify round over in-capsule and R2T sizes, then
//! random 4 KiB reads at a queue depth for a while, one I/O queue on this thread. For checking
//! the transport against another target (SPDK's nvmf_tgt, the kernel's nvmet-tcp) by hand, and
//! for a figure of the transport's own cost.
//!
//! ```text
//! cargo run --release -p fp-nvme --example tcp_probe -- TRADDR TRSVCID SUBNQN [QD] [SECONDS] [--digests] [--no-verify]
//! ```
//!
//! `--no-verify` for a namespace that keeps nothing (a null bdev): the writes and reads run,
//! their data is not compared.

use std::time::{Duration, Instant};

use fp_bdev::Iovecs;
use fp_nvme::cmd;
use fp_nvme::tcp::{Adrfam, TcpTarget, TcpTransport};
use fp_nvme::transport::{AdminData, AdminQueue, IoQueue, Transport};

const T: Duration = Duration::from_secs(10);

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() < 3 {
        eprintln!("usage: tcp_probe TRADDR TRSVCID SUBNQN [QD] [SECONDS] [--digests] [--no-verify]");
        std::process::exit(2);
    }
    let digests = args.iter().any(|a| a == "--digests");
    let verify = !args.iter().any(|a| a == "--no-verify");
    let pos: Vec<&String> = args.iter().filter(|a| !a.starts_with("--")).collect();
    let qd: usize = pos.get(3).map_or(32, |s| s.parse().expect("QD"));
    let secs: u64 = pos.get(4).map_or(3, |s| s.parse().expect("SECONDS"));
    let traddr = pos[0].clone();
    let tr = TcpTransport::new(TcpTarget {
        adrfam: if traddr.contains(':') { Adrfam::IPv6 } else { Adrfam::IPv4 },
        traddr,
        trsvcid: pos[1].parse().expect("TRSVCID"),
        subnqn: pos[2].clone(),
        hostnqn: "nqn.2014-08.io.flashpath:tcp-probe".into(),
        hostid: [0x42; 16],
        hdgst: digests,
        ddgst: digests,
        kato_ms: 0,
        dhchap: Default::default(),
        tls: None,
    });
    let mut admin = tr.connect_admin(32, T).expect("admin queue");
    let cap = admin.get_property(fp_nvme_spec::registers::CAP, true).expect("CAP");
    let vs = admin.get_property(fp_nvme_spec::registers::VS, false).expect("VS");
    println!(
        "connected: cntlid {} CAP.MQES {} VS {:#x} IOCCSZ data {} max transfer {}",
        admin.cntlid(),
        fp_nvme_spec::registers::cap_mqes(cap),
        vs,
        admin.io_in_capsule_data(),
        admin.max_transfer()
    );
    let mut id = vec![0u8; 4096];
    let cqe = admin
        .execute(cmd::identify(fp_nvme_spec::identify::CNS_NAMESPACE, 1), AdminData::FromDevice(&mut id), T)
        .unwrap();
    assert!(cqe.status.is_success(), "Identify Namespace 1: {cqe:?}");
    let nsze = u64::from_le_bytes(id[0..8].try_into().unwrap());
    let flbas = usize::from(id[26] & 0xf);
    let lbads = id[128 + flbas * 4 + 2];
    let bs = 1usize << lbads;
    println!("namespace 1: {nsze} blocks of {bs} bytes");
    let depth = (qd + 1).min(usize::from(fp_nvme_spec::registers::cap_mqes(cap)) + 1) as u16;
    let mut q = tr.connect_io(&mut admin, 1, depth).expect("I/O queue");

    let run = |q: &mut fp_nvme::tcp::TcpQueue, write: bool, slba: u64, buf: &mut [u8]| {
        let sqe = cmd::read_write(write, 1, slba, (buf.len() / bs) as u32, false);
        let v = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
        // SAFETY: `buf` outlives the command: reaped before returning.
        q.submit(&sqe, unsafe { Iovecs::from_slice(&[v]) }, 0).unwrap();
        let mut out = Vec::new();
        while out.is_empty() {
            q.flush();
            q.poll(&mut out).expect("queue");
        }
        assert!(out[0].1.is_success(), "{out:?}");
    };
    for (i, len) in [bs, 4096, 8192, 65536, 131072].into_iter().enumerate() {
        let len = len.min(admin.max_transfer() as usize).max(bs);
        let mut w: Vec<u8> = (0..len).map(|j| (j as u8).wrapping_mul(7).wrapping_add(i as u8)).collect();
        let slba = (i as u64) * 512 % nsze.max(1);
        run(&mut q, true, slba, &mut w);
        let mut r = vec![0u8; len];
        run(&mut q, false, slba, &mut r);
        if verify {
            assert_eq!(r, w, "read back {len} bytes at {slba}");
        }
        println!("write/read {len} bytes: ok{}", if verify { ", verified" } else { "" });
    }

    // Random 4 KiB reads at `qd`.
    let io = 4096usize.max(bs);
    let span = (nsze * bs as u64 / io as u64).max(1);
    let mut bufs: Vec<Vec<u8>> = (0..qd).map(|_| vec![0u8; io]).collect();
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let next = |x: &mut u64| {
        *x ^= *x << 13;
        *x ^= *x >> 7;
        *x ^= *x << 17;
        *x % span
    };
    let submit = |q: &mut fp_nvme::tcp::TcpQueue, b: &mut Vec<u8>, tag: u32, blk: u64| {
        let sqe = cmd::read_write(false, 1, blk * (io / bs) as u64, (io / bs) as u32, false);
        let v = libc::iovec { iov_base: b.as_mut_ptr().cast(), iov_len: io };
        // SAFETY: `bufs` outlives every command (all reaped below).
        q.submit(&sqe, unsafe { Iovecs::from_slice(&[v]) }, tag).unwrap();
    };
    for (t, b) in bufs.iter_mut().enumerate() {
        let blk = next(&mut x);
        submit(&mut q, b, t as u32, blk);
    }
    let start = Instant::now();
    let end = start + Duration::from_secs(secs);
    let mut done = 0u64;
    let mut out = Vec::with_capacity(qd);
    loop {
        q.flush();
        out.clear();
        q.poll(&mut out).expect("queue");
        let stop = Instant::now() >= end;
        for &(tag, st) in &out {
            assert!(st.is_success());
            done += 1;
            if !stop {
                let blk = next(&mut x);
                submit(&mut q, &mut bufs[tag as usize], tag, blk);
            }
        }
        if stop && q.in_flight() == 0 {
            break;
        }
    }
    let el = start.elapsed().as_secs_f64();
    let s = q.stats();
    let d = q.data_stats();
    println!(
        "randread {io} B QD{qd}: {done} I/Os in {el:.2} s = {:.0} IOPS, {:.2} sendmsg per I/O, read data {:.0}% straight into the buffers",
        done as f64 / el,
        s.doorbells as f64 / s.submitted.max(1) as f64,
        100.0 * d.direct as f64 / (d.direct + d.copied).max(1) as f64
    );
    tr.shutdown(&mut admin, T);
}
