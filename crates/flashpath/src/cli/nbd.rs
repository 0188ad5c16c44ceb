//! `nbd start|stop|list`: NBD exports, SPDK's `nbd_start_disk`, `nbd_stop_disk` and
//! `nbd_get_disks` (docs/nbd.md).

use std::path::{Path, PathBuf};

use clap::{Args, Subcommand};
use serde_json::json;

use super::session::{cell, one_call, out, print_json, table, usage, yes_no, CliError, Session};

#[derive(Debug, Subcommand)]
pub(crate) enum NbdCommand {
    /// Export a disk over NBD (SPDK's nbd_start_disk); prints NBD_DEVICE
    Start(NbdStartArgs),
    /// Stop an export (disconnects its clients)
    Stop {
        /// The export's NBD_DEVICE, as `nbd start` was given it
        nbd_device: String,
    },
    /// List exports (or show one)
    List { nbd_device: Option<String> },
}

#[derive(Debug, Args)]
pub(crate) struct NbdStartArgs {
    /// The disk to export; also the export's name unless NBD_DEVICE names one
    disk: String,
    /// Where to listen: a Unix socket path, nbd+unix:///NAME?socket=PATH, or
    /// nbd://HOST[:PORT][/NAME] (TCP, port 10809 by default)
    nbd_device: String,
    /// Refuse writes; the disk may then be shared with other read-only exports
    #[arg(long)]
    readonly: bool,
    /// Require TLS: the server's certificate (PEM); needs --tls-key
    #[arg(long, value_name = "FILE")]
    tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM)
    #[arg(long, value_name = "FILE")]
    tls_key: Option<PathBuf>,
    /// Require client certificates signed by this CA (PEM)
    #[arg(long, value_name = "FILE")]
    tls_ca: Option<PathBuf>,
    /// Serve a dirty bitmap as the qemu:dirty-bitmap:NAME metadata context: NAME is a bitmap of
    /// DISK, BDEV/NAME one of another bdev of DISK's size (split at the last '/': a bitmap
    /// name has none). Repeat for several
    #[arg(long = "bitmap", value_name = "[BDEV/]NAME")]
    bitmaps: Vec<String>,
}

/// `nbd start|stop|list`.
pub(crate) fn run(rpc: &Path, json: bool, cmd: NbdCommand) -> Result<(), CliError> {
    match cmd {
        NbdCommand::Start(a) => nbd_start(rpc, json, a),
        NbdCommand::Stop { nbd_device } => {
            let params = json!({ "nbd_device": nbd_device_param(nbd_device) });
            let r = Session::connect(rpc, NBD_FLAGS)?.call("nbd_stop_disk", Some(params))?;
            if json {
                print_json(&r);
            }
            Ok(())
        }
        NbdCommand::List { nbd_device } => nbd_list(rpc, json, nbd_device),
    }
}

/// `nbd_start_disk`'s parameters and the options that set them.
const NBD_FLAGS: &[(&str, &str)] = &[
    ("bdev_name", "DISK"),
    ("nbd_device", "NBD_DEVICE"),
    ("tls_cert", "--tls-cert"),
    ("tls_key", "--tls-key"),
    ("tls_ca", "--tls-ca"),
    ("bitmaps", "--bitmap"),
];

/// NBD_DEVICE as the daemon wants it: a URI as written, a socket path made absolute (the daemon
/// resolves paths against its own working directory, not ours).
fn nbd_device_param(device: String) -> String {
    if device.contains("://") {
        return device;
    }
    match std::path::absolute(&device) {
        Ok(p) => p.display().to_string(),
        Err(_) => device,
    }
}

fn nbd_start(rpc: &Path, json: bool, a: NbdStartArgs) -> Result<(), CliError> {
    match (&a.tls_cert, &a.tls_key) {
        (Some(_), None) => return Err(usage("--tls-key", "required with --tls-cert")),
        (None, Some(_)) => return Err(usage("--tls-cert", "required with --tls-key")),
        (None, None) if a.tls_ca.is_some() => {
            return Err(usage("--tls-ca", "only used with --tls-cert and --tls-key"))
        }
        _ => {}
    }
    let mut params = json!({ "bdev_name": a.disk, "nbd_device": nbd_device_param(a.nbd_device) });
    if a.readonly {
        params["readonly"] = json!(true);
    }
    let absolute = |p: std::path::PathBuf| std::path::absolute(&p).unwrap_or(p);
    for (field, file) in [("tls_cert", a.tls_cert), ("tls_key", a.tls_key), ("tls_ca", a.tls_ca)] {
        if let Some(f) = file {
            params[field] = json!(absolute(f));
        }
    }
    if !a.bitmaps.is_empty() {
        params["bitmaps"] = a.bitmaps.iter().map(|b| bitmap_param(b)).collect();
    }
    one_call(rpc, json, NBD_FLAGS, "nbd_start_disk", params)
}

/// `--bitmap [BDEV/]NAME` as an entry of `bitmaps`: a name, or `{bdev, name}` split at the
/// last '/' (bdev names may hold one, an lvol's `lvs/vol`; bitmap names never do).
fn bitmap_param(arg: &str) -> serde_json::Value {
    match arg.rsplit_once('/') {
        Some((bdev, name)) => json!({ "bdev": bdev, "name": name }),
        None => json!(arg),
    }
}

fn nbd_list(rpc: &Path, json: bool, nbd_device: Option<String>) -> Result<(), CliError> {
    let params = nbd_device.map(|d| json!({ "nbd_device": nbd_device_param(d) }));
    let list = Session::connect(rpc, NBD_FLAGS)?.call("nbd_get_disks", params)?;
    if json {
        print_json(&list);
        return Ok(());
    }
    let Some(list) = list.as_array() else {
        return Err(CliError::Unexpected { method: "nbd_get_disks", result: list });
    };
    let rows: Vec<Vec<String>> = list
        .iter()
        .map(|d| {
            vec![
                cell(d, "nbd_device"),
                cell(d, "bdev_name"),
                cell(d, "export_name"),
                yes_no(&d["readonly"]),
                yes_no(&d["tls"]),
                cell(d, "connections"),
            ]
        })
        .collect();
    out(&table(&["DEVICE", "DISK", "EXPORT", "READONLY", "TLS", "CONNECTIONS"], &rows));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bitmap_argument_names_the_disks_bitmap_or_another_bdevs_split_at_the_last_slash() {
        assert_eq!(bitmap_param("daily"), json!("daily"));
        assert_eq!(bitmap_param("vm1-disk/daily"), json!({ "bdev": "vm1-disk", "name": "daily" }));
        assert_eq!(bitmap_param("lvs0/vol1/daily"), json!({ "bdev": "lvs0/vol1", "name": "daily" }));
    }
}
