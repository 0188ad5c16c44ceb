//! `nvme attach|detach|list|reset|set-keys|options|set-multipath-policy|io-paths`: NVMe
//! controllers driven by the daemon itself (PCIe through VFIO, NVMe/TCP) and the paths of
//! multipath ones, through SPDK's `bdev_nvme_*` methods (docs/nvme.md).

use std::path::Path;

use clap::{Args, Subcommand};
use serde_json::{json, Value};

use super::args::u32_arg;
use super::session::{cell, disks_with, out, print_json, set_given, table, CliError, Session};

#[derive(Debug, Subcommand)]
pub(crate) enum NvmeCommand {
    /// Attach a controller; prints the disks made of its namespaces (NAMEn1, ...)
    Attach(AttachArgs),
    /// Detach a controller: its disks are deleted (refused while one is in use)
    Detach {
        /// The controller's name
        name: String,
    },
    /// List controllers (or show one) and their disks
    List { name: Option<String> },
    /// Reset a controller; I/O in flight is retried once it is back
    Reset {
        /// The controller's name
        name: String,
    },
    /// Change a controller's DH-HMAC-CHAP keys: its queues authenticate again with them (SPDK's
    /// bdev_nvme_set_keys; a key left out is cleared)
    SetKeys(SetKeysArgs),
    /// Set the driver's options for controllers attached afterwards (SPDK's
    /// bdev_nvme_set_options; refused once a controller is attached)
    Options(OptionsArgs),
    /// Set how a multipath disk spreads its I/O over its paths (SPDK's
    /// bdev_nvme_set_multipath_policy)
    SetMultipathPolicy(PolicyArgs),
    /// List the paths of multipath disks (or of one) per reactor: which one I/O goes to,
    /// connected, accessible (SPDK's bdev_nvme_get_io_paths)
    IoPaths {
        /// The disk's name (e.g. Nvme0n1) [default: every multipath disk]
        name: Option<String>,
    },
}

/// The reconnect policy, shared by `attach` and `options`.
#[derive(Debug, Args)]
pub(crate) struct ReconnectArgs {
    /// After losing the controller, seconds to keep reconnecting before deleting it; -1
    /// forever [default: 0, no reconnect]
    #[arg(long, value_name = "SECONDS", allow_negative_numbers = true)]
    ctrlr_loss_timeout_sec: Option<i64>,
    /// Seconds between reconnect attempts [default: 0]
    #[arg(long, value_name = "SECONDS")]
    reconnect_delay_sec: Option<u64>,
    /// Seconds without the controller after which waiting I/O fails [default: 0, never]
    #[arg(long, value_name = "SECONDS")]
    fast_io_fail_timeout_sec: Option<u64>,
}

impl ReconnectArgs {
    fn add_to(&self, params: &mut Value) {
        set_given(params, "ctrlr_loss_timeout_sec", self.ctrlr_loss_timeout_sec);
        for (field, v) in [
            ("reconnect_delay_sec", self.reconnect_delay_sec),
            ("fast_io_fail_timeout_sec", self.fast_io_fail_timeout_sec),
        ] {
            if let Some(v) = v {
                params[field] = json!(v);
            }
        }
    }
}

#[derive(Debug, Args)]
pub(crate) struct AttachArgs {
    /// The controller's name, its disks' prefix (e.g. Nvme0 makes Nvme0n1)
    name: String,
    /// pcie or tcp
    #[arg(long, value_name = "TYPE")]
    trtype: String,
    /// PCIe: the function's address (0000:00:04.0); TCP: the target's IP address
    #[arg(long, value_name = "ADDRESS")]
    traddr: String,
    /// TCP: the target's port [default: 4420]
    #[arg(long, value_name = "PORT")]
    trsvcid: Option<String>,
    /// TCP: ipv4 or ipv6 [default: the address's]
    #[arg(long, value_name = "FAMILY")]
    adrfam: Option<String>,
    /// TCP: the subsystem's NQN
    #[arg(long, value_name = "NQN")]
    subnqn: Option<String>,
    /// TCP: this host's NQN [default: one per daemon]
    #[arg(long, value_name = "NQN")]
    hostnqn: Option<String>,
    /// TCP: header digests
    #[arg(long)]
    hdgst: bool,
    /// TCP: data digests
    #[arg(long)]
    ddgst: bool,
    /// TCP: what NAME already attached means: multipath adds this controller as another path
    /// of its disks, failover does too and makes their policy active_passive, disable refuses
    /// it [default: refused]
    #[arg(short = 'x', long, value_name = "MODE", value_parser = ["multipath", "failover", "disable"])]
    multipath: Option<String>,
    /// TCP: TLS 1.3 on every queue with the keyring's PSK (keyring_file_add_key; a file in
    /// the interchange format, NVMeTLSkey-1:...)
    #[arg(long, value_name = "KEY")]
    psk: Option<String>,
    #[command(flatten)]
    keys: DhchapArgs,
    #[command(flatten)]
    reconnect: ReconnectArgs,
}

#[derive(Debug, Args)]
pub(crate) struct PolicyArgs {
    /// The multipath disk's name (e.g. Nvme0n1)
    name: String,
    /// active_passive: I/O on one path, the next when it fails; active_active: on every
    /// usable path
    #[arg(short = 'p', long, value_name = "POLICY", value_parser = ["active_passive", "active_active"])]
    policy: String,
    /// active_active: how a path is chosen [default: round_robin]
    #[arg(short = 's', long, value_name = "SELECTOR", value_parser = ["round_robin", "queue_depth"])]
    selector: Option<String>,
    /// active_active round_robin: I/Os sent down a path before the next one [default: 1]
    #[arg(short = 'r', long, value_name = "N", value_parser = u32_arg)]
    rr_min_io: Option<u32>,
}

/// DH-HMAC-CHAP keys by their keyring names, shared by `attach` and `set-keys`.
#[derive(Debug, Args)]
pub(crate) struct DhchapArgs {
    /// TCP: the keyring's key (keyring_file_add_key) this host authenticates with
    #[arg(long, value_name = "KEY")]
    dhchap_key: Option<String>,
    /// TCP: the keyring's key the controller must prove it has (bidirectional; needs
    /// --dhchap-key)
    #[arg(long, value_name = "KEY")]
    dhchap_ctrlr_key: Option<String>,
}

impl DhchapArgs {
    fn add_to(&self, params: &mut Value) {
        set_given(params, "dhchap_key", self.dhchap_key.as_ref());
        set_given(params, "dhchap_ctrlr_key", self.dhchap_ctrlr_key.as_ref());
    }
}

#[derive(Debug, Args)]
pub(crate) struct SetKeysArgs {
    /// The controller's name
    name: String,
    #[command(flatten)]
    keys: DhchapArgs,
}

#[derive(Debug, Args)]
pub(crate) struct OptionsArgs {
    /// An I/O command's timeout in microseconds; 0 none [default: 0]
    #[arg(long, value_name = "US")]
    timeout_us: Option<u64>,
    /// An admin command's timeout in microseconds [default: --timeout-us]
    #[arg(long, value_name = "US")]
    timeout_admin_us: Option<u64>,
    /// What a timeout does: none, abort or reset [default: none]
    #[arg(long, value_name = "ACTION")]
    action_on_timeout: Option<String>,
    /// The keep-alive timeout asked of controllers in ms; 0 none [default: 10000]
    #[arg(long, value_name = "MS")]
    keep_alive_timeout_ms: Option<u64>,
    #[command(flatten)]
    reconnect: ReconnectArgs,
}

/// Parameters whose option is not `--` plus the parameter's name with dashes.
const NVME_FLAGS: &[(&str, &str)] = &[("name", "NAME")];

/// Parameters set by the option of the same name with dashes.
const NVME_DASHED: &[&str] = &[
    "trtype",
    "traddr",
    "trsvcid",
    "adrfam",
    "subnqn",
    "hostnqn",
    "hdgst",
    "ddgst",
    "dhchap_key",
    "dhchap_ctrlr_key",
    "psk",
    "ctrlr_loss_timeout_sec",
    "reconnect_delay_sec",
    "fast_io_fail_timeout_sec",
    "timeout_us",
    "timeout_admin_us",
    "action_on_timeout",
    "keep_alive_timeout_ms",
    "multipath",
    "policy",
    "selector",
    "rr_min_io",
];

fn session(rpc: &Path) -> Result<Session, CliError> {
    Ok(Session::connect(rpc, NVME_FLAGS)?.dashed(NVME_DASHED))
}

/// The `bdev_nvme_attach_controller` parameters of `a`.
fn attach_params(a: &AttachArgs) -> Value {
    let mut params = json!({ "name": a.name, "trtype": a.trtype, "traddr": a.traddr });
    for (field, v) in
        [("trsvcid", &a.trsvcid), ("adrfam", &a.adrfam), ("subnqn", &a.subnqn), ("hostnqn", &a.hostnqn)]
    {
        if let Some(v) = v {
            params[field] = json!(v);
        }
    }
    // Only when asked: a PCIe attach refuses the TCP fields, even false.
    if a.hdgst {
        params["hdgst"] = json!(true);
    }
    if a.ddgst {
        params["ddgst"] = json!(true);
    }
    set_given(&mut params, "multipath", a.multipath.as_ref());
    set_given(&mut params, "psk", a.psk.as_ref());
    a.keys.add_to(&mut params);
    a.reconnect.add_to(&mut params);
    params
}

/// The `bdev_nvme_set_multipath_policy` parameters of `a`.
fn policy_params(a: &PolicyArgs) -> Value {
    let mut params = json!({ "name": a.name, "policy": a.policy });
    set_given(&mut params, "selector", a.selector.as_ref());
    set_given(&mut params, "rr_min_io", a.rr_min_io);
    params
}

/// The `bdev_nvme_set_keys` parameters of `a`.
fn set_keys_params(a: &SetKeysArgs) -> Value {
    let mut params = json!({ "name": a.name });
    a.keys.add_to(&mut params);
    params
}

/// The `bdev_nvme_set_options` parameters of `a`.
fn options_params(a: &OptionsArgs) -> Value {
    let mut params = json!({});
    for (field, v) in [
        ("timeout_us", a.timeout_us),
        ("timeout_admin_us", a.timeout_admin_us),
        ("keep_alive_timeout_ms", a.keep_alive_timeout_ms),
    ] {
        if let Some(v) = v {
            params[field] = json!(v);
        }
    }
    set_given(&mut params, "action_on_timeout", a.action_on_timeout.as_ref());
    a.reconnect.add_to(&mut params);
    params
}

pub(crate) fn run(rpc: &Path, json: bool, cmd: NvmeCommand) -> Result<(), CliError> {
    match cmd {
        NvmeCommand::Attach(a) => {
            let names = session(rpc)?.call("bdev_nvme_attach_controller", Some(attach_params(&a)))?;
            if json {
                print_json(&names);
            } else {
                let list = names.as_array().ok_or_else(|| CliError::Unexpected {
                    method: "bdev_nvme_attach_controller",
                    result: names.clone(),
                })?;
                for n in list {
                    out(n.as_str().unwrap_or_default());
                }
            }
            Ok(())
        }
        NvmeCommand::Detach { name } => {
            call(rpc, json, "bdev_nvme_detach_controller", json!({ "name": name }))
        }
        NvmeCommand::Reset { name } => call(rpc, json, "bdev_nvme_reset_controller", json!({ "name": name })),
        NvmeCommand::SetKeys(a) => call(rpc, json, "bdev_nvme_set_keys", set_keys_params(&a)),
        NvmeCommand::Options(a) => call(rpc, json, "bdev_nvme_set_options", options_params(&a)),
        NvmeCommand::List { name } => list(rpc, json, name),
        NvmeCommand::SetMultipathPolicy(a) => {
            call(rpc, json, "bdev_nvme_set_multipath_policy", policy_params(&a))
        }
        NvmeCommand::IoPaths { name } => io_paths(rpc, json, name),
    }
}

/// Calls a method that answers `true`: prints nothing unless `--json`.
fn call(rpc: &Path, json: bool, method: &str, params: Value) -> Result<(), CliError> {
    let r = session(rpc)?.call(method, Some(params))?;
    if json {
        print_json(&r);
    }
    Ok(())
}

/// `ADDRESS:PORT` of a transport ID (`[ADDRESS]:PORT` for IPv6), or its address alone.
fn address(trid: &Value) -> String {
    match trid["trsvcid"].as_str() {
        Some(port) if trid["adrfam"] == "IPv6" => format!("[{}]:{port}", cell(trid, "traddr")),
        Some(port) => format!("{}:{port}", cell(trid, "traddr")),
        None => cell(trid, "traddr"),
    }
}

/// One row per path per reactor thread: the disk, the thread, the path's controller and
/// address, and whether I/O goes there now, it is connected and its ANA state lets I/O in.
fn io_paths(rpc: &Path, json: bool, name: Option<String>) -> Result<(), CliError> {
    let r = session(rpc)?.call("bdev_nvme_get_io_paths", name.map(|n| json!({ "name": n })))?;
    if json {
        print_json(&r);
        return Ok(());
    }
    let groups = r["poll_groups"]
        .as_array()
        .ok_or_else(|| CliError::Unexpected { method: "bdev_nvme_get_io_paths", result: r.clone() })?;
    let mut rows = Vec::new();
    for g in groups {
        for p in g["io_paths"].as_array().into_iter().flatten() {
            rows.push(vec![
                cell(p, "bdev_name"),
                cell(g, "thread"),
                cell(p, "cntlid"),
                address(&p["transport"]),
                cell(p, "current"),
                cell(p, "connected"),
                cell(p, "accessible"),
            ]);
        }
    }
    out(&table(&["DISK", "THREAD", "CNTLID", "ADDRESS", "CURRENT", "CONNECTED", "ACCESSIBLE"], &rows));
    Ok(())
}

/// One row per controller: its state, where it is, and its disks.
fn list(rpc: &Path, json: bool, name: Option<String>) -> Result<(), CliError> {
    let mut s = session(rpc)?;
    let ctrlrs = s.call("bdev_nvme_get_controllers", name.map(|n| json!({ "name": n })))?;
    if json {
        print_json(&ctrlrs);
        return Ok(());
    }
    let bdevs = s.call("bdev_get_bdevs", None)?;
    let rows: Vec<Vec<String>> = ctrlrs
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            let path = &c["ctrlrs"][0];
            let trid = &path["trid"];
            vec![
                cell(c, "name"),
                cell(path, "state"),
                cell(trid, "trtype"),
                address(trid),
                cell(trid, "subnqn"),
                cell(path, "cntlid"),
                disks_with(&bdevs, "nvme", "controller", &c["name"]),
            ]
        })
        .collect();
    out(&table(&["NAME", "STATE", "TRTYPE", "ADDRESS", "SUBNQN", "CNTLID", "DISKS"], &rows));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct T {
        #[command(subcommand)]
        cmd: NvmeCommand,
    }

    fn parse(args: &[&str]) -> NvmeCommand {
        T::try_parse_from([&["t"], args].concat()).unwrap().cmd
    }

    #[test]
    fn attach_options_become_spdks_parameters() {
        let NvmeCommand::Attach(a) = parse(&[
            "attach",
            "Nvme0",
            "--trtype",
            "tcp",
            "--traddr",
            "127.0.0.1",
            "--trsvcid",
            "4421",
            "--subnqn",
            "nqn.2016-06.io.spdk:cnode1",
            "--ddgst",
            "--dhchap-key",
            "host0",
            "--dhchap-ctrlr-key",
            "ctrl0",
            "--psk",
            "tls0",
            "--ctrlr-loss-timeout-sec",
            "-1",
            "--reconnect-delay-sec",
            "2",
        ]) else {
            panic!("not attach")
        };
        assert_eq!(
            attach_params(&a),
            json!({
                "name": "Nvme0", "trtype": "tcp", "traddr": "127.0.0.1", "trsvcid": "4421",
                "subnqn": "nqn.2016-06.io.spdk:cnode1", "ddgst": true,
                "dhchap_key": "host0", "dhchap_ctrlr_key": "ctrl0", "psk": "tls0",
                "ctrlr_loss_timeout_sec": -1, "reconnect_delay_sec": 2,
            })
        );
        let NvmeCommand::Attach(a) = parse(&["attach", "N", "--trtype", "pcie", "--traddr", "0000:00:04.0"])
        else {
            panic!("not attach")
        };
        assert_eq!(attach_params(&a), json!({"name": "N", "trtype": "pcie", "traddr": "0000:00:04.0"}));
    }

    #[test]
    fn multipath_options_become_spdks_parameters() {
        let NvmeCommand::Attach(a) =
            parse(&["attach", "Nvme0", "--trtype", "tcp", "--traddr", "127.0.0.1", "-x", "multipath"])
        else {
            panic!("not attach")
        };
        assert_eq!(
            attach_params(&a),
            json!({"name": "Nvme0", "trtype": "tcp", "traddr": "127.0.0.1", "multipath": "multipath"})
        );
        let NvmeCommand::Attach(a) =
            parse(&["attach", "Nvme0", "--trtype", "tcp", "--traddr", "::1", "--multipath", "failover"])
        else {
            panic!("not attach")
        };
        assert_eq!(attach_params(&a)["multipath"], "failover");
        let words = "set-multipath-policy Nvme0n1 -p active_active -s round_robin -r 8";
        let NvmeCommand::SetMultipathPolicy(a) = parse(&words.split(' ').collect::<Vec<_>>()) else {
            panic!("not set-multipath-policy")
        };
        assert_eq!(
            policy_params(&a),
            json!({"name": "Nvme0n1", "policy": "active_active", "selector": "round_robin", "rr_min_io": 8})
        );
        let NvmeCommand::SetMultipathPolicy(a) =
            parse(&["set-multipath-policy", "Nvme0n1", "--policy", "active_passive"])
        else {
            panic!("not set-multipath-policy")
        };
        assert_eq!(policy_params(&a), json!({"name": "Nvme0n1", "policy": "active_passive"}));
        let NvmeCommand::IoPaths { name } = parse(&["io-paths", "Nvme0n1"]) else { panic!("not io-paths") };
        assert_eq!(name.as_deref(), Some("Nvme0n1"));
        let NvmeCommand::IoPaths { name } = parse(&["io-paths"]) else { panic!("not io-paths") };
        assert_eq!(name, None);
    }

    #[test]
    fn set_keys_options_become_spdks_parameters() {
        let NvmeCommand::SetKeys(a) =
            parse(&["set-keys", "Nvme0", "--dhchap-key", "host1", "--dhchap-ctrlr-key", "ctrl1"])
        else {
            panic!("not set-keys")
        };
        assert_eq!(
            set_keys_params(&a),
            json!({"name": "Nvme0", "dhchap_key": "host1", "dhchap_ctrlr_key": "ctrl1"})
        );
        // No key: both are cleared, as SPDK's.
        let NvmeCommand::SetKeys(a) = parse(&["set-keys", "Nvme0"]) else { panic!("not set-keys") };
        assert_eq!(set_keys_params(&a), json!({"name": "Nvme0"}));
    }

    #[test]
    fn options_options_become_spdks_parameters() {
        let NvmeCommand::Options(a) = parse(&[
            "options",
            "--timeout-us",
            "1000000",
            "--action-on-timeout",
            "abort",
            "--keep-alive-timeout-ms",
            "0",
        ]) else {
            panic!("not options")
        };
        assert_eq!(
            options_params(&a),
            json!({"timeout_us": 1000000, "action_on_timeout": "abort", "keep_alive_timeout_ms": 0})
        );
    }
}
