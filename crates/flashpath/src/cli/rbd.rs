//! `rbd cluster add|remove|list`: shared Ceph cluster connections (SPDK's
//! `bdev_rbd_register_cluster` and friends) for `disk create --type rbd --cluster`.

use std::path::{Path, PathBuf};

use clap::{Args, Subcommand};
use serde_json::{json, Map, Value};

use super::session::{
    cell, disks_with, one_call, out, print_json, set_given, table, usage, CliError, Session,
};

#[derive(Debug, Subcommand)]
pub(crate) enum RbdCommand {
    /// Ceph clusters: one connection each, shared by the disks that name it
    #[command(subcommand)]
    Cluster(RbdClusterCommand),
}

#[derive(Debug, Subcommand)]
pub(crate) enum RbdClusterCommand {
    /// Connect to a cluster and keep the connection under NAME (SPDK's
    /// bdev_rbd_register_cluster)
    Add(RbdClusterAddArgs),
    /// Drop a cluster's connection (refused while a disk uses it)
    Remove { name: String },
    /// List clusters (or show one) and the disks on each
    List { name: Option<String> },
}

#[derive(Debug, Args)]
pub(crate) struct RbdClusterAddArgs {
    name: String,
    /// The cluster's ceph.conf [default: /etc/ceph/ceph.conf unless --param is given]
    #[arg(long, value_name = "FILE")]
    config_file: Option<PathBuf>,
    /// The keyring holding the user's key
    #[arg(long, value_name = "FILE")]
    key_file: Option<PathBuf>,
    /// The Ceph user, without "client." [default: admin]
    #[arg(long, value_name = "USER")]
    user_id: Option<String>,
    /// Cores for the connection's librados and librbd threads (SPDK's core_mask): "0-1",
    /// "0,2" or "0x3" [default: any]
    #[arg(long, value_name = "LIST")]
    cpus: Option<String>,
    /// A Ceph option, e.g. mon_host=10.0.0.1 or rados_osd_op_timeout=5 (repeatable)
    #[arg(long = "param", value_name = "KEY=VALUE", value_parser = key_value)]
    params: Vec<(String, String)>,
}

/// `KEY=VALUE`, as `--param` takes it.
fn key_value(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_string(), v.to_string())),
        _ => Err(format!("'{s}' is not KEY=VALUE (e.g. rados_osd_op_timeout=5)")),
    }
}

/// `rbd cluster add|remove|list`.
fn cluster(rpc: &Path, json: bool, cmd: RbdClusterCommand) -> Result<(), CliError> {
    match cmd {
        RbdClusterCommand::Add(a) => rbd_cluster_add(rpc, json, a),
        RbdClusterCommand::Remove { name } => {
            one_call(rpc, json, &[("name", "NAME")], "bdev_rbd_unregister_cluster", json!({ "name": name }))
        }
        RbdClusterCommand::List { name } => rbd_cluster_list(rpc, json, name),
    }
}

fn rbd_cluster_add(rpc: &Path, json: bool, a: RbdClusterAddArgs) -> Result<(), CliError> {
    let mut config_param = Map::new();
    for (key, value) in a.params {
        if config_param.insert(key.clone(), json!(value)).is_some() {
            return Err(usage("--param", format!("{key} given twice")));
        }
    }
    let mut params = json!({ "name": a.name });
    // The daemon resolves relative paths against its own working directory, not ours.
    let absolute = |p: std::path::PathBuf| std::path::absolute(&p).unwrap_or(p);
    set_given(&mut params, "config_file", a.config_file.map(absolute));
    set_given(&mut params, "key_file", a.key_file.map(absolute));
    set_given(&mut params, "user_id", a.user_id);
    set_given(&mut params, "core_mask", a.cpus);
    if !config_param.is_empty() {
        params["config_param"] = Value::Object(config_param);
    }
    let flags = &[
        ("name", "NAME"),
        ("config_file", "--config-file"),
        ("key_file", "--key-file"),
        ("user_id", "--user-id"),
        ("core_mask", "--cpus"),
        ("config_param", "--param"),
    ];
    one_call(rpc, json, flags, "bdev_rbd_register_cluster", params)
}

/// One row per cluster: how it connects and the rbd disks on it.
fn rbd_cluster_list(rpc: &Path, json: bool, name: Option<String>) -> Result<(), CliError> {
    let mut s = Session::connect(rpc, &[("name", "NAME")])?;
    let info = s.call("bdev_rbd_get_clusters_info", name.map(|n| json!({ "name": n })))?;
    if json {
        print_json(&info);
        return Ok(());
    }
    // One cluster asked for by name comes as an object, all of them as an array.
    let clusters = match info {
        Value::Array(list) => list,
        one @ Value::Object(_) => vec![one],
        other => return Err(CliError::Unexpected { method: "bdev_rbd_get_clusters_info", result: other }),
    };
    let bdevs = s.call("bdev_get_bdevs", None)?;
    let rows: Vec<Vec<String>> = clusters
        .iter()
        .map(|c| {
            let params = c["config_param"]
                .as_object()
                .map(|m| m.iter().map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default())).collect())
                .unwrap_or_else(Vec::new)
                .join(" ");
            vec![
                cell(c, "cluster_name"),
                cell(c, "user_id"),
                cell(c, "config_file"),
                cell(c, "key_file"),
                cell(c, "core_mask"),
                disks_with(&bdevs, "rbd", "cluster_name", &c["cluster_name"]),
                if params.is_empty() { "-".into() } else { params },
            ]
        })
        .collect();
    out(&table(&["CLUSTER", "USER", "CONFIG FILE", "KEY FILE", "CPUS", "DISKS", "PARAMS"], &rows));
    Ok(())
}

pub(crate) fn run(rpc: &Path, json: bool, command: RbdCommand) -> Result<(), CliError> {
    match command {
        RbdCommand::Cluster(c) => cluster(rpc, json, c),
    }
}
