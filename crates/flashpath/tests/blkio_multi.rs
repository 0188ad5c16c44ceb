//! Two disks (RAM and file), two controllers, two libblkio clients driven at the same time from
//! two threads against one daemon; each verifies its own data.

mod common;

use std::time::Duration;

use common::{bounded, random_write_verify, BlkClient, Daemon};
use serde_json::Value;

#[test]
fn two_disks_two_clients_at_once() {
    let mut daemon = Daemon::start("0,1");
    const SIZE: u64 = 16 << 20;
    daemon.malloc("ram", SIZE / 512, 512);
    let file = daemon.backing_file("disk.img", SIZE);
    daemon.uring("file", &file, Some(4096));
    let a = daemon.controller("ctrl-ram", "ram", Some(2), false);
    let b = daemon.controller("ctrl-file", "file", Some(2), false);

    let total = bounded(Duration::from_secs(180), "two clients", move || {
        let ta = std::thread::spawn(move || {
            let mut c = BlkClient::open(&a, 2);
            assert_eq!(c.capacity, SIZE);
            random_write_verify(&mut c, 100, 10, 0, SIZE, Some(0))
        });
        let tb = std::thread::spawn(move || {
            let mut c = BlkClient::open(&b, 2);
            assert_eq!(c.block_size, 4096);
            random_write_verify(&mut c, 200, 10, 0, SIZE, Some(0))
        });
        let ra = ta.join();
        let rb = tb.join();
        let ra = ra.unwrap_or_else(|p| std::panic::resume_unwind(p));
        let rb = rb.unwrap_or_else(|p| std::panic::resume_unwind(p));
        ra + rb
    });
    assert!(total >= 2 * SIZE, "only {total} bytes compared");
    let bdevs = daemon.call("bdev_get_bdevs", Value::Null);
    assert_eq!(bdevs.as_array().map(Vec::len), Some(2), "{bdevs}");
    daemon.assert_alive();
}
