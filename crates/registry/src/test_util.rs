//! What the registry's tests share: a method called with JSON as a client would, and a RAM
//! disk made in one line.

use serde_json::{json, Value};

use crate::Registry;

impl Registry {
    /// [`Registry::call`] with the JSON-RPC error a client would get.
    pub(crate) fn call_json(&self, method: &str, params: Value) -> Result<Value, fp_rpc::RpcError> {
        self.call(method, Some(params)).map_err(|e| e.to_rpc())
    }

    /// A malloc bdev of `num_blocks` 512-byte blocks.
    pub(crate) fn malloc_for_test(&self, name: &str, num_blocks: u64) {
        let p = json!({ "name": name, "num_blocks": num_blocks, "block_size": 512 });
        self.call_module("bdev_malloc_create", Some(p)).unwrap().unwrap();
    }
}
