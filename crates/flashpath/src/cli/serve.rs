//! `serve`: runs the daemon ([`crate::serve`]) with the options of its command line.

use std::path::PathBuf;
use std::process::ExitCode;

use crate::serve;
use clap::Args;

use super::args::u64_arg;

#[derive(Debug, Args)]
pub(crate) struct ServeArgs {
    /// Cores to run reactors on: "0", "0-3", "0,2" or a hex mask "0x3" [default: the first CPU
    /// this process may use]
    #[arg(long, value_name = "LIST")]
    cpus: Option<String>,
    /// Directory for the vhost-user sockets, created if missing [default: /var/tmp/flashpath]
    #[arg(long, value_name = "DIR")]
    vhost_dir: Option<PathBuf>,
    /// TOML file declaring bdevs and controllers to create at start-up
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// How long a reactor keeps polling after its last work before it sleeps [default: 200]
    #[arg(long, value_name = "N", value_parser = u64_arg)]
    idle_window_us: Option<u64>,
    /// Only open file disks inside DIR (repeatable; replaces the config file's
    /// security.export_dirs) [default: any path]
    #[arg(long = "export-dir", value_name = "DIR")]
    export_dirs: Vec<PathBuf>,
    /// Serve Prometheus metrics at http://ADDR/metrics: a loopback HOST:PORT such as
    /// 127.0.0.1:9111, or unix:PATH [default: off]
    #[arg(long, value_name = "ADDR")]
    metrics: Option<String>,
    /// Do not count per-disk I/O statistics (bdev_get_iostat, histograms): the frontends use the
    /// backends' channels directly (replaces the config file's stats.iostat)
    #[arg(long)]
    no_iostat: bool,
    /// How long stopping a vhost-user queue may take for controllers created without
    /// stop_timeout_ms, 1 to 600000; also how long shutdown waits for requests a disk still
    /// holds (replaces the config file's vhost.stop_timeout_ms) [default: 5000]
    #[arg(long, value_name = "MS", value_parser = u64_arg)]
    vhost_stop_timeout_ms: Option<u64>,
    /// How long nvmf_subsystem_remove_ns waits for the namespace's commands on the device before
    /// answering EBUSY, 1 to 600000 (replaces the config file's nvmf.drain_timeout_ms)
    /// [default: 5000]
    #[arg(long, value_name = "MS", value_parser = u64_arg)]
    nvmf_drain_timeout_ms: Option<u64>,
    /// How long a closing NVMe/TCP queue pair retries commands its disk refuses as busy before
    /// answering them aborted, 1 to 600000 (replaces nvmf.close_timeout_ms) [default: 5000]
    #[arg(long, value_name = "MS", value_parser = u64_arg)]
    nvmf_close_timeout_ms: Option<u64>,
    /// How long nbd_stop_disk (and shutdown, per export) waits for the export's connections
    /// before answering EBUSY, 1 to 600000 (replaces nbd.stop_timeout_ms) [default: 5000]
    #[arg(long, value_name = "MS", value_parser = u64_arg)]
    nbd_stop_timeout_ms: Option<u64>,
    /// How long a closing NBD connection retries requests its disk refuses as busy before
    /// answering them EIO, 1 to 600000 (replaces nbd.close_timeout_ms) [default: 5000]
    #[arg(long, value_name = "MS", value_parser = u64_arg)]
    nbd_close_timeout_ms: Option<u64>,
}

/// Runs the daemon until it is told to stop; `rpc` is the global `--rpc`.
pub(crate) fn run(args: ServeArgs, rpc: Option<PathBuf>) -> ExitCode {
    let opts = serve::ServeOptions {
        cpus: args.cpus,
        rpc,
        vhost_dir: args.vhost_dir,
        config: args.config,
        idle_window_us: args.idle_window_us,
        export_dirs: (!args.export_dirs.is_empty()).then_some(args.export_dirs),
        metrics: args.metrics,
        no_iostat: args.no_iostat,
        vhost_stop_timeout_ms: args.vhost_stop_timeout_ms,
        nvmf_drain_timeout_ms: args.nvmf_drain_timeout_ms,
        nvmf_close_timeout_ms: args.nvmf_close_timeout_ms,
        nbd_stop_timeout_ms: args.nbd_stop_timeout_ms,
        nbd_close_timeout_ms: args.nbd_close_timeout_ms,
    };
    match serve::run(&opts) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e @ serve::ServeError::Config(_)) => {
            // Already reads "config error: ...".
            eprintln!("{e}");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
