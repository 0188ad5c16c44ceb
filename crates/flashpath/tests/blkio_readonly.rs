//! A read-only controller: the device advertises VIRTIO_BLK_F_RO (so libblkio refuses to start a
//! writable client), serves reads, and every write-type request fails. The same bdev is written
//! first through a writable controller, which is then deleted and replaced by a read-only one.

mod common;

use std::time::Duration;

use common::{assert_same, bounded, pattern, BlkClient, ClientOpts, Daemon};
use serde_json::json;

#[test]
fn readonly_controller_rejects_writes_and_serves_reads() {
    let mut daemon = Daemon::start("0");
    daemon.malloc("m", 4096, 512); // 2 MiB
    let rw = daemon.controller("rw", "m", Some(1), false);
    let data = pattern(5, 0, 64 << 10);
    let d = data.clone();
    bounded(Duration::from_secs(30), "writer", move || {
        let mut c = BlkClient::open(&rw, 1);
        c.write_all(0, &d);
    });
    daemon.call("vhost_delete_controller", json!({"ctrlr": "rw"}));
    assert!(!daemon.dir.path().join("rw").exists(), "vhost_delete_controller left the socket behind");
    let ro = daemon.controller("ro", "m", Some(2), true);

    bounded(Duration::from_secs(60), "read-only client", move || {
        // A client that wants to write is refused at start: the device says it is read-only.
        match BlkClient::connect(&ro, ClientOpts { num_queues: 1, ..ClientOpts::default() }) {
            Ok(_) => panic!("a writable libblkio client started on a read-only controller"),
            Err(e) => assert_eq!(e.errno(), blkio::Errno::ROFS, "unexpected error: {e}"),
        }

        let mut c =
            BlkClient::connect(&ro, ClientOpts { num_queues: 2, read_only: true, ..ClientOpts::default() })
                .expect("a read-only client starts");
        assert!(c.blkio().get_bool("read-only").expect("read-only property"));
        for q in 0..2 {
            let got = c.read(q, 0, data.len()).expect("read on a read-only controller");
            assert_same("read-only data", 0, &got, &data);
            let w = c.write(q, 0, &[0xff; 4096]);
            assert!(w < 0, "write on a read-only controller returned {w}");
            let z = c.write_zeroes(q, 0, 4096, false);
            assert!(z < 0, "write-zeroes on a read-only controller returned {z}");
            let dsc = c.discard(q, 0, 4096);
            assert!(dsc < 0, "discard on a read-only controller returned {dsc}");
        }
        let got = c.read(0, 0, data.len()).expect("read after rejected writes");
        assert_same("data after rejected writes", 0, &got, &data);
    });
    daemon.assert_alive();
}
