//! The ublk kind on a host without ublk_drv (the kernel-facing tests run in the guest,
//! crates/flashpath/tests/guest_ublk.rs): refusals before any kernel command.

use std::sync::Arc;

use serde_json::json;

use crate::{Registry, RegistryOptions};

/// A registry on one reactor, and what must outlive it.
fn registry_with_reactors() -> (Arc<Registry>, fp_reactor::ReactorSet, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let reactors = fp_reactor::ReactorSet::start(&[0], fp_reactor::ReactorConfig::default()).unwrap();
    let r = Registry::with_options(reactors.handles().to_vec(), dir.path(), RegistryOptions::default());
    (r, reactors, dir)
}

#[test]
fn without_a_control_device_the_target_is_refused_in_one_line_naming_it() {
    let (r, _set, _dir) = registry_with_reactors();
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("ublk-control");
    let e = r.create_ublk_target_at(&missing, None).unwrap_err();
    assert_eq!(e.errno(), -libc::ENODEV);
    let text = e.to_string();
    assert!(text.contains(&missing.display().to_string()) && text.contains("ublk_drv"), "{text}");
    assert!(!text.contains('\n'));
    // No target was made: the disk methods say so.
    let e = r.call("ublk_start_disk", Some(json!({"bdev_name": "x", "ublk_id": 1}))).unwrap_err().to_string();
    assert!(e.contains("ublk_create_target"), "{e}");
    assert_eq!(r.call("ublk_get_disks", None).unwrap(), json!([]));
}

#[test]
fn a_cpumask_without_reactors_is_refused() {
    let (r, _set, _dir) = registry_with_reactors();
    let e = r.call("ublk_create_target", Some(json!({"cpumask": "0x80000000"}))).unwrap_err().to_string();
    assert!(e.contains("cpumask"), "{e}");
}

#[test]
fn unknown_parameters_and_bad_ids_are_refused_by_name() {
    let (r, _set, _dir) = registry_with_reactors();
    let e = r.call("ublk_stop_disk", Some(json!({"ublk_id": -1}))).unwrap_err().to_string();
    assert!(e.contains("ublk_id"), "{e}");
    let e = r.call("ublk_get_disks", Some(json!({"ublk_id": 1, "bogus": 1}))).unwrap_err().to_string();
    assert!(e.contains("bogus"), "{e}");
    let e = r.call("ublk_get_disks", Some(json!({"ublk_id": 7}))).unwrap_err().to_string();
    assert!(e.contains("/dev/ublkb7"), "{e}");
}
