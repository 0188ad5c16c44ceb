//! `ublk target-create|target-destroy|start|stop|recover|list`: disks as kernel block devices
//! through Linux's ublk driver, SPDK's `ublk_*` methods (docs/ublk.md).

use std::path::Path;

use clap::{Args, Subcommand};
use serde_json::json;

use super::session::{cell, one_call, out, print_json, table, yes_no, CliError, Session};

#[derive(Debug, Subcommand)]
pub(crate) enum UblkCommand {
    /// Open the kernel's ublk control device (SPDK's ublk_create_target)
    TargetCreate {
        /// The reactors the disks' queues run on (hex mask or core list); all by default
        #[arg(long)]
        cpumask: Option<String>,
    },
    /// Stop every ublk disk and close the control device (ublk_destroy_target)
    TargetDestroy,
    /// Serve a disk as /dev/ublkbID (ublk_start_disk); prints ID
    Start(UblkStartArgs),
    /// Stop /dev/ublkbID and delete the device (ublk_stop_disk)
    Stop { id: u32 },
    /// Take over /dev/ublkbID, left by a daemon that died, for DISK (ublk_recover_disk)
    Recover { disk: String, id: u32 },
    /// List ublk disks (or show one)
    List { id: Option<u32> },
}

#[derive(Debug, Args)]
pub(crate) struct UblkStartArgs {
    /// The disk to serve
    disk: String,
    /// The device id: the disk appears as /dev/ublkbID
    id: u32,
    /// Queues (1 to 32; 1 by default), spread over the target's reactors
    #[arg(short = 'q', long)]
    num_queues: Option<u16>,
    /// Requests per queue (1 to 4096; 128 by default)
    #[arg(short = 'd', long)]
    queue_depth: Option<u16>,
    /// Require the kernel's user recovery (the device survives the daemon's death); by default
    /// used when the kernel offers it
    #[arg(long, conflicts_with = "no_user_recovery")]
    user_recovery: bool,
    /// Do not use user recovery: the device goes away with the daemon
    #[arg(long)]
    no_user_recovery: bool,
}

/// The methods' parameters and the arguments that set them.
const UBLK_FLAGS: &[(&str, &str)] = &[
    ("bdev_name", "DISK"),
    ("ublk_id", "ID"),
    ("num_queues", "--num-queues"),
    ("queue_depth", "--queue-depth"),
    ("cpumask", "--cpumask"),
];

/// `ublk ...`.
pub(crate) fn run(rpc: &Path, json: bool, cmd: UblkCommand) -> Result<(), CliError> {
    match cmd {
        UblkCommand::TargetCreate { cpumask } => {
            let params = match cpumask {
                Some(m) => json!({ "cpumask": m }),
                None => json!({}),
            };
            one_call(rpc, json, UBLK_FLAGS, "ublk_create_target", params)
        }
        UblkCommand::TargetDestroy => one_call(rpc, json, UBLK_FLAGS, "ublk_destroy_target", json!({})),
        UblkCommand::Start(a) => {
            let mut params = json!({ "bdev_name": a.disk, "ublk_id": a.id });
            if let Some(q) = a.num_queues {
                params["num_queues"] = json!(q);
            }
            if let Some(d) = a.queue_depth {
                params["queue_depth"] = json!(d);
            }
            if a.user_recovery || a.no_user_recovery {
                params["user_recovery"] = json!(a.user_recovery);
            }
            one_call(rpc, json, UBLK_FLAGS, "ublk_start_disk", params)
        }
        UblkCommand::Stop { id } => {
            one_call(rpc, json, UBLK_FLAGS, "ublk_stop_disk", json!({ "ublk_id": id }))
        }
        UblkCommand::Recover { disk, id } => {
            one_call(rpc, json, UBLK_FLAGS, "ublk_recover_disk", json!({ "bdev_name": disk, "ublk_id": id }))
        }
        UblkCommand::List { id } => ublk_list(rpc, json, id),
    }
}

fn ublk_list(rpc: &Path, json: bool, id: Option<u32>) -> Result<(), CliError> {
    let params = id.map(|id| json!({ "ublk_id": id }));
    let list = Session::connect(rpc, UBLK_FLAGS)?.call("ublk_get_disks", params)?;
    if json {
        print_json(&list);
        return Ok(());
    }
    let Some(list) = list.as_array() else {
        return Err(CliError::Unexpected { method: "ublk_get_disks", result: list });
    };
    let rows: Vec<Vec<String>> = list
        .iter()
        .map(|d| {
            vec![
                cell(d, "ublk_device"),
                cell(d, "bdev_name"),
                cell(d, "num_queues"),
                cell(d, "queue_depth"),
                cell(d, "copy_mode"),
                yes_no(&d["user_recovery"]),
                yes_no(&d["live_resize"]),
            ]
        })
        .collect();
    out(&table(&["DEVICE", "DISK", "QUEUES", "DEPTH", "COPY", "RECOVERY", "LIVE RESIZE"], &rows));
    Ok(())
}
