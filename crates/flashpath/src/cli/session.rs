//! What every client command shares: its connection to the daemon ([`Session`]), which words
//! the daemon's parameter errors as about the options typed, the commands' errors
//! ([`CliError`]), and the output helpers (tables, cells, raw JSON).
//!
//! Validation is the daemon's: the CLI only checks what it must to build the request (which
//! options go with which disk type, size arithmetic). When the daemon rejects a parameter, the
//! message is reworded to name the option the user typed (`--block-size`, not `block_size`).

use std::io::Write;
use std::path::Path;
use std::time::Duration;

use fp_rpc::{codes, RpcClient, RpcClientError};
use serde_json::{json, Value};

/// How long a command waits for the daemon. Generous: deleting a controller waits for its
/// queues to drain.
const CALL_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Debug, thiserror::Error)]
pub(crate) enum CliError {
    /// The options do not make a valid request.
    #[error("{flag}: {reason}")]
    Usage { flag: &'static str, reason: String },
    #[error("{0}; is `flashpath serve` running? (--rpc PATH or FLASHPATH_RPC selects the socket)")]
    Connect(RpcClientError),
    #[error("{0}")]
    Rpc(RpcClientError),
    /// The daemon refused the call (`rpc` passthrough shows the code too).
    #[error("{message}")]
    Refused { message: String },
    #[error("unexpected result from {method}: {result}")]
    Unexpected { method: &'static str, result: Value },
    #[error("terminal: {0} (flashpath top needs an interactive terminal)")]
    Terminal(#[source] std::io::Error),
}

impl CliError {
    pub(crate) fn exit_code(&self) -> u8 {
        match self {
            CliError::Usage { .. } => 2,
            _ => 1,
        }
    }
}

pub(crate) fn usage(flag: &'static str, reason: impl Into<String>) -> CliError {
    CliError::Usage { flag, reason: reason.into() }
}

/// One connection to the daemon, and how to word its parameter errors for this command.
pub(crate) struct Session {
    client: RpcClient,
    /// RPC parameter name → the option that sets it.
    flags: &'static [(&'static str, &'static str)],
    /// Parameters set by the option of the same name with dashes (`iops_total_max` by
    /// `--iops-total-max`).
    dashed: &'static [&'static str],
}

impl Session {
    pub(crate) fn connect(
        rpc: &Path,
        flags: &'static [(&'static str, &'static str)],
    ) -> Result<Session, CliError> {
        let mut client = RpcClient::connect(rpc).map_err(CliError::Connect)?;
        client.set_timeout(Some(CALL_TIMEOUT)).map_err(CliError::Rpc)?;
        Ok(Session { client, flags, dashed: &[] })
    }

    /// Words errors about any of `fields` as about the option of the same name with dashes.
    pub(crate) fn dashed(mut self, fields: &'static [&'static str]) -> Session {
        self.dashed = fields;
        self
    }

    pub(crate) fn call(&mut self, method: &str, params: Option<Value>) -> Result<Value, CliError> {
        self.client.call(method, params).map_err(|e| match e {
            RpcClientError::Rpc(err) => {
                let mut message = err.message;
                // Invalid parameters, and refusals about one (a path outside the export
                // directories, -EACCES), start with the field: name the option instead.
                if err.code == codes::INVALID_PARAMS || err.code == -13 {
                    let named = |field: &str| message.starts_with(&format!("{field}: "));
                    if let Some((field, flag)) = self.flags.iter().find(|(field, _)| named(field)) {
                        message = format!("{flag}{}", &message[field.len()..]);
                    } else if let Some(field) = self.dashed.iter().find(|field| named(field)) {
                        message = format!("--{}{}", field.replace('_', "-"), &message[field.len()..]);
                    }
                }
                CliError::Refused { message }
            }
            other => CliError::Rpc(other),
        })
    }
}

impl Session {
    /// Calls `method` as written, without rewording: a refusal shows the daemon's code and
    /// message (`rpc METHOD`).
    pub(crate) fn call_verbatim(&mut self, method: &str, params: Option<Value>) -> Result<Value, CliError> {
        self.client.call(method, params).map_err(|e| match e {
            RpcClientError::Rpc(e) => CliError::Refused { message: e.to_string() },
            e => CliError::Rpc(e),
        })
    }
}

/// The names of the bdevs in `bdevs` (`bdev_get_bdevs`' answer) whose `driver_specific.<driver>`
/// has `key` equal to `value`, comma-separated ("-" for none): a cluster's or a controller's
/// disks.
pub(crate) fn disks_with(bdevs: &Value, driver: &str, key: &str, value: &Value) -> String {
    let names: Vec<String> = bdevs
        .as_array()
        .into_iter()
        .flatten()
        .filter(|b| b["driver_specific"][driver][key] == *value)
        .map(|b| cell(b, "name"))
        .collect();
    if names.is_empty() {
        "-".into()
    } else {
        names.join(",")
    }
}

/// Writes to stdout, ignoring a closed pipe (`flashpath disk list | head -1`).
pub(crate) fn out(text: &str) {
    let mut stdout = std::io::stdout().lock();
    let _ = stdout.write_all(text.as_bytes()).and_then(|_| stdout.write_all(b"\n"));
}

pub(crate) fn print_json(v: &Value) {
    out(&serde_json::to_string_pretty(v).expect("a JSON value always serialises"));
}

/// Left-aligned columns two spaces apart, no borders (comfy-table's `NOTHING` preset); the
/// last column is not padded.
pub(crate) fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut t = comfy_table::Table::new();
    t.load_preset(comfy_table::presets::NOTHING)
        .set_content_arrangement(comfy_table::ContentArrangement::Disabled)
        .set_header(headers.iter().copied())
        .add_rows(rows.iter().cloned());
    for column in t.column_iter_mut() {
        column.set_padding((0, 2));
    }
    t.lines().map(|l| l.trim_end().to_string()).collect::<Vec<_>>().join("\n")
}

/// A JSON field as table text: strings bare, numbers and booleans as written, absent as "-".
pub(crate) fn cell(v: &Value, key: &str) -> String {
    match v.get(key) {
        None | Some(Value::Null) => "-".into(),
        Some(Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
    }
}

/// A JSON boolean as table text: "yes" when true, "no" otherwise.
pub(crate) fn yes_no(v: &Value) -> String {
    if v.as_bool() == Some(true) { "yes" } else { "no" }.to_string()
}

pub(crate) fn u64_field(v: &Value, key: &str) -> u64 {
    v.get(key).and_then(Value::as_u64).unwrap_or(0)
}

pub(crate) fn seconds(ns: u64) -> String {
    format!("{:.3}s", ns as f64 / 1e9)
}

/// Calls a listing method (`bdev_get_bdevs`, `vhost_get_controllers`), optionally for one name.
/// With `--json` it prints the result and returns `None`; otherwise it returns the entries for
/// a table.
pub(crate) fn fetch_list(
    rpc: &Path,
    json: bool,
    method: &'static str,
    name: Option<String>,
) -> Result<Option<Vec<Value>>, CliError> {
    let params = name.map(|n| json!({ "name": n }));
    let result = Session::connect(rpc, &[("name", "NAME")])?.call(method, params)?;
    if json {
        print_json(&result);
        return Ok(None);
    }
    match result {
        Value::Array(list) => Ok(Some(list)),
        other => Err(CliError::Unexpected { method, result: other }),
    }
}

pub(crate) const MIB: u64 = 1 << 20;

/// A size in whole MiB, as the volume methods take it.
pub(crate) fn whole_mib(size: u64) -> Result<u64, CliError> {
    if size == 0 || size % MIB != 0 {
        return Err(usage("--size", format!("{size} bytes is not a non-zero whole number of MiB")));
    }
    Ok(size / MIB)
}

/// Sets `params[key]` to `value` when the user gave it: an option left out stays out of the
/// request, and the daemon applies its own default.
pub(crate) fn set_given(params: &mut Value, key: &str, value: Option<impl serde::Serialize>) {
    if let Some(v) = value {
        params[key] = json!(v);
    }
}

/// Calls `method` and prints its result: with `--json` as it is, otherwise only a name it made
/// (not `true`).
pub(crate) fn one_call(
    rpc: &Path,
    json: bool,
    flags: &'static [(&'static str, &'static str)],
    method: &str,
    params: Value,
) -> Result<(), CliError> {
    let r = Session::connect(rpc, flags)?.call(method, Some(params))?;
    if json {
        print_json(&r);
    } else if let Some(name) = r.as_str() {
        out(name);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_aligns_columns() {
        let t = table(&["A", "LONGER"], &[vec!["xyz".into(), "1".into()], vec!["q".into(), "22".into()]]);
        assert_eq!(t, "A    LONGER\nxyz  1\nq    22");
    }
}
