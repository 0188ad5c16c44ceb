//! `stats`: I/O counters and uptime since the daemon started, per disk and per controller.

use std::path::Path;

use crate::size::format_size;

use super::session::{cell, out, print_json, seconds, table, u64_field, CliError, Session};
use super::top::disk_counters;

/// Mean latency in microseconds, "-" when unknown.
fn micros(v: Option<f64>) -> String {
    v.map_or_else(|| "-".to_string(), |x| format!("{x:.1}"))
}

pub(crate) fn run(rpc: &Path, json: bool) -> Result<(), CliError> {
    let mut session = Session::connect(rpc, &[])?;
    let s = session.call("flashpath_get_stats", None)?;
    if json {
        print_json(&s);
        return Ok(());
    }
    out(&format!(
        "uptime {}  disks {}  controllers {}",
        seconds(u64_field(&s, "uptime_ns")),
        cell(&s, "num_bdevs"),
        cell(&s, "num_controllers")
    ));
    // Per disk, iostat-style: totals since the daemon started.
    let disks = disk_counters(&mut session)?;
    let rows: Vec<Vec<String>> = disks
        .iter()
        .map(|(name, d)| {
            let ops = d.read_ops + d.write_ops;
            let avg = d.latency_s.filter(|_| ops > 0).map(|l| l / ops as f64 * 1e6);
            vec![
                name.clone(),
                d.read_ops.to_string(),
                d.write_ops.to_string(),
                format_size(d.bytes_read),
                format_size(d.bytes_written),
                micros(avg),
                micros(d.p99_us),
                d.queue_depth.to_string(),
                d.errors.to_string(),
            ]
        })
        .collect();
    if !rows.is_empty() {
        out("");
        out(&table(
            &["DISK", "READS", "WRITES", "READ", "WRITTEN", "AVG us", "P99 us", "QD", "ERRORS"],
            &rows,
        ));
    }
    let rows: Vec<Vec<String>> = s["controllers"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .map(|c| {
            let st = &c["stats"];
            vec![
                cell(c, "ctrlr"),
                cell(c, "bdev"),
                cell(st, "read_ops"),
                cell(st, "write_ops"),
                format_size(u64_field(st, "bytes_read")),
                format_size(u64_field(st, "bytes_written")),
                cell(st, "in_flight"),
                cell(st, "io_errors"),
                cell(st, "notifications"),
                cell(st, "kicks"),
                st["requests_per_notification"]
                    .as_f64()
                    .map_or_else(|| "-".to_string(), |r| format!("{r:.1}")),
            ]
        })
        .collect();
    if !rows.is_empty() {
        out("");
        out(&table(
            &[
                "CONTROLLER",
                "DISK",
                "READS",
                "WRITES",
                "READ",
                "WRITTEN",
                "IN FLIGHT",
                "ERRORS",
                "NOTIFY",
                "KICKS",
                "IO/NOTIFY",
            ],
            &rows,
        ));
    }
    Ok(())
}
