//! `flashpath`: the daemon (`flashpath serve`) and its command-line client.
//!
//! ```text
//! flashpath serve [--cpus LIST] [--vhost-dir DIR] [--config FILE] [--idle-window-us N]
//!                 [--export-dir DIR]... [--metrics HOST:PORT|unix:PATH]
//! flashpath disk create --type null|ram|file --name N (--size SIZE | --num-blocks N)
//!                       [--block-size 512] [--path FILE] [--no-direct]
//! flashpath disk create --type rbd --pool P --image I [--cluster C] [--name N]
//!                       [--block-size 512] [--read-only]
//! flashpath disk list [NAME] | disk delete NAME | disk resize NAME --size SIZE
//! flashpath rbd cluster add NAME [--config-file F] [--key-file F] [--user-id U]
//!                           [--cpus LIST] [--param KEY=VALUE]...
//! flashpath rbd cluster remove NAME | rbd cluster list [NAME]
//! flashpath vhost create --name CTRL --disk NAME [--cpus LIST] [--readonly] [--queues N]
//! flashpath vhost list [NAME] | vhost delete NAME
//! flashpath nbd start DISK NBD_DEVICE [--readonly] [--tls-cert F --tls-key F [--tls-ca F]]
//! flashpath nbd stop NBD_DEVICE | nbd list [NBD_DEVICE]
//! flashpath volume create-store --disk NAME --name STORE [--cluster-size 4MiB] | stores
//! flashpath volume create STORE/NAME --size SIZE [--thin] | list [--store S] | delete VOL
//! flashpath volume snapshot VOL NAME | clone SNAP NAME | resize VOL --size SIZE
//! flashpath qos limit DISK [--iops N] [--mbps N] [--read-mbps N] [--write-mbps N]   (0 removes)
//! flashpath qos group create|set NAME [--iops-total N] [--iops-total-max N]
//!                        [--iops-total-max-length SECONDS] [--bps-read 100MiB] ...
//! flashpath qos group delete NAME | add NAME DISK [--weight W] | remove NAME DISK
//! flashpath qos group weight NAME DISK W | qos groups [NAME] | qos show [DISK]
//! flashpath reactor list | version | stats | top
//! flashpath rpc METHOD [JSON]
//! ```
//!
//! Global options: `--rpc PATH` (or `FLASHPATH_RPC`; default [`DEFAULT_RPC_SOCKET`]) is the
//! socket `serve` listens on and the client commands talk to; `--json` prints raw RPC results
//! instead of tables; `--log-level` (or `RUST_LOG`).
//!
//! Errors are one line on stderr naming the offending option and what it accepts. Exit status:
//! 0 on success, 1 when the operation failed, 2 for a malformed command line.

mod commands;
mod logger;
mod top;

use flashpath::{serve, size, DEFAULT_RPC_SOCKET};

use std::path::PathBuf;
use std::process::ExitCode;

use clap::error::{ContextKind, ContextValue, ErrorKind};
use clap::{Args, Parser, Subcommand, ValueEnum};
use log::LevelFilter;

#[derive(Debug, Parser)]
#[command(name = "flashpath", version, about = "A polled user-space vhost-user-blk storage target")]
struct Cli {
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
enum Command {
    /// Run the daemon
    Serve(ServeArgs),
    /// Block devices: create, list, delete
    #[command(subcommand)]
    Disk(DiskCommand),
    /// vhost-user-blk controllers: create, list, delete
    #[command(subcommand)]
    Vhost(VhostCommand),
    /// NBD exports: a disk served over the Network Block Device protocol (docs/nbd.md)
    #[command(subcommand)]
    Nbd(NbdCommand),
    /// Logical volumes: stores on a disk, thin volumes, snapshots, clones
    #[command(subcommand)]
    Volume(VolumeCommand),
    /// Quality of service: per-disk limits, groups of disks sharing limits, weighted shares
    #[command(subcommand)]
    Qos(QosCommand),
    /// Ceph RBD: shared cluster connections for `disk create --type rbd --cluster`
    #[command(subcommand)]
    Rbd(RbdCommand),
    /// Reactors (polling cores)
    #[command(subcommand)]
    Reactor(ReactorCommand),
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

#[derive(Debug, Args)]
struct ServeArgs {
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
}

/// The kinds of disk the CLI offers, named for people; each maps to one SPDK bdev type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum DiskType {
    /// Discards writes, reads leave buffers as they are (bdev type "null")
    Null,
    /// A RAM disk (bdev type "malloc")
    Ram,
    /// A file or block device through io_uring (bdev type "uring")
    File,
    /// A Ceph RBD image (bdev type "rbd")
    Rbd,
}

#[derive(Debug, Subcommand)]
enum DiskCommand {
    /// Create a disk
    Create(DiskCreateArgs),
    /// List disks (or show one)
    List { name: Option<String> },
    /// Delete a disk
    Delete { name: String },
    /// Change a disk's size (ram, null and rbd disks, volumes; an rbd image is resized too)
    Resize {
        name: String,
        /// The new size, e.g. 2G (K/M/G/T are powers of 1024)
        #[arg(long, value_parser = size::parse_size)]
        size: u64,
    },
}

#[derive(Debug, Args)]
struct DiskCreateArgs {
    /// What backs the disk
    #[arg(long = "type", value_enum, value_name = "TYPE")]
    kind: DiskType,
    #[arg(long, help = "Disk name [ram: default Malloc<N>; rbd: Ceph<N>]")]
    name: Option<String>,
    /// Size, e.g. 512MiB, 1G, 4096 (K/M/G/T are powers of 1024)
    #[arg(long, value_parser = size::parse_size, conflicts_with = "num_blocks")]
    size: Option<u64>,
    /// Size in blocks
    #[arg(long, value_name = "N", value_parser = u64_arg)]
    num_blocks: Option<u64>,
    /// Block size in bytes [default: 512; file: the device's logical block size]
    #[arg(long, value_name = "BYTES", value_parser = u32_arg)]
    block_size: Option<u32>,
    /// The backing file or block device (--type file)
    #[arg(long, value_name = "FILE")]
    path: Option<PathBuf>,
    /// Use the page cache instead of O_DIRECT (--type file)
    #[arg(long)]
    no_direct: bool,
    /// The Ceph pool that holds the image (--type rbd)
    #[arg(long, value_name = "POOL")]
    pool: Option<String>,
    /// The RBD image (--type rbd)
    #[arg(long, value_name = "IMAGE")]
    image: Option<String>,
    /// A cluster added with `rbd cluster add` (--type rbd) [default: a connection of the
    /// disk's own, from /etc/ceph/ceph.conf]
    #[arg(long, value_name = "NAME")]
    cluster: Option<String>,
    /// Open the image read-only (--type rbd)
    #[arg(long)]
    read_only: bool,
}

#[derive(Debug, Subcommand)]
enum VhostCommand {
    /// Export a disk as a vhost-user-blk socket
    Create(VhostCreateArgs),
    /// List controllers (or show one)
    List { name: Option<String> },
    /// Delete a controller (disconnects its VM)
    Delete { name: String },
}

#[derive(Debug, Args)]
struct VhostCreateArgs {
    /// Controller name; also the socket's file name in the vhost directory
    #[arg(long)]
    name: String,
    /// The disk to export
    #[arg(long)]
    disk: String,
    /// Reactor cores to run its queues on: "0-1", "0,2" or "0x3" [default: all]
    #[arg(long, value_name = "LIST")]
    cpus: Option<String>,
    /// Refuse writes
    #[arg(long)]
    readonly: bool,
    /// Most queues the guest may use, 1-64 [default: 64, spread over the cores]
    #[arg(long, value_name = "N", value_parser = u16_arg)]
    queues: Option<u16>,
}

#[derive(Debug, Subcommand)]
enum NbdCommand {
    /// Export a disk over NBD (SPDK's nbd_start_disk); prints NBD_DEVICE
    Start(NbdStartArgs),
    /// Stop an export (disconnects its clients)
    Stop {
        /// The export's NBD_DEVICE, as `nbd start` was given it
        nbd_device: String,
    },
    /// List exports (or show one)
    List { nbd_device: Option<String> },
}

#[derive(Debug, Args)]
struct NbdStartArgs {
    /// The disk to export; also the export's name unless NBD_DEVICE names one
    disk: String,
    /// Where to listen: a Unix socket path, nbd+unix:///NAME?socket=PATH, or
    /// nbd://HOST[:PORT][/NAME] (TCP, port 10809 by default)
    nbd_device: String,
    /// Refuse writes; the disk may then be shared with other read-only exports
    #[arg(long)]
    readonly: bool,
    /// Require TLS: the server's certificate (PEM); needs --tls-key
    #[arg(long, value_name = "FILE")]
    tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM)
    #[arg(long, value_name = "FILE")]
    tls_key: Option<PathBuf>,
    /// Require client certificates signed by this CA (PEM)
    #[arg(long, value_name = "FILE")]
    tls_ca: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
enum VolumeCommand {
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

#[derive(Debug, Subcommand)]
enum QosCommand {
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
struct QosLimitArgs {
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
enum QosGroupCommand {
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
struct QosGroupLimits {
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

#[derive(Debug, Subcommand)]
enum RbdCommand {
    /// Ceph clusters: one connection each, shared by the disks that name it
    #[command(subcommand)]
    Cluster(RbdClusterCommand),
}

#[derive(Debug, Subcommand)]
enum RbdClusterCommand {
    /// Connect to a cluster and keep the connection under NAME (SPDK's
    /// bdev_rbd_register_cluster)
    Add(RbdClusterAddArgs),
    /// Drop a cluster's connection (refused while a disk uses it)
    Remove { name: String },
    /// List clusters (or show one) and the disks on each
    List { name: Option<String> },
}

#[derive(Debug, Args)]
struct RbdClusterAddArgs {
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

#[derive(Debug, Subcommand)]
enum ReactorCommand {
    /// Per-reactor time split and sleep counts
    List,
}

/// Parses a whole number up to `max`, with a message that says what is accepted (clap's own
/// number errors do not).
fn bounded_number(s: &str, max: u64) -> Result<u64, String> {
    match s.trim().parse::<u64>() {
        Ok(n) if n <= max => Ok(n),
        _ => Err(format!("'{s}' is not a whole number between 0 and {max}")),
    }
}

fn u16_arg(s: &str) -> Result<u16, String> {
    bounded_number(s, u16::MAX.into()).map(|n| n as u16)
}

fn u32_arg(s: &str) -> Result<u32, String> {
    bounded_number(s, u32::MAX.into()).map(|n| n as u32)
}

fn u64_arg(s: &str) -> Result<u64, String> {
    bounded_number(s, u64::MAX)
}

/// Renders a clap error as one line: the option, the bad value and what is accepted.
fn one_line_usage_error(err: &clap::Error) -> String {
    let ctx = |kind| match err.get(kind) {
        Some(ContextValue::String(s)) => Some(s.clone()),
        Some(ContextValue::Strings(v)) => Some(v.join(", ")),
        Some(ContextValue::StyledStr(s)) => Some(s.to_string()),
        Some(ContextValue::StyledStrs(v)) => {
            Some(v.iter().map(|s| s.to_string()).collect::<Vec<_>>().join(", "))
        }
        _ => None,
    };
    // "--size <SIZE>" names the option; the value placeholder is noise here.
    let option = |kind| {
        ctx(kind)
            .map(|a| if a.starts_with('-') { a.split(' ').next().unwrap_or(&a).to_string() } else { a })
            .unwrap_or_default()
    };
    let arg = option(ContextKind::InvalidArg);
    let value = ctx(ContextKind::InvalidValue).unwrap_or_default();
    let detail = match err.kind() {
        ErrorKind::InvalidValue if value.is_empty() => Some(format!("{arg}: a value is required")),
        ErrorKind::InvalidValue => {
            let valid = ctx(ContextKind::ValidValue).unwrap_or_default();
            Some(format!("{arg}: '{value}' is not one of {valid}"))
        }
        ErrorKind::ValueValidation => {
            let why = std::error::Error::source(err).map(|s| s.to_string()).unwrap_or_default();
            // Our parsers quote the value themselves; clap's own (numbers) do not.
            if why.contains(&format!("'{value}'")) {
                Some(format!("{arg}: {why}"))
            } else {
                Some(format!("{arg}: '{value}': {why}"))
            }
        }
        ErrorKind::MissingRequiredArgument => Some(format!("missing required option {arg}")),
        ErrorKind::ArgumentConflict => {
            Some(format!("{arg} cannot be used with {}", option(ContextKind::PriorArg)))
        }
        ErrorKind::UnknownArgument => Some(match ctx(ContextKind::SuggestedArg) {
            Some(s) => format!("unknown option '{arg}' (did you mean '{s}'?)"),
            None => format!("unknown option '{arg}' (see --help)"),
        }),
        ErrorKind::InvalidSubcommand => {
            let cmd = ctx(ContextKind::InvalidSubcommand).unwrap_or_default();
            // Several close names ("grups": group, groups) are each quoted.
            let suggested = match err.get(ContextKind::SuggestedSubcommand) {
                Some(ContextValue::Strings(v)) => Some(v.join("' or '")),
                _ => ctx(ContextKind::SuggestedSubcommand),
            };
            Some(match suggested {
                Some(s) => format!("unknown command '{cmd}' (did you mean '{s}'?)"),
                None => format!("unknown command '{cmd}' (see --help)"),
            })
        }
        _ => None,
    };
    detail.unwrap_or_else(|| {
        // Anything else: clap's first line, which carries the gist.
        let text = err.render().to_string();
        text.lines().next().unwrap_or("invalid command line").trim_start_matches("error: ").to_string()
    })
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => match e.kind() {
            ErrorKind::DisplayHelp
            | ErrorKind::DisplayVersion
            | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => e.exit(),
            _ => {
                eprintln!("error: {}", one_line_usage_error(&e));
                return ExitCode::from(2);
            }
        },
    };
    match cli.command {
        Command::Serve(args) => {
            logger::init(cli.log_level, LevelFilter::Info);
            let opts = serve::ServeOptions {
                cpus: args.cpus,
                rpc: cli.rpc,
                vhost_dir: args.vhost_dir,
                config: args.config,
                idle_window_us: args.idle_window_us,
                export_dirs: (!args.export_dirs.is_empty()).then_some(args.export_dirs),
                metrics: args.metrics,
                no_iostat: args.no_iostat,
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
        command => {
            logger::init(cli.log_level, LevelFilter::Warn);
            let rpc = cli.rpc.unwrap_or_else(|| DEFAULT_RPC_SOCKET.into());
            match commands::run(command, &rpc, cli.json) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("error: {e}");
                    ExitCode::from(e.exit_code())
                }
            }
        }
    }
}
