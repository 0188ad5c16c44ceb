//! `vhost create|list|delete`: vhost-user-blk controllers, SPDK's `vhost_*` methods.

use std::path::Path;

use clap::{Args, Subcommand};
use serde_json::{json, Value};

use super::args::u16_arg;
use super::session::{cell, fetch_list, out, print_json, set_given, table, yes_no, CliError, Session};

#[derive(Debug, Subcommand)]
pub(crate) enum VhostCommand {
    /// Export a disk as a vhost-user-blk socket
    Create(VhostCreateArgs),
    /// List controllers (or show one)
    List { name: Option<String> },
    /// Delete a controller (disconnects its VM)
    Delete { name: String },
}

#[derive(Debug, Args)]
pub(crate) struct VhostCreateArgs {
    /// Controller name; also the socket's file name in the vhost directory
    #[arg(long)]
    name: String,
    /// The disk to export
    #[arg(long)]
    disk: String,
    /// Reactor cores to run its queues on: "0-1", "0,2" or "0x3" [default: all]
    #[arg(long, value_name = "LIST")]
    cpus: Option<String>,
    /// Refuse writes
    #[arg(long)]
    readonly: bool,
    /// Most queues the guest may use, 1-64 [default: 64, spread over the cores]
    #[arg(long, value_name = "N", value_parser = u16_arg)]
    queues: Option<u16>,
    /// Live migration within this daemon: the export of the same disk this controller takes
    /// over (docs/migration.md); the two share the disk, one writing at a time
    #[arg(long, value_name = "EXPORT")]
    migrate_from: Option<String>,
}

pub(crate) fn run(rpc: &Path, json: bool, command: VhostCommand) -> Result<(), CliError> {
    match command {
        VhostCommand::Create(args) => vhost_create(rpc, json, args),
        VhostCommand::List { name } => vhost_list(rpc, json, name),
        VhostCommand::Delete { name } => {
            let mut s = Session::connect(rpc, &[("ctrlr", "NAME")])?;
            let r = s.call("vhost_delete_controller", Some(json!({ "ctrlr": name })))?;
            if json {
                print_json(&r);
            }
            Ok(())
        }
    }
}

fn vhost_create(rpc: &Path, json: bool, a: VhostCreateArgs) -> Result<(), CliError> {
    let mut params = json!({ "ctrlr": a.name, "dev_name": a.disk, "readonly": a.readonly });
    set_given(&mut params, "cpumask", a.cpus.as_ref());
    set_given(&mut params, "num_queues", a.queues);
    set_given(&mut params, "migrate_from", a.migrate_from.as_ref());
    let mut s = Session::connect(
        rpc,
        &[
            ("ctrlr", "--name"),
            ("dev_name", "--disk"),
            ("cpumask", "--cpus"),
            ("num_queues", "--queues"),
            ("migrate_from", "--migrate-from"),
        ],
    )?;
    let r = s.call("vhost_create_blk_controller", Some(params))?;
    if json {
        print_json(&r);
        return Ok(());
    }
    // People want the socket path to hand to the VM.
    let info = s.call("vhost_get_controllers", Some(json!({ "name": a.name })))?;
    match info.get(0).and_then(|c| c.get("socket")).and_then(Value::as_str) {
        Some(socket) => out(socket),
        None => out(&a.name),
    }
    Ok(())
}

fn vhost_list(rpc: &Path, json: bool, name: Option<String>) -> Result<(), CliError> {
    let Some(list) = fetch_list(rpc, json, "vhost_get_controllers", name)? else { return Ok(()) };
    let rows: Vec<Vec<String>> = list
        .iter()
        .map(|c| {
            let block = &c["backend_specific"]["block"];
            vec![
                cell(c, "ctrlr"),
                cell(block, "bdev"),
                cell(c, "cpumask"),
                cell(c, "num_queues"),
                yes_no(&block["readonly"]),
                yes_no(&c["connected"]),
                cell(c, "socket"),
            ]
        })
        .collect();
    out(&table(&["NAME", "DISK", "CPUMASK", "QUEUES", "READONLY", "CONNECTED", "SOCKET"], &rows));
    Ok(())
}
