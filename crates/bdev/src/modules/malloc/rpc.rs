//! `bdev_malloc_create` and `bdev_malloc_delete`, SPDK's parameters; `bdev_malloc_resize`, with
//! `bdev_null_resize`'s (SPDK has no resize for RAM disks).

use std::sync::Arc;

use fp_rpc::{Neutral, Params};
use serde_json::Value;

use super::RamDevice;
use crate::module::{
    delete_method, resize_method, BdevModule, ModuleError, ModuleHost, ModuleMethodFn, NewBdev, U32_MAX,
};

/// The malloc module: RAM disks.
pub struct MallocModule;

/// SPDK parameters of `bdev_malloc_create` that flashpath does not implement (see the null
/// module's list).
const SPDK_ONLY: [(&str, Neutral); 9] = [
    ("uuid", Neutral::Absent),
    ("physical_block_size", Neutral::Absent),
    ("optimal_io_boundary", Neutral::Int(0)),
    ("md_size", Neutral::Int(0)),
    ("md_interleave", Neutral::Bool(false)),
    ("dif_type", Neutral::Int(0)),
    ("dif_is_head_of_md", Neutral::Bool(false)),
    ("dif_pi_format", Neutral::Int(0)),
    ("numa_id", Neutral::Int(-1)),
];

impl BdevModule for MallocModule {
    fn name(&self) -> &'static str {
        "malloc"
    }

    fn methods(&self) -> &'static [(&'static str, ModuleMethodFn)] {
        &[
            ("bdev_malloc_create", create),
            ("bdev_malloc_delete", |h, p| delete_method(h, p, "malloc")),
            ("bdev_malloc_resize", |h, p| resize_method(h, p, "malloc", "malloc bdev")),
        ]
    }
}

fn create(host: &dyn ModuleHost, mut p: Params) -> Result<Value, ModuleError> {
    let name = p.optional_str("name")?;
    let num_blocks = p.required_uint("num_blocks", u64::MAX)?;
    let block_size = p.required_uint("block_size", U32_MAX)? as u32;
    p.spdk_only(&SPDK_ONLY)?;
    p.finish()?;
    let build = |name: &str| -> Result<String, ModuleError> {
        host.check_new_bdev(name)?;
        host.check_memory_size(name, block_size, num_blocks)?;
        // It may grow up to the limit later (bdev_malloc_resize): address space only.
        let dev = Arc::new(RamDevice::with_reserve(name, block_size, num_blocks, host.memory_limit())?);
        host.add_bdev("malloc", NewBdev::new(dev))
    };
    if let Some(name) = name {
        return Ok(Value::from(build(&name)?));
    }
    // SPDK names unnamed RAM disks Malloc0, Malloc1, ...: take the first free one, and the next
    // if a concurrent call took it between our look and our insertion.
    for i in 0.. {
        let name = format!("Malloc{i}");
        if host.bdev_exists(&name) {
            continue;
        }
        match build(&name) {
            Err(_) if host.bdev_exists(&name) => continue,
            other => return Ok(Value::from(other?)),
        }
    }
    unreachable!("an unbounded range ends only by returning")
}
