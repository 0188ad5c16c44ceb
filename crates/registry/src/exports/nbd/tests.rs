//! `nbd_stop_disk` with a request its disk holds: bounded, said, and the bdev kept claimed.

use serde_json::{json, Value};

use crate::exports::{KindOptions, OptionValue};
use crate::{Registry, RegistryOptions};

#[test]
fn stopping_an_export_whose_disk_holds_a_request_fails_and_keeps_the_bdev_claimed() {
    let dir = tempfile::tempdir().unwrap();
    let reactors = fp_reactor::ReactorSet::start(&[0], fp_reactor::ReactorConfig::default()).unwrap();
    let registry =
        Registry::with_options(reactors.handles().to_vec(), dir.path(), RegistryOptions::default());
    let call =
        |m: &str, p: Value| registry.call(m, Some(p.clone())).unwrap_or_else(|e| panic!("{m} {p}: {e}"));
    let sock = dir.path().join("ee.nbd");
    let sock = sock.to_str().unwrap();
    call("bdev_malloc_create", json!({ "name": "m0", "num_blocks": 256, "block_size": 512 }));
    call("bdev_error_create", json!({ "base_name": "m0" }));
    call("nbd_start_disk", json!({ "bdev_name": "EE_m0", "nbd_device": sock }));
    call("bdev_nbd_client_create", json!({ "name": "client", "address": sock }));
    call("bdev_error_inject_error", json!({ "name": "EE_m0", "io_type": "write", "error_type": "pending" }));
    let (client, _) = fp_bdev::ModuleHost::bdev(&*registry, "client").expect("the client bdev");
    let writer = std::thread::spawn(move || {
        let mut ch = client.open_channel().unwrap();
        fp_bdev::conformance::write_range(&mut *ch, 0, &[0x5a; 512]);
    });
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let b = call("bdev_get_bdevs", json!({ "name": "EE_m0" }));
        let inj = &b[0]["driver_specific"]["error"]["injections"];
        assert!(inj.is_object(), "{b}");
        if inj.get("write").is_none() {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the write never reached the error bdev");
        std::thread::sleep(std::time::Duration::from_millis(1));
    }

    let e = registry.call("nbd_stop_disk", Some(json!({ "nbd_device": sock }))).unwrap_err();
    assert_eq!(e.to_rpc().code, -libc::EBUSY, "{e}");
    let msg = e.to_string();
    assert!(msg.contains("1 connection(s) still wait") && msg.contains("EE_m0"), "{msg}");
    let b = call("bdev_get_bdevs", json!({ "name": "EE_m0" }));
    assert_eq!(b[0]["claimed_by"], sock, "{b}");

    call("bdev_error_resume_pending", json!({ "name": "EE_m0" }));
    writer.join().expect("the write completed");
    assert_eq!(call("nbd_stop_disk", json!({ "nbd_device": sock })), true);
    assert_eq!(call("bdev_get_bdevs", json!({ "name": "EE_m0" }))[0]["claimed"], false);
    call("bdev_nbd_client_delete", json!({ "name": "client" }));
    drop(registry);
    reactors.shutdown();
}

/// An nbd_client bdev whose server stops answering (its disk holds the write): with
/// `io_timeout_ms`, the write fails with EIO at the timeout, and an export stacked on the
/// client bdev, whose stop gave up at its own bound while the write was out, then stops.
#[test]
fn an_nbd_client_request_the_server_never_answers_fails_at_io_timeout_ms() {
    let dir = tempfile::tempdir().unwrap();
    let reactors = fp_reactor::ReactorSet::start(&[0], fp_reactor::ReactorConfig::default()).unwrap();
    let registry =
        Registry::with_options(reactors.handles().to_vec(), dir.path(), RegistryOptions::default());
    let call =
        |m: &str, p: Value| registry.call(m, Some(p.clone())).unwrap_or_else(|e| panic!("{m} {p}: {e}"));
    let remote = dir.path().join("remote.nbd");
    let remote = remote.to_str().unwrap();
    let upper = dir.path().join("upper.nbd");
    let upper = upper.to_str().unwrap();
    call("bdev_malloc_create", json!({ "name": "m0", "num_blocks": 256, "block_size": 512 }));
    call("bdev_error_create", json!({ "base_name": "m0" }));
    call("nbd_start_disk", json!({ "bdev_name": "EE_m0", "nbd_device": remote }));
    let too_long = json!({ "name": "c", "address": remote, "io_timeout_ms": 86_400_001u64 });
    let e = registry.call("bdev_nbd_client_create", Some(too_long)).unwrap_err();
    assert!(e.to_string().contains("io_timeout_ms"), "{e}");
    call("bdev_nbd_client_create", json!({ "name": "client", "address": remote, "io_timeout_ms": 2000 }));
    let b = call("bdev_get_bdevs", json!({ "name": "client" }));
    assert_eq!(b[0]["driver_specific"]["nbd_client"]["io_timeout_ms"], 2000, "{b}");
    // The upper export's connection opens the client bdev's channel on the reactor.
    call("nbd_start_disk", json!({ "bdev_name": "client", "nbd_device": upper }));
    call("bdev_nbd_client_create", json!({ "name": "top", "address": upper }));
    call("bdev_error_inject_error", json!({ "name": "EE_m0", "io_type": "write", "error_type": "pending" }));
    let (top, _) = fp_bdev::ModuleHost::bdev(&*registry, "top").expect("the top bdev");
    let writer = std::thread::spawn(move || {
        let mut ch = top.open_channel().unwrap();
        let start = std::time::Instant::now();
        let status = fp_bdev::conformance::write_status(&mut *ch, 0, &[0x5a; 512]);
        (status, start.elapsed())
    });
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let b = call("bdev_get_bdevs", json!({ "name": "EE_m0" }));
        if b[0]["driver_specific"]["error"]["injections"].get("write").is_none() {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the write never reached the error bdev");
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    // The write is held two layers down; the upper export's stop waits its bound. Whether it
    // gives up (the write still out) or succeeds (the timeout came first) depends on when the
    // 2 s timeout ran out, so only the write's end is asserted, then a stop that must succeed.
    let (status, waited) = writer.join().expect("the write completed");
    assert_eq!(status, fp_bdev::IoStatus::Error(libc::EIO));
    assert!(waited >= std::time::Duration::from_millis(1900), "failed before the timeout: {waited:?}");
    let b = call("bdev_get_bdevs", json!({ "name": "client" }));
    assert_eq!(b[0]["driver_specific"]["nbd_client"]["connections_lost"], 1, "{b}");
    call("bdev_nbd_client_delete", json!({ "name": "top" }));
    assert_eq!(call("nbd_stop_disk", json!({ "nbd_device": upper })), true);
    call("bdev_nbd_client_delete", json!({ "name": "client" }));
    call("bdev_error_resume_pending", json!({ "name": "EE_m0" }));
    assert_eq!(call("nbd_stop_disk", json!({ "nbd_device": remote })), true);
    drop(registry);
    reactors.shutdown();
}

/// A write a crypto bdev took and keeps retrying against its busy base is not on the device:
/// `nbd_stop_disk` retries it until the daemon's stop bound (`[nbd] stop_timeout_ms`, here 300 ms,
/// which also ends the connection's own longer close bound), then answers it EIO and succeeds,
/// releasing the bdev.
#[test]
fn stopping_an_export_gives_up_a_write_parked_on_busy_at_the_configured_bound() {
    let dir = tempfile::tempdir().unwrap();
    let reactors = fp_reactor::ReactorSet::start(&[0], fp_reactor::ReactorConfig::default()).unwrap();
    let bound = std::time::Duration::from_millis(300);
    let options = RegistryOptions {
        kind_options: KindOptions::default()
            .with("nbd", "stop_timeout_ms", OptionValue::Millis(bound.as_millis() as u64))
            .with("nbd", "close_timeout_ms", OptionValue::Millis(600_000)),
        ..RegistryOptions::default()
    };
    let registry = Registry::with_options(reactors.handles().to_vec(), dir.path(), options);
    let call =
        |m: &str, p: Value| registry.call(m, Some(p.clone())).unwrap_or_else(|e| panic!("{m} {p}: {e}"));
    let sock = dir.path().join("c.nbd");
    let sock = sock.to_str().unwrap();
    call("bdev_malloc_create", json!({ "name": "m0", "num_blocks": 256, "block_size": 512 }));
    call("bdev_error_create", json!({ "base_name": "m0" }));
    call(
        "accel_crypto_key_create",
        json!({ "name": "k", "cipher": "AES_XTS", "key": "11".repeat(32), "key2": "22".repeat(32) }),
    );
    call("bdev_crypto_create", json!({ "base_bdev_name": "EE_m0", "name": "c", "key_name": "k" }));
    call("nbd_start_disk", json!({ "bdev_name": "c", "nbd_device": sock }));
    call("bdev_nbd_client_create", json!({ "name": "client", "address": sock }));
    call(
        "bdev_error_inject_error",
        json!({ "name": "EE_m0", "io_type": "write", "error_type": "nomem", "num": 1u64 << 40 }),
    );
    let (client, _) = fp_bdev::ModuleHost::bdev(&*registry, "client").expect("the client bdev");
    let writer = std::thread::spawn(move || {
        let mut ch = client.open_channel().unwrap();
        fp_bdev::conformance::write_status(&mut *ch, 0, &[0x5a; 512])
    });
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let b = call("bdev_get_bdevs", json!({ "name": "EE_m0" }));
        let left = b[0]["driver_specific"]["error"]["injections"]["write"]["num"].as_u64();
        if left.is_some_and(|n| n < 1 << 40) {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the write never reached the error bdev");
        std::thread::sleep(std::time::Duration::from_millis(1));
    }

    let start = std::time::Instant::now();
    assert_eq!(call("nbd_stop_disk", json!({ "nbd_device": sock })), true);
    let took = start.elapsed();
    // The configured bound, not the 5 s default, nor the connection's 600 s.
    assert!(took >= bound && took < fp_nbd::STOP_TIMEOUT, "{took:?}");
    assert_eq!(call("bdev_get_bdevs", json!({ "name": "c" }))[0]["claimed"], false);
    let status = writer.join().expect("the write was answered");
    assert_ne!(status, fp_bdev::IoStatus::Success, "the parked write failed");
    call("bdev_nbd_client_delete", json!({ "name": "client" }));
    drop(registry);
    reactors.shutdown();
}

/// `bitmaps`: checked at start (naming the field, changing nothing), held busy while exported,
/// another bdev's accepted when it has the export's size, shown by `nbd_get_disks`.
#[test]
fn an_exports_bitmaps_are_checked_at_start_and_refuse_removal_while_exported() {
    let (dir, reactors, registry) = fixture();
    let call = |m: &str, p: Value| called(&registry, m, p);
    let sock = dir.path().join("b.nbd");
    let sock = sock.to_str().unwrap();
    for (name, blocks) in [("m0", 256), ("m1", 256), ("m2", 512)] {
        call("bdev_malloc_create", json!({ "name": name, "num_blocks": blocks, "block_size": 512 }));
        call("bdev_dirty_bitmap_add", json!({ "bdev": name, "name": "b" }));
    }
    let refused = |bitmaps: Value, says: &str| {
        let p = json!({ "bdev_name": "m0", "nbd_device": sock, "bitmaps": bitmaps });
        let e = registry.call("nbd_start_disk", Some(p)).unwrap_err();
        let rpc = e.to_rpc();
        assert_eq!(rpc.code, -32602, "{e}");
        assert!(rpc.message.contains("bitmaps") && rpc.message.contains(says), "{}", rpc.message);
    };
    refused(json!(["nope"]), "nope");
    refused(json!([{ "bdev": "m2", "name": "b" }]), "262144");
    refused(json!([{ "bdev": "zz", "name": "b" }]), "zz");
    refused(json!(["b", { "bdev": "m1", "name": "b" }]), "twice");
    refused(json!([{ "bdev": "m1" }]), "name");
    refused(json!([7]), "bitmaps[0]");
    assert_eq!(call("nbd_get_disks", json!({})), json!([]));
    assert_eq!(call("bdev_dirty_bitmap_list", json!({ "bdev": "m0" }))[0]["busy"], false);

    call("nbd_start_disk", json!({ "bdev_name": "m0", "nbd_device": sock, "bitmaps": ["b"] }));
    assert_eq!(call("nbd_get_disks", json!({}))[0]["bitmaps"], json!(["b"]));
    assert_eq!(call("bdev_dirty_bitmap_list", json!({ "bdev": "m0" }))[0]["busy"], true);
    let e =
        registry.call("bdev_dirty_bitmap_remove", Some(json!({ "bdev": "m0", "name": "b" }))).unwrap_err();
    assert_eq!(e.to_rpc().code, -libc::EBUSY, "{e}");
    assert!(e.to_string().contains("busy"), "{e}");
    call("nbd_stop_disk", json!({ "nbd_device": sock }));
    assert_eq!(call("bdev_dirty_bitmap_list", json!({ "bdev": "m0" }))[0]["busy"], false);
    call("bdev_dirty_bitmap_remove", json!({ "bdev": "m0", "name": "b" }));

    // Another bdev's bitmap of the same size.
    call(
        "nbd_start_disk",
        json!({ "bdev_name": "m0", "nbd_device": sock, "bitmaps": [{ "bdev": "m1", "name": "b" }] }),
    );
    assert_eq!(call("bdev_dirty_bitmap_list", json!({ "bdev": "m1" }))[0]["busy"], true);
    call("nbd_stop_disk", json!({ "nbd_device": sock }));
    drop(registry);
    reactors.shutdown();
}

/// A registry on one reactor, its vhost directory a temporary one.
fn fixture() -> (tempfile::TempDir, fp_reactor::ReactorSet, std::sync::Arc<Registry>) {
    let dir = tempfile::tempdir().unwrap();
    let reactors = fp_reactor::ReactorSet::start(&[0], fp_reactor::ReactorConfig::default()).unwrap();
    let registry =
        Registry::with_options(reactors.handles().to_vec(), dir.path(), RegistryOptions::default());
    (dir, reactors, registry)
}

/// A call that must succeed.
fn called(registry: &Registry, method: &str, params: Value) -> Value {
    registry.call(method, Some(params.clone())).unwrap_or_else(|e| panic!("{method} {params}: {e}"))
}
