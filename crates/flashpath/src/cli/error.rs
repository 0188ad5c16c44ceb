//! `error create|delete|inject|resume`: SPDK's error bdev, `EE_<base>` over a disk, failing,
//! holding, corrupting or refusing requests on demand for tests (docs/error.md).

use std::path::Path;

use clap::{Args, Subcommand};
use serde_json::json;

use super::args::{u32_arg, u64_arg};
use super::session::{one_call, out, print_json, CliError, Session};

#[derive(Debug, Subcommand)]
pub(crate) enum ErrorCommand {
    /// Stack an error disk, EE_<BASE>, on a disk (claimed until the error disk is deleted);
    /// prints its name
    Create {
        /// The disk below
        base: String,
    },
    /// Delete an error disk; requests it holds fail
    Delete {
        /// The error disk's name (EE_<BASE>)
        name: String,
    },
    /// Inject errors into the next requests of a kind, or clear every injection
    Inject(InjectArgs),
    /// End the pending injections and pass the requests they hold to the disk below
    Resume {
        /// The error disk's name
        name: String,
    },
}

#[derive(Debug, Args)]
pub(crate) struct InjectArgs {
    /// The error disk's name
    name: String,
    /// read, write, unmap, flush, write_zeroes, all, or clear (ends every injection and
    /// passes held requests down)
    io_type: String,
    /// failure (EIO), pending (held), corrupt_data (one byte xored), nomem (submission refused
    /// as busy, retried by the caller)
    error_type: String,
    /// How many requests it takes
    #[arg(long, short = 'n', value_name = "N", value_parser = u64_arg, default_value = "1")]
    num: u64,
    /// Only requests submitted while at least this many are in flight below them (0: any)
    #[arg(long, short = 'q', value_name = "DEPTH", value_parser = u64_arg)]
    queue_depth: Option<u64>,
    /// corrupt_data: the byte offset in the request's data
    #[arg(long, short = 'o', value_name = "BYTES", value_parser = u64_arg)]
    corrupt_offset: Option<u64>,
    /// corrupt_data: the value xored into that byte (1-255)
    #[arg(long, short = 'v', value_name = "VALUE", value_parser = u32_arg)]
    corrupt_value: Option<u32>,
}

/// The error methods' parameters and the arguments that set them.
const FLAGS: &[(&str, &str)] = &[
    ("base_name", "BASE"),
    ("name", "NAME"),
    ("io_type", "IO_TYPE"),
    ("error_type", "ERROR_TYPE"),
    ("num", "--num"),
    ("queue_depth", "--queue-depth"),
    ("corrupt_offset", "--corrupt-offset"),
    ("corrupt_value", "--corrupt-value"),
];

/// `error ...`.
pub(crate) fn run(rpc: &Path, json: bool, cmd: ErrorCommand) -> Result<(), CliError> {
    match cmd {
        ErrorCommand::Create { base } => {
            let r = Session::connect(rpc, FLAGS)?
                .call("bdev_error_create", Some(json!({ "base_name": base })))?;
            if json {
                print_json(&r);
            } else {
                out(&format!("EE_{base}"));
            }
            Ok(())
        }
        ErrorCommand::Delete { name } => {
            one_call(rpc, json, FLAGS, "bdev_error_delete", json!({ "name": name }))
        }
        ErrorCommand::Inject(a) => {
            let mut params =
                json!({ "name": a.name, "io_type": a.io_type, "error_type": a.error_type, "num": a.num });
            let optional = [
                ("queue_depth", a.queue_depth),
                ("corrupt_offset", a.corrupt_offset),
                ("corrupt_value", a.corrupt_value.map(u64::from)),
            ];
            for (field, v) in optional {
                if let Some(v) = v {
                    params[field] = json!(v);
                }
            }
            one_call(rpc, json, FLAGS, "bdev_error_inject_error", params)
        }
        ErrorCommand::Resume { name } => {
            one_call(rpc, json, FLAGS, "bdev_error_resume_pending", json!({ "name": name }))
        }
    }
}
