//! `qos limit|group|groups|show`: per-disk limits (SPDK's `bdev_set_qos_limit`) and groups of
//! disks sharing limits (QEMU-style throttle groups, divided among members by weight).

use std::path::Path;

use crate::size::{self, format_size};
use clap::{Args, Subcommand};
use fp_registry::THROTTLE_FIELDS;
use serde_json::{json, Value};

use super::args::{u16_arg, u64_arg};
use super::session::{
    cell, one_call, out, print_json, set_given, table, u64_field, usage, CliError, Session,
};

#[derive(Debug, Subcommand)]
pub(crate) enum QosCommand {
    /// Set a disk's limits (SPDK's bdev_set_qos_limit); options left out keep their value
    Limit(QosLimitArgs),
    /// Groups of disks sharing limits (QEMU-style throttle groups with bursts), divided among
    /// the busy members by weight
    #[command(subcommand)]
    Group(QosGroupCommand),
    /// List groups: limits, members, weights and each member's share now
    Groups { name: Option<String> },
    /// Disks' limits, groups, and requests held and time throttled by QoS
    Show { disk: Option<String> },
}

#[derive(Debug, Args)]
pub(crate) struct QosLimitArgs {
    disk: String,
    /// Read and write I/Os per second, at least 1000 (0 removes the limit)
    #[arg(long, value_name = "N", value_parser = u64_arg)]
    iops: Option<u64>,
    /// Read and write MiB per second (0 removes the limit)
    #[arg(long, value_name = "N", value_parser = u64_arg)]
    mbps: Option<u64>,
    /// Read MiB per second (0 removes the limit)
    #[arg(long, value_name = "N", value_parser = u64_arg)]
    read_mbps: Option<u64>,
    /// Write MiB per second (0 removes the limit)
    #[arg(long, value_name = "N", value_parser = u64_arg)]
    write_mbps: Option<u64>,
}

#[derive(Debug, Subcommand)]
pub(crate) enum QosGroupCommand {
    /// Create a group (limits left out are none)
    Create {
        name: String,
        #[command(flatten)]
        limits: Box<QosGroupLimits>,
    },
    /// Change a group's limits (those left out are kept; 0 removes one)
    Set {
        name: String,
        #[command(flatten)]
        limits: Box<QosGroupLimits>,
    },
    /// Delete a group (refused while it has members)
    Delete { name: String },
    /// Add a disk to a group (a disk is in one group at most)
    Add {
        name: String,
        disk: String,
        /// Its share relative to the other members', 1-65535 [default: 1]
        #[arg(long, value_name = "W", value_parser = u16_arg)]
        weight: Option<u16>,
    },
    /// Take a disk out of a group
    Remove { name: String, disk: String },
    /// Change a member's weight
    Weight {
        name: String,
        disk: String,
        #[arg(value_parser = u16_arg)]
        weight: u16,
    },
}

/// A group's limits, QEMU's throttle-group names: each an average, a burst ceiling (`-max`)
/// and how long a burst may last at it (`-max-length`, seconds); 0 is none. Serialised (less
/// those left out) they are the parameters of `bdev_qos_group_create` and `_set`, which is why
/// the field names are the RPC's.
#[derive(Debug, Args, serde::Serialize)]
pub(crate) struct QosGroupLimits {
    /// Read and write I/Os per second
    #[arg(long, value_name = "N", value_parser = u64_arg)]
    iops_total: Option<u64>,
    /// Burst ceiling of --iops-total
    #[arg(long, value_name = "N", value_parser = u64_arg)]
    iops_total_max: Option<u64>,
    /// Longest burst at --iops-total-max, in seconds
    #[arg(long, value_name = "SECONDS", value_parser = u64_arg)]
    iops_total_max_length: Option<u64>,
    /// Read I/Os per second
    #[arg(long, value_name = "N", value_parser = u64_arg)]
    iops_read: Option<u64>,
    /// Burst ceiling of --iops-read
    #[arg(long, value_name = "N", value_parser = u64_arg)]
    iops_read_max: Option<u64>,
    /// Longest burst at --iops-read-max, in seconds
    #[arg(long, value_name = "SECONDS", value_parser = u64_arg)]
    iops_read_max_length: Option<u64>,
    /// Write I/Os per second
    #[arg(long, value_name = "N", value_parser = u64_arg)]
    iops_write: Option<u64>,
    /// Burst ceiling of --iops-write
    #[arg(long, value_name = "N", value_parser = u64_arg)]
    iops_write_max: Option<u64>,
    /// Longest burst at --iops-write-max, in seconds
    #[arg(long, value_name = "SECONDS", value_parser = u64_arg)]
    iops_write_max_length: Option<u64>,
    /// Read and write bytes per second, e.g. 100MiB (K/M/G/T are powers of 1024)
    #[arg(long, value_name = "SIZE", value_parser = size::parse_size)]
    bps_total: Option<u64>,
    /// Burst ceiling of --bps-total
    #[arg(long, value_name = "SIZE", value_parser = size::parse_size)]
    bps_total_max: Option<u64>,
    /// Longest burst at --bps-total-max, in seconds
    #[arg(long, value_name = "SECONDS", value_parser = u64_arg)]
    bps_total_max_length: Option<u64>,
    /// Read bytes per second
    #[arg(long, value_name = "SIZE", value_parser = size::parse_size)]
    bps_read: Option<u64>,
    /// Burst ceiling of --bps-read
    #[arg(long, value_name = "SIZE", value_parser = size::parse_size)]
    bps_read_max: Option<u64>,
    /// Longest burst at --bps-read-max, in seconds
    #[arg(long, value_name = "SECONDS", value_parser = u64_arg)]
    bps_read_max_length: Option<u64>,
    /// Write bytes per second
    #[arg(long, value_name = "SIZE", value_parser = size::parse_size)]
    bps_write: Option<u64>,
    /// Burst ceiling of --bps-write
    #[arg(long, value_name = "SIZE", value_parser = size::parse_size)]
    bps_write_max: Option<u64>,
    /// Longest burst at --bps-write-max, in seconds
    #[arg(long, value_name = "SECONDS", value_parser = u64_arg)]
    bps_write_max_length: Option<u64>,
}

/// `bdev_set_qos_limit`'s parameters and the options that set them, the limits in
/// [`QosLimitArgs`]' order.
const QOS_LIMIT_FLAGS: &[(&str, &str)] = &[
    ("name", "DISK"),
    ("rw_ios_per_sec", "--iops"),
    ("rw_mbytes_per_sec", "--mbps"),
    ("r_mbytes_per_sec", "--read-mbps"),
    ("w_mbytes_per_sec", "--write-mbps"),
];

/// A group command's parameters other than its limits, and the arguments that set them.
const QOS_GROUP_FLAGS: &[(&str, &str)] = &[("name", "NAME"), ("bdev_name", "DISK"), ("weight", "--weight")];

/// The group limits given, as `bdev_qos_group_create`'s parameters (clap's field names are
/// QEMU's, as the RPC's are), plus `name`.
fn group_params(name: String, limits: &QosGroupLimits) -> Value {
    let mut params = match serde_json::to_value(limits) {
        Ok(Value::Object(map)) => map,
        _ => unreachable!("a struct of numbers serialises to an object"),
    };
    params.retain(|_, v| !v.is_null());
    params.insert("name".into(), json!(name));
    Value::Object(params)
}

pub(crate) fn run(rpc: &Path, json: bool, cmd: QosCommand) -> Result<(), CliError> {
    let group_call = |flags, method: &str, params| {
        let r = Session::connect(rpc, flags)?
            .dashed(THROTTLE_FIELDS.as_flattened())
            .call(method, Some(params))?;
        if json {
            print_json(&r);
        }
        Ok(())
    };
    match cmd {
        QosCommand::Limit(a) => qos_limit(rpc, json, a),
        QosCommand::Group(QosGroupCommand::Create { name, limits }) => {
            group_call(QOS_GROUP_FLAGS, "bdev_qos_group_create", group_params(name, &limits))
        }
        QosCommand::Group(QosGroupCommand::Set { name, limits }) => {
            let params = group_params(name, &limits);
            // `name` alone would change nothing.
            if params.as_object().is_some_and(|p| p.len() == 1) {
                return Err(usage(
                    "qos group set",
                    "no limit given: set at least one, e.g. --iops-total N (0 removes one)",
                ));
            }
            group_call(QOS_GROUP_FLAGS, "bdev_qos_group_set", params)
        }
        QosCommand::Group(QosGroupCommand::Delete { name }) => {
            group_call(QOS_GROUP_FLAGS, "bdev_qos_group_delete", json!({ "name": name }))
        }
        QosCommand::Group(QosGroupCommand::Add { name, disk, weight }) => {
            let mut params = json!({ "name": name, "bdev_name": disk });
            set_given(&mut params, "weight", weight);
            group_call(QOS_GROUP_FLAGS, "bdev_qos_group_add_bdev", params)
        }
        QosCommand::Group(QosGroupCommand::Remove { name, disk }) => group_call(
            QOS_GROUP_FLAGS,
            "bdev_qos_group_remove_bdev",
            json!({ "name": name, "bdev_name": disk }),
        ),
        QosCommand::Group(QosGroupCommand::Weight { name, disk, weight }) => group_call(
            &[("name", "NAME"), ("bdev_name", "DISK"), ("weight", "WEIGHT")],
            "bdev_qos_group_set_weight",
            json!({ "name": name, "bdev_name": disk, "weight": weight }),
        ),
        QosCommand::Groups { name } => qos_groups(rpc, json, name),
        QosCommand::Show { disk } => qos_show(rpc, json, disk),
    }
}

fn qos_limit(rpc: &Path, json: bool, a: QosLimitArgs) -> Result<(), CliError> {
    let values = [a.iops, a.mbps, a.read_mbps, a.write_mbps];
    if values.iter().all(Option::is_none) {
        return Err(usage(
            "qos limit",
            "no limit given: set at least one of --iops, --mbps, --read-mbps, --write-mbps (0 removes one)",
        ));
    }
    let mut params = json!({ "name": a.disk });
    for ((field, _), value) in QOS_LIMIT_FLAGS[1..].iter().zip(values) {
        if let Some(v) = value {
            params[*field] = json!(v);
        }
    }
    one_call(rpc, json, QOS_LIMIT_FLAGS, "bdev_set_qos_limit", params)
}

/// A rate in the unit of a limit named `field` (QEMU's `iops_*`, `bps_*`).
fn rate(field: &str, per_second: u64) -> String {
    if field.starts_with("bps") {
        format!("{}/s", format_size(per_second))
    } else {
        format!("{per_second} IOPS")
    }
}

/// A group's limits that are set, e.g. "iops_total 10000 IOPS (burst 20000 IOPS for 5 s)".
fn group_limits_text(g: &Value) -> String {
    let set: Vec<String> = THROTTLE_FIELDS
        .iter()
        .filter(|[avg, max, _]| u64_field(g, avg) > 0 || u64_field(g, max) > 0)
        .map(|[avg, max, length]| {
            let mut text = format!("{avg} {}", rate(avg, u64_field(g, avg)));
            if u64_field(g, max) > 0 {
                text += &format!(" (burst {} for {} s)", rate(avg, u64_field(g, max)), u64_field(g, length));
            }
            text
        })
        .collect();
    if set.is_empty() {
        "none".into()
    } else {
        set.join(", ")
    }
}

/// One row per member (the group's own cells on its first), one for a group without members.
fn qos_groups(rpc: &Path, json: bool, name: Option<String>) -> Result<(), CliError> {
    let params = name.map(|n| json!({ "name": n }));
    let groups = Session::connect(rpc, &[("name", "NAME")])?.call("bdev_qos_get_groups", params)?;
    if json {
        print_json(&groups);
        return Ok(());
    }
    let Some(groups) = groups.as_array() else {
        return Err(CliError::Unexpected { method: "bdev_qos_get_groups", result: groups });
    };
    let mut rows = Vec::new();
    for g in groups {
        let own = |first: bool| {
            if first {
                vec![cell(g, "name"), group_limits_text(g)]
            } else {
                vec![String::new(); 2]
            }
        };
        let members = g["members"].as_array().map(Vec::as_slice).unwrap_or_default();
        if members.is_empty() {
            rows.push([own(true), vec!["-".into(); 3]].concat());
        }
        for (i, m) in members.iter().enumerate() {
            // The share is in the unit of the limit it divides; without one nothing is divided.
            let share = match g["fair_on"].as_str() {
                Some(on) => rate(on, u64_field(m, "rate")),
                None => "-".into(),
            };
            rows.push([own(i == 0), vec![cell(m, "bdev_name"), cell(m, "weight"), share]].concat());
        }
    }
    out(&table(&["GROUP", "LIMITS", "DISK", "WEIGHT", "SHARE"], &rows));
    Ok(())
}

/// Per disk: its limits (SPDK's four), its group and weight, and what QoS held back.
fn qos_show(rpc: &Path, json: bool, disk: Option<String>) -> Result<(), CliError> {
    let mut s = Session::connect(rpc, &[("name", "DISK")])?;
    let params = disk.map(|n| json!({ "name": n }));
    let bdevs = s.call("bdev_get_bdevs", params.clone())?;
    // Without statistics (`serve --no-iostat`) there is nothing to show of what was held.
    let iostat = match s.call("bdev_get_iostat", params) {
        Ok(v) => Some(v),
        Err(CliError::Refused { .. }) => None,
        Err(e) => return Err(e),
    };
    if json {
        print_json(&json!({ "bdevs": bdevs, "iostat": iostat }));
        return Ok(());
    }
    let Some(bdevs) = bdevs.as_array() else {
        return Err(CliError::Unexpected { method: "bdev_get_bdevs", result: bdevs });
    };
    let tick_rate = iostat.as_ref().map_or(1.0, crate::metrics::tick_rate);
    let stats_of = |name: &Value| {
        let list = iostat.as_ref().and_then(|io| io["bdevs"].as_array());
        list.and_then(|l| l.iter().find(|b| &b["name"] == name))
    };
    let rows: Vec<Vec<String>> = bdevs
        .iter()
        .map(|b| {
            let limits = &b["assigned_rate_limits"];
            let limit = |field: &str| match u64_field(limits, field) {
                0 => "-".to_string(),
                v => v.to_string(),
            };
            let group = &b["qos_group"];
            let stats = stats_of(&b["name"]);
            let held = |field: &str| stats.map_or("-".to_string(), |st| cell(st, field));
            let throttled = stats.map_or("-".to_string(), |st| {
                format!("{:.3}s", u64_field(st, "qos_throttled_ticks") as f64 / tick_rate)
            });
            vec![
                cell(b, "name"),
                limit("rw_ios_per_sec"),
                limit("rw_mbytes_per_sec"),
                limit("r_mbytes_per_sec"),
                limit("w_mbytes_per_sec"),
                cell(group, "name"),
                cell(group, "weight"),
                held("qos_queued"),
                held("qos_queued_total"),
                throttled,
            ]
        })
        .collect();
    out(&table(
        &[
            "DISK",
            "IOPS",
            "MiB/s",
            "READ MiB/s",
            "WRITE MiB/s",
            "GROUP",
            "WEIGHT",
            "QUEUED",
            "QUEUED TOTAL",
            "THROTTLED",
        ],
        &rows,
    ));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use serde_json::Map;

    /// `flashpath qos ...` on its own.
    #[derive(Debug, Parser)]
    struct Qos {
        #[command(subcommand)]
        command: QosCommand,
    }

    /// The group commands' options are the RPC's limit names with dashes, one for each, so
    /// the daemon's errors about a field can be worded as about its option.
    #[test]
    fn group_limit_options_are_the_rpc_fields_with_dashes() {
        let fields = THROTTLE_FIELDS.as_flattened();
        let flags: Vec<String> = fields.iter().map(|f| format!("--{}", f.replace('_', "-"))).collect();
        let mut args = vec!["qos", "group", "create", "g"];
        for (i, flag) in flags.iter().enumerate() {
            args.extend([flag.as_str(), ["1", "2", "3"][i % 3]]);
        }
        let cli = Qos::try_parse_from(args).unwrap();
        let QosCommand::Group(QosGroupCommand::Create { name, limits }) = cli.command else {
            panic!("parsed as {:?}", cli.command)
        };
        let params = group_params(name, &limits);
        let mut want: Map<String, Value> =
            fields.iter().enumerate().map(|(i, f)| (f.to_string(), json!(i % 3 + 1))).collect();
        want.insert("name".into(), json!("g"));
        assert_eq!(params, Value::Object(want));
        // Left out is left out (the daemon keeps those), not 0 (which removes).
        let cli = Qos::try_parse_from(["qos", "group", "set", "g", "--bps-read", "1M"]).unwrap();
        let QosCommand::Group(QosGroupCommand::Set { name, limits }) = cli.command else {
            panic!("parsed as {:?}", cli.command)
        };
        assert_eq!(group_params(name, &limits), json!({ "name": "g", "bps_read": 1 << 20 }));
    }

    #[test]
    fn group_limits_read_in_their_units() {
        let mut g = json!({ "name": "g" });
        assert_eq!(group_limits_text(&g), "none");
        g["iops_total"] = json!(10_000);
        g["bps_write"] = json!(100 << 20);
        g["bps_write_max"] = json!(1 << 30);
        g["bps_write_max_length"] = json!(5);
        assert_eq!(
            group_limits_text(&g),
            "iops_total 10000 IOPS, bps_write 100 MiB/s (burst 1 GiB/s for 5 s)"
        );
    }
}
