//! NBD export methods, with SPDK's names: `nbd_start_disk {bdev_name, nbd_device}`,
//! `nbd_stop_disk {nbd_device}`, `nbd_get_disks {nbd_device?}`. SPDK's `nbd_device` is the
//! kernel device it drives (`/dev/nbd0`); flashpath serves the protocol itself, so it is the
//! listener: a Unix socket path or an NBD URI (docs/nbd.md), by default the first free
//! `<vhost_dir>/nbdN` socket. flashpath adds `readonly`, the
//! TLS files `tls_cert`, `tls_key` and `tls_ca`, and `bitmaps` (QEMU's `block-export-add`
//! `bitmaps`: dirty bitmaps served as `qemu:dirty-bitmap:NAME` metadata contexts).

use std::path::PathBuf;

use fp_nbd::TlsFiles;
use fp_rpc::{ParamError, Params};
use serde_json::{json, Value};

use super::{BitmapRef, NbdSpec};
use crate::methods::{MethodError, MethodFn};
use crate::Registry;

/// The kind's methods ([`crate::exports::ExportKind::methods`]).
pub(super) const METHODS: &[(&str, MethodFn)] =
    &[("nbd_start_disk", nbd_start_disk), ("nbd_stop_disk", nbd_stop_disk), ("nbd_get_disks", nbd_get_disks)];

fn nbd_start_disk(registry: &Registry, mut p: Params) -> Result<Value, MethodError> {
    let bdev_name = p.required_str("bdev_name")?;
    let nbd_device = p.optional_str("nbd_device")?;
    let readonly = p.optional_bool("readonly")?.unwrap_or(false);
    let cert = p.optional_str("tls_cert")?.map(PathBuf::from);
    let key = p.optional_str("tls_key")?.map(PathBuf::from);
    let ca = p.optional_str("tls_ca")?.map(PathBuf::from);
    let bitmaps = p.optional_list("bitmaps")?.unwrap_or_default();
    p.finish()?;
    let bitmaps = bitmaps.into_iter().enumerate().map(bitmap_ref).collect::<Result<Vec<_>, _>>()?;
    let tls = match (cert, key, ca) {
        (None, None, None) => None,
        (Some(cert), Some(key), ca) => Some(TlsFiles { cert, key, ca }),
        (None, _, _) => return Err(ParamError::new("tls_cert", "tls_key and tls_ca need tls_cert").into()),
        (Some(_), None, _) => return Err(ParamError::new("tls_key", "tls_cert needs tls_key").into()),
    };
    // Without one, a socket in the vhost directory (Registry::free_nbd_device), as SPDK picks
    // a free /dev/nbdN.
    let nbd_device = match nbd_device {
        Some(d) => d,
        None => registry.free_nbd_device()?,
    };
    registry.start_nbd(NbdSpec { bdev_name, nbd_device: nbd_device.clone(), readonly, tls, bitmaps })?;
    Ok(json!(nbd_device))
}

/// `bitmaps[i]`: a bitmap name of the exported bdev, or `{bdev, name}`.
fn bitmap_ref((i, v): (usize, Value)) -> Result<BitmapRef, ParamError> {
    let field = || format!("bitmaps[{i}]");
    match v {
        Value::String(name) => Ok(BitmapRef { bdev: None, name }),
        Value::Object(mut m) => {
            let mut text = |key: &str| match m.remove(key) {
                Some(Value::String(s)) => Ok(s),
                _ => Err(ParamError::new(format!("{}.{key}", field()), "required: a string")),
            };
            let (bdev, name) = (text("bdev")?, text("name")?);
            if let Some(extra) = m.keys().next() {
                return Err(ParamError::new(
                    format!("{}.{extra}", field()),
                    "unknown field (bdev and name only)",
                ));
            }
            Ok(BitmapRef { bdev: Some(bdev), name })
        }
        _ => Err(ParamError::new(field(), "expected a bitmap name or {\"bdev\": ..., \"name\": ...}")),
    }
}

fn nbd_stop_disk(registry: &Registry, mut p: Params) -> Result<Value, MethodError> {
    let nbd_device = p.required_str("nbd_device")?;
    p.finish()?;
    registry.stop_nbd(&nbd_device)?;
    Ok(json!(true))
}

fn nbd_get_disks(registry: &Registry, mut p: Params) -> Result<Value, MethodError> {
    let nbd_device = p.optional_str("nbd_device")?;
    p.finish()?;
    let disks = registry.nbd_disks(nbd_device.as_deref())?;
    Ok(serde_json::to_value(disks).expect("plain data serialises"))
}
