//! `mirror start|status|set-speed|complete|cancel`: jobs that copy a live disk to another
//! (`bdev_mirror_*`, docs/mirror.md).

use std::path::Path;

use crate::size::{self, format_size};
use clap::{Args, Subcommand};
use serde_json::{json, Value};

use super::session::{cell, one_call, out, print_json, set_given, table, u64_field, CliError, Session};

#[derive(Debug, Subcommand)]
pub(crate) enum MirrorCommand {
    /// Start copying a disk, live, to another disk; prints the job's id
    Start(MirrorStartArgs),
    /// Jobs: state, bytes copied, bytes still dirty (or one job)
    Status { job_id: Option<String> },
    /// Limit how fast a job copies, in bytes per second, e.g. 100MiB (0: no limit)
    SetSpeed {
        job_id: String,
        #[arg(value_parser = size::parse_size)]
        speed: u64,
    },
    /// Complete a ready job: returns once the target holds the source's data and is free
    Complete { job_id: String },
    /// Cancel a job (the target keeps what was copied), or dismiss one that ended
    Cancel { job_id: String },
}

#[derive(Debug, Args)]
pub(crate) struct MirrorStartArgs {
    /// The disk to copy (it may be exported and busy)
    source: String,
    /// The disk to copy it to: at least as large, writable, not in use
    target: String,
    /// The job's name [default: the source's name]
    #[arg(long, value_name = "NAME")]
    job_id: Option<String>,
    /// Bytes per dirty-bitmap bit, a power of two, e.g. 64KiB [default: 64KiB, more for disks
    /// so large that the bitmap would pass 1 MiB]
    #[arg(long, value_name = "SIZE", value_parser = size::parse_size)]
    granularity: Option<u64>,
    /// Copy at most this many bytes per second, e.g. 200MiB, so the disk's own I/O keeps its
    /// share of the daemon [default: no limit]
    #[arg(long, value_name = "SIZE", value_parser = size::parse_size)]
    speed: Option<u64>,
    /// The copy's share, in percent (1 to 100), of the source's requests in flight while the
    /// disk's own I/O has some; with none in flight it copies at full speed [default: 10]
    #[arg(long, value_name = "PERCENT")]
    weight: Option<u64>,
    /// When the disk's writes go to the target too: background (once the copy has caught up)
    /// or write-blocking (from the start: the job converges however fast the disk is written)
    /// [default: background]
    #[arg(long, value_name = "MODE", value_parser = ["background", "write-blocking"])]
    copy_mode: Option<String>,
}

/// The mirror methods' parameters and the arguments that set them.
const MIRROR_FLAGS: &[(&str, &str)] = &[
    ("source", "SOURCE"),
    ("target", "TARGET"),
    ("job_id", "JOB_ID"),
    ("granularity", "--granularity"),
    ("speed", "--speed"),
    ("weight", "--weight"),
    ("copy_mode", "--copy-mode"),
];

/// `mirror start|status|complete|cancel`.
pub(crate) fn run(rpc: &Path, json: bool, cmd: MirrorCommand) -> Result<(), CliError> {
    match cmd {
        MirrorCommand::Start(a) => {
            let mut params = json!({ "source": a.source, "target": a.target });
            set_given(&mut params, "job_id", a.job_id);
            set_given(&mut params, "granularity", a.granularity);
            set_given(&mut params, "speed", a.speed);
            set_given(&mut params, "weight", a.weight);
            set_given(&mut params, "copy_mode", a.copy_mode);
            one_call(rpc, json, MIRROR_FLAGS, "bdev_mirror_start", params)
        }
        MirrorCommand::Status { job_id } => status(rpc, json, job_id),
        MirrorCommand::SetSpeed { job_id, speed } => one_call(
            rpc,
            json,
            MIRROR_FLAGS,
            "bdev_mirror_set_speed",
            json!({ "job_id": job_id, "speed": speed }),
        ),
        MirrorCommand::Complete { job_id } => {
            one_call(rpc, json, MIRROR_FLAGS, "bdev_mirror_complete", json!({ "job_id": job_id }))
        }
        MirrorCommand::Cancel { job_id } => {
            one_call(rpc, json, MIRROR_FLAGS, "bdev_mirror_cancel", json!({ "job_id": job_id }))
        }
    }
}

fn status(rpc: &Path, json: bool, job_id: Option<String>) -> Result<(), CliError> {
    let params = job_id.map(|id| json!({ "job_id": id }));
    let list = Session::connect(rpc, MIRROR_FLAGS)?.call("bdev_mirror_get_jobs", params)?;
    if json {
        print_json(&list);
        return Ok(());
    }
    let Some(jobs) = list.as_array() else {
        return Err(CliError::Unexpected { method: "bdev_mirror_get_jobs", result: list });
    };
    out(&table(
        &["JOB", "SOURCE", "TARGET", "STATE", "SIZE", "COPIED", "DIRTY", "IN FLIGHT", "ERROR"],
        &rows(jobs),
    ));
    Ok(())
}

fn rows(jobs: &[Value]) -> Vec<Vec<String>> {
    jobs.iter()
        .map(|j| {
            let bytes = |k| format_size(u64_field(j, k));
            vec![
                cell(j, "job_id"),
                cell(j, "source"),
                cell(j, "target"),
                cell(j, "state"),
                bytes("len"),
                bytes("copied"),
                bytes("dirty_bytes"),
                cell(j, "in_flight"),
                j["error"].as_str().unwrap_or("-").to_string(),
            ]
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_rows_show_sizes_and_errors() {
        let jobs = [json!({ "job_id": "j", "source": "a", "target": "b", "state": "failed", "len": 1 << 30,
            "copied": 3 << 20, "dirty_bytes": 0, "in_flight": 0, "error": "write to target 'b' failed" })];
        let r = rows(&jobs);
        assert_eq!(r[0][..5], ["j", "a", "b", "failed", format_size(1 << 30).as_str()]);
        assert_eq!(r[0][5], format_size(3 << 20));
        assert_eq!(r[0][8], "write to target 'b' failed");
    }
}
