//! The error module through the registry, as the RPC server drives it: SPDK's shapes for
//! `bdev_error_create`, `bdev_error_inject_error` and `bdev_error_delete`, the claim on the
//! base, refusals naming their field, and a delete that fails the requests an injection holds.

use fp_bdev::conformance::{read_range, write_range};
use fp_bdev::Iovecs;
use fp_bdev::{IoOp, IoRequest, IoStatus};
use fp_registry::Registry;
use fp_rpc::codes;
use serde_json::{json, Value};

fn call(m: &Registry, method: &str, params: Value) -> Result<Value, fp_rpc::RpcError> {
    m.call(method, Some(params)).map_err(|e| e.to_rpc())
}

fn refused(m: &Registry, method: &str, params: Value, field: &str) -> String {
    let e = call(m, method, params).map(|v| panic!("{method} gave {v}")).unwrap_err();
    assert_eq!(e.code, codes::INVALID_PARAMS, "{e:?}");
    assert!(e.message.starts_with(&format!("{field}: ")), "{e:?} does not name {field}");
    e.message
}

#[test]
fn error_bdev_by_rpc_in_spdk_shapes() {
    let dir = tempfile::tempdir().unwrap();
    let m = Registry::new(vec![], &dir.path().join("vhost"));
    call(&m, "bdev_malloc_create", json!({"name": "M", "num_blocks": 2048, "block_size": 512})).unwrap();
    assert_eq!(call(&m, "bdev_error_create", json!({"base_name": "M"})).unwrap(), json!(true));
    let b = &call(&m, "bdev_get_bdevs", json!({"name": "EE_M"})).unwrap()[0];
    assert_eq!(b["product_name"], "Error Injection Disk");
    assert_eq!(b["num_blocks"], 2048);
    assert_eq!(b["driver_specific"]["error"]["base_bdev_name"], "M");
    assert_eq!(b["driver_specific"]["error"]["injections"], json!({}));
    // The base is claimed: not deleted, not stacked on twice.
    assert_eq!(call(&m, "bdev_malloc_delete", json!({"name": "M"})).unwrap_err().code, -libc::EBUSY);
    assert!(call(&m, "bdev_error_create", json!({"base_name": "M"})).is_err());
    refused(&m, "bdev_error_create", json!({"base_name": "M", "uuid": "x"}), "uuid");

    let inject = |extra: Value| {
        let mut p = json!({"name": "EE_M", "io_type": "read", "error_type": "failure"});
        p.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        p
    };
    let msg = refused(&m, "bdev_error_inject_error", inject(json!({"io_type": "reed"})), "io_type");
    assert!(msg.contains("write_zeroes") && msg.contains("clear"), "{msg}");
    let msg =
        refused(&m, "bdev_error_inject_error", inject(json!({"error_type": "nvme_failure"})), "error_type");
    assert!(msg.contains("NVMe"), "{msg}");
    refused(&m, "bdev_error_inject_error", inject(json!({"error_type": "corrupt_data"})), "corrupt_value");
    refused(&m, "bdev_error_inject_error", inject(json!({"corrupt_value": 256})), "corrupt_value");
    refused(&m, "bdev_error_inject_error", inject(json!({"num": -1})), "num");
    refused(&m, "bdev_error_inject_error", inject(json!({"nvme_sc": 2})), "nvme_sc");
    let e = call(&m, "bdev_error_inject_error", inject(json!({"name": "M"}))).unwrap_err();
    assert_eq!(e.code, -libc::ENODEV, "{e:?}");

    // `num` defaults to 1, as in SPDK; the read after it passes.
    call(&m, "bdev_error_inject_error", inject(json!({}))).unwrap();
    let b = &call(&m, "bdev_get_bdevs", json!({"name": "EE_M"})).unwrap()[0];
    assert_eq!(b["driver_specific"]["error"]["injections"]["read"]["num"], 1);
    let mut ch = m.disk("EE_M").unwrap().open().unwrap();
    write_range(&mut *ch, 0, &[5u8; 512]);
    let mut buf = vec![0u8; 512];
    let iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: 512 };
    // SAFETY: the test keeps the buffers and their iovecs until the request completes.
    let iovs = unsafe { Iovecs::from_raw(&iov, 1) };
    let read = IoRequest { tag: 3, op: IoOp::Read, offset: 0, len: 512, iov: iovs };
    let run = |ch: &mut Box<dyn fp_bdev::IoChannel>, req: &IoRequest| {
        ch.submit(req).unwrap();
        let mut got = None;
        while got.is_none() {
            ch.poll(&mut |_, s| got = Some(s));
        }
        got.unwrap()
    };
    assert_eq!(run(&mut ch, &read), IoStatus::Error(libc::EIO));
    assert!(read_range(&mut *ch, 0, 512) == vec![5u8; 512]);

    // A held request is failed by the delete, so its user can drain and close.
    let p = json!({"name": "EE_M", "io_type": "all", "error_type": "pending", "num": 5});
    call(&m, "bdev_error_inject_error", p).unwrap();
    ch.submit(&read).unwrap();
    for _ in 0..100 {
        ch.poll(&mut |t, s| panic!("{t} completed with {s:?} while held"));
    }
    assert_eq!(ch.in_flight(), 1);
    assert_eq!(call(&m, "bdev_error_delete", json!({"name": "EE_M"})).unwrap(), json!(true));
    let mut got = None;
    while got.is_none() {
        ch.poll(&mut |t, s| got = Some((t, s)));
    }
    assert_eq!(got, Some((3, IoStatus::Error(libc::ENXIO))));
    assert_eq!(ch.in_flight(), 0);
    drop(ch);
    // The base is free again.
    assert_eq!(call(&m, "bdev_malloc_delete", json!({"name": "M"})).unwrap(), json!(true));
}
