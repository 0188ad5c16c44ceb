//! The controller over the fake transport: attach, namespaces and their events, keep-alive,
//! detach, and the reconnect policy's timing.

use std::time::{Duration, Instant};

use fp_bdev::BlockDevice;

use super::core_fake::*;
use crate::ctrlr::NamespaceEvent;

#[test]
fn attach_finds_the_namespaces_and_reports_the_controller() {
    let dev = FakeDevice::new(&[(1, 512, 2048), (3, 4096, 100)]);
    let (opts, global) = test_options("c0");
    let (c, _) = attach(&dev, "TCP", opts, global);
    let ns = c.namespaces();
    assert_eq!(ns.iter().map(|n| n.name()).collect::<Vec<_>>(), ["c0n1", "c0n3"]);
    assert_eq!((ns[0].info().block_size, ns[0].info().num_blocks()), (512, 2048));
    assert_eq!((ns[1].info().block_size, ns[1].info().num_blocks()), (4096, 100));
    assert_eq!(ns[0].info().driver, "nvme");
    assert_eq!(ns[0].info().product_name, "NVMe disk");
    let t = ns[0].info().io_types;
    assert!(t.read && t.write && t.flush && t.unmap && t.write_zeroes);
    // MDTS 5 with 4 KiB pages.
    assert_eq!(ns[0].max_transfer(), 128 * 1024);
    let info = c.info();
    let json = serde_json::to_value(&info).unwrap();
    assert_eq!(json["name"], "c0");
    assert_eq!(json["ctrlrs"][0]["state"], "enabled");
    assert_eq!(json["ctrlrs"][0]["cntlid"], 7);
    assert_eq!(json["ctrlrs"][0]["trid"]["trtype"], "TCP");
    assert_eq!(json["ctrlrs"][0]["trid"]["traddr"], "fake:0");
    assert_eq!(json["ctrlrs"][0]["max_io_queues"], 8);
    assert_eq!(json["ctrlrs"][0]["namespaces"], serde_json::json!([1, 3]));
    let ds = ns[1].driver_specific();
    assert_eq!(ds["nvme"][0]["ns_data"]["id"], 3);
    assert_eq!(ds["nvme"][0]["ctrlr_data"]["serial_number"], "FAKE0001");
    assert_eq!(ds["nvme"][0]["vs"]["nvme_version"], "1.4");
    c.detach();
    assert_eq!(dev.lock().shutdowns, 1);
    assert_eq!(c.info().ctrlrs[0].state, "deleting");
    // Detach is idempotent; channels cannot be opened any more.
    c.detach();
    assert!(ns[0].open_channel().is_err());
}

#[test]
fn attach_fails_cleanly_when_the_controller_is_unreachable() {
    let dev = FakeDevice::new(&[(1, 512, 64)]);
    dev.lock().down = true;
    let (opts, global) = test_options("c0");
    let r = crate::ctrlr::attach(dev.transport("TCP"), opts, global, Box::new(|_| {}));
    assert!(r.is_err());
    let (mut opts, global) = test_options("c0");
    opts.reconnect_delay_sec = 5;
    let e = crate::ctrlr::attach(dev.transport("TCP"), opts, global, Box::new(|_| {})).err().unwrap();
    assert!(e.to_string().contains("reconnect_delay_sec"), "{e}");
}

#[test]
fn asynchronous_events_resize_add_and_remove_namespaces() {
    let dev = FakeDevice::new(&[(1, 512, 64), (2, 512, 64)]);
    let (opts, global) = test_options("c0");
    let (c, log) = attach(&dev, "PCIe", opts, global);
    let ns1 = c.namespaces()[0].clone();
    // Namespace 1 grows, 2 goes, 4 comes: one Namespace Attribute Changed notice.
    {
        let mut d = dev.lock();
        d.namespaces.get_mut(&1).unwrap().data.resize(128 * 512, 0);
        d.namespaces.remove(&2);
        d.namespaces.insert(4, FakeNs::new(4096, 8));
        // Notice (2), Namespace Attribute Changed (info 0), log page 04h.
        d.events.push(2 | (0x04 << 16));
    }
    wait_for("three namespace events", || log.lock().unwrap().len() == 3);
    let events = std::mem::take(&mut *log.lock().unwrap());
    assert!(matches!(events[0], NamespaceEvent::Removed { nsid: 2 }), "{events:?}");
    assert!(matches!(events[1], NamespaceEvent::Resized { nsid: 1, num_blocks: 128 }), "{events:?}");
    match &events[2] {
        NamespaceEvent::Added(ns) => assert_eq!((ns.name(), ns.info().block_size), ("c0n4", 4096)),
        e => panic!("{e:?}"),
    }
    // The Changed Namespace List was read (which re-arms the event on a real controller).
    assert!(dev.lock().log_pages >= 1);
    // The bdev's size follows when the registry resizes it, to the reported size only.
    assert_eq!(ns1.info().num_blocks(), 64);
    assert_eq!(ns1.reported_blocks(), 128);
    assert!(ns1.resize(100).is_err());
    ns1.resize(128).unwrap();
    assert_eq!(ns1.info().num_blocks(), 128);
    assert_eq!(c.namespaces().iter().map(|n| n.nsid()).collect::<Vec<_>>(), [1, 4]);
    // The request was re-armed: another event is heard.
    dev.lock().namespaces.remove(&4);
    dev.lock().events.push(2 | (0x04 << 16));
    wait_for("the removal", || log.lock().unwrap().len() == 1);
    assert!(matches!(log.lock().unwrap()[0], NamespaceEvent::Removed { nsid: 4 }));
    assert_eq!(c.info().ctrlrs[0].async_events, 2);
}

#[test]
fn keep_alive_goes_every_half_timeout() {
    let dev = FakeDevice::new(&[(1, 512, 64)]);
    let (opts, mut global) = test_options("c0");
    global.keep_alive_timeout_ms = 20;
    let (_c, _) = attach(&dev, "TCP", opts, global);
    let start = Instant::now();
    wait_for("five keep-alives", || dev.lock().keep_alives >= 5);
    // Five at 10 ms intervals take at least 40 ms after the first.
    assert!(start.elapsed() >= Duration::from_millis(40), "{:?}", start.elapsed());
}

#[test]
fn a_lost_connection_reconnects_every_delay_until_it_comes_back() {
    let dev = FakeDevice::new(&[(1, 512, 64)]);
    let (mut opts, global) = test_options("c0");
    opts.ctrlr_loss_timeout_sec = -1;
    opts.reconnect_delay_sec = 3; // 30 ms
    let (c, log) = attach(&dev, "TCP", opts, global);
    let before = dev.lock().connects;
    dev.drop_connections(true);
    let start = Instant::now();
    wait_for("four failed attempts", || dev.lock().connects >= before + 4);
    let took = start.elapsed();
    // The first attempt comes at once, then one every 30 ms: three delays at least.
    assert!(took >= Duration::from_millis(90), "{took:?}");
    assert_eq!(c.info().ctrlrs[0].state, "reconnect_is_delayed");
    dev.up();
    wait_for("the controller back", || c.info().ctrlrs[0].state == "enabled");
    assert!(c.info().ctrlrs[0].reconnect_attempts >= 3);
    // Nothing was removed.
    assert!(log.lock().unwrap().is_empty());
    assert_eq!(c.namespaces().len(), 1);
}

#[test]
fn a_controller_lost_past_ctrlr_loss_timeout_is_failed_and_its_namespaces_removed() {
    let dev = FakeDevice::new(&[(1, 512, 64), (2, 512, 64)]);
    let (mut opts, global) = test_options("c0");
    opts.ctrlr_loss_timeout_sec = 5; // 50 ms
    opts.reconnect_delay_sec = 1;
    let (c, log) = attach(&dev, "TCP", opts, global);
    let start = Instant::now();
    dev.drop_connections(true);
    wait_for("failed", || c.info().ctrlrs[0].state == "failed");
    assert!(start.elapsed() >= Duration::from_millis(50), "{:?}", start.elapsed());
    // The controller thread reports the removals after it marks itself failed.
    wait_for("the namespaces' removal", || log.lock().unwrap().len() >= 2);
    let events = log.lock().unwrap();
    assert_eq!(events.len(), 2);
    assert!(events.iter().all(|e| matches!(e, NamespaceEvent::Removed { .. })));
    assert!(c.namespaces().is_empty());
    // No more attempts once failed.
    let n = dev.lock().connects;
    std::thread::sleep(Duration::from_millis(30));
    assert_eq!(dev.lock().connects, n);
}

#[test]
fn rpc_reset_reconnects_and_reports_the_outcome() {
    let dev = FakeDevice::new(&[(1, 512, 64)]);
    let (opts, global) = test_options("c0");
    let (c, _) = attach(&dev, "PCIe", opts, global);
    let g = c.info().ctrlrs[0].generation;
    c.reset().unwrap();
    assert_eq!(dev.lock().connects, 2);
    assert!(c.info().ctrlrs[0].generation > g);
    assert_eq!(c.info().ctrlrs[0].resets, 1);
    // ctrlr_loss_timeout_sec 0: a failed reset fails the controller.
    dev.lock().down = true;
    assert!(c.reset().is_err());
    assert_eq!(c.info().ctrlrs[0].state, "failed");
}
