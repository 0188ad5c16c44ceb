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
//! flashpath nbd start DISK NBD_DEVICE [--readonly] [--tls-cert F --tls-key F [--tls-ca F]] [--bitmap [BDEV/]NAME]...
//! flashpath nbd stop NBD_DEVICE | nbd list [NBD_DEVICE]
//! flashpath nvmf transport create [--max-queue-depth N] [--max-io-size BYTES] ... | transport list
//! flashpath nvmf subsystem create NQN [--serial SN] [--model MN] [--allow-any-host]
//!                                    [--max-namespaces N]
//! flashpath nvmf subsystem delete NQN | subsystem list [NQN]
//! flashpath nvmf listener add|remove NQN HOST:PORT | ns add NQN DISK [--nsid N] [--read-only]
//! flashpath nvmf ns remove NQN NSID | host add|remove NQN HOST_NQN | controllers|qpairs NQN
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
//! Global options: `--rpc PATH` (or `FLASHPATH_RPC`; default [`flashpath::DEFAULT_RPC_SOCKET`]) is the
//! socket `serve` listens on and the client commands talk to; `--json` prints raw RPC results
//! instead of tables; `--log-level` (or `RUST_LOG`).
//!
//! Errors are one line on stderr naming the offending option and what it accepts. Exit status:
//! 0 on success, 1 when the operation failed, 2 for a malformed command line.

use std::process::ExitCode;

use flashpath::cli::Cli;
use flashpath::logger;

fn main() -> ExitCode {
    let cli = match Cli::parse_or_exit() {
        Ok(cli) => cli,
        Err(code) => return code,
    };
    let (level, default) = cli.log_levels();
    logger::init(level, default);
    cli.run()
}
