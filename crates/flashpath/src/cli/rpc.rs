//! `rpc METHOD [JSON]`, any method passed through as written, and `version`.

use std::path::Path;

use serde_json::Value;

use super::session::{out, print_json, usage, CliError, Session};

/// `rpc METHOD [JSON]`: the result as JSON; a refusal shows the daemon's code too.
pub(crate) fn passthrough(rpc: &Path, method: &str, params: Option<String>) -> Result<(), CliError> {
    let params = params
        .map(|text| serde_json::from_str::<Value>(&text))
        .transpose()
        .map_err(|e| usage("PARAMS", format!("not valid JSON: {e}")))?;
    let v = Session::connect(rpc, &[])?.call_verbatim(method, params)?;
    print_json(&v);
    Ok(())
}

/// `version`: the daemon's (`spdk_get_version`).
pub(crate) fn version(rpc: &Path, json: bool) -> Result<(), CliError> {
    let v = Session::connect(rpc, &[])?.call("spdk_get_version", None)?;
    match v.get("version").and_then(Value::as_str) {
        _ if json => print_json(&v),
        Some(version) => out(version),
        None => return Err(CliError::Unexpected { method: "spdk_get_version", result: v }),
    }
    Ok(())
}
