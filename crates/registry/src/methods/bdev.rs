//! `bdev_get_bdevs`, SPDK's shape, and the stable UUID it reports for each bdev.

use std::time::{Duration, Instant};

use fp_rpc::Params;
use serde_json::{json, Value};

use super::{qos, MethodError};
use crate::{BdevSummary, Registry, RegistryError};

/// The longest `bdev_get_bdevs` may be asked to wait for a bdev, in milliseconds.
const MAX_WAIT_MS: u64 = 60_000;

/// How long `bdev_get_bdevs` sleeps between looks while waiting for a bdev to appear.
const WAIT_STEP: Duration = Duration::from_millis(10);

pub(crate) fn bdev_get_bdevs(registry: &Registry, mut p: Params) -> Result<Value, MethodError> {
    let name = p.optional_str("name")?;
    // SPDK's `timeout` (ms): wait that long for the named bdev to appear. Bounded, because
    // a waiting call holds a connection thread and delays the server's stop.
    let timeout = Duration::from_millis(p.optional_uint("timeout", MAX_WAIT_MS)?.unwrap_or(0));
    p.finish()?;
    let deadline = Instant::now() + timeout;
    let bdevs = loop {
        match registry.bdevs(name.as_deref()) {
            Err(RegistryError::NotFound { .. }) if Instant::now() < deadline => std::thread::sleep(WAIT_STEP),
            other => break other?,
        }
    };
    Ok(Value::Array(bdevs.iter().map(bdev_json).collect()))
}

/// A stable identifier for a bdev, derived from its name so it survives a restart with the same
/// configuration. Two FNV-1a passes make 128 bits, stamped as an RFC 9562 version 8 (custom)
/// UUID since it is neither random nor one of the standard name-based kinds.
pub fn bdev_uuid(name: &str) -> String {
    let fnv =
        |basis: u64| name.bytes().fold(basis, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3));
    let hi = fnv(0xcbf2_9ce4_8422_2325);
    let lo = fnv(0x6c62_272e_07bb_0142);
    let hi = (hi & !0xf000) | 0x8000; // version 8 in bits 48..52 of the first half
    let lo = (lo & !(0b11 << 62)) | (0b10 << 62); // RFC variant
    format!(
        "{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
        hi >> 32,
        (hi >> 16) & 0xffff,
        hi & 0xffff,
        lo >> 48,
        lo & 0xffff_ffff_ffff
    )
}

/// RFC 4122 text: 8-4-4-4-12 hexadecimal digits.
fn looks_like_uuid(s: &str) -> bool {
    s.len() == 36
        && s.char_indices()
            .all(|(i, c)| if matches!(i, 8 | 13 | 18 | 23) { c == '-' } else { c.is_ascii_hexdigit() })
}

fn bdev_json(b: &BdevSummary) -> Value {
    let info = &b.info;
    let io = info.io_types;
    let writable = !b.read_only;
    let mut v = json!({
        "name": info.name,
        "aliases": b.aliases,
        "product_name": info.product_name,
        "block_size": info.block_size,
        "num_blocks": info.num_blocks(),
        // A bdev named by a UUID (a logical volume) is that UUID.
        "uuid": if looks_like_uuid(&info.name) { info.name.clone() } else { bdev_uuid(&info.name) },
        "claimed": !b.claims.is_empty(),
        "zoned": false,
        "supported_io_types": {
            "read": io.read,
            "write": io.write && writable,
            "flush": io.flush,
            "unmap": io.unmap && writable,
            "write_zeroes": io.write_zeroes && writable,
            "reset": false,
            "nvme_admin": false,
            "nvme_io": false,
        },
        "driver_specific": { info.driver: b.driver_specific },
        "assigned_rate_limits": qos::limits_json(&b.qos_limits),
    });
    if let Some((group, weight)) = &b.qos_group {
        v["qos_group"] = json!({ "name": group, "weight": weight });
    }
    // SPDK reports the claim type only while there is one; all claims on a bdev share it, or
    // it would not have accepted the later ones.
    if let Some(c) = b.claims.first() {
        v["claim_type"] = json!(c.claim_type.name());
    }
    if let Some(by) = b.claimed_by() {
        v["claimed_by"] = json!(by);
    }
    v
}
