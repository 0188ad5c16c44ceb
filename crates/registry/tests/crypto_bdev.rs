//! The crypto module through the registry: a base that changes size under a crypto bdev (the
//! issue's "a base that changes size" bad input). Growing carries the crypto bdev with it and
//! keeps its blocks; shrinking is refused naming the crypto bdev, and nothing changes.

use fp_bdev::conformance::{read_range, write_range};
use fp_registry::Registry;
use serde_json::{json, Value};

const K1: &str = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";
const K2: &str = "ffeeddccbbaa99887766554433221100f0e1d2c3b4a5968778695a4b3c2d1e0f";

fn call(m: &Registry, method: &str, params: Value) -> Result<Value, fp_rpc::RpcError> {
    m.call(method, Some(params)).map_err(|e| e.to_rpc())
}

fn blocks(m: &Registry, name: &str) -> u64 {
    call(m, "bdev_get_bdevs", json!({"name": name})).unwrap()[0]["num_blocks"].as_u64().unwrap()
}

#[test]
fn a_base_that_changes_size_grows_the_crypto_bdev_and_is_refused_a_shrink() {
    let dir = tempfile::tempdir().unwrap();
    let m = Registry::new(vec![], &dir.path().join("vhost"));
    call(&m, "bdev_malloc_create", json!({"name": "M", "num_blocks": 2048, "block_size": 512})).unwrap();
    call(&m, "accel_crypto_key_create", json!({"cipher": "AES_XTS", "key": K1, "key2": K2, "name": "k"}))
        .unwrap();
    call(&m, "bdev_crypto_create", json!({"base_bdev_name": "M", "name": "C", "key_name": "k"})).unwrap();
    let mut ch = m.disk("C").unwrap().open().unwrap();
    let data: Vec<u8> = (0..4096u32).map(|i| (i * 7) as u8).collect();
    write_range(&mut *ch, 2048 * 512 - 4096, &data);

    // A shrink of the base in use: refused, naming the crypto bdev; both sizes unchanged.
    let e = call(&m, "bdev_malloc_resize", json!({"name": "M", "new_size_bytes": 1024 * 512})).unwrap_err();
    assert_eq!(e.code, -libc::EBUSY, "{e:?}");
    assert!(e.message.contains("'C'") && e.message.contains("only grow"), "{e:?}");
    assert_eq!((blocks(&m, "M"), blocks(&m, "C")), (2048, 2048));

    // A grown base grows the crypto bdev; the old last blocks still decrypt to what was written.
    call(&m, "bdev_malloc_resize", json!({"name": "M", "new_size_bytes": 4096 * 512})).unwrap();
    assert_eq!(blocks(&m, "C"), 4096);
    assert_eq!(read_range(&mut *ch, 2048 * 512 - 4096, 4096), data);
    let tail: Vec<u8> = vec![0x5a; 4096];
    write_range(&mut *ch, 4096 * 512 - 4096, &tail);
    assert_eq!(read_range(&mut *ch, 4096 * 512 - 4096, 4096), tail);
}
