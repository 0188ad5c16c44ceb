//! The command line: [`Cli`] and its `Command`s, each subcommand's options beside its
//! handler in a file of its own. The client commands turn their options into one or two
//! JSON-RPC calls to the daemon and print the result as a table (or, with `--json`, as the raw
//! result); `serve` runs the daemon itself.
//!
//! The files depend on each other one way: every command on `session` (the connection, errors
//! and output) and `args` (value parsers); `stats` on `top`; this file on all of them.

mod args;
mod backup;
mod bitmap;
mod crypto;
mod disk;
mod error;
mod fleece;
mod luks;
mod mirror;
mod nbd;
mod nbd_client;
mod nvme;
mod nvmf;
mod qos;
mod raid;
mod rbd;
mod reactor;
mod restore;
mod rpc;
mod serve;
mod session;
mod stats;
mod top;
mod ublk;
mod vhost;
mod volume;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use crate::DEFAULT_RPC_SOCKET;
use clap::error::ErrorKind;
use clap::{Parser, Subcommand};
use log::LevelFilter;

use crate::logger;
use session::CliError;

#[derive(Debug, Parser)]
#[command(name = "flashpath", version, about = "A polled user-space vhost-user-blk storage target")]
pub struct Cli {
    /// The daemon's JSON-RPC socket [default: /var/tmp/flashpath.sock]
    #[arg(long, global = true, env = "FLASHPATH_RPC", value_name = "PATH")]
    rpc: Option<PathBuf>,

    /// Print raw JSON-RPC results instead of tables
    #[arg(long, global = true)]
    json: bool,

    /// Log level: off, error, warn, info, debug, trace [default: info for serve, warn otherwise;
    /// RUST_LOG also works]
    #[arg(long, global = true, value_name = "LEVEL", value_parser = logger::parse_level)]
    log_level: Option<LevelFilter>,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Run the daemon
    Serve(serve::ServeArgs),
    /// Block devices: create, list, delete
    #[command(subcommand)]
    Disk(disk::DiskCommand),
    /// vhost-user-blk controllers: create, list, delete
    #[command(subcommand)]
    Vhost(vhost::VhostCommand),
    /// NBD exports: a disk served over the Network Block Device protocol (docs/nbd.md)
    #[command(subcommand)]
    Nbd(nbd::NbdCommand),
    /// Remote NBD exports attached as disks (any NBD server; docs/nbd.md)
    #[command(subcommand)]
    NbdClient(nbd_client::NbdClientCommand),
    /// ublk: disks as kernel block devices, /dev/ublkbN, surviving a daemon restart (docs/ublk.md)
    #[command(subcommand)]
    Ublk(ublk::UblkCommand),
    /// NVMe over TCP: subsystems, listeners, namespaces, allowed hosts (docs/nvmf.md)
    #[command(subcommand)]
    Nvmf(nvmf::NvmfCommand),
    /// NVMe controllers driven from user space (PCIe through VFIO, NVMe/TCP) as disks
    /// (docs/nvme.md)
    #[command(subcommand)]
    Nvme(nvme::NvmeCommand),
    /// Logical volumes: stores on a disk, thin volumes, snapshots, clones
    #[command(subcommand)]
    Volume(volume::VolumeCommand),
    /// Quality of service: per-disk limits, groups of disks sharing limits, weighted shares
    #[command(subcommand)]
    Qos(qos::QosCommand),
    /// Mirror jobs: copy a live disk to another (docs/mirror.md)
    #[command(subcommand)]
    Mirror(mirror::MirrorCommand),
    /// Dirty bitmaps: which blocks of a disk changed since a point (docs/backup.md)
    #[command(subcommand)]
    Bitmap(bitmap::BitmapCommand),
    /// Point-in-time views of a live disk, for backups (docs/backup.md)
    #[command(subcommand)]
    Fleece(fleece::FleeceCommand),
    /// Backups of live disks to object stores: jobs, stores, the backups they hold
    /// (docs/backup.md)
    #[command(subcommand)]
    Backup(backup::BackupCommand),
    /// Live restores: a disk that serves a backup at once while it is copied onto a local
    /// disk (docs/backup.md)
    #[command(subcommand)]
    Restore(restore::RestoreCommand),
    /// Raid bdevs: raid0, concat, and raid1 replicas with partial rebuild (docs/raid.md)
    #[command(subcommand)]
    Raid(raid::RaidCommand),
    /// Error disks: fail, hold, corrupt or refuse requests on demand, for tests (docs/error.md)
    #[command(subcommand)]
    Error(error::ErrorCommand),
    /// Encrypted disks (AES-XTS over another disk, readable by dm-crypt) and their keys
    /// (docs/crypto.md)
    #[command(subcommand)]
    Crypto(crypto::CryptoCommand),
    /// Ceph RBD: shared cluster connections for `disk create --type rbd --cluster`
    #[command(subcommand)]
    Rbd(rbd::RbdCommand),
    /// Reactors (polling cores)
    #[command(subcommand)]
    Reactor(reactor::ReactorCommand),
    /// The daemon's version
    Version,
    /// I/O counters and uptime, per disk and per controller
    Stats,
    /// Live per-disk IOPS, MB/s, latency and queue depth, and reactor load (q quits)
    Top,
    /// Call any JSON-RPC method, e.g. `flashpath rpc bdev_get_bdevs '{"name":"d0"}'`
    Rpc {
        /// Method name (`flashpath rpc rpc_get_methods` lists them)
        method: String,
        /// Parameters, a JSON object
        params: Option<String>,
    },
}

impl Cli {
    /// The command line of this process. Help and `--version` are printed and the process
    /// exits; a malformed command line is one line on stderr and exit status 2.
    pub fn parse_or_exit() -> Result<Cli, ExitCode> {
        Cli::try_parse().map_err(|e| match e.kind() {
            ErrorKind::DisplayHelp
            | ErrorKind::DisplayVersion
            | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => e.exit(),
            _ => {
                eprintln!("error: {}", args::one_line_usage_error(&e));
                ExitCode::from(2)
            }
        })
    }

    /// The log level asked for, and the one to use without `--log-level` or `RUST_LOG`: the
    /// daemon tells what it does, a client command only what went wrong.
    pub fn log_levels(&self) -> (Option<LevelFilter>, LevelFilter) {
        let default = match self.command {
            Command::Serve(_) => LevelFilter::Info,
            _ => LevelFilter::Warn,
        };
        (self.log_level, default)
    }

    /// Runs the command: the daemon, or a client command whose error is one line on stderr.
    pub fn run(self) -> ExitCode {
        if let Command::Serve(args) = self.command {
            return serve::run(args, self.rpc);
        }
        let rpc = self.rpc.unwrap_or_else(|| DEFAULT_RPC_SOCKET.into());
        match client(self.command, &rpc, self.json) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::from(e.exit_code())
            }
        }
    }
}

/// A client command: its calls to the daemon at `rpc`.
fn client(command: Command, rpc: &Path, json: bool) -> Result<(), CliError> {
    match command {
        Command::Serve(_) => unreachable!("serve is run by Cli::run, not as a client command"),
        Command::Disk(c) => disk::run(rpc, json, c),
        Command::Vhost(c) => vhost::run(rpc, json, c),
        Command::Nbd(c) => nbd::run(rpc, json, c),
        Command::NbdClient(c) => nbd_client::run(rpc, json, c),
        Command::Ublk(c) => ublk::run(rpc, json, c),
        Command::Nvmf(c) => nvmf::run(rpc, json, c),
        Command::Nvme(c) => nvme::run(rpc, json, c),
        Command::Volume(c) => volume::run(rpc, json, c),
        Command::Qos(c) => qos::run(rpc, json, c),
        Command::Mirror(c) => mirror::run(rpc, json, c),
        Command::Bitmap(c) => bitmap::run(rpc, json, c),
        Command::Restore(c) => restore::run(rpc, json, c),
        Command::Fleece(c) => fleece::run(rpc, json, c),
        Command::Backup(c) => backup::run(rpc, json, c),
        Command::Raid(c) => raid::run(rpc, json, c),
        Command::Error(c) => error::run(rpc, json, c),
        Command::Crypto(c) => crypto::run(rpc, json, c),
        Command::Rbd(c) => rbd::run(rpc, json, c),
        Command::Reactor(c) => reactor::run(rpc, json, c),
        Command::Version => rpc::version(rpc, json),
        Command::Stats => stats::run(rpc, json),
        Command::Top => top::run(rpc),
        Command::Rpc { method, params } => rpc::passthrough(rpc, &method, params),
    }
}
