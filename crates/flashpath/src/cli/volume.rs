//! `volume ...`: logical volume stores on a disk, thin volumes, snapshots and clones, SPDK's
//! `bdev_lvol_*` methods.

use std::path::Path;

use crate::size::{self, format_size};
use clap::Subcommand;
use serde_json::json;

use super::session::{
    cell, one_call, out, print_json, set_given, table, u64_field, usage, whole_mib, CliError, Session,
};

#[derive(Debug, Subcommand)]
pub(crate) enum VolumeCommand {
    /// Create a volume store on a disk (what the disk held is lost)
    CreateStore {
        /// The disk that holds the store
        #[arg(long)]
        disk: String,
        /// The store's name
        #[arg(long)]
        name: String,
        /// Allocation unit, a power of two from 4KiB to 1GiB [default: 4MiB]
        #[arg(long, value_parser = size::parse_size)]
        cluster_size: Option<u64>,
    },
    /// List volume stores
    Stores,
    /// Delete a volume store and its volumes (refused while one is in use)
    DeleteStore { name: String },
    /// Create a volume, named STORE/NAME; its disk is named by its UUID and by STORE/NAME
    Create {
        volume: String,
        /// Size, a whole number of the store's clusters, e.g. 10G
        #[arg(long, value_parser = size::parse_size)]
        size: u64,
        /// Allocate clusters on first write instead of now
        #[arg(long)]
        thin: bool,
    },
    /// List volumes (of one store)
    List {
        #[arg(long)]
        store: Option<String>,
    },
    /// Take a read-only snapshot of a volume; the volume goes on as its clone
    Snapshot { volume: String, name: String },
    /// Create a writable thin clone of a snapshot
    Clone { snapshot: String, name: String },
    /// Change a volume's size (a disk in use may only grow)
    Resize {
        volume: String,
        #[arg(long, value_parser = size::parse_size)]
        size: u64,
    },
    /// Delete a volume (refused while in use, or for a snapshot with clones)
    Delete { volume: String },
}

pub(crate) fn run(rpc: &Path, json: bool, cmd: VolumeCommand) -> Result<(), CliError> {
    match cmd {
        VolumeCommand::CreateStore { disk, name, cluster_size } => {
            let mut params = json!({ "bdev_name": disk, "lvs_name": name });
            set_given(&mut params, "cluster_sz", cluster_size);
            let flags = &[("bdev_name", "--disk"), ("lvs_name", "--name"), ("cluster_sz", "--cluster-size")];
            one_call(rpc, json, flags, "bdev_lvol_create_lvstore", params)
        }
        VolumeCommand::DeleteStore { name } => one_call(
            rpc,
            json,
            &[("lvs_name", "NAME")],
            "bdev_lvol_delete_lvstore",
            json!({ "lvs_name": name }),
        ),
        VolumeCommand::Create { volume, size, thin } => {
            let (store, name) = volume
                .split_once('/')
                .ok_or_else(|| usage("VOLUME", format!("'{volume}' is not STORE/NAME")))?;
            let params = json!({
                "lvs_name": store, "lvol_name": name, "size_in_mib": whole_mib(size)?, "thin_provision": thin,
            });
            let flags = &[("lvs_name", "VOLUME"), ("lvol_name", "VOLUME"), ("size_in_mib", "--size")];
            one_call(rpc, json, flags, "bdev_lvol_create", params)
        }
        VolumeCommand::Snapshot { volume, name } => {
            let params = json!({ "lvol_name": volume, "snapshot_name": name });
            one_call(
                rpc,
                json,
                &[("lvol_name", "VOLUME"), ("snapshot_name", "NAME")],
                "bdev_lvol_snapshot",
                params,
            )
        }
        VolumeCommand::Clone { snapshot, name } => {
            let params = json!({ "snapshot_name": snapshot, "clone_name": name });
            one_call(
                rpc,
                json,
                &[("snapshot_name", "SNAPSHOT"), ("clone_name", "NAME")],
                "bdev_lvol_clone",
                params,
            )
        }
        VolumeCommand::Resize { volume, size } => {
            let params = json!({ "name": volume, "size_in_mib": whole_mib(size)? });
            one_call(rpc, json, &[("name", "VOLUME"), ("size_in_mib", "--size")], "bdev_lvol_resize", params)
        }
        VolumeCommand::Delete { volume } => {
            one_call(rpc, json, &[("name", "VOLUME")], "bdev_lvol_delete", json!({ "name": volume }))
        }
        VolumeCommand::Stores => {
            let list = Session::connect(rpc, &[])?.call("bdev_lvol_get_lvstores", None)?;
            if json {
                print_json(&list);
                return Ok(());
            }
            let rows: Vec<Vec<String>> = list
                .as_array()
                .into_iter()
                .flatten()
                .map(|s| {
                    let cluster = u64_field(s, "cluster_size");
                    vec![
                        cell(s, "name"),
                        cell(s, "uuid"),
                        cell(s, "base_bdev"),
                        format_size(cluster),
                        format_size(cluster.saturating_mul(u64_field(s, "total_data_clusters"))),
                        format_size(cluster.saturating_mul(u64_field(s, "free_clusters"))),
                    ]
                })
                .collect();
            out(&table(&["STORE", "UUID", "DISK", "CLUSTER", "SIZE", "FREE"], &rows));
            Ok(())
        }
        VolumeCommand::List { store } => {
            let mut s = Session::connect(rpc, &[("lvs_name", "--store")])?;
            let params = store.map(|n| json!({ "lvs_name": n }));
            let list = s.call("bdev_lvol_get_lvols", params)?;
            if json {
                print_json(&list);
                return Ok(());
            }
            let bdevs = s.call("bdev_get_bdevs", None)?;
            let size_of = |uuid: &str| {
                bdevs
                    .as_array()
                    .into_iter()
                    .flatten()
                    .find(|b| b["name"] == uuid)
                    .map_or(0, |b| u64_field(b, "block_size").saturating_mul(u64_field(b, "num_blocks")))
            };
            let rows: Vec<Vec<String>> = list
                .as_array()
                .into_iter()
                .flatten()
                .map(|v| {
                    let kind = match (
                        v["is_snapshot"].as_bool(),
                        v["is_clone"].as_bool(),
                        v["is_thin_provisioned"].as_bool(),
                    ) {
                        (Some(true), _, _) => "snapshot",
                        (_, Some(true), _) => "clone",
                        (_, _, Some(true)) => "thin",
                        _ => "thick",
                    };
                    vec![
                        cell(v, "alias"),
                        cell(v, "uuid"),
                        kind.to_string(),
                        format_size(size_of(v["uuid"].as_str().unwrap_or_default())),
                        cell(v, "num_allocated_clusters"),
                    ]
                })
                .collect();
            out(&table(&["VOLUME", "UUID", "KIND", "SIZE", "CLUSTERS"], &rows));
            Ok(())
        }
    }
}
