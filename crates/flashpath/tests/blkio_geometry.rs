//! What libblkio sees in the virtio-blk configuration space (capacity, block size, queue count)
//! matches what was created over RPC, and requests outside the disk or not aligned to its block
//! size fail without touching data.

mod common;

use std::time::Duration;

use common::{assert_same, bounded, pattern, BlkClient, ClientOpts, Daemon};
use serde_json::{json, Value};

#[test]
fn capacity_block_size_and_queues_match_what_was_created() {
    let mut daemon = Daemon::start("0,1");
    daemon.malloc("m4k", 2048, 4096); // 8 MiB, 4 KiB blocks
    daemon.malloc("m512", 5000, 512); // 2.56 MB, not a power of two
    let r = daemon
        .call("bdev_null_create", json!({"name": "n0", "num_blocks": 1_000_000u64, "block_size": 4096}));
    assert_eq!(r, json!("n0"));
    let file = daemon.backing_file("u.img", 3 << 20);
    daemon.uring("u4k", &file, Some(4096));

    // (controller, bdev, queues, expected capacity, expected block size)
    let cases: Vec<(&str, &str, u16, u64, usize)> = vec![
        ("c-m4k", "m4k", 1, 8 << 20, 4096),
        ("c-m512", "m512", 2, 5000 * 512, 512),
        ("c-n0", "n0", 3, 4096 * 1_000_000, 4096),
        ("c-u4k", "u4k", 4, 3 << 20, 4096),
    ];
    let mut socks = Vec::new();
    for &(ctrlr, bdev, q, _, _) in &cases {
        socks.push(daemon.controller(ctrlr, bdev, Some(q), false));
    }

    // The RPC view agrees with what was asked for.
    let bdevs = daemon.call("bdev_get_bdevs", Value::Null);
    let bdevs = bdevs.as_array().expect("bdev_get_bdevs returns an array");
    assert_eq!(bdevs.len(), 4, "{bdevs:?}");
    for (name, blocks, bs) in
        [("m4k", 2048u64, 4096u64), ("m512", 5000, 512), ("n0", 1_000_000, 4096), ("u4k", 768, 4096)]
    {
        let b =
            bdevs.iter().find(|b| b["name"] == name).unwrap_or_else(|| panic!("{name} missing: {bdevs:?}"));
        assert_eq!(b["block_size"], json!(bs), "{name}: {b}");
        assert_eq!(b["num_blocks"], json!(blocks), "{name}: {b}");
    }
    let ctrls = daemon.call("vhost_get_controllers", Value::Null);
    let listed = ctrls.as_array().expect("vhost_get_controllers returns an array");
    assert_eq!(listed.len(), 4, "{ctrls}");
    for &(ctrlr, ..) in &cases {
        assert!(listed.iter().any(|c| c["ctrlr"] == ctrlr), "{ctrlr} not in {ctrls}");
    }

    let cases: Vec<_> = cases.into_iter().map(|(_, _, q, cap, bs)| (q, cap, bs)).collect();
    bounded(Duration::from_secs(60), "geometry", move || {
        for ((q, cap, bs), sock) in cases.into_iter().zip(socks) {
            let mut c = BlkClient::open(&sock, q as usize);
            assert_eq!(c.capacity, cap, "{}: capacity", sock.display());
            assert_eq!(c.block_size, bs, "{}: request-alignment (block size)", sock.display());
            assert_eq!(c.max_queues, q as usize, "{}: max-queues", sock.display());
            let ro = c.blkio().get_bool("read-only").expect("read-only property");
            assert!(!ro, "{}: a writable controller reported read-only", sock.display());
            // Every queue works: one write and one read of the last block on each.
            for qi in 0..c.num_queues() {
                let off = cap - bs as u64;
                let data = pattern(qi as u64 + 1, off, bs);
                assert_eq!(c.write(qi, off, &data), 0, "write on queue {qi}");
                let got = c.read(qi, off, bs).expect("read of the last block");
                if !sock.ends_with("c-n0") {
                    assert_same("last block", off, &got, &data);
                }
            }
        }
    });
    daemon.assert_alive();
}

#[test]
fn out_of_range_and_misaligned_requests_fail_and_leave_data_alone() {
    let mut daemon = Daemon::start("0");
    daemon.malloc("m", 256, 4096); // 1 MiB
    let sock = daemon.controller("vhost.0", "m", Some(1), false);
    bounded(Duration::from_secs(60), "bad requests", move || {
        let mut c = BlkClient::open(&sock, 1);
        let cap = c.capacity;
        assert_eq!(cap, 1 << 20);
        let data = pattern(3, 0, 16384);
        assert_eq!(c.write(0, 0, &data), 0);
        assert_eq!(c.write(0, cap - 4096, &pattern(3, cap - 4096, 4096)), 0);

        // Entirely past the end, and straddling the end.
        assert!(c.read(0, cap, 4096).is_err(), "read at the capacity succeeded");
        assert!(c.read(0, cap - 4096, 8192).is_err(), "read across the end succeeded");
        assert!(c.write(0, cap - 4096, &[0x11; 8192]) < 0, "write across the end succeeded");
        // Not a multiple of the 4 KiB block: offset and length.
        assert!(c.write(0, 512, &[0x22; 512]) < 0, "512-byte write at 512 on a 4K disk succeeded");
        assert!(c.write(0, 4096, &[0x33; 1024]) < 0, "1 KiB write on a 4K disk succeeded");
        assert!(c.read(0, 2048, 4096).is_err(), "misaligned read succeeded");

        // Nothing was changed, and the queue still works.
        let got = c.read(0, 0, 16384).expect("read after the failures");
        assert_same("data after rejected requests", 0, &got, &data);
        let got = c.read(0, cap - 4096, 4096).expect("read of the last block");
        assert_same("last block after rejected requests", cap - 4096, &got, &pattern(3, cap - 4096, 4096));
    });
    daemon.assert_alive();
}

/// A controller created without `num_queues`, on a daemon with one reactor, offers
/// `MAX_QUEUES` (64): libblkio sees them as max-queues, can start all of them (all on that
/// reactor) and no more, and the daemon's counters are the sum over the queues.
#[test]
fn by_default_a_controller_offers_64_queues_whatever_the_reactors() {
    const MAX: usize = 64;
    let mut daemon = Daemon::start("0");
    daemon.malloc("m", 2 * MAX as u64, 4096);
    let sock = daemon.controller("vhost.0", "m", None, false);
    let listed = daemon.call("vhost_get_controllers", json!({"name": "vhost.0"}));
    assert_eq!(listed[0]["num_queues"], json!(MAX), "{listed}");

    let too_many = sock.clone();
    bounded(Duration::from_secs(60), "queues", move || {
        let e = BlkClient::connect(&too_many, ClientOpts { num_queues: MAX + 1, ..ClientOpts::default() })
            .err()
            .expect("libblkio started more queues than the device offers");
        assert!(e.message().contains(&MAX.to_string()), "{e}");

        let mut c = BlkClient::open(&sock, MAX);
        assert_eq!((c.max_queues, c.num_queues()), (MAX, MAX), "max-queues and queues started");
        // Block `qi` written through queue `qi`, then all of them read back through queue 0 and
        // each through its own queue.
        for qi in 0..MAX {
            let off = qi as u64 * 4096;
            assert_eq!(c.write(qi, off, &pattern(qi as u64, off, 4096)), 0, "write on queue {qi}");
        }
        let all = c.read(0, 0, MAX * 4096).expect("read of every queue's block");
        for qi in 0..MAX {
            let off = qi as u64 * 4096;
            let own = c.read(qi, off, 4096).expect("read on its own queue");
            assert_same("a block through its own queue", off, &own, &pattern(qi as u64, off, 4096));
            assert_same("a block through queue 0", off, &all[qi * 4096..][..4096], &own);
        }
    });

    // The counters are per controller, summed over the 64 queues: 64 writes, 1 + 64 reads.
    let stats = &daemon.call("vhost_get_controllers", json!({"name": "vhost.0"}))[0]["stats"];
    assert_eq!(stats["write_ops"], json!(MAX), "{stats}");
    assert_eq!(stats["read_ops"], json!(MAX + 1), "{stats}");
    assert_eq!(stats["bytes_written"], json!(MAX * 4096), "{stats}");
    assert_eq!(stats["bytes_read"], json!(2 * MAX * 4096), "{stats}");
    let all = daemon.call("flashpath_get_stats", Value::Null);
    assert_eq!(all["controllers"][0]["stats"], *stats, "{all}");
    daemon.assert_alive();
}
