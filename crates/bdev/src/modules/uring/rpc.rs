//! `bdev_uring_create`, `bdev_uring_delete` and `bdev_uring_rescan`: SPDK's parameters, plus
//! `direct` and `submit_batch`.

use std::path::PathBuf;
use std::sync::Arc;

use fp_rpc::{Neutral, Params};
use serde_json::Value;

use super::UringDevice;
use crate::module::{delete_method, BdevModule, ModuleError, ModuleHost, ModuleMethodFn, NewBdev, U32_MAX};

/// The uring module: files and block devices through io_uring.
pub struct UringModule;

impl BdevModule for UringModule {
    fn name(&self) -> &'static str {
        "uring"
    }

    fn methods(&self) -> &'static [(&'static str, ModuleMethodFn)] {
        &[
            ("bdev_uring_create", create),
            ("bdev_uring_delete", |h, p| delete_method(h, p, "uring")),
            ("bdev_uring_rescan", rescan),
        ]
    }
}

/// `block_size` defaults to the device's logical block size (512 for a regular file); `direct`
/// (O_DIRECT) to true; `submit_batch` (SQEs that wait before an `io_uring_enter`, 0 for one
/// enter per reactor round, [`UringDevice::with_submit_batch`]) to 1. The file must be inside
/// the export directories when they are set.
fn create(host: &dyn ModuleHost, mut p: Params) -> Result<Value, ModuleError> {
    let name = p.required_str("name")?;
    let filename = PathBuf::from(p.required_str("filename")?);
    let block_size = p.optional_uint("block_size", U32_MAX)?.map(|b| b as u32);
    let direct = p.optional_bool("direct")?.unwrap_or(true);
    let submit_batch = p.optional_uint("submit_batch", U32_MAX)?.map(|b| b as u32);
    p.spdk_only(&[("uuid", Neutral::Absent)])?;
    p.finish()?;
    host.check_new_bdev(&name)?;
    let open = host.file_opener(&filename)?;
    let mut dev = UringDevice::open_with(&name, &filename, block_size, direct, open)?;
    if let Some(batch) = submit_batch {
        dev = dev.with_submit_batch(batch)?;
    }
    let dev = Arc::new(dev);
    Ok(Value::from(host.add_bdev("uring", NewBdev::new(dev))?))
}

/// SPDK's `bdev_uring_rescan` {name}: the file or block device was grown or truncated; the
/// bdev takes its size (whole blocks). A bdev in use is not shrunk (-16); the file must still
/// hold at least one block.
fn rescan(host: &dyn ModuleHost, mut p: Params) -> Result<Value, ModuleError> {
    let name = p.required_str("name")?;
    p.finish()?;
    let device = host.module_device(&name, "uring", "uring bdev")?;
    let dev = device.downcast_ref::<UringDevice>().expect("the uring module's devices are UringDevices");
    let blocks = dev.backing_blocks()?;
    host.resize_bdev(&name, "uring", blocks)?;
    Ok(Value::Bool(true))
}
