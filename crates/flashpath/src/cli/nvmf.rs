//! `nvmf transport|subsystem|listener|ns|host|controllers|qpairs`: the NVMe over TCP target,
//! through SPDK's `nvmf_*` methods (docs/nvmf.md).

use std::path::Path;

use clap::{Args, Subcommand};
use serde_json::{json, Value};

use super::session::{cell, out, print_json, set_given, table, usage, CliError, Session};

#[derive(Debug, Subcommand)]
pub(crate) enum NvmfCommand {
    /// The TCP transport: create it (once, before any listener) or show it
    #[command(subcommand)]
    Transport(TransportCommand),
    /// Subsystems: create, delete, list
    #[command(subcommand)]
    Subsystem(SubsystemCommand),
    /// Addresses a subsystem listens on
    #[command(subcommand)]
    Listener(ListenerCommand),
    /// Namespaces: a disk served as a namespace of a subsystem
    #[command(subcommand)]
    Ns(NsCommand),
    /// Hosts (host NQNs) allowed to connect to a subsystem
    #[command(subcommand)]
    Host(HostCommand),
    /// The controllers connected to a subsystem
    Controllers {
        /// The subsystem's NQN
        nqn: String,
    },
    /// The queue pairs connected to a subsystem
    Qpairs {
        /// The subsystem's NQN
        nqn: String,
    },
}

#[derive(Debug, Subcommand)]
pub(crate) enum TransportCommand {
    /// Create the TCP transport (SPDK's nvmf_create_transport -t TCP)
    Create(TransportArgs),
    /// Show the transport and its settings
    List,
}

#[derive(Debug, Args)]
pub(crate) struct TransportArgs {
    /// Entries of each I/O queue [default: 128]
    #[arg(long, value_name = "N")]
    max_queue_depth: Option<u32>,
    /// Entries of the admin queue [default: 128]
    #[arg(long, value_name = "N")]
    max_aq_depth: Option<u32>,
    /// I/O queues a controller may have [default: 127]
    #[arg(long, value_name = "N")]
    max_io_qpairs: Option<u32>,
    /// Bytes of write data a command may carry in its capsule [default: 4096]
    #[arg(long, value_name = "BYTES")]
    in_capsule_data_size: Option<u32>,
    /// Largest transfer of one command in bytes [default: 131072]
    #[arg(long, value_name = "BYTES")]
    max_io_size: Option<u32>,
}

#[derive(Debug, Subcommand)]
pub(crate) enum SubsystemCommand {
    /// Create a subsystem (SPDK's nvmf_create_subsystem)
    Create(SubsystemArgs),
    /// Delete a subsystem: its hosts are disconnected, its disks released
    Delete {
        /// The subsystem's NQN
        nqn: String,
    },
    /// List subsystems (or show one)
    List { nqn: Option<String> },
}

#[derive(Debug, Args)]
pub(crate) struct SubsystemArgs {
    /// The subsystem's NQN, e.g. nqn.2016-06.io.spdk:cnode1
    nqn: String,
    /// Serial number its controllers report (at most 20 ASCII characters)
    #[arg(long, value_name = "SN")]
    serial: Option<String>,
    /// Model number its controllers report (at most 40 ASCII characters)
    #[arg(long, value_name = "MN")]
    model: Option<String>,
    /// Let any host connect (otherwise only those added with `nvmf host add`)
    #[arg(long)]
    allow_any_host: bool,
    /// Every host must authenticate (DH-HMAC-CHAP): only hosts added with --dhchap-key connect
    #[arg(long, conflicts_with = "allow_any_host")]
    require_dhchap: bool,
    /// Most namespaces it may hold [default: 32]
    #[arg(long, value_name = "N")]
    max_namespaces: Option<u32>,
}

#[derive(Debug, Subcommand)]
pub(crate) enum ListenerCommand {
    /// Listen on ADDRESS for a subsystem (nvmf_subsystem_add_listener)
    Add {
        /// The subsystem's NQN
        nqn: String,
        /// HOST:PORT, e.g. 127.0.0.1:4420 or [::1]:4420 (port 4420 when left out)
        address: String,
        /// TLS 1.3 only: the hosts added with --psk connect (SPDK's --secure-channel)
        #[arg(long)]
        secure_channel: bool,
    },
    /// Stop listening on ADDRESS for a subsystem: the hosts connected to it through ADDRESS
    /// are disconnected (nvmf_subsystem_remove_listener)
    Remove { nqn: String, address: String },
}

#[derive(Debug, Subcommand)]
pub(crate) enum NsCommand {
    /// Add DISK as a namespace of a subsystem; prints its namespace ID
    Add(NsAddArgs),
    /// Remove a namespace (its hosts are told; the disk is released)
    Remove {
        /// The subsystem's NQN
        nqn: String,
        /// The namespace ID
        nsid: u32,
    },
}

#[derive(Debug, Args)]
pub(crate) struct NsAddArgs {
    /// The subsystem's NQN
    nqn: String,
    /// The disk to serve
    disk: String,
    /// The namespace ID [default: the lowest free one]
    #[arg(long, value_name = "N")]
    nsid: Option<u32>,
    /// The namespace's UUID [default: the disk's]
    #[arg(long)]
    uuid: Option<String>,
    /// The namespace's NGUID, 32 hexadecimal digits
    #[arg(long)]
    nguid: Option<String>,
    /// The namespace's EUI-64, 16 hexadecimal digits
    #[arg(long)]
    eui64: Option<String>,
    /// Refuse writes; the disk may then be shared with other read-only exports
    #[arg(long)]
    read_only: bool,
}

#[derive(Debug, Subcommand)]
pub(crate) enum HostCommand {
    /// Allow HOST_NQN to connect to a subsystem
    Add(HostAddArgs),
    /// Disallow HOST_NQN (its controllers are disconnected)
    Remove { nqn: String, host_nqn: String },
}

#[derive(Debug, Args)]
pub(crate) struct HostAddArgs {
    /// The subsystem's NQN
    nqn: String,
    /// The host's NQN
    host_nqn: String,
    /// The keyring key (its name) the host must prove it holds (DH-HMAC-CHAP)
    #[arg(long, value_name = "KEY")]
    dhchap_key: Option<String>,
    /// The keyring key the controller proves it holds when the host asks (bidirectional)
    #[arg(long, value_name = "KEY", requires = "dhchap_key")]
    dhchap_ctrlr_key: Option<String>,
    /// The keyring key (its name) holding the host's TLS PSK in the interchange format: the
    /// host may connect through the subsystem's secure listeners
    #[arg(long, value_name = "KEY")]
    psk: Option<String>,
}

/// The nvmf methods' parameters and the options or arguments that set them.
const NVMF_FLAGS: &[(&str, &str)] = &[
    ("nqn", "NQN"),
    ("host", "HOST_NQN"),
    ("nsid", "NSID"),
    ("namespace.bdev_name", "DISK"),
    ("namespace.nsid", "--nsid"),
    ("namespace.uuid", "--uuid"),
    ("namespace.nguid", "--nguid"),
    ("namespace.eui64", "--eui64"),
    ("listen_address.traddr", "ADDRESS"),
    ("listen_address.trsvcid", "ADDRESS"),
    ("listen_address", "ADDRESS"),
    ("serial_number", "--serial"),
    ("model_number", "--model"),
    ("max_namespaces", "--max-namespaces"),
    ("require_dhchap", "--require-dhchap"),
    ("allow_any_host", "--allow-any-host"),
    ("dhchap_key", "--dhchap-key"),
    ("dhchap_ctrlr_key", "--dhchap-ctrlr-key"),
    ("psk", "--psk"),
    ("secure_channel", "--secure-channel"),
    ("max_queue_depth", "--max-queue-depth"),
    ("max_aq_depth", "--max-aq-depth"),
    ("max_io_qpairs_per_ctrlr", "--max-io-qpairs"),
    ("in_capsule_data_size", "--in-capsule-data-size"),
    ("max_io_size", "--max-io-size"),
];

/// The discovery subsystem's NQN (NVMe-oF 1.1, 7.2.1), as SPDK's rpc.py expands `discovery`.
const DISCOVERY_NQN: &str = "nqn.2014-08.org.nvmexpress.discovery";

/// The port NVMe/TCP hosts try when none is given (the IANA port for NVMe-oF over TCP).
const DEFAULT_PORT: &str = "4420";

/// `nvmf ...`.
pub(crate) fn run(rpc: &Path, json: bool, cmd: NvmfCommand) -> Result<(), CliError> {
    match cmd {
        NvmfCommand::Transport(TransportCommand::Create(a)) => {
            let mut params = json!({ "trtype": "TCP" });
            for (field, v) in [
                ("max_queue_depth", a.max_queue_depth),
                ("max_aq_depth", a.max_aq_depth),
                ("max_io_qpairs_per_ctrlr", a.max_io_qpairs),
                ("in_capsule_data_size", a.in_capsule_data_size),
                ("max_io_size", a.max_io_size),
            ] {
                if let Some(v) = v {
                    params[field] = json!(v);
                }
            }
            call(rpc, json, "nvmf_create_transport", params)
        }
        NvmfCommand::Transport(TransportCommand::List) => transport_list(rpc, json),
        NvmfCommand::Subsystem(SubsystemCommand::Create(a)) => {
            let mut params = json!({ "nqn": a.nqn, "allow_any_host": a.allow_any_host });
            if a.require_dhchap {
                params["require_dhchap"] = json!(true);
            }
            set_given(&mut params, "serial_number", a.serial);
            set_given(&mut params, "model_number", a.model);
            set_given(&mut params, "max_namespaces", a.max_namespaces);
            call(rpc, json, "nvmf_create_subsystem", params)
        }
        NvmfCommand::Subsystem(SubsystemCommand::Delete { nqn }) => {
            call(rpc, json, "nvmf_delete_subsystem", json!({ "nqn": nqn }))
        }
        NvmfCommand::Subsystem(SubsystemCommand::List { nqn }) => subsystem_list(rpc, json, nqn),
        NvmfCommand::Listener(ListenerCommand::Add { nqn, address, secure_channel }) => {
            let mut params =
                json!({ "nqn": subsystem_nqn(nqn), "listen_address": listen_address(&address)? });
            if secure_channel {
                params["secure_channel"] = json!(true);
            }
            call(rpc, json, "nvmf_subsystem_add_listener", params)
        }
        NvmfCommand::Listener(ListenerCommand::Remove { nqn, address }) => {
            let params = json!({ "nqn": subsystem_nqn(nqn), "listen_address": listen_address(&address)? });
            call(rpc, json, "nvmf_subsystem_remove_listener", params)
        }
        NvmfCommand::Ns(NsCommand::Add(a)) => ns_add(rpc, json, a),
        NvmfCommand::Ns(NsCommand::Remove { nqn, nsid }) => {
            call(rpc, json, "nvmf_subsystem_remove_ns", json!({ "nqn": nqn, "nsid": nsid }))
        }
        NvmfCommand::Host(HostCommand::Add(a)) => {
            let mut params = json!({ "nqn": a.nqn, "host": a.host_nqn });
            set_given(&mut params, "dhchap_key", a.dhchap_key);
            set_given(&mut params, "dhchap_ctrlr_key", a.dhchap_ctrlr_key);
            set_given(&mut params, "psk", a.psk);
            call(rpc, json, "nvmf_subsystem_add_host", params)
        }
        NvmfCommand::Host(HostCommand::Remove { nqn, host_nqn }) => {
            call(rpc, json, "nvmf_subsystem_remove_host", json!({ "nqn": nqn, "host": host_nqn }))
        }
        NvmfCommand::Controllers { nqn } => controllers(rpc, json, nqn),
        NvmfCommand::Qpairs { nqn } => qpairs(rpc, json, nqn),
    }
}

/// Calls a method that answers `true`: prints nothing unless `--json`.
fn call(rpc: &Path, json: bool, method: &str, params: Value) -> Result<(), CliError> {
    let r = Session::connect(rpc, NVMF_FLAGS)?.call(method, Some(params))?;
    if json {
        print_json(&r);
    }
    Ok(())
}

/// `discovery` stands for the discovery subsystem, as in SPDK's rpc.py.
fn subsystem_nqn(nqn: String) -> String {
    if nqn == "discovery" {
        DISCOVERY_NQN.into()
    } else {
        nqn
    }
}

/// `HOST:PORT`, `[V6]:PORT`, or a bare host (port 4420) as SPDK's `listen_address`.
fn listen_address(address: &str) -> Result<Value, CliError> {
    let bad =
        |why: &str| usage("ADDRESS", format!("'{address}' {why} (examples: 127.0.0.1:4420, [::1]:4420)"));
    let (host, port, adrfam) = if let Some(rest) = address.strip_prefix('[') {
        let (host, rest) = rest.split_once(']').ok_or_else(|| bad("has no closing ']'"))?;
        let port = match rest {
            "" => DEFAULT_PORT,
            p => p.strip_prefix(':').ok_or_else(|| bad("has text after ']' that is not :PORT"))?,
        };
        (host, port, "IPv6")
    } else if address.matches(':').count() > 1 {
        (address, DEFAULT_PORT, "IPv6")
    } else {
        match address.split_once(':') {
            Some((host, port)) => (host, port, "IPv4"),
            None => (address, DEFAULT_PORT, "IPv4"),
        }
    };
    if host.is_empty() {
        return Err(bad("has no host"));
    }
    if port.parse::<u16>().map_or(true, |p| p == 0) {
        return Err(bad("has no port from 1 to 65535"));
    }
    Ok(json!({ "trtype": "TCP", "adrfam": adrfam, "traddr": host, "trsvcid": port }))
}

fn ns_add(rpc: &Path, json: bool, a: NsAddArgs) -> Result<(), CliError> {
    let mut ns = json!({ "bdev_name": a.disk });
    if let Some(n) = a.nsid {
        if n == 0 {
            return Err(usage("--nsid", "must be 1 or more"));
        }
        ns["nsid"] = json!(n);
    }
    for (field, v) in [("uuid", a.uuid), ("nguid", a.nguid), ("eui64", a.eui64)] {
        if let Some(v) = v {
            ns[field] = json!(v);
        }
    }
    if a.read_only {
        ns["read_only"] = json!(true);
    }
    let params = json!({ "nqn": a.nqn, "namespace": ns });
    let r = Session::connect(rpc, NVMF_FLAGS)?.call("nvmf_subsystem_add_ns", Some(params))?;
    if json {
        print_json(&r);
    } else {
        out(&r.to_string());
    }
    Ok(())
}

/// Calls a listing method and returns its array, or prints it raw with `--json`.
fn list(
    rpc: &Path,
    json: bool,
    method: &'static str,
    params: Option<Value>,
) -> Result<Option<Vec<Value>>, CliError> {
    let r = Session::connect(rpc, NVMF_FLAGS)?.call(method, params)?;
    if json {
        print_json(&r);
        return Ok(None);
    }
    match r {
        Value::Array(items) => Ok(Some(items)),
        other => Err(CliError::Unexpected { method, result: other }),
    }
}

fn transport_list(rpc: &Path, json: bool) -> Result<(), CliError> {
    let Some(items) = list(rpc, json, "nvmf_get_transports", None)? else { return Ok(()) };
    let rows: Vec<Vec<String>> = items
        .iter()
        .map(|t| {
            vec![
                cell(t, "trtype"),
                cell(t, "max_queue_depth"),
                cell(t, "max_aq_depth"),
                cell(t, "max_io_qpairs_per_ctrlr"),
                cell(t, "in_capsule_data_size"),
                cell(t, "max_io_size"),
            ]
        })
        .collect();
    out(&table(&["TYPE", "QUEUE_DEPTH", "ADMIN_DEPTH", "IO_QPAIRS", "IN_CAPSULE", "MAX_IO"], &rows));
    Ok(())
}

/// `traddr:trsvcid` (IPv6 in brackets).
fn address_text(a: &Value) -> String {
    let host = cell(a, "traddr");
    let host = if host.contains(':') { format!("[{host}]") } else { host };
    format!("{host}:{}", cell(a, "trsvcid"))
}

/// A list as one cell: comma-separated, "-" when empty.
fn joined(items: impl Iterator<Item = String>) -> String {
    let all: Vec<String> = items.collect();
    if all.is_empty() {
        "-".into()
    } else {
        all.join(",")
    }
}

fn subsystem_list(rpc: &Path, json: bool, nqn: Option<String>) -> Result<(), CliError> {
    let params = nqn.map(|n| json!({ "nqn": subsystem_nqn(n) }));
    let Some(items) = list(rpc, json, "nvmf_get_subsystems", params)? else { return Ok(()) };
    let empty = Vec::new();
    let arr = |v: &Value| v.as_array().unwrap_or(&empty).clone();
    let rows: Vec<Vec<String>> = items
        .iter()
        .map(|s| {
            let hosts = if s["allow_any_host"].as_bool() == Some(true) {
                "any".to_string()
            } else {
                joined(arr(&s["hosts"]).iter().map(|h| cell(h, "nqn")))
            };
            let namespaces = joined(
                arr(&s["namespaces"]).iter().map(|n| format!("{}={}", cell(n, "nsid"), cell(n, "bdev_name"))),
            );
            vec![
                cell(s, "nqn"),
                cell(s, "subtype"),
                joined(arr(&s["listen_addresses"]).iter().map(|a| {
                    let tls = if a["secure_channel"] == json!(true) { "(tls)" } else { "" };
                    format!("{}{tls}", address_text(a))
                })),
                hosts,
                namespaces,
            ]
        })
        .collect();
    out(&table(&["NQN", "TYPE", "LISTENERS", "HOSTS", "NAMESPACES"], &rows));
    Ok(())
}

fn controllers(rpc: &Path, json: bool, nqn: String) -> Result<(), CliError> {
    let params = Some(json!({ "nqn": subsystem_nqn(nqn) }));
    let Some(items) = list(rpc, json, "nvmf_subsystem_get_controllers", params)? else { return Ok(()) };
    let rows: Vec<Vec<String>> = items
        .iter()
        .map(|c| vec![cell(c, "cntlid"), cell(c, "hostnqn"), cell(c, "hostid"), cell(c, "num_io_qpairs")])
        .collect();
    out(&table(&["CNTLID", "HOST_NQN", "HOST_ID", "IO_QPAIRS"], &rows));
    Ok(())
}

fn qpairs(rpc: &Path, json: bool, nqn: String) -> Result<(), CliError> {
    let params = Some(json!({ "nqn": subsystem_nqn(nqn) }));
    let Some(items) = list(rpc, json, "nvmf_subsystem_get_qpairs", params)? else { return Ok(()) };
    let rows: Vec<Vec<String>> = items
        .iter()
        .map(|q| {
            vec![cell(q, "cntlid"), cell(q, "qid"), cell(q, "state"), address_text(&q["listen_address"])]
        })
        .collect();
    out(&table(&["CNTLID", "QID", "STATE", "LISTENER"], &rows));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_parse_to_spdk_listen_addresses() {
        let a = listen_address("127.0.0.1:4421").unwrap();
        assert_eq!(a, json!({"trtype": "TCP", "adrfam": "IPv4", "traddr": "127.0.0.1", "trsvcid": "4421"}));
        assert_eq!(listen_address("127.0.0.1").unwrap()["trsvcid"], "4420");
        let v6 = listen_address("[::1]:4430").unwrap();
        assert_eq!(
            (v6["adrfam"].as_str(), v6["traddr"].as_str(), v6["trsvcid"].as_str()),
            (Some("IPv6"), Some("::1"), Some("4430"))
        );
        assert_eq!(listen_address("::1").unwrap()["traddr"], "::1");
        for bad in ["127.0.0.1:0", "127.0.0.1:x", ":4420", "[::1", "[::1]x"] {
            let e = listen_address(bad).unwrap_err().to_string();
            assert!(e.starts_with(&format!("ADDRESS: '{bad}' ")), "{bad}: {e}");
        }
        assert_eq!(address_text(&v6), "[::1]:4430");
    }
}
