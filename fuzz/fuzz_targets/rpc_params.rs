//! Fuzz `fp_rpc::Params`: arbitrary bytes are parsed as JSON and handed to
//! `Params::new` as a request's `params`, then decoded with a sequence of field
//! accessors chosen by the first input byte, the way a method decodes its
//! parameters; errors are rendered as the server would (`RpcError::to_json`).
//!
//! The methods themselves (`fp_registry::Registry::call`) are driven by the
//! `config_file` target, whose tables are their parameters.
#![no_main]

use fp_rpc::{ParamError, Params, RpcError};
use libfuzzer_sys::fuzz_target;
use serde_json::{json, Value};

const FIELDS: [&str; 6] = ["name", "block_size", "num_blocks", "read_only", "ctrlr", "bdev_name"];

fn decode(selector: u8, params: Option<Value>) -> Result<(), ParamError> {
    let mut p = Params::new(params)?;
    // Eight accessor calls, each picked by 3 bits of a rotating selector.
    let mut s = u32::from(selector) * 0x0101_0101;
    for i in 0..8 {
        let field = FIELDS[(i + usize::from(selector)) % FIELDS.len()];
        match s & 7 {
            0 => {
                let _ = p.optional_str(field)?;
            }
            1 => {
                let _ = p.required_str(field)?;
            }
            2 => {
                let _ = p.optional_bool(field)?;
            }
            3 => {
                let _ = p.optional_uint(field, u64::from(u32::MAX))?;
            }
            4 => {
                let _ = p.required_uint(field, u64::MAX)?;
            }
            5 => p.unsupported(field, Some(json!(0)))?,
            6 => p.unsupported(field, None)?,
            // Odd steps: a list of strings (SPDK's `names`), whose errors name `field[i]`.
            _ if i % 2 == 1 => {
                let _ = p.optional_str_list(field)?;
            }
            _ => p.unsupported(field, Some(json!(false)))?,
        }
        s = s.rotate_right(3);
    }
    p.finish()
}

fuzz_target!(|data: &[u8]| {
    let Some((&selector, json)) = data.split_first() else { return };
    let Ok(v) = serde_json::from_slice::<Value>(json) else { return };
    // Bit 7 of the selector: pass the value as absent params when it is null.
    let params = if selector & 0x80 != 0 && v.is_null() { None } else { Some(v) };
    if let Err(e) = decode(selector, params) {
        let rendered = e.to_string();
        assert!(rendered.contains(&e.reason));
        let rpc: RpcError = e.into();
        let out = rpc.to_json();
        // The error object must serialize and parse back.
        let text = serde_json::to_string(&out).expect("error serializes");
        let _: Value = serde_json::from_str(&text).expect("error round-trips");
    }
});
