//! The nbd_client module and its methods. SPDK has no such bdev (its NBD code only serves),
//! so the names follow its pattern: `bdev_nbd_client_create` and `bdev_nbd_client_delete`
//! (docs/nbd.md, "Attaching a remote export").
//!
//! Creating connects and negotiates on the RPC thread (each step bounded by
//! [`HANDSHAKE_TIMEOUT`](crate::client::HANDSHAKE_TIMEOUT)), never on a reactor.

use std::any::Any;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use fp_bdev::module::{delete_method, BdevModule, ModuleError, ModuleHost, ModuleMethodFn, NewBdev, U32_MAX};
use fp_bdev::BdevInfo;
use fp_rpc::{ParamError, Params};
use serde_json::{json, Map, Value};

use crate::address::parse_device;
use crate::client::device::MODULE;
use crate::client::{NbdClientDetail, NbdClientDevice};

/// The largest `io_timeout_ms` taken: one day (0 waits for ever).
const MAX_IO_TIMEOUT_MS: u64 = 24 * 3600 * 1000;

/// The nbd_client module.
pub struct NbdClientModule;

impl BdevModule for NbdClientModule {
    fn name(&self) -> &'static str {
        MODULE
    }

    fn methods(&self) -> &'static [(&'static str, ModuleMethodFn)] {
        &[("bdev_nbd_client_create", create), ("bdev_nbd_client_delete", |h, p| delete_method(h, p, MODULE))]
    }

    fn driver_specific(&self, _info: &BdevInfo, device: &(dyn Any + Send + Sync)) -> Map<String, Value> {
        let Some(dev) = device.downcast_ref::<NbdClientDevice>() else {
            return Map::new();
        };
        let mut m = Map::new();
        m.insert("address".into(), json!(dev.detail.address));
        m.insert("export_name".into(), json!(dev.detail.export_name));
        m.insert("read_only".into(), json!(dev.detail.read_only));
        m.insert("export_size".into(), json!(dev.export().size));
        m.insert("max_transfer".into(), json!(dev.max_transfer()));
        m.insert("io_timeout_ms".into(), json!(dev.io_timeout().as_millis() as u64));
        m.insert("connections".into(), json!(dev.stats.connections.load(Ordering::Relaxed)));
        m.insert("connections_lost".into(), json!(dev.stats.connections_lost.load(Ordering::Relaxed)));
        m
    }
}

/// `bdev_nbd_client_create`: connects, negotiates, adds the bdev; returns its name.
fn create(host: &dyn ModuleHost, mut p: Params) -> Result<Value, ModuleError> {
    let name = p.required_str("name")?;
    let address = p.required_str("address")?;
    let export_name = p.optional_str("export_name")?;
    let block_size = p.optional_uint("block_size", U32_MAX)?.map(|b| b as u32);
    let read_only = p.optional_bool("read_only")?.unwrap_or(false);
    let io_timeout_ms = p.optional_uint("io_timeout_ms", MAX_IO_TIMEOUT_MS)?;
    p.finish()?;
    let device = parse_device(&address).map_err(|e| ParamError::new("address", e))?;
    let export_name = match (export_name, device.name) {
        (Some(a), Some(b)) if a != b => {
            return Err(ParamError::new(
                "export_name",
                format!("'{a}' differs from the export '{b}' the address names; give one of them"),
            )
            .into())
        }
        (Some(a), _) => a,
        (None, b) => b.unwrap_or_default(),
    };
    host.check_new_bdev(&name)?;
    let detail = NbdClientDetail { address, export_name, read_only };
    let mut dev = NbdClientDevice::connect(&name, device.address, detail, block_size)?;
    if let Some(ms) = io_timeout_ms {
        dev = dev.with_io_timeout(Duration::from_millis(ms));
    }
    let name = host.add_bdev(MODULE, NewBdev::new(Arc::new(dev)))?;
    Ok(Value::from(name))
}
