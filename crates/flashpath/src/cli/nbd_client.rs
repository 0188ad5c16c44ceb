//! `nbd-client attach|detach|list`: remote NBD exports as disks (the nbd_client bdev,
//! `bdev_nbd_client_create` and `bdev_nbd_client_delete`; docs/nbd.md, "Attaching a remote
//! export").

use std::path::Path;

use clap::{Args, Subcommand};
use serde_json::json;

use super::args::u32_arg;
use super::session::{cell, fetch_list, one_call, out, set_given, table, yes_no, CliError};

#[derive(Debug, Subcommand)]
pub(crate) enum NbdClientCommand {
    /// Attach a remote NBD export as disk NAME (any NBD server: flashpath, qemu-nbd,
    /// qemu-storage-daemon, nbdkit); prints NAME
    Attach(NbdClientAttachArgs),
    /// Detach (delete) an attached disk; refused while something uses it
    Detach { name: String },
    /// List attached disks (or show one)
    List { name: Option<String> },
}

#[derive(Debug, Args)]
pub(crate) struct NbdClientAttachArgs {
    /// The disk's name
    name: String,
    /// The server: a Unix socket path, nbd+unix:///EXPORT?socket=PATH or
    /// nbd://HOST[:PORT][/EXPORT]
    address: String,
    /// The export's name, when ADDRESS names none [default: the server's default export]
    #[arg(long, value_name = "NAME")]
    export: Option<String>,
    /// Block size in bytes [default: the server's minimum, at least 512]
    #[arg(long, value_name = "BYTES", value_parser = u32_arg)]
    block_size: Option<u32>,
    /// Refuse writes even if the export takes them
    #[arg(long)]
    read_only: bool,
}

/// `bdev_nbd_client_create`'s parameters and the options that set them.
const FLAGS: &[(&str, &str)] = &[
    ("name", "NAME"),
    ("address", "ADDRESS"),
    ("export_name", "--export"),
    ("block_size", "--block-size"),
    ("read_only", "--read-only"),
];

/// `nbd-client attach|detach|list`.
pub(crate) fn run(rpc: &Path, json: bool, cmd: NbdClientCommand) -> Result<(), CliError> {
    match cmd {
        NbdClientCommand::Attach(a) => {
            // A socket path is resolved here: the daemon's working directory is not ours.
            let address = match a.address.contains("://") {
                true => a.address,
                false => std::path::absolute(&a.address).map_or(a.address, |p| p.display().to_string()),
            };
            let mut params = json!({ "name": a.name, "address": address });
            set_given(&mut params, "export_name", a.export);
            set_given(&mut params, "block_size", a.block_size);
            if a.read_only {
                params["read_only"] = json!(true);
            }
            one_call(rpc, json, FLAGS, "bdev_nbd_client_create", params)
        }
        NbdClientCommand::Detach { name } => {
            one_call(rpc, json, FLAGS, "bdev_nbd_client_delete", json!({ "name": name }))
        }
        NbdClientCommand::List { name } => list(rpc, json, name),
    }
}

/// One row per nbd_client disk: where it points and how its connections fare.
fn list(rpc: &Path, json: bool, name: Option<String>) -> Result<(), CliError> {
    let Some(bdevs) = fetch_list(rpc, json, "bdev_get_bdevs", name)? else {
        return Ok(());
    };
    let rows: Vec<Vec<String>> = bdevs
        .iter()
        .filter_map(|b| {
            let d = b["driver_specific"].get("nbd_client")?;
            let size = b["num_blocks"].as_u64().unwrap_or(0) * b["block_size"].as_u64().unwrap_or(0);
            Some(vec![
                cell(b, "name"),
                cell(d, "address"),
                match d["export_name"].as_str() {
                    Some("") | None => "-".into(),
                    Some(e) => e.into(),
                },
                size.to_string(),
                cell(b, "block_size"),
                yes_no(&d["read_only"]),
                cell(d, "connections"),
                cell(d, "connections_lost"),
            ])
        })
        .collect();
    out(&table(&["DISK", "ADDRESS", "EXPORT", "BYTES", "BLOCK", "READONLY", "CONNECTIONS", "LOST"], &rows));
    Ok(())
}
