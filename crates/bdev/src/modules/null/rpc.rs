//! `bdev_null_create`, `bdev_null_delete` and `bdev_null_resize`, SPDK's parameters.

use std::sync::Arc;

use fp_rpc::{Neutral, Params};
use serde_json::Value;

use super::NullDevice;
use crate::module::{
    delete_method, resize_method, BdevModule, ModuleError, ModuleHost, ModuleMethodFn, NewBdev, U32_MAX,
};

/// The null module: bdevs that keep no data.
pub struct NullModule;

/// SPDK parameters of `bdev_null_create` that flashpath does not implement; rpc.py sends the
/// metadata/protection ones on every call with these values.
const SPDK_ONLY: [(&str, Neutral); 11] = [
    ("uuid", Neutral::Absent),
    ("physical_block_size", Neutral::Absent),
    ("md_size", Neutral::Int(0)),
    ("dif_type", Neutral::Int(0)),
    ("dif_is_head_of_md", Neutral::Bool(false)),
    ("dif_pi_format", Neutral::Int(0)),
    ("preferred_write_alignment", Neutral::Absent),
    ("preferred_write_granularity", Neutral::Absent),
    ("optimal_write_size", Neutral::Absent),
    ("preferred_unmap_alignment", Neutral::Absent),
    ("preferred_unmap_granularity", Neutral::Absent),
];

impl BdevModule for NullModule {
    fn name(&self) -> &'static str {
        "null"
    }

    fn methods(&self) -> &'static [(&'static str, ModuleMethodFn)] {
        &[
            ("bdev_null_create", create),
            ("bdev_null_delete", |h, p| delete_method(h, p, "null")),
            ("bdev_null_resize", |h, p| resize_method(h, p, "null", "null bdev")),
        ]
    }
}

fn create(host: &dyn ModuleHost, mut p: Params) -> Result<Value, ModuleError> {
    let name = p.required_str("name")?;
    let num_blocks = p.required_uint("num_blocks", u64::MAX)?;
    let block_size = p.required_uint("block_size", U32_MAX)? as u32;
    p.spdk_only(&SPDK_ONLY)?;
    p.finish()?;
    host.check_new_bdev(&name)?;
    let dev = Arc::new(NullDevice::new(&name, block_size, num_blocks)?);
    Ok(Value::from(host.add_bdev("null", NewBdev::new(dev))?))
}
