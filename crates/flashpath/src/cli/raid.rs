//! `raid create|delete|list|add|remove|options`: raid bdevs (raid0, concat, raid1 with a
//! superblock and partial rebuild) through SPDK's `bdev_raid_*` methods (docs/raid.md).

use std::path::Path;

use clap::{Args, Subcommand};
use serde_json::{json, Value};

use super::args::{u32_arg, u64_arg};
use super::session::{
    cell, one_call, out, print_json, set_given, table, u64_field, yes_no, CliError, Session,
};

#[derive(Debug, Subcommand)]
pub(crate) enum RaidCommand {
    /// Create a raid bdev over existing disks; prints its name
    Create(RaidCreateArgs),
    /// Delete a raid bdev (its bases are released, their data kept)
    Delete {
        /// The raid's name
        name: String,
        /// Also wipe the superblock from every base, so examine no longer finds the raid
        #[arg(long)]
        clear_superblock: bool,
    },
    /// Raids, their bases and any rebuild in progress (or one raid)
    List {
        name: Option<String>,
        /// Only raids in this state: all, online, configuring, offline
        #[arg(long, value_name = "STATE", default_value = "all")]
        category: String,
    },
    /// Add a disk to a raid1 (into an empty or failed slot): it is rebuilt, partially when it
    /// is the replica that left and the bitmap covers what it missed
    Add {
        /// The raid's name
        raid: String,
        /// The disk to add
        base: String,
    },
    /// Remove a base disk from its raid (refused for the last in-sync replica, and for any
    /// base of raid0 or concat)
    Remove {
        /// The base disk's name
        base: String,
    },
    /// Set how rebuilds run: window size and bandwidth limit (SPDK's bdev_raid_set_options)
    Options(RaidOptionsArgs),
}

#[derive(Debug, Args)]
pub(crate) struct RaidCreateArgs {
    /// The raid's name
    name: String,
    /// raid0, concat or raid1
    #[arg(long, value_name = "LEVEL")]
    level: String,
    /// A base disk (repeat for each, in slot order)
    #[arg(long = "base", value_name = "DISK", required = true)]
    bases: Vec<String>,
    /// raid0, concat: the strip size in KiB, a power of two (raid1 takes none)
    #[arg(long, value_name = "KIB", value_parser = u32_arg)]
    strip_size_kb: Option<u32>,
    /// Keep a superblock (and for raid1 a write-intent bitmap) on every base, so the raid is
    /// assembled again at restart and a returning replica is rebuilt partially
    #[arg(long)]
    superblock: bool,
    /// The raid's UUID [default: a random one]
    #[arg(long, value_name = "UUID")]
    uuid: Option<String>,
}

#[derive(Debug, Args)]
pub(crate) struct RaidOptionsArgs {
    /// Bytes a rebuild copies per window, in KiB
    #[arg(long, value_name = "KIB", value_parser = u32_arg)]
    process_window_size_kb: Option<u32>,
    /// Most a rebuild copies per second, in MiB (0: no limit)
    #[arg(long, value_name = "MIB", value_parser = u64_arg)]
    process_max_bandwidth_mb_sec: Option<u64>,
    /// A rebuild's share, in percent (1 to 100), of the requests in flight while the raid
    /// has guest I/O in flight; with none it copies at full speed [default: 10]
    #[arg(long, value_name = "PERCENT", value_parser = u64_arg)]
    process_weight: Option<u64>,
}

/// The raid methods' parameters and the options that set them.
const FLAGS: &[(&str, &str)] = &[
    ("name", "NAME"),
    ("raid_level", "--level"),
    ("base_bdevs", "--base"),
    ("strip_size_kb", "--strip-size-kb"),
    ("superblock", "--superblock"),
    ("uuid", "--uuid"),
    ("raid_bdev", "RAID"),
    ("base_bdev", "BASE"),
    ("category", "--category"),
    ("process_window_size_kb", "--process-window-size-kb"),
    ("process_max_bandwidth_mb_sec", "--process-max-bandwidth-mb-sec"),
    ("process_weight", "--process-weight"),
];

/// `raid ...`.
pub(crate) fn run(rpc: &Path, json: bool, cmd: RaidCommand) -> Result<(), CliError> {
    match cmd {
        RaidCommand::Create(a) => one_call(rpc, json, FLAGS, "bdev_raid_create", create_params(a)),
        RaidCommand::Delete { name, clear_superblock } => {
            let mut params = json!({ "name": name });
            if clear_superblock {
                params["clear_sb"] = json!(true);
            }
            one_call(rpc, json, FLAGS, "bdev_raid_delete", params)
        }
        RaidCommand::List { name, category } => list(rpc, json, name, category),
        RaidCommand::Add { raid, base } => one_call(
            rpc,
            json,
            FLAGS,
            "bdev_raid_add_base_bdev",
            json!({ "raid_bdev": raid, "base_bdev": base }),
        ),
        RaidCommand::Remove { base } => {
            // The method's `name` is the base here, not the raid.
            const REMOVE_FLAGS: &[(&str, &str)] = &[("name", "BASE")];
            one_call(rpc, json, REMOVE_FLAGS, "bdev_raid_remove_base_bdev", json!({ "name": base }))
        }
        RaidCommand::Options(o) => {
            let mut params = json!({});
            set_given(&mut params, "process_window_size_kb", o.process_window_size_kb);
            set_given(&mut params, "process_max_bandwidth_mb_sec", o.process_max_bandwidth_mb_sec);
            set_given(&mut params, "process_weight", o.process_weight);
            one_call(rpc, json, FLAGS, "bdev_raid_set_options", params)
        }
    }
}

/// `bdev_raid_create`'s parameters: only what was given, so the daemon's defaults apply.
fn create_params(a: RaidCreateArgs) -> Value {
    let mut params = json!({ "name": a.name, "raid_level": a.level, "base_bdevs": a.bases });
    set_given(&mut params, "strip_size_kb", a.strip_size_kb);
    if a.superblock {
        params["superblock"] = json!(true);
    }
    set_given(&mut params, "uuid", a.uuid);
    params
}

fn list(rpc: &Path, json: bool, name: Option<String>, category: String) -> Result<(), CliError> {
    let result =
        Session::connect(rpc, FLAGS)?.call("bdev_raid_get_bdevs", Some(json!({ "category": category })))?;
    let Some(raids) = result.as_array() else {
        return Err(CliError::Unexpected { method: "bdev_raid_get_bdevs", result });
    };
    let raids: Vec<&Value> =
        raids.iter().filter(|r| name.as_ref().is_none_or(|n| r["name"] == **n)).collect();
    if let (Some(n), true) = (&name, raids.is_empty()) {
        return Err(CliError::Refused { message: format!("no raid bdev named '{n}'") });
    }
    if json {
        print_json(&Value::Array(raids.into_iter().cloned().collect()));
        return Ok(());
    }
    out(&table(
        &["RAID", "LEVEL", "STATE", "SUPERBLOCK", "OPERATIONAL", "BASES", "PROCESS"],
        &raids.iter().map(|r| row(r)).collect::<Vec<_>>(),
    ));
    Ok(())
}

/// One raid's line: its bases as `name(state)` in slot order, and any rebuild.
fn row(r: &Value) -> Vec<String> {
    let states = r["flashpath"]["slots"].as_array();
    let bases: Vec<String> = r["base_bdevs_list"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
        .map(|(i, b)| {
            let name = b["name"].as_str().unwrap_or("-");
            let state = states.and_then(|s| s.get(i)).and_then(Value::as_str);
            match state {
                Some(state) => format!("{name}({state})"),
                None if b["is_configured"] == true => name.to_string(),
                None => format!("{name}(missing)"),
            }
        })
        .collect();
    vec![
        cell(r, "name"),
        cell(r, "raid_level"),
        cell(r, "state"),
        yes_no(&r["superblock"]),
        format!("{}/{}", u64_field(r, "num_base_bdevs_operational"), u64_field(r, "num_base_bdevs")),
        bases.join(","),
        process(&r["process"]),
    ]
}

/// `rebuild -> TARGET 42.0%`, or "-" when no process runs.
fn process(p: &Value) -> String {
    let Some(kind) = p["type"].as_str() else {
        return "-".into();
    };
    let percent = p["progress"]["percent"].as_f64().unwrap_or(0.0);
    format!("{kind} -> {} {percent:.1}%", p["target"].as_str().unwrap_or("-"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_show_slot_states_and_the_rebuild() {
        let r = json!({
            "name": "r1", "raid_level": "raid1", "state": "online", "superblock": true,
            "num_base_bdevs": 2, "num_base_bdevs_operational": 1,
            "base_bdevs_list": [{"name": "a", "is_configured": true}, {"name": "b", "is_configured": true}],
            "process": {"type": "rebuild", "target": "b", "progress": {"blocks": 10, "percent": 42.04}},
            "flashpath": {"slots": ["active", "rebuilding"]}
        });
        assert_eq!(
            row(&r),
            ["r1", "raid1", "online", "yes", "1/2", "a(active),b(rebuilding)", "rebuild -> b 42.0%"]
        );
        let r = json!({"name": "r0", "raid_level": "raid0", "state": "configuring", "num_base_bdevs": 2,
            "base_bdevs_list": [{"name": "a", "is_configured": true}, {"name": null, "is_configured": false}]});
        assert_eq!(row(&r)[4..], ["0/2".to_string(), "a,-(missing)".into(), "-".into()]);
    }

    #[test]
    fn create_sends_only_what_was_given() {
        let a = RaidCreateArgs {
            name: "r".into(),
            level: "raid1".into(),
            bases: vec!["a".into(), "b".into()],
            strip_size_kb: None,
            superblock: true,
            uuid: None,
        };
        assert_eq!(
            create_params(a),
            json!({"name": "r", "raid_level": "raid1", "base_bdevs": ["a", "b"], "superblock": true})
        );
    }
}
