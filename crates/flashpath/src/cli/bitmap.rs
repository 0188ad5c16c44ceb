//! `bitmap add|remove|clear|enable|disable|merge|list|extents`: a disk's dirty bitmaps
//! (`bdev_dirty_bitmap_*`, docs/backup.md).

use std::path::Path;

use crate::size::{self, format_size};
use clap::{Args, Subcommand};
use serde_json::{json, Value};

use super::session::{cell, one_call, out, print_json, set_given, table, u64_field, CliError, Session};

#[derive(Debug, Subcommand)]
pub(crate) enum BitmapCommand {
    /// Add a bitmap to a disk: completed writes mark it from now on
    Add(BitmapAddArgs),
    /// Remove a bitmap (an inconsistent one too), and its file if persistent
    Remove { bdev: String, name: String },
    /// Clear every bit of a bitmap
    Clear { bdev: String, name: String },
    /// Let completed writes mark a bitmap again
    Enable { bdev: String, name: String },
    /// Stop completed writes from marking a bitmap
    Disable { bdev: String, name: String },
    /// Set in TARGET every bit of each of BITMAPS (same granularity and size)
    Merge {
        bdev: String,
        target: String,
        #[arg(required = true)]
        bitmaps: Vec<String>,
    },
    /// Bitmaps: granularity, dirty bytes, recording, persistent, inconsistent (or one disk's)
    List { bdev: Option<String> },
    /// A bitmap's dirty extents (offset and length in bytes)
    Extents(BitmapExtentsArgs),
}

#[derive(Debug, Args)]
pub(crate) struct BitmapAddArgs {
    bdev: String,
    name: String,
    /// Bytes per bit, a power of two from 512 to 64MiB [default: 64KiB]
    #[arg(long, value_name = "SIZE", value_parser = size::parse_size)]
    granularity: Option<u64>,
    /// Keep it across clean restarts (the daemon needs --state-dir)
    #[arg(long)]
    persistent: bool,
    /// Add it without recording
    #[arg(long)]
    disabled: bool,
}

#[derive(Debug, Args)]
pub(crate) struct BitmapExtentsArgs {
    bdev: String,
    name: String,
    /// Where to start, e.g. 1GiB [default: 0]
    #[arg(long, value_name = "SIZE", value_parser = size::parse_size)]
    offset: Option<u64>,
    /// How much to look at [default: to the end]
    #[arg(long, value_name = "SIZE", value_parser = size::parse_size)]
    length: Option<u64>,
}

const BITMAP_FLAGS: &[(&str, &str)] = &[
    ("bdev", "BDEV"),
    ("name", "NAME"),
    ("target", "TARGET"),
    ("bitmaps", "BITMAPS"),
    ("granularity", "--granularity"),
    ("persistent", "--persistent"),
    ("disabled", "--disabled"),
    ("offset", "--offset"),
    ("length", "--length"),
];

/// `bitmap ...`.
pub(crate) fn run(rpc: &Path, json: bool, cmd: BitmapCommand) -> Result<(), CliError> {
    let call = |method, params| one_call(rpc, json, BITMAP_FLAGS, method, params);
    match cmd {
        BitmapCommand::Add(a) => {
            let mut params = json!({ "bdev": a.bdev, "name": a.name });
            set_given(&mut params, "granularity", a.granularity);
            set_given(&mut params, "persistent", a.persistent.then_some(true));
            set_given(&mut params, "disabled", a.disabled.then_some(true));
            call("bdev_dirty_bitmap_add", params)
        }
        BitmapCommand::Remove { bdev, name } => {
            call("bdev_dirty_bitmap_remove", json!({ "bdev": bdev, "name": name }))
        }
        BitmapCommand::Clear { bdev, name } => {
            call("bdev_dirty_bitmap_clear", json!({ "bdev": bdev, "name": name }))
        }
        BitmapCommand::Enable { bdev, name } => {
            call("bdev_dirty_bitmap_enable", json!({ "bdev": bdev, "name": name }))
        }
        BitmapCommand::Disable { bdev, name } => {
            call("bdev_dirty_bitmap_disable", json!({ "bdev": bdev, "name": name }))
        }
        BitmapCommand::Merge { bdev, target, bitmaps } => {
            call("bdev_dirty_bitmap_merge", json!({ "bdev": bdev, "target": target, "bitmaps": bitmaps }))
        }
        BitmapCommand::List { bdev } => list(rpc, json, bdev),
        BitmapCommand::Extents(a) => extents(rpc, json, a),
    }
}

fn list(rpc: &Path, json: bool, bdev: Option<String>) -> Result<(), CliError> {
    let params = bdev.map(|b| json!({ "bdev": b }));
    let list = Session::connect(rpc, BITMAP_FLAGS)?.call("bdev_dirty_bitmap_list", params)?;
    if json {
        print_json(&list);
        return Ok(());
    }
    let Some(bitmaps) = list.as_array() else {
        return Err(CliError::Unexpected { method: "bdev_dirty_bitmap_list", result: list });
    };
    let rows: Vec<Vec<String>> = bitmaps
        .iter()
        .map(|b| {
            vec![
                cell(b, "bdev"),
                cell(b, "name"),
                format_size(u64_field(b, "granularity")),
                format_size(u64_field(b, "count")),
                cell(b, "recording"),
                cell(b, "persistent"),
                cell(b, "inconsistent"),
            ]
        })
        .collect();
    out(&table(&["BDEV", "NAME", "GRANULARITY", "DIRTY", "RECORDING", "PERSISTENT", "INCONSISTENT"], &rows));
    Ok(())
}

fn extents(rpc: &Path, json: bool, a: BitmapExtentsArgs) -> Result<(), CliError> {
    let mut params = json!({ "bdev": a.bdev, "name": a.name });
    set_given(&mut params, "offset", a.offset);
    set_given(&mut params, "length", a.length);
    let reply = Session::connect(rpc, BITMAP_FLAGS)?.call("bdev_dirty_bitmap_get_extents", Some(params))?;
    if json {
        print_json(&reply);
        return Ok(());
    }
    let Some(list) = reply.get("extents").and_then(Value::as_array) else {
        return Err(CliError::Unexpected { method: "bdev_dirty_bitmap_get_extents", result: reply });
    };
    let rows: Vec<Vec<String>> = list
        .iter()
        .map(|e| vec![u64_field(e, "offset").to_string(), u64_field(e, "length").to_string()])
        .collect();
    out(&table(&["OFFSET", "LENGTH"], &rows));
    if let Some(next) = reply.get("next").and_then(Value::as_u64) {
        out(&format!("(cut: continue with --offset {next})"));
    }
    Ok(())
}
