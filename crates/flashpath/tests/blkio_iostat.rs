//! The disk layer end to end: I/O from libblkio through a vhost-blk controller shows up in
//! `bdev_get_iostat` (counts, bytes, latencies) and `bdev_get_histogram`, and the counts
//! survive the client's disconnect and the controller's delete and re-create.

mod common;

use std::time::Duration;

use common::{bounded, pattern, BlkClient, Daemon};
use fp_registry::metrics::Histogram;
use serde_json::{json, Value};

fn iostat(daemon: &Daemon) -> (Value, u64) {
    let v = daemon.call("bdev_get_iostat", json!({"name": "m0"}));
    let rate = v["tick_rate"].as_u64().expect("tick_rate");
    (v["bdevs"][0].clone(), rate)
}

#[test]
fn iostat_and_histogram_count_guest_io() {
    let daemon = Daemon::start("0");
    daemon.malloc("m0", 2048, 512);
    assert_eq!(daemon.call("bdev_enable_histogram", json!({"name": "m0", "enable": true})), true);
    let sock = daemon.controller("c0", "m0", Some(2), false);

    let s = sock.clone();
    bounded(Duration::from_secs(60), "guest I/O", move || {
        let mut c = BlkClient::open(&s, 2);
        for i in 0..10u64 {
            assert_eq!(c.write(0, i * 4096, &pattern(i, i * 4096, 4096)), 0);
        }
        for i in 0..6u64 {
            c.read(1, i * 4096, 4096).expect("read");
        }
        assert_eq!(c.discard(0, 65536, 8192), 0);
        assert_eq!(c.flush(1), 0);
        assert_eq!(c.write_zeroes(0, 131072, 1024, false), 0);
        // Out of the disk: refused by the frontend before the bdev, so not counted.
        assert!(c.read(0, 2048 * 512, 512).is_err());
    });

    let (s, rate) = iostat(&daemon);
    assert_eq!((s["num_write_ops"].as_u64(), s["bytes_written"].as_u64()), (Some(10), Some(40960)), "{s}");
    assert_eq!((s["num_read_ops"].as_u64(), s["bytes_read"].as_u64()), (Some(6), Some(24576)), "{s}");
    assert_eq!((s["num_unmap_ops"].as_u64(), s["bytes_unmapped"].as_u64()), (Some(1), Some(8192)), "{s}");
    assert_eq!(s["num_flush_ops"], 1, "{s}");
    assert_eq!(
        (s["num_write_zeroes_ops"].as_u64(), s["bytes_zeroed"].as_u64()),
        (Some(1), Some(1024)),
        "{s}"
    );
    assert_eq!(s["queue_depth"], 0);
    assert_eq!(s["io_error"], json!({}));
    // No QoS limit: nothing waited.
    assert_eq!((s["qos_queued"].as_u64(), s["qos_queued_total"].as_u64()), (Some(0), Some(0)), "{s}");
    assert_eq!((s["qos_wait_ticks"].as_u64(), s["qos_throttled_ticks"].as_u64()), (Some(0), Some(0)), "{s}");
    for op in ["read", "write"] {
        let sum = s[format!("{op}_latency_ticks")].as_u64().unwrap();
        let max = s[format!("max_{op}_latency_ticks")].as_u64().unwrap();
        let min = s[format!("min_{op}_latency_ticks")].as_u64().unwrap();
        assert!(0 < min && min <= max && max <= sum, "{op}: {s}");
        // A RAM disk completes in microseconds; a second would mean the clock is wrong.
        assert!(sum < rate, "{op}: {sum} ticks at {rate}/s");
    }

    let h = daemon.call("bdev_get_histogram", json!({"name": "m0"}));
    let buckets = Histogram::from_base64(h["histogram"].as_str().unwrap()).expect("base64 buckets");
    assert_eq!(buckets.total(), 19, "every successful request: {h}");
    assert_eq!(h["tsc_rate"].as_u64(), Some(rate));
    assert!(h["percentiles_us"]["p50"].as_f64().unwrap() > 0.0, "{h}");

    // The controller goes and comes back: the disk keeps its counts and adds to them.
    daemon.call("vhost_delete_controller", json!({"ctrlr": "c0"}));
    assert_eq!(iostat(&daemon).0["num_read_ops"], 6);
    let sock = daemon.controller("c0", "m0", Some(1), false);
    bounded(Duration::from_secs(60), "guest I/O after re-create", move || {
        let mut c = BlkClient::open(&sock, 1);
        c.read(0, 0, 512).expect("read");
    });
    let (s, _) = iostat(&daemon);
    assert_eq!((s["num_read_ops"].as_u64(), s["bytes_read"].as_u64()), (Some(7), Some(25088)), "{s}");

    daemon.call("bdev_reset_iostat", json!({"name": "m0"}));
    assert_eq!(iostat(&daemon).0["num_read_ops"], 0);
}
