//! The keyring as a daemon-wide service: a key added with `keyring_file_add_key` is handed to
//! any module or export that asks the registry for it by name (`fp_crypto::keyring`), and a
//! holder keeps its key when the keyring drops it.

use std::os::unix::fs::PermissionsExt;

use fp_registry::Registry;
use serde_json::{json, Value};

fn call(m: &Registry, method: &str, params: Value) -> Result<Value, fp_rpc::RpcError> {
    m.call(method, Some(params)).map_err(|e| e.to_rpc())
}

#[test]
fn a_key_added_by_rpc_is_handed_to_whoever_asks_the_daemon() {
    let dir = tempfile::tempdir().unwrap();
    let m = Registry::new(vec![], &dir.path().join("vhost"));
    let path = dir.path().join("tls.key");
    std::fs::write(&path, b"NVMeTLSkey-1:01:secret:").unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    let path = path.to_str().unwrap();

    let keyring = fp_crypto::keyring(&*m);
    let e = keyring.key("tls0").unwrap_err().to_string();
    assert!(e.contains("key") && e.contains("'tls0'"), "{e}");

    call(&m, "keyring_file_add_key", json!({"name": "tls0", "path": path})).unwrap();
    // Asked again (as another module or an export would): the same keyring, the file's bytes.
    let key = fp_crypto::keyring(&*m).key("tls0").unwrap();
    assert_eq!(key.with_material(|k| k.to_vec()), b"NVMeTLSkey-1:01:secret:");
    assert_eq!(key.path, path);
    assert!(keyring.key("tls0").is_ok(), "the first handle sees the key added after it was taken");
    let listed = call(&m, "keyring_get_keys", json!({})).unwrap();
    assert_eq!(listed, json!([{"name": "tls0", "module": "keyring_file", "path": path, "removed": false}]));

    // Removed from the keyring: no longer handed out, but a holder's copy stays usable.
    call(&m, "keyring_file_remove_key", json!({"name": "tls0"})).unwrap();
    assert!(keyring.key("tls0").is_err());
    assert_eq!(key.len(), 23);
    assert_eq!(call(&m, "keyring_get_keys", json!({})).unwrap(), json!([]));
}

/// Two daemons (registries) keep separate keyrings.
#[test]
fn each_registry_has_its_own_keyring() {
    let dir = tempfile::tempdir().unwrap();
    let a = Registry::new(vec![], &dir.path().join("a"));
    let b = Registry::new(vec![], &dir.path().join("b"));
    let path = dir.path().join("k");
    std::fs::write(&path, b"0123456789abcdef").unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    call(&a, "keyring_file_add_key", json!({"name": "k", "path": path.to_str().unwrap()})).unwrap();
    assert!(fp_crypto::keyring(&*a).key("k").is_ok());
    assert!(fp_crypto::keyring(&*b).key("k").is_err());
}
