//! `nbd_stop_disk` with a request its disk holds: bounded, said, and the bdev kept claimed.

use serde_json::{json, Value};

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
