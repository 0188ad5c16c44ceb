//! The client commands: each turns its options into one or two JSON-RPC calls and prints the
//! result as a table (or, with `--json`, as the raw result).
//!
//! Validation is the daemon's: the CLI only checks what it must to build the request (which
//! options go with which disk type, size arithmetic). When the daemon rejects a parameter, the
//! message is reworded to name the option the user typed (`--block-size`, not `block_size`).

use std::io::Write;
use std::path::Path;
use std::time::Duration;

use fp_rpc::{codes, RpcClient, RpcClientError};
use serde_json::{json, Map, Value};

use crate::{
    Command, DiskCommand, DiskCreateArgs, DiskType, NbdCommand, NbdStartArgs, QosCommand, QosGroupCommand,
    QosGroupLimits, QosLimitArgs, RbdClusterAddArgs, RbdClusterCommand, RbdCommand, ReactorCommand,
    VhostCommand, VhostCreateArgs, VolumeCommand,
};
use flashpath::size::format_size;
use fp_registry::THROTTLE_FIELDS;

/// How long a command waits for the daemon. Generous: deleting a controller waits for its
/// queues to drain.
const CALL_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// The options do not make a valid request.
    #[error("{flag}: {reason}")]
    Usage { flag: &'static str, reason: String },
    #[error("{0}; is `flashpath serve` running? (--rpc PATH or FLASHPATH_RPC selects the socket)")]
    Connect(RpcClientError),
    #[error("{0}")]
    Rpc(RpcClientError),
    /// The daemon refused the call (`rpc` passthrough shows the code too).
    #[error("{message}")]
    Refused { message: String },
    #[error("unexpected result from {method}: {result}")]
    Unexpected { method: &'static str, result: Value },
    #[error("terminal: {0} (flashpath top needs an interactive terminal)")]
    Terminal(#[source] std::io::Error),
}

impl CliError {
    pub fn exit_code(&self) -> u8 {
        match self {
            CliError::Usage { .. } => 2,
            _ => 1,
        }
    }
}

fn usage(flag: &'static str, reason: impl Into<String>) -> CliError {
    CliError::Usage { flag, reason: reason.into() }
}

/// One connection to the daemon, and how to word its parameter errors for this command.
pub(crate) struct Session {
    client: RpcClient,
    /// RPC parameter name → the option that sets it.
    flags: &'static [(&'static str, &'static str)],
    /// Parameters set by the option of the same name with dashes (`iops_total_max` by
    /// `--iops-total-max`).
    dashed: &'static [&'static str],
}

impl Session {
    pub(crate) fn connect(
        rpc: &Path,
        flags: &'static [(&'static str, &'static str)],
    ) -> Result<Session, CliError> {
        let mut client = RpcClient::connect(rpc).map_err(CliError::Connect)?;
        client.set_timeout(Some(CALL_TIMEOUT)).map_err(CliError::Rpc)?;
        Ok(Session { client, flags, dashed: &[] })
    }

    /// Words errors about any of `fields` as about the option of the same name with dashes.
    fn dashed(mut self, fields: &'static [&'static str]) -> Session {
        self.dashed = fields;
        self
    }

    pub(crate) fn call(&mut self, method: &str, params: Option<Value>) -> Result<Value, CliError> {
        self.client.call(method, params).map_err(|e| match e {
            RpcClientError::Rpc(err) => {
                let mut message = err.message;
                // Invalid parameters, and refusals about one (a path outside the export
                // directories, -EACCES), start with the field: name the option instead.
                if err.code == codes::INVALID_PARAMS || err.code == -13 {
                    let named = |field: &str| message.starts_with(&format!("{field}: "));
                    if let Some((field, flag)) = self.flags.iter().find(|(field, _)| named(field)) {
                        message = format!("{flag}{}", &message[field.len()..]);
                    } else if let Some(field) = self.dashed.iter().find(|field| named(field)) {
                        message = format!("--{}{}", field.replace('_', "-"), &message[field.len()..]);
                    }
                }
                CliError::Refused { message }
            }
            other => CliError::Rpc(other),
        })
    }
}

/// Writes to stdout, ignoring a closed pipe (`flashpath disk list | head -1`).
fn out(text: &str) {
    let mut stdout = std::io::stdout().lock();
    let _ = stdout.write_all(text.as_bytes()).and_then(|_| stdout.write_all(b"\n"));
}

fn print_json(v: &Value) {
    out(&serde_json::to_string_pretty(v).expect("a JSON value always serialises"));
}

/// Left-aligned columns two spaces apart, no borders (comfy-table's `NOTHING` preset); the
/// last column is not padded.
fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut t = comfy_table::Table::new();
    t.load_preset(comfy_table::presets::NOTHING)
        .set_content_arrangement(comfy_table::ContentArrangement::Disabled)
        .set_header(headers.iter().copied())
        .add_rows(rows.iter().cloned());
    for column in t.column_iter_mut() {
        column.set_padding((0, 2));
    }
    t.lines().map(|l| l.trim_end().to_string()).collect::<Vec<_>>().join("\n")
}

/// A JSON field as table text: strings bare, numbers and booleans as written, absent as "-".
fn cell(v: &Value, key: &str) -> String {
    match v.get(key) {
        None | Some(Value::Null) => "-".into(),
        Some(Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
    }
}

/// A JSON boolean as table text: "yes" when true, "no" otherwise.
fn yes_no(v: &Value) -> String {
    if v.as_bool() == Some(true) { "yes" } else { "no" }.to_string()
}

fn u64_field(v: &Value, key: &str) -> u64 {
    v.get(key).and_then(Value::as_u64).unwrap_or(0)
}

/// The bdev's driver: the one key of its `driver_specific` object.
fn driver_of(bdev: &Value) -> Option<&str> {
    bdev.get("driver_specific")?.as_object()?.keys().next().map(String::as_str)
}

/// The CLI's name for a driver.
fn disk_type_name(driver: &str) -> &str {
    match driver {
        "malloc" => "ram",
        "uring" => "file",
        other => other,
    }
}

fn seconds(ns: u64) -> String {
    format!("{:.3}s", ns as f64 / 1e9)
}

pub fn run(command: Command, rpc: &Path, json: bool) -> Result<(), CliError> {
    match command {
        Command::Serve(_) => unreachable!("serve is run by main, not as a client command"),
        Command::Disk(DiskCommand::Create(args)) => disk_create(rpc, json, args),
        Command::Disk(DiskCommand::List { name }) => disk_list(rpc, json, name),
        Command::Disk(DiskCommand::Delete { name }) => disk_delete(rpc, json, &name),
        Command::Disk(DiskCommand::Resize { name, size }) => disk_resize(rpc, json, &name, size),
        Command::Vhost(VhostCommand::Create(args)) => vhost_create(rpc, json, args),
        Command::Vhost(VhostCommand::List { name }) => vhost_list(rpc, json, name),
        Command::Vhost(VhostCommand::Delete { name }) => {
            let mut s = Session::connect(rpc, &[("ctrlr", "NAME")])?;
            let r = s.call("vhost_delete_controller", Some(json!({ "ctrlr": name })))?;
            if json {
                print_json(&r);
            }
            Ok(())
        }
        Command::Nbd(n) => nbd(rpc, json, n),
        Command::Volume(v) => volume(rpc, json, v),
        Command::Qos(q) => qos(rpc, json, q),
        Command::Rbd(RbdCommand::Cluster(c)) => rbd_cluster(rpc, json, c),
        Command::Reactor(ReactorCommand::List) => reactor_list(rpc, json),
        Command::Version => {
            let v = Session::connect(rpc, &[])?.call("spdk_get_version", None)?;
            match v.get("version").and_then(Value::as_str) {
                _ if json => print_json(&v),
                Some(version) => out(version),
                None => return Err(CliError::Unexpected { method: "spdk_get_version", result: v }),
            }
            Ok(())
        }
        Command::Stats => stats(rpc, json),
        Command::Top => crate::top::run(rpc),
        Command::Rpc { method, params } => {
            let params = params
                .map(|text| serde_json::from_str::<Value>(&text))
                .transpose()
                .map_err(|e| usage("PARAMS", format!("not valid JSON: {e}")))?;
            let mut client = RpcClient::connect(rpc).map_err(CliError::Connect)?;
            client.set_timeout(Some(CALL_TIMEOUT)).map_err(CliError::Rpc)?;
            match client.call(&method, params) {
                Ok(v) => {
                    print_json(&v);
                    Ok(())
                }
                Err(RpcClientError::Rpc(e)) => Err(CliError::Refused { message: e.to_string() }),
                Err(e) => Err(CliError::Rpc(e)),
            }
        }
    }
}

/// The options only `--type rbd` takes, as (given, option).
fn rbd_options(a: &DiskCreateArgs) -> [(bool, &'static str); 4] {
    [
        (a.pool.is_some(), "--pool"),
        (a.image.is_some(), "--image"),
        (a.cluster.is_some(), "--cluster"),
        (a.read_only, "--read-only"),
    ]
}

fn disk_create(rpc: &Path, json: bool, a: DiskCreateArgs) -> Result<(), CliError> {
    if a.kind != DiskType::Rbd {
        if let Some((_, flag)) = rbd_options(&a).iter().find(|(given, _)| *given) {
            return Err(usage(flag, "only used with --type rbd"));
        }
    }
    let mut params = Map::new();
    let method = match a.kind {
        DiskType::Null | DiskType::Ram => {
            let kind = if a.kind == DiskType::Null { "null" } else { "ram" };
            if a.path.is_some() {
                return Err(usage("--path", "only used with --type file"));
            }
            if a.no_direct {
                return Err(usage("--no-direct", "only used with --type file"));
            }
            let block_size = a.block_size.unwrap_or(512);
            let num_blocks = match (a.size, a.num_blocks) {
                (_, Some(n)) => n,
                (Some(size), None) if block_size != 0 && size % u64::from(block_size) == 0 => {
                    size / u64::from(block_size)
                }
                (Some(size), None) => {
                    return Err(usage(
                        "--size",
                        format!("{size} bytes is not a whole number of {block_size}-byte blocks"),
                    ))
                }
                (None, None) => {
                    return Err(usage("--size", format!("required for --type {kind} (or --num-blocks)")))
                }
            };
            match (&a.name, a.kind) {
                (Some(name), _) => {
                    params.insert("name".into(), json!(name));
                }
                (None, DiskType::Null) => return Err(usage("--name", "required for --type null")),
                // RAM disks without a name get SPDK's Malloc<N>.
                (None, _) => {}
            }
            params.insert("num_blocks".into(), json!(num_blocks));
            params.insert("block_size".into(), json!(block_size));
            if a.kind == DiskType::Null {
                "bdev_null_create"
            } else {
                "bdev_malloc_create"
            }
        }
        DiskType::File => {
            if a.size.is_some() {
                return Err(usage("--size", "not used with --type file: the disk has the file's size"));
            }
            if a.num_blocks.is_some() {
                return Err(usage("--num-blocks", "not used with --type file: the disk has the file's size"));
            }
            let name = a.name.ok_or_else(|| usage("--name", "required for --type file"))?;
            let path = a.path.ok_or_else(|| usage("--path", "required for --type file"))?;
            // The daemon resolves relative paths against its own working directory, not ours.
            let path = std::path::absolute(&path).unwrap_or(path);
            params.insert("name".into(), json!(name));
            params.insert("filename".into(), json!(path));
            if let Some(bs) = a.block_size {
                params.insert("block_size".into(), json!(bs));
            }
            params.insert("direct".into(), json!(!a.no_direct));
            "bdev_uring_create"
        }
        DiskType::Rbd => return rbd_disk_create(rpc, json, a),
    };
    // num_blocks is what the user wrote as --size or as --num-blocks.
    let flags: &'static [(&str, &str)] = if a.size.is_some() {
        &[
            ("name", "--name"),
            ("num_blocks", "--size"),
            ("block_size", "--block-size"),
            ("filename", "--path"),
        ]
    } else {
        &[
            ("name", "--name"),
            ("num_blocks", "--num-blocks"),
            ("block_size", "--block-size"),
            ("filename", "--path"),
        ]
    };
    let name = Session::connect(rpc, flags)?.call(method, Some(Value::Object(params)))?;
    if json {
        print_json(&name);
    } else {
        out(name.as_str().unwrap_or_default());
    }
    Ok(())
}

/// `disk create --type rbd`: `bdev_rbd_create` on a registered cluster (`--cluster`) or on a
/// connection of the disk's own (the daemon's /etc/ceph/ceph.conf).
fn rbd_disk_create(rpc: &Path, json: bool, a: DiskCreateArgs) -> Result<(), CliError> {
    let sized = "not used with --type rbd: the disk has the image's size (disk resize changes it)";
    if a.size.is_some() {
        return Err(usage("--size", sized));
    }
    if a.num_blocks.is_some() {
        return Err(usage("--num-blocks", sized));
    }
    if a.path.is_some() {
        return Err(usage("--path", "only used with --type file"));
    }
    if a.no_direct {
        return Err(usage("--no-direct", "only used with --type file"));
    }
    let pool = a.pool.ok_or_else(|| usage("--pool", "required for --type rbd"))?;
    let image = a.image.ok_or_else(|| usage("--image", "required for --type rbd"))?;
    let mut params = json!({ "pool_name": pool, "rbd_name": image });
    // Without a name the daemon picks SPDK's Ceph<N>.
    if let Some(name) = a.name {
        params["name"] = json!(name);
    }
    if let Some(cluster) = a.cluster {
        params["cluster_name"] = json!(cluster);
    }
    if let Some(bs) = a.block_size {
        params["block_size"] = json!(bs);
    }
    if a.read_only {
        params["read_only"] = json!(true);
    }
    let flags = &[
        ("name", "--name"),
        ("pool_name", "--pool"),
        ("rbd_name", "--image"),
        ("cluster_name", "--cluster"),
        ("block_size", "--block-size"),
    ];
    one_call(rpc, json, flags, "bdev_rbd_create", params)
}

/// Calls a listing method (`bdev_get_bdevs`, `vhost_get_controllers`), optionally for one name.
/// With `--json` it prints the result and returns `None`; otherwise it returns the entries for
/// a table.
fn fetch_list(
    rpc: &Path,
    json: bool,
    method: &'static str,
    name: Option<String>,
) -> Result<Option<Vec<Value>>, CliError> {
    let params = name.map(|n| json!({ "name": n }));
    let result = Session::connect(rpc, &[("name", "NAME")])?.call(method, params)?;
    if json {
        print_json(&result);
        return Ok(None);
    }
    match result {
        Value::Array(list) => Ok(Some(list)),
        other => Err(CliError::Unexpected { method, result: other }),
    }
}

fn disk_list(rpc: &Path, json: bool, name: Option<String>) -> Result<(), CliError> {
    let Some(list) = fetch_list(rpc, json, "bdev_get_bdevs", name)? else { return Ok(()) };
    let rows: Vec<Vec<String>> = list
        .iter()
        .map(|b| {
            let driver = driver_of(b).unwrap_or("-");
            let detail = b["driver_specific"][driver]
                .as_object()
                .map(|m| {
                    m.iter().map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or(&v.to_string()))).collect()
                })
                .unwrap_or_else(Vec::new)
                .join(" ");
            let size = u64_field(b, "block_size").saturating_mul(u64_field(b, "num_blocks"));
            vec![
                cell(b, "name"),
                disk_type_name(driver).to_string(),
                format_size(size),
                cell(b, "block_size"),
                cell(b, "num_blocks"),
                cell(b, "claimed_by"),
                detail,
            ]
        })
        .collect();
    out(&table(&["NAME", "TYPE", "SIZE", "BLOCK", "BLOCKS", "USED BY", "DETAIL"], &rows));
    Ok(())
}

fn disk_delete(rpc: &Path, json: bool, name: &str) -> Result<(), CliError> {
    let mut s = Session::connect(rpc, &[("name", "NAME")])?;
    let found = s.call("bdev_get_bdevs", Some(json!({ "name": name })))?;
    let driver = found
        .get(0)
        .and_then(driver_of)
        .ok_or_else(|| CliError::Unexpected { method: "bdev_get_bdevs", result: found.clone() })?;
    let r = s.call(&format!("bdev_{driver}_delete"), Some(json!({ "name": name })))?;
    if json {
        print_json(&r);
    }
    Ok(())
}

/// `disk resize`: the resize method of the disk's module. Sizes go in MiB when whole (SPDK's
/// `new_size`), else in bytes (flashpath's `new_size_bytes`).
fn disk_resize(rpc: &Path, json: bool, name: &str, size: u64) -> Result<(), CliError> {
    let mut s = Session::connect(
        rpc,
        &[("name", "NAME"), ("new_size", "--size"), ("new_size_bytes", "--size"), ("size_in_mib", "--size")],
    )?;
    let found = s.call("bdev_get_bdevs", Some(json!({ "name": name })))?;
    let driver = found
        .get(0)
        .and_then(driver_of)
        .ok_or_else(|| CliError::Unexpected { method: "bdev_get_bdevs", result: found.clone() })?;
    let (method, params) = match driver {
        "lvol" => ("bdev_lvol_resize".to_string(), json!({ "name": name, "size_in_mib": whole_mib(size)? })),
        "null" | "malloc" | "rbd" if size % MIB == 0 => {
            (format!("bdev_{driver}_resize"), json!({ "name": name, "new_size": size / MIB }))
        }
        "null" | "malloc" | "rbd" => {
            (format!("bdev_{driver}_resize"), json!({ "name": name, "new_size_bytes": size }))
        }
        "uring" => {
            return Err(CliError::Refused {
                message: format!(
                    "disk '{name}' is a file disk, which has its file's size: grow the file, then \
                     run `flashpath rpc bdev_uring_rescan '{{\"name\": \"{name}\"}}'`"
                ),
            })
        }
        other => {
            let kind = disk_type_name(other);
            return Err(CliError::Refused {
                message: format!("disk '{name}' is a {kind} disk, which cannot be resized"),
            });
        }
    };
    let r = s.call(&method, Some(params))?;
    if json {
        print_json(&r);
    }
    Ok(())
}

/// `rbd cluster add|remove|list`.
fn rbd_cluster(rpc: &Path, json: bool, cmd: RbdClusterCommand) -> Result<(), CliError> {
    match cmd {
        RbdClusterCommand::Add(a) => rbd_cluster_add(rpc, json, a),
        RbdClusterCommand::Remove { name } => {
            one_call(rpc, json, &[("name", "NAME")], "bdev_rbd_unregister_cluster", json!({ "name": name }))
        }
        RbdClusterCommand::List { name } => rbd_cluster_list(rpc, json, name),
    }
}

fn rbd_cluster_add(rpc: &Path, json: bool, a: RbdClusterAddArgs) -> Result<(), CliError> {
    let mut config_param = Map::new();
    for (key, value) in a.params {
        if config_param.insert(key.clone(), json!(value)).is_some() {
            return Err(usage("--param", format!("{key} given twice")));
        }
    }
    let mut params = json!({ "name": a.name });
    // The daemon resolves relative paths against its own working directory, not ours.
    let absolute = |p: std::path::PathBuf| std::path::absolute(&p).unwrap_or(p);
    if let Some(f) = a.config_file {
        params["config_file"] = json!(absolute(f));
    }
    if let Some(f) = a.key_file {
        params["key_file"] = json!(absolute(f));
    }
    if let Some(u) = a.user_id {
        params["user_id"] = json!(u);
    }
    if let Some(cpus) = a.cpus {
        params["core_mask"] = json!(cpus);
    }
    if !config_param.is_empty() {
        params["config_param"] = Value::Object(config_param);
    }
    let flags = &[
        ("name", "NAME"),
        ("config_file", "--config-file"),
        ("key_file", "--key-file"),
        ("user_id", "--user-id"),
        ("core_mask", "--cpus"),
        ("config_param", "--param"),
    ];
    one_call(rpc, json, flags, "bdev_rbd_register_cluster", params)
}

/// One row per cluster: how it connects and the rbd disks on it.
fn rbd_cluster_list(rpc: &Path, json: bool, name: Option<String>) -> Result<(), CliError> {
    let mut s = Session::connect(rpc, &[("name", "NAME")])?;
    let info = s.call("bdev_rbd_get_clusters_info", name.map(|n| json!({ "name": n })))?;
    if json {
        print_json(&info);
        return Ok(());
    }
    // One cluster asked for by name comes as an object, all of them as an array.
    let clusters = match info {
        Value::Array(list) => list,
        one @ Value::Object(_) => vec![one],
        other => return Err(CliError::Unexpected { method: "bdev_rbd_get_clusters_info", result: other }),
    };
    let bdevs = s.call("bdev_get_bdevs", None)?;
    let disks_on = |cluster: &Value| {
        let names: Vec<String> = bdevs
            .as_array()
            .into_iter()
            .flatten()
            .filter(|b| b["driver_specific"]["rbd"]["cluster_name"] == *cluster)
            .map(|b| cell(b, "name"))
            .collect();
        if names.is_empty() {
            "-".into()
        } else {
            names.join(",")
        }
    };
    let rows: Vec<Vec<String>> = clusters
        .iter()
        .map(|c| {
            let params = c["config_param"]
                .as_object()
                .map(|m| m.iter().map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default())).collect())
                .unwrap_or_else(Vec::new)
                .join(" ");
            vec![
                cell(c, "cluster_name"),
                cell(c, "user_id"),
                cell(c, "config_file"),
                cell(c, "key_file"),
                cell(c, "core_mask"),
                disks_on(&c["cluster_name"]),
                if params.is_empty() { "-".into() } else { params },
            ]
        })
        .collect();
    out(&table(&["CLUSTER", "USER", "CONFIG FILE", "KEY FILE", "CPUS", "DISKS", "PARAMS"], &rows));
    Ok(())
}

const MIB: u64 = 1 << 20;

/// A size in whole MiB, as the volume methods take it.
fn whole_mib(size: u64) -> Result<u64, CliError> {
    if size == 0 || size % MIB != 0 {
        return Err(usage("--size", format!("{size} bytes is not a non-zero whole number of MiB")));
    }
    Ok(size / MIB)
}

/// Calls `method` and prints its result: with `--json` as it is, otherwise only a name it made
/// (not `true`).
fn one_call(
    rpc: &Path,
    json: bool,
    flags: &'static [(&'static str, &'static str)],
    method: &str,
    params: Value,
) -> Result<(), CliError> {
    let r = Session::connect(rpc, flags)?.call(method, Some(params))?;
    if json {
        print_json(&r);
    } else if let Some(name) = r.as_str() {
        out(name);
    }
    Ok(())
}

fn volume(rpc: &Path, json: bool, cmd: VolumeCommand) -> Result<(), CliError> {
    match cmd {
        VolumeCommand::CreateStore { disk, name, cluster_size } => {
            let mut params = json!({ "bdev_name": disk, "lvs_name": name });
            if let Some(c) = cluster_size {
                params["cluster_sz"] = json!(c);
            }
            let flags = &[("bdev_name", "--disk"), ("lvs_name", "--name"), ("cluster_sz", "--cluster-size")];
            one_call(rpc, json, flags, "bdev_lvol_create_lvstore", params)
        }
        VolumeCommand::DeleteStore { name } => one_call(
            rpc,
            json,
            &[("lvs_name", "NAME")],
            "bdev_lvol_delete_lvstore",
            json!({ "lvs_name": name }),
        ),
        VolumeCommand::Create { volume, size, thin } => {
            let (store, name) = volume
                .split_once('/')
                .ok_or_else(|| usage("VOLUME", format!("'{volume}' is not STORE/NAME")))?;
            let params = json!({
                "lvs_name": store, "lvol_name": name, "size_in_mib": whole_mib(size)?, "thin_provision": thin,
            });
            let flags = &[("lvs_name", "VOLUME"), ("lvol_name", "VOLUME"), ("size_in_mib", "--size")];
            one_call(rpc, json, flags, "bdev_lvol_create", params)
        }
        VolumeCommand::Snapshot { volume, name } => {
            let params = json!({ "lvol_name": volume, "snapshot_name": name });
            one_call(
                rpc,
                json,
                &[("lvol_name", "VOLUME"), ("snapshot_name", "NAME")],
                "bdev_lvol_snapshot",
                params,
            )
        }
        VolumeCommand::Clone { snapshot, name } => {
            let params = json!({ "snapshot_name": snapshot, "clone_name": name });
            one_call(
                rpc,
                json,
                &[("snapshot_name", "SNAPSHOT"), ("clone_name", "NAME")],
                "bdev_lvol_clone",
                params,
            )
        }
        VolumeCommand::Resize { volume, size } => {
            let params = json!({ "name": volume, "size_in_mib": whole_mib(size)? });
            one_call(rpc, json, &[("name", "VOLUME"), ("size_in_mib", "--size")], "bdev_lvol_resize", params)
        }
        VolumeCommand::Delete { volume } => {
            one_call(rpc, json, &[("name", "VOLUME")], "bdev_lvol_delete", json!({ "name": volume }))
        }
        VolumeCommand::Stores => {
            let list = Session::connect(rpc, &[])?.call("bdev_lvol_get_lvstores", None)?;
            if json {
                print_json(&list);
                return Ok(());
            }
            let rows: Vec<Vec<String>> = list
                .as_array()
                .into_iter()
                .flatten()
                .map(|s| {
                    let cluster = u64_field(s, "cluster_size");
                    vec![
                        cell(s, "name"),
                        cell(s, "uuid"),
                        cell(s, "base_bdev"),
                        format_size(cluster),
                        format_size(cluster.saturating_mul(u64_field(s, "total_data_clusters"))),
                        format_size(cluster.saturating_mul(u64_field(s, "free_clusters"))),
                    ]
                })
                .collect();
            out(&table(&["STORE", "UUID", "DISK", "CLUSTER", "SIZE", "FREE"], &rows));
            Ok(())
        }
        VolumeCommand::List { store } => {
            let mut s = Session::connect(rpc, &[("lvs_name", "--store")])?;
            let params = store.map(|n| json!({ "lvs_name": n }));
            let list = s.call("bdev_lvol_get_lvols", params)?;
            if json {
                print_json(&list);
                return Ok(());
            }
            let bdevs = s.call("bdev_get_bdevs", None)?;
            let size_of = |uuid: &str| {
                bdevs
                    .as_array()
                    .into_iter()
                    .flatten()
                    .find(|b| b["name"] == uuid)
                    .map_or(0, |b| u64_field(b, "block_size").saturating_mul(u64_field(b, "num_blocks")))
            };
            let rows: Vec<Vec<String>> = list
                .as_array()
                .into_iter()
                .flatten()
                .map(|v| {
                    let kind = match (
                        v["is_snapshot"].as_bool(),
                        v["is_clone"].as_bool(),
                        v["is_thin_provisioned"].as_bool(),
                    ) {
                        (Some(true), _, _) => "snapshot",
                        (_, Some(true), _) => "clone",
                        (_, _, Some(true)) => "thin",
                        _ => "thick",
                    };
                    vec![
                        cell(v, "alias"),
                        cell(v, "uuid"),
                        kind.to_string(),
                        format_size(size_of(v["uuid"].as_str().unwrap_or_default())),
                        cell(v, "num_allocated_clusters"),
                    ]
                })
                .collect();
            out(&table(&["VOLUME", "UUID", "KIND", "SIZE", "CLUSTERS"], &rows));
            Ok(())
        }
    }
}

/// `bdev_set_qos_limit`'s parameters and the options that set them, the limits in
/// [`QosLimitArgs`]' order.
const QOS_LIMIT_FLAGS: &[(&str, &str)] = &[
    ("name", "DISK"),
    ("rw_ios_per_sec", "--iops"),
    ("rw_mbytes_per_sec", "--mbps"),
    ("r_mbytes_per_sec", "--read-mbps"),
    ("w_mbytes_per_sec", "--write-mbps"),
];

/// A group command's parameters other than its limits, and the arguments that set them.
const QOS_GROUP_FLAGS: &[(&str, &str)] = &[("name", "NAME"), ("bdev_name", "DISK"), ("weight", "--weight")];

/// The group limits given, as `bdev_qos_group_create`'s parameters (clap's field names are
/// QEMU's, as the RPC's are), plus `name`.
fn group_params(name: String, limits: &QosGroupLimits) -> Value {
    let mut params = match serde_json::to_value(limits) {
        Ok(Value::Object(map)) => map,
        _ => unreachable!("a struct of numbers serialises to an object"),
    };
    params.retain(|_, v| !v.is_null());
    params.insert("name".into(), json!(name));
    Value::Object(params)
}

fn qos(rpc: &Path, json: bool, cmd: QosCommand) -> Result<(), CliError> {
    let group_call = |flags, method: &str, params| {
        let r = Session::connect(rpc, flags)?
            .dashed(THROTTLE_FIELDS.as_flattened())
            .call(method, Some(params))?;
        if json {
            print_json(&r);
        }
        Ok(())
    };
    match cmd {
        QosCommand::Limit(a) => qos_limit(rpc, json, a),
        QosCommand::Group(QosGroupCommand::Create { name, limits }) => {
            group_call(QOS_GROUP_FLAGS, "bdev_qos_group_create", group_params(name, &limits))
        }
        QosCommand::Group(QosGroupCommand::Set { name, limits }) => {
            let params = group_params(name, &limits);
            // `name` alone would change nothing.
            if params.as_object().is_some_and(|p| p.len() == 1) {
                return Err(usage(
                    "qos group set",
                    "no limit given: set at least one, e.g. --iops-total N (0 removes one)",
                ));
            }
            group_call(QOS_GROUP_FLAGS, "bdev_qos_group_set", params)
        }
        QosCommand::Group(QosGroupCommand::Delete { name }) => {
            group_call(QOS_GROUP_FLAGS, "bdev_qos_group_delete", json!({ "name": name }))
        }
        QosCommand::Group(QosGroupCommand::Add { name, disk, weight }) => {
            let mut params = json!({ "name": name, "bdev_name": disk });
            if let Some(w) = weight {
                params["weight"] = json!(w);
            }
            group_call(QOS_GROUP_FLAGS, "bdev_qos_group_add_bdev", params)
        }
        QosCommand::Group(QosGroupCommand::Remove { name, disk }) => group_call(
            QOS_GROUP_FLAGS,
            "bdev_qos_group_remove_bdev",
            json!({ "name": name, "bdev_name": disk }),
        ),
        QosCommand::Group(QosGroupCommand::Weight { name, disk, weight }) => group_call(
            &[("name", "NAME"), ("bdev_name", "DISK"), ("weight", "WEIGHT")],
            "bdev_qos_group_set_weight",
            json!({ "name": name, "bdev_name": disk, "weight": weight }),
        ),
        QosCommand::Groups { name } => qos_groups(rpc, json, name),
        QosCommand::Show { disk } => qos_show(rpc, json, disk),
    }
}

fn qos_limit(rpc: &Path, json: bool, a: QosLimitArgs) -> Result<(), CliError> {
    let values = [a.iops, a.mbps, a.read_mbps, a.write_mbps];
    if values.iter().all(Option::is_none) {
        return Err(usage(
            "qos limit",
            "no limit given: set at least one of --iops, --mbps, --read-mbps, --write-mbps (0 removes one)",
        ));
    }
    let mut params = json!({ "name": a.disk });
    for ((field, _), value) in QOS_LIMIT_FLAGS[1..].iter().zip(values) {
        if let Some(v) = value {
            params[*field] = json!(v);
        }
    }
    one_call(rpc, json, QOS_LIMIT_FLAGS, "bdev_set_qos_limit", params)
}

/// A rate in the unit of a limit named `field` (QEMU's `iops_*`, `bps_*`).
fn rate(field: &str, per_second: u64) -> String {
    if field.starts_with("bps") {
        format!("{}/s", format_size(per_second))
    } else {
        format!("{per_second} IOPS")
    }
}

/// A group's limits that are set, e.g. "iops_total 10000 IOPS (burst 20000 IOPS for 5 s)".
fn group_limits_text(g: &Value) -> String {
    let set: Vec<String> = THROTTLE_FIELDS
        .iter()
        .filter(|[avg, max, _]| u64_field(g, avg) > 0 || u64_field(g, max) > 0)
        .map(|[avg, max, length]| {
            let mut text = format!("{avg} {}", rate(avg, u64_field(g, avg)));
            if u64_field(g, max) > 0 {
                text += &format!(" (burst {} for {} s)", rate(avg, u64_field(g, max)), u64_field(g, length));
            }
            text
        })
        .collect();
    if set.is_empty() {
        "none".into()
    } else {
        set.join(", ")
    }
}

/// One row per member (the group's own cells on its first), one for a group without members.
fn qos_groups(rpc: &Path, json: bool, name: Option<String>) -> Result<(), CliError> {
    let params = name.map(|n| json!({ "name": n }));
    let groups = Session::connect(rpc, &[("name", "NAME")])?.call("bdev_qos_get_groups", params)?;
    if json {
        print_json(&groups);
        return Ok(());
    }
    let Some(groups) = groups.as_array() else {
        return Err(CliError::Unexpected { method: "bdev_qos_get_groups", result: groups });
    };
    let mut rows = Vec::new();
    for g in groups {
        let own = |first: bool| {
            if first {
                vec![cell(g, "name"), group_limits_text(g)]
            } else {
                vec![String::new(); 2]
            }
        };
        let members = g["members"].as_array().map(Vec::as_slice).unwrap_or_default();
        if members.is_empty() {
            rows.push([own(true), vec!["-".into(); 3]].concat());
        }
        for (i, m) in members.iter().enumerate() {
            // The share is in the unit of the limit it divides; without one nothing is divided.
            let share = match g["fair_on"].as_str() {
                Some(on) => rate(on, u64_field(m, "rate")),
                None => "-".into(),
            };
            rows.push([own(i == 0), vec![cell(m, "bdev_name"), cell(m, "weight"), share]].concat());
        }
    }
    out(&table(&["GROUP", "LIMITS", "DISK", "WEIGHT", "SHARE"], &rows));
    Ok(())
}

/// Per disk: its limits (SPDK's four), its group and weight, and what QoS held back.
fn qos_show(rpc: &Path, json: bool, disk: Option<String>) -> Result<(), CliError> {
    let mut s = Session::connect(rpc, &[("name", "DISK")])?;
    let params = disk.map(|n| json!({ "name": n }));
    let bdevs = s.call("bdev_get_bdevs", params.clone())?;
    // Without statistics (`serve --no-iostat`) there is nothing to show of what was held.
    let iostat = match s.call("bdev_get_iostat", params) {
        Ok(v) => Some(v),
        Err(CliError::Refused { .. }) => None,
        Err(e) => return Err(e),
    };
    if json {
        print_json(&json!({ "bdevs": bdevs, "iostat": iostat }));
        return Ok(());
    }
    let Some(bdevs) = bdevs.as_array() else {
        return Err(CliError::Unexpected { method: "bdev_get_bdevs", result: bdevs });
    };
    let tick_rate = iostat.as_ref().map_or(1.0, flashpath::metrics::tick_rate);
    let stats_of = |name: &Value| {
        let list = iostat.as_ref().and_then(|io| io["bdevs"].as_array());
        list.and_then(|l| l.iter().find(|b| &b["name"] == name))
    };
    let rows: Vec<Vec<String>> = bdevs
        .iter()
        .map(|b| {
            let limits = &b["assigned_rate_limits"];
            let limit = |field: &str| match u64_field(limits, field) {
                0 => "-".to_string(),
                v => v.to_string(),
            };
            let group = &b["qos_group"];
            let stats = stats_of(&b["name"]);
            let held = |field: &str| stats.map_or("-".to_string(), |st| cell(st, field));
            let throttled = stats.map_or("-".to_string(), |st| {
                format!("{:.3}s", u64_field(st, "qos_throttled_ticks") as f64 / tick_rate)
            });
            vec![
                cell(b, "name"),
                limit("rw_ios_per_sec"),
                limit("rw_mbytes_per_sec"),
                limit("r_mbytes_per_sec"),
                limit("w_mbytes_per_sec"),
                cell(group, "name"),
                cell(group, "weight"),
                held("qos_queued"),
                held("qos_queued_total"),
                throttled,
            ]
        })
        .collect();
    out(&table(
        &[
            "DISK",
            "IOPS",
            "MiB/s",
            "READ MiB/s",
            "WRITE MiB/s",
            "GROUP",
            "WEIGHT",
            "QUEUED",
            "QUEUED TOTAL",
            "THROTTLED",
        ],
        &rows,
    ));
    Ok(())
}

fn vhost_create(rpc: &Path, json: bool, a: VhostCreateArgs) -> Result<(), CliError> {
    let mut params = json!({ "ctrlr": a.name, "dev_name": a.disk, "readonly": a.readonly });
    if let Some(cpus) = &a.cpus {
        params["cpumask"] = json!(cpus);
    }
    if let Some(q) = a.queues {
        params["num_queues"] = json!(q);
    }
    let mut s = Session::connect(
        rpc,
        &[("ctrlr", "--name"), ("dev_name", "--disk"), ("cpumask", "--cpus"), ("num_queues", "--queues")],
    )?;
    let r = s.call("vhost_create_blk_controller", Some(params))?;
    if json {
        print_json(&r);
        return Ok(());
    }
    // People want the socket path to hand to the VM.
    let info = s.call("vhost_get_controllers", Some(json!({ "name": a.name })))?;
    match info.get(0).and_then(|c| c.get("socket")).and_then(Value::as_str) {
        Some(socket) => out(socket),
        None => out(&a.name),
    }
    Ok(())
}

fn vhost_list(rpc: &Path, json: bool, name: Option<String>) -> Result<(), CliError> {
    let Some(list) = fetch_list(rpc, json, "vhost_get_controllers", name)? else { return Ok(()) };
    let rows: Vec<Vec<String>> = list
        .iter()
        .map(|c| {
            let block = &c["backend_specific"]["block"];
            vec![
                cell(c, "ctrlr"),
                cell(block, "bdev"),
                cell(c, "cpumask"),
                cell(c, "num_queues"),
                yes_no(&block["readonly"]),
                yes_no(&c["connected"]),
                cell(c, "socket"),
            ]
        })
        .collect();
    out(&table(&["NAME", "DISK", "CPUMASK", "QUEUES", "READONLY", "CONNECTED", "SOCKET"], &rows));
    Ok(())
}

/// `nbd start|stop|list`: SPDK's `nbd_start_disk`, `nbd_stop_disk` and `nbd_get_disks`.
fn nbd(rpc: &Path, json: bool, cmd: NbdCommand) -> Result<(), CliError> {
    match cmd {
        NbdCommand::Start(a) => nbd_start(rpc, json, a),
        NbdCommand::Stop { nbd_device } => {
            let params = json!({ "nbd_device": nbd_device_param(nbd_device) });
            let r = Session::connect(rpc, NBD_FLAGS)?.call("nbd_stop_disk", Some(params))?;
            if json {
                print_json(&r);
            }
            Ok(())
        }
        NbdCommand::List { nbd_device } => nbd_list(rpc, json, nbd_device),
    }
}

/// `nbd_start_disk`'s parameters and the options that set them.
const NBD_FLAGS: &[(&str, &str)] = &[
    ("bdev_name", "DISK"),
    ("nbd_device", "NBD_DEVICE"),
    ("tls_cert", "--tls-cert"),
    ("tls_key", "--tls-key"),
    ("tls_ca", "--tls-ca"),
];

/// NBD_DEVICE as the daemon wants it: a URI as written, a socket path made absolute (the daemon
/// resolves paths against its own working directory, not ours).
fn nbd_device_param(device: String) -> String {
    if device.contains("://") {
        return device;
    }
    match std::path::absolute(&device) {
        Ok(p) => p.display().to_string(),
        Err(_) => device,
    }
}

fn nbd_start(rpc: &Path, json: bool, a: NbdStartArgs) -> Result<(), CliError> {
    match (&a.tls_cert, &a.tls_key) {
        (Some(_), None) => return Err(usage("--tls-key", "required with --tls-cert")),
        (None, Some(_)) => return Err(usage("--tls-cert", "required with --tls-key")),
        (None, None) if a.tls_ca.is_some() => {
            return Err(usage("--tls-ca", "only used with --tls-cert and --tls-key"))
        }
        _ => {}
    }
    let mut params = json!({ "bdev_name": a.disk, "nbd_device": nbd_device_param(a.nbd_device) });
    if a.readonly {
        params["readonly"] = json!(true);
    }
    let absolute = |p: std::path::PathBuf| std::path::absolute(&p).unwrap_or(p);
    for (field, file) in [("tls_cert", a.tls_cert), ("tls_key", a.tls_key), ("tls_ca", a.tls_ca)] {
        if let Some(f) = file {
            params[field] = json!(absolute(f));
        }
    }
    one_call(rpc, json, NBD_FLAGS, "nbd_start_disk", params)
}

fn nbd_list(rpc: &Path, json: bool, nbd_device: Option<String>) -> Result<(), CliError> {
    let params = nbd_device.map(|d| json!({ "nbd_device": nbd_device_param(d) }));
    let list = Session::connect(rpc, NBD_FLAGS)?.call("nbd_get_disks", params)?;
    if json {
        print_json(&list);
        return Ok(());
    }
    let Some(list) = list.as_array() else {
        return Err(CliError::Unexpected { method: "nbd_get_disks", result: list });
    };
    let rows: Vec<Vec<String>> = list
        .iter()
        .map(|d| {
            vec![
                cell(d, "nbd_device"),
                cell(d, "bdev_name"),
                cell(d, "export_name"),
                yes_no(&d["readonly"]),
                yes_no(&d["tls"]),
                cell(d, "connections"),
            ]
        })
        .collect();
    out(&table(&["DEVICE", "DISK", "EXPORT", "READONLY", "TLS", "CONNECTIONS"], &rows));
    Ok(())
}

fn reactor_list(rpc: &Path, json: bool) -> Result<(), CliError> {
    let r = Session::connect(rpc, &[])?.call("framework_get_reactors", None)?;
    if json {
        print_json(&r);
        return Ok(());
    }
    let Some(list) = r.get("reactors").and_then(Value::as_array) else {
        return Err(CliError::Unexpected { method: "framework_get_reactors", result: r });
    };
    let rows: Vec<Vec<String>> = list
        .iter()
        .map(|x| {
            let busy = u64_field(x, "busy");
            let idle = u64_field(x, "idle");
            let pct = if busy + idle == 0 { 0.0 } else { 100.0 * busy as f64 / (busy + idle) as f64 };
            let state = if x["in_interrupt"].as_bool() == Some(true) { "sleeping" } else { "polling" };
            vec![
                cell(x, "lcore"),
                state.to_string(),
                format!("{pct:.1}"),
                seconds(busy),
                seconds(u64_field(x, "poll_idle_ns")),
                seconds(u64_field(x, "sleep_ns")),
                cell(x, "sleeps"),
                cell(x, "rounds"),
            ]
        })
        .collect();
    out(&table(&["CORE", "STATE", "BUSY%", "BUSY", "IDLE", "ASLEEP", "SLEEPS", "ROUNDS"], &rows));
    Ok(())
}

/// Mean latency in microseconds, "-" when unknown.
fn micros(v: Option<f64>) -> String {
    v.map_or_else(|| "-".to_string(), |x| format!("{x:.1}"))
}

fn stats(rpc: &Path, json: bool) -> Result<(), CliError> {
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
    let disks = crate::top::disk_counters(&mut session)?;
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
            ]
        })
        .collect();
    if !rows.is_empty() {
        out("");
        out(&table(
            &["CONTROLLER", "DISK", "READS", "WRITES", "READ", "WRITTEN", "IN FLIGHT", "ERRORS"],
            &rows,
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_aligns_columns() {
        let t = table(&["A", "LONGER"], &[vec!["xyz".into(), "1".into()], vec!["q".into(), "22".into()]]);
        assert_eq!(t, "A    LONGER\nxyz  1\nq    22");
    }

    /// The group commands' options are the RPC's limit names with dashes, one for each, so
    /// the daemon's errors about a field can be worded as about its option.
    #[test]
    fn group_limit_options_are_the_rpc_fields_with_dashes() {
        use clap::Parser;
        let fields = THROTTLE_FIELDS.as_flattened();
        let flags: Vec<String> = fields.iter().map(|f| format!("--{}", f.replace('_', "-"))).collect();
        let mut args = vec!["flashpath", "qos", "group", "create", "g"];
        for (i, flag) in flags.iter().enumerate() {
            args.extend([flag.as_str(), ["1", "2", "3"][i % 3]]);
        }
        let cli = crate::Cli::try_parse_from(args).unwrap();
        let Command::Qos(QosCommand::Group(QosGroupCommand::Create { name, limits })) = cli.command else {
            panic!("parsed as {:?}", cli.command)
        };
        let params = group_params(name, &limits);
        let mut want: Map<String, Value> =
            fields.iter().enumerate().map(|(i, f)| (f.to_string(), json!(i % 3 + 1))).collect();
        want.insert("name".into(), json!("g"));
        assert_eq!(params, Value::Object(want));
        // Left out is left out (the daemon keeps those), not 0 (which removes).
        let cli = crate::Cli::try_parse_from(["flashpath", "qos", "group", "set", "g", "--bps-read", "1M"])
            .unwrap();
        let Command::Qos(QosCommand::Group(QosGroupCommand::Set { name, limits })) = cli.command else {
            panic!("parsed as {:?}", cli.command)
        };
        assert_eq!(group_params(name, &limits), json!({ "name": "g", "bps_read": 1 << 20 }));
    }

    #[test]
    fn group_limits_read_in_their_units() {
        let mut g = json!({ "name": "g" });
        assert_eq!(group_limits_text(&g), "none");
        g["iops_total"] = json!(10_000);
        g["bps_write"] = json!(100 << 20);
        g["bps_write_max"] = json!(1 << 30);
        g["bps_write_max_length"] = json!(5);
        assert_eq!(
            group_limits_text(&g),
            "iops_total 10000 IOPS, bps_write 100 MiB/s (burst 1 GiB/s for 5 s)"
        );
    }

    #[test]
    fn driver_names() {
        let b = json!({"driver_specific": {"uring": {"filename": "/x"}}});
        assert_eq!(driver_of(&b), Some("uring"));
        assert_eq!(disk_type_name("uring"), "file");
        assert_eq!(disk_type_name("malloc"), "ram");
        assert_eq!(disk_type_name("null"), "null");
    }
}
