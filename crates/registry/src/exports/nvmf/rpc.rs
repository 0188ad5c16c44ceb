//! NVMe-oF methods with SPDK v23.01's names, parameters and result shapes (and what SPDK's
//! newer `rpc.py` adds, such as `secure_channel` or `no_auto_visible`). Parameters SPDK defines
//! that flashpath does not implement are accepted only at their neutral value and refused by
//! name otherwise ([`Params::spdk_only`]); the sizes of SPDK's shared buffer pool, which has no
//! counterpart here (each queue pair owns its buffers), are accepted and have no effect.
//! flashpath has one target: `tgt_name` may only name SPDK's default, `nvmf_tgt`.
//! docs/nvmf.md lists every difference.

use fp_nvme_spec::auth::{DhGroupId, HashId};
use fp_nvme_spec::fabrics::DISCOVERY_NQN;
use fp_nvmf::model::AnaState;
use fp_nvmf::{
    DhchapConfig, DhchapKeys, HostPsk, ListenAddress, NvmfTarget, SocketImpl, SubsystemSpec, TransportOptions,
};
use fp_rpc::{Neutral, ParamError, Params};
use serde_json::{json, Value};

use super::{parse_hex, parse_uuid, NvmfNamespaceSpec};
use crate::methods::{MethodError, MethodFn};
use crate::metrics::array;
use crate::{Registry, RegistryError};

/// The kind's methods ([`crate::exports::ExportKind::methods`]).
pub(super) const METHODS: &[(&str, MethodFn)] = &[
    ("nvmf_create_transport", nvmf_create_transport),
    ("nvmf_get_transports", nvmf_get_transports),
    ("nvmf_create_subsystem", nvmf_create_subsystem),
    ("nvmf_delete_subsystem", nvmf_delete_subsystem),
    ("nvmf_get_subsystems", nvmf_get_subsystems),
    ("nvmf_subsystem_add_listener", nvmf_subsystem_add_listener),
    ("nvmf_subsystem_remove_listener", nvmf_subsystem_remove_listener),
    ("nvmf_subsystem_get_listeners", nvmf_subsystem_get_listeners),
    ("nvmf_subsystem_listener_set_ana_state", nvmf_subsystem_listener_set_ana_state),
    ("nvmf_subsystem_set_ns_ana_group", nvmf_subsystem_set_ns_ana_group),
    ("nvmf_subsystem_add_ns", nvmf_subsystem_add_ns),
    ("nvmf_subsystem_remove_ns", nvmf_subsystem_remove_ns),
    ("nvmf_subsystem_add_host", nvmf_subsystem_add_host),
    ("nvmf_subsystem_set_keys", nvmf_subsystem_set_keys),
    ("nvmf_set_config", nvmf_set_config),
    ("nvmf_subsystem_remove_host", nvmf_subsystem_remove_host),
    ("nvmf_subsystem_allow_any_host", nvmf_subsystem_allow_any_host),
    ("nvmf_subsystem_get_controllers", nvmf_subsystem_get_controllers),
    ("nvmf_subsystem_get_qpairs", nvmf_subsystem_get_qpairs),
    ("nvmf_get_stats", nvmf_get_stats),
    ("sock_set_default_impl", sock_set_default_impl),
    ("sock_get_default_impl", sock_get_default_impl),
    ("sock_impl_set_options", sock_impl_set_options),
];

/// SPDK's default target, the only one flashpath has.
const TGT_NAME: &str = "nvmf_tgt";

/// The controller IDs a subsystem may hand out (NVMe-oF 1.1, 3.3: 0xFFF0 and above are
/// reserved), SPDK's defaults for `min_cntlid` and `max_cntlid`.
const MIN_CNTLID: u64 = 1;
const MAX_CNTLID: u64 = 0xffef;

/// Namespace IDs: 1 to 0xFFFFFFFE (0 and the broadcast value are not namespaces).
const MAX_NSID: u64 = 0xffff_fffe;

/// `tgt_name`: absent or SPDK's default.
fn target_name(p: &mut Params) -> Result<(), ParamError> {
    p.unsupported("tgt_name", Some(json!(TGT_NAME)))
}

fn to_u32(v: Option<u64>, default: u32) -> u32 {
    v.map_or(default, |v| u32::try_from(v).expect("bounded by the decoder"))
}

fn nvmf_create_transport(registry: &Registry, mut p: Params) -> Result<Value, MethodError> {
    let trtype = transport_type(&p.required_str("trtype")?)?;
    target_name(&mut p)?;
    let d = TransportOptions::default();
    let max = u64::from(u32::MAX);
    let opts = TransportOptions {
        trtype,
        max_queue_depth: to_u32(p.optional_uint("max_queue_depth", max)?, d.max_queue_depth),
        max_io_qpairs_per_ctrlr: to_u32(
            p.optional_uint("max_io_qpairs_per_ctrlr", max)?,
            d.max_io_qpairs_per_ctrlr,
        ),
        in_capsule_data_size: to_u32(p.optional_uint("in_capsule_data_size", max)?, d.in_capsule_data_size),
        max_io_size: to_u32(p.optional_uint("max_io_size", max)?, d.max_io_size),
        io_unit_size: to_u32(p.optional_uint("io_unit_size", max)?, d.io_unit_size),
        max_aq_depth: to_u32(p.optional_uint("max_aq_depth", max)?, d.max_aq_depth),
        c2h_success: p.optional_bool("c2h_success")?.unwrap_or(d.c2h_success),
        sock_priority: to_u32(p.optional_uint("sock_priority", max)?, d.sock_priority),
        abort_timeout_sec: to_u32(p.optional_uint("abort_timeout_sec", max)?, d.abort_timeout_sec),
    };
    // SPDK's shared data buffer pool and its per-poll-group caches: flashpath's queue pairs own
    // their buffers, so there is nothing for these to size. (`io_unit_size`, SPDK's buffer
    // granularity, and `abort_timeout_sec`, for Aborts flashpath answers at once as "not
    // aborted", are taken above and reported back, with no effect either.)
    for pool in ["num_shared_buffers", "buf_cache_size", "iobuf_small_cache_size", "iobuf_large_cache_size"] {
        p.optional_uint(pool, max)?;
    }
    p.spdk_only(&[
        ("zcopy", Neutral::Bool(false)),
        ("dif_insert_or_strip", Neutral::Bool(false)),
        ("control_msg_num", Neutral::Absent),
        ("acceptor_poll_rate", Neutral::Absent),
        ("disable_command_passthru", Neutral::Bool(false)),
        ("kas", Neutral::Absent),
        ("min_kato", Neutral::Absent),
        ("masked_oncs", Neutral::Absent),
        ("masked_fuses", Neutral::Absent),
        // Other transports' options, which rpc.py sends with every call.
        ("no_srq", Neutral::Bool(false)),
        ("num_cqe", Neutral::Absent),
        ("max_srq_depth", Neutral::Absent),
        ("acceptor_backlog", Neutral::Absent),
        ("no_wr_batching", Neutral::Bool(false)),
        ("ack_timeout", Neutral::Absent),
        ("data_wr_pool_size", Neutral::Absent),
        ("disable_mappable_bar0", Neutral::Bool(false)),
        ("disable_adaptive_irq", Neutral::Bool(false)),
        ("disable_shadow_doorbells", Neutral::Bool(false)),
    ])?;
    p.finish()?;
    registry.nvmf().create_transport(opts).map_err(RegistryError::from)?;
    Ok(json!(true))
}

/// SPDK's `trtype` in any case ("tcp", "TCP"); flashpath has the TCP transport only.
fn transport_type(trtype: &str) -> Result<String, ParamError> {
    if trtype.eq_ignore_ascii_case("tcp") {
        Ok("TCP".into())
    } else {
        Err(ParamError::new(
            "trtype",
            format!("'{trtype}' is not supported: flashpath has the TCP transport only"),
        ))
    }
}

fn nvmf_get_transports(registry: &Registry, mut p: Params) -> Result<Value, MethodError> {
    let trtype = p.optional_str("trtype")?;
    target_name(&mut p)?;
    p.finish()?;
    let all = registry.nvmf().transports();
    let listed: Vec<_> = all
        .into_iter()
        .filter(|t| trtype.as_ref().is_none_or(|want| t.trtype.eq_ignore_ascii_case(want)))
        .collect();
    if let (Some(want), true) = (&trtype, listed.is_empty()) {
        return Err(RegistryError::NotFound { kind: "transport", name: want.clone() }.into());
    }
    Ok(serde_json::to_value(listed).expect("plain data serialises"))
}

fn nvmf_create_subsystem(registry: &Registry, mut p: Params) -> Result<Value, MethodError> {
    let nqn = p.required_str("nqn")?;
    target_name(&mut p)?;
    let serial_number = p.optional_str("serial_number")?;
    let model_number = p.optional_str("model_number")?;
    let allow_any_host = p.optional_bool("allow_any_host")?.unwrap_or(false);
    let require_dhchap = p.optional_bool("require_dhchap")?.unwrap_or(false);
    let max_namespaces = to_u32(p.optional_uint("max_namespaces", u64::from(u32::MAX))?, 0);
    let min_cntlid = p.optional_uint("min_cntlid", MAX_CNTLID)?.unwrap_or(MIN_CNTLID);
    let max_cntlid = p.optional_uint("max_cntlid", MAX_CNTLID)?.unwrap_or(MAX_CNTLID);
    let ana_reporting = p.optional_bool("ana_reporting")?.unwrap_or(false);
    p.spdk_only(&[
        ("passthrough", Neutral::Bool(false)),
        ("enable_nssr", Neutral::Bool(false)),
        ("dmrsl", Neutral::Absent),
        ("wzsl", Neutral::Absent),
        ("admin_label", Neutral::Absent),
    ])?;
    p.finish()?;
    if min_cntlid == 0 {
        return Err(ParamError::new("min_cntlid", "must be 1 or more (controller ID 0 is reserved)").into());
    }
    if min_cntlid > max_cntlid {
        return Err(
            ParamError::new("max_cntlid", format!("{max_cntlid} is below min_cntlid {min_cntlid}")).into()
        );
    }
    let spec = SubsystemSpec {
        nqn,
        serial_number,
        model_number,
        allow_any_host,
        require_dhchap,
        max_namespaces,
        min_cntlid: min_cntlid as u16,
        max_cntlid: max_cntlid as u16,
        ana_reporting,
    };
    registry.nvmf().create_subsystem(spec).map_err(RegistryError::from)?;
    Ok(json!(true))
}

/// The methods that only name a subsystem: its `nqn`, and `tgt_name`.
fn nqn_only(p: &mut Params) -> Result<String, ParamError> {
    let nqn = p.required_str("nqn")?;
    target_name(p)?;
    Ok(nqn)
}

fn nvmf_delete_subsystem(registry: &Registry, mut p: Params) -> Result<Value, MethodError> {
    let nqn = nqn_only(&mut p)?;
    p.finish()?;
    if nqn == DISCOVERY_NQN {
        return Err(ParamError::new("nqn", "the discovery subsystem cannot be deleted").into());
    }
    registry.nvmf_delete_subsystem(&nqn)?;
    Ok(json!(true))
}

/// The subsystems as SPDK lists them, each secure listen address marked `"secure_channel":
/// true` (flashpath's addition: SPDK shows it only in its saved configuration).
fn subsystems_shown(registry: &Registry) -> Value {
    let subs = registry.nvmf().subsystems();
    let mut all = serde_json::to_value(&subs).expect("plain data serialises");
    if let Value::Array(shown) = &mut all {
        for (s, v) in subs.iter().zip(shown.iter_mut()) {
            if let Some(Value::Array(addrs)) = v.get_mut("listen_addresses") {
                for (a, shown) in s.listen_addresses.iter().zip(addrs.iter_mut()) {
                    if let (true, Value::Object(o)) = (s.secure_listeners.contains(a), shown) {
                        o.insert("secure_channel".into(), json!(true));
                    }
                }
            }
        }
    }
    all
}

fn nvmf_get_subsystems(registry: &Registry, mut p: Params) -> Result<Value, MethodError> {
    let nqn = p.optional_str("nqn")?;
    target_name(&mut p)?;
    p.finish()?;
    let all = subsystems_shown(registry);
    match nqn {
        None => Ok(all),
        Some(nqn) => {
            let one: Vec<Value> = array(&all).iter().filter(|s| s["nqn"] == nqn.as_str()).cloned().collect();
            if one.is_empty() {
                return Err(RegistryError::NotFound { kind: "subsystem", name: nqn }.into());
            }
            Ok(Value::Array(one))
        }
    }
}

/// A nested object parameter (`listen_address`, `namespace`) decoded on its own, its errors
/// named `outer.field`.
fn nested<T>(
    p: &mut Params,
    outer: &'static str,
    decode: impl FnOnce(&mut Params) -> Result<T, ParamError>,
) -> Result<T, ParamError> {
    let object = p
        .optional_object(outer)?
        .ok_or_else(|| ParamError::new(outer, "required parameter missing (an object)"))?;
    let prefix = |e: ParamError| ParamError::new(format!("{outer}.{}", e.field), e.reason);
    let mut inner = Params::new(Some(Value::Object(object))).map_err(prefix)?;
    let decoded = decode(&mut inner).map_err(prefix)?;
    inner.finish().map_err(prefix)?;
    Ok(decoded)
}

/// SPDK's `listen_address` object: `trtype` and `adrfam` in any case (rpc.py passes what was
/// typed: `-t tcp -f ipv4`), normalised to SPDK's spelling ("TCP", "IPv4"); `adrfam` defaults
/// to the address's family.
fn listen_address(p: &mut Params) -> Result<ListenAddress, ParamError> {
    let trtype = transport_type(&p.required_str("trtype")?)?;
    let traddr = p.required_str("traddr")?;
    let adrfam = match p.optional_str("adrfam")? {
        None if traddr.contains(':') => "IPv6".to_string(),
        None => "IPv4".to_string(),
        Some(f) if f.eq_ignore_ascii_case("ipv4") => "IPv4".to_string(),
        Some(f) if f.eq_ignore_ascii_case("ipv6") => "IPv6".to_string(),
        Some(f) => {
            return Err(ParamError::new("adrfam", format!("'{f}' is not supported over TCP: IPv4 or IPv6")))
        }
    };
    let trsvcid = p.optional_str("trsvcid")?.ok_or_else(|| {
        ParamError::new("trsvcid", "required parameter missing (the TCP port, e.g. \"4420\")")
    })?;
    Ok(ListenAddress { trtype, adrfam, traddr, trsvcid })
}

fn nvmf_subsystem_add_listener(registry: &Registry, mut p: Params) -> Result<Value, MethodError> {
    let nqn = nqn_only(&mut p)?;
    let addr = nested(&mut p, "listen_address", listen_address)?;
    let sock_impl = p.optional_str("sock_impl")?.map(|s| socket_impl("sock_impl", &s)).transpose()?;
    let state =
        p.optional_str("ana_state")?.map(|s| ana_state(&s)).transpose()?.unwrap_or(AnaState::Optimized);
    let secure = p.optional_bool("secure_channel")?.unwrap_or(false);
    p.spdk_only(&[("numa_id", Neutral::Int(-1))])?;
    p.finish()?;
    registry.nvmf().add_listener_secure(&nqn, addr, sock_impl, state, secure).map_err(RegistryError::from)?;
    Ok(json!(true))
}

/// An ANA state by SPDK's name (its three, and flashpath's `persistent_loss` and `change`).
fn ana_state(name: &str) -> Result<AnaState, ParamError> {
    AnaState::from_name(name).ok_or_else(|| {
        ParamError::new(
            "ana_state",
            format!("'{name}' is not an ANA state: optimized, non_optimized, inaccessible, persistent_loss or change"),
        )
    })
}

/// SPDK's `nvmf_subsystem_listener_set_ana_state`: one ANA group's state (`anagrpid`), or
/// every group's, on one listener of a subsystem created with `ana_reporting`.
fn nvmf_subsystem_listener_set_ana_state(registry: &Registry, mut p: Params) -> Result<Value, MethodError> {
    let nqn = nqn_only(&mut p)?;
    let addr = nested(&mut p, "listen_address", listen_address)?;
    let state = ana_state(&p.required_str("ana_state")?)?;
    let anagrpid = p.optional_uint("anagrpid", u64::from(u32::MAX))?.map(|g| g as u32);
    p.finish()?;
    registry.nvmf().set_ana_state(&nqn, &addr, state, anagrpid).map_err(RegistryError::from)?;
    Ok(json!(true))
}

/// SPDK's `nvmf_subsystem_set_ns_ana_group`: namespace `nsid` moves to ANA group `anagrpid`.
fn nvmf_subsystem_set_ns_ana_group(registry: &Registry, mut p: Params) -> Result<Value, MethodError> {
    let nqn = nqn_only(&mut p)?;
    let nsid = p.required_uint("nsid", MAX_NSID)? as u32;
    let anagrpid = p.required_uint("anagrpid", u64::from(u32::MAX))? as u32;
    p.finish()?;
    registry.nvmf().set_ns_ana_group(&nqn, nsid, anagrpid).map_err(RegistryError::from)?;
    Ok(json!(true))
}

/// A socket implementation's name (`posix`, `uring`) in parameter `field`.
fn socket_impl(field: &'static str, name: &str) -> Result<SocketImpl, ParamError> {
    name.parse().map_err(|e: fp_nvmf::UnknownSocketImpl| ParamError::new(field, e.to_string()))
}

/// SPDK's `sock_set_default_impl`: the socket implementation of NVMe/TCP queue pairs that
/// connect from now on, the target's through listeners that name none and the host's
/// (`bdev_nvme_attach_controller`) I/O queues.
fn sock_set_default_impl(registry: &Registry, mut p: Params) -> Result<Value, MethodError> {
    let imp = socket_impl("impl_name", &p.required_str("impl_name")?)?;
    p.finish()?;
    registry.nvmf().set_sock_impl(imp);
    fp_conn::uring::set_default_impl(imp);
    Ok(json!(true))
}

/// SPDK's `sock_get_default_impl`: `{"impl_name": ...}`.
fn sock_get_default_impl(registry: &Registry, p: Params) -> Result<Value, MethodError> {
    p.finish()?;
    Ok(json!({ "impl_name": registry.nvmf().sock_impl().name() }))
}

/// SPDK's `sock_impl_set_options` options (its socket layer's tuning), each refused when given.
const SOCK_IMPL_OPTIONS: [&str; 13] = [
    "recv_buf_size",
    "send_buf_size",
    "enable_recv_pipe",
    "enable_quickack",
    "enable_placement_id",
    "enable_zerocopy_send",
    "enable_zerocopy_send_server",
    "enable_zerocopy_send_client",
    "zerocopy_threshold",
    "tls_version",
    "enable_ktls",
    "psk_key",
    "psk_identity",
];

/// SPDK's `sock_impl_set_options`: the implementation must be one flashpath has; its options
/// are SPDK's tuning of its own socket layer, accepted only at their neutral values (absent)
/// since flashpath sizes its buffers itself (docs/nvmf.md, "Socket implementations").
fn sock_impl_set_options(_registry: &Registry, mut p: Params) -> Result<Value, MethodError> {
    socket_impl("impl_name", &p.required_str("impl_name")?)?;
    for option in SOCK_IMPL_OPTIONS {
        p.unsupported(option, None)?;
    }
    p.finish()?;
    Ok(json!(true))
}

fn nvmf_subsystem_remove_listener(registry: &Registry, mut p: Params) -> Result<Value, MethodError> {
    let nqn = nqn_only(&mut p)?;
    let addr = nested(&mut p, "listen_address", listen_address)?;
    p.finish()?;
    registry.nvmf().remove_listener(&nqn, &addr).map_err(RegistryError::from)?;
    Ok(json!(true))
}

/// SPDK's `nvmf_subsystem_get_listeners` objects: the address and its ANA state (group 1's,
/// as SPDK v23.01 shows it), and with ANA reporting every group's (`ana_states`, as SPDK's
/// newer releases).
fn nvmf_subsystem_get_listeners(registry: &Registry, mut p: Params) -> Result<Value, MethodError> {
    let nqn = nqn_only(&mut p)?;
    p.finish()?;
    let all = subsystems_shown(registry);
    let Some(sub) = array(&all).iter().find(|s| s["nqn"] == nqn.as_str()) else {
        return Err(RegistryError::NotFound { kind: "subsystem", name: nqn }.into());
    };
    // The address as SPDK shows it; a secure one says so beside it.
    let shown = |a: &Value, mut listener: Value| {
        let mut address = a.clone();
        if address.as_object_mut().and_then(|o| o.remove("secure_channel")).is_some() {
            listener["secure_channel"] = json!(true);
        }
        listener["address"] = address;
        listener
    };
    let addresses = array(&sub["listen_addresses"]);
    if let Some(listeners) = registry.nvmf().listener_ana_states(&nqn).map_err(RegistryError::from)? {
        let all: Vec<Value> = listeners
            .iter()
            .map(|(address, ana)| {
                let groups: Vec<Value> = (1..=ana.states.len() as u32)
                    .map(|g| json!({ "ana_group": g, "ana_state": ana.get(g).name() }))
                    .collect();
                let listener = json!({ "ana_state": ana.get(1).name(), "ana_states": groups });
                let address = serde_json::to_value(address).expect("plain data serialises");
                let same = |a: &&Value| {
                    ["trtype", "adrfam", "traddr", "trsvcid"].iter().all(|k| a[*k] == address[*k])
                };
                shown(addresses.iter().find(same).unwrap_or(&address), listener)
            })
            .collect();
        return Ok(Value::Array(all));
    }
    let listeners: Vec<Value> =
        addresses.iter().map(|a| shown(a, json!({ "ana_state": "optimized" }))).collect();
    Ok(Value::Array(listeners))
}

/// SPDK's `namespace` object, and flashpath's `read_only`.
fn namespace(p: &mut Params) -> Result<NvmfNamespaceSpec, ParamError> {
    let bdev_name = p.required_str("bdev_name")?;
    let nsid = match p.optional_uint("nsid", MAX_NSID)? {
        // rpc.py of v23.01 leaves nsid out for "any"; SPDK's decoder reads 0 the same way.
        None | Some(0) => None,
        Some(n) => Some(n as u32),
    };
    let nguid = match p.optional_str("nguid")? {
        None => None,
        Some(t) => Some(
            parse_hex::<16>(&t.replace('-', ""))
                .ok_or_else(|| ParamError::new("nguid", format!("'{t}' is not 32 hexadecimal digits")))?,
        ),
    };
    let eui64 = match p.optional_str("eui64")? {
        None => None,
        Some(t) => Some(
            parse_hex::<8>(&t.replace('-', ""))
                .ok_or_else(|| ParamError::new("eui64", format!("'{t}' is not 16 hexadecimal digits")))?,
        ),
    };
    let uuid = match p.optional_str("uuid")? {
        None => None,
        Some(t) => Some(parse_uuid(&t).ok_or_else(|| {
            ParamError::new("uuid", format!("'{t}' is not a UUID (8-4-4-4-12 hexadecimal digits)"))
        })?),
    };
    let read_only = p.optional_bool("read_only")?.unwrap_or(false);
    // 0 is SPDK's "the NSID" too.
    let anagrpid = p.optional_uint("anagrpid", u64::from(u32::MAX))?.filter(|&g| g != 0).map(|g| g as u32);
    p.spdk_only(&[
        ("ptpl_file", Neutral::Absent),
        ("no_auto_visible", Neutral::Bool(false)),
        // SPDK's newest rpc.py sends it (false) with every namespace; flashpath's namespaces
        // carry no metadata to hide.
        ("hide_metadata", Neutral::Bool(false)),
    ])?;
    Ok(NvmfNamespaceSpec { nqn: String::new(), nsid, bdev_name, uuid, nguid, eui64, read_only, anagrpid })
}

fn nvmf_subsystem_add_ns(registry: &Registry, mut p: Params) -> Result<Value, MethodError> {
    let nqn = nqn_only(&mut p)?;
    let ns = nested(&mut p, "namespace", namespace)?;
    p.finish()?;
    let nsid = registry.nvmf_add_namespace(NvmfNamespaceSpec { nqn, ..ns })?;
    Ok(json!(nsid))
}

fn nvmf_subsystem_remove_ns(registry: &Registry, mut p: Params) -> Result<Value, MethodError> {
    let nqn = nqn_only(&mut p)?;
    let nsid = p.required_uint("nsid", MAX_NSID)? as u32;
    p.finish()?;
    registry.nvmf_remove_namespace(&nqn, nsid)?;
    Ok(json!(true))
}

/// `nqn` and `host`.
fn nqn_and_host(p: &mut Params) -> Result<(String, String), ParamError> {
    let nqn = nqn_only(p)?;
    let host = p.required_str("host")?;
    Ok((nqn, host))
}

/// `dhchap_key` and `dhchap_ctrlr_key`: keyring names, resolved to the secrets (errors name
/// the key, never its content). `None`: no `dhchap_key`.
fn dhchap_keys(registry: &Registry, p: &mut Params) -> Result<Option<DhchapKeys>, MethodError> {
    let key = p.optional_str("dhchap_key")?;
    let ctrlr_key = p.optional_str("dhchap_ctrlr_key")?;
    let resolve = |field, name: Option<&str>| {
        fp_nvme::rpc::dhchap_secret(registry, field, name).map_err(RegistryError::from)
    };
    let (key_name, ctrlr_key_name) = (key, ctrlr_key);
    let key = resolve("dhchap_key", key_name.as_deref())?;
    let ctrlr_key = resolve("dhchap_ctrlr_key", ctrlr_key_name.as_deref())?;
    match (key, key_name) {
        (Some(key), Some(key_name)) => Ok(Some(DhchapKeys { key, ctrlr_key, key_name, ctrlr_key_name })),
        _ if ctrlr_key.is_some() => Err(ParamError::new(
            "dhchap_ctrlr_key",
            "needs dhchap_key (the controller is authenticated in the host's transaction)",
        )
        .into()),
        _ => Ok(None),
    }
}

/// `psk`: a keyring name, its key the host's configured PSK in the interchange format
/// (`NVMeTLSkey-1:hh:...:`), retained for the host at once (errors name the key, never its
/// content).
fn host_psk(registry: &Registry, p: &mut Params, host: &str) -> Result<Option<HostPsk>, MethodError> {
    let Some(name) = p.optional_str("psk")? else { return Ok(None) };
    let key = fp_crypto::keyring(registry).key(&name).map_err(|e| ParamError::new("psk", e.to_string()))?;
    let psk = key.with_material(|m| {
        let not = |why: String| {
            ParamError::new("psk", format!("key '{name}' is not a TLS PSK in the interchange format: {why}"))
        };
        let text = std::str::from_utf8(m).map_err(|_| not("not text".into()))?;
        HostPsk::from_interchange(&name, text, host).map_err(|e| not(psk_error(&e)))
    })?;
    Ok(Some(psk))
}

/// What is wrong with a PSK, without quoting any of its bytes.
fn psk_error(e: &fp_crypto::tls::PskError) -> String {
    match e {
        // Base64 errors quote a byte of the text, CRC errors a function of the key.
        fp_crypto::tls::PskError::Base64(_) => "its key is not base64".to_string(),
        fp_crypto::tls::PskError::Crc { .. } => "its CRC-32 does not match its key".to_string(),
        e => e.to_string(),
    }
}

fn nvmf_subsystem_add_host(registry: &Registry, mut p: Params) -> Result<Value, MethodError> {
    let (nqn, host) = nqn_and_host(&mut p)?;
    let keys = dhchap_keys(registry, &mut p)?;
    let psk = host_psk(registry, &mut p, &host)?;
    p.finish()?;
    registry.nvmf().add_host_with(&nqn, &host, keys, psk).map_err(RegistryError::from)?;
    Ok(json!(true))
}

/// Replaces a host's keys: the connections after it use them. As SPDK, the keys not named
/// are removed.
fn nvmf_subsystem_set_keys(registry: &Registry, p: Params) -> Result<Value, MethodError> {
    with_host_keys(registry, p, &[], NvmfTarget::set_host_keys)
}

/// `nqn`, `host`, SPDK's parameters `neutral` and the host's keys, given to `apply`.
fn with_host_keys(
    registry: &Registry,
    mut p: Params,
    neutral: &[(&'static str, Neutral)],
    apply: fn(&NvmfTarget, &str, &str, Option<DhchapKeys>) -> Result<(), fp_nvmf::NvmfError>,
) -> Result<Value, MethodError> {
    let (nqn, host) = nqn_and_host(&mut p)?;
    p.spdk_only(neutral)?;
    let keys = dhchap_keys(registry, &mut p)?;
    p.finish()?;
    apply(registry.nvmf(), &nqn, &host, keys).map_err(RegistryError::from)?;
    Ok(json!(true))
}

fn nvmf_subsystem_remove_host(registry: &Registry, mut p: Params) -> Result<Value, MethodError> {
    let (nqn, host) = nqn_and_host(&mut p)?;
    // The host's controllers are disconnected at once; their in-flight commands are answered
    // first, so there is no timeout to give.
    p.spdk_only(&[("timeout_ms", Neutral::Absent)])?;
    p.finish()?;
    registry.nvmf().remove_host(&nqn, &host).map_err(RegistryError::from)?;
    Ok(json!(true))
}

/// The target's DH-HMAC-CHAP hashes and groups; SPDK's other target settings have no
/// counterpart and are refused by name unless at their neutral value.
fn nvmf_set_config(registry: &Registry, mut p: Params) -> Result<Value, MethodError> {
    let current = registry.nvmf().dhchap_config();
    let digests = fp_nvme::rpc::params::names_of(&mut p, "dhchap_digests", HashId::ALL, HashId::name)?;
    let dhgroups =
        fp_nvme::rpc::params::names_of(&mut p, "dhchap_dhgroups", DhGroupId::ALL, DhGroupId::name)?;
    p.spdk_only(&[
        ("acceptor_poll_rate", Neutral::Absent),
        ("conn_sched", Neutral::Absent),
        ("passthru_identify_ctrlr", Neutral::Absent),
        ("poll_groups_mask", Neutral::Absent),
        ("discovery_filter", Neutral::Absent),
        ("admin_cmd_passthru", Neutral::Absent),
    ])?;
    p.finish()?;
    registry.nvmf().set_dhchap_config(DhchapConfig {
        digests: digests.unwrap_or(current.digests),
        dhgroups: dhgroups.unwrap_or(current.dhgroups),
    });
    Ok(json!(true))
}

fn nvmf_subsystem_allow_any_host(registry: &Registry, mut p: Params) -> Result<Value, MethodError> {
    let nqn = nqn_only(&mut p)?;
    let allow = p
        .optional_bool("allow_any_host")?
        .ok_or_else(|| ParamError::new("allow_any_host", "required parameter missing (true or false)"))?;
    p.finish()?;
    registry.nvmf().set_allow_any_host(&nqn, allow).map_err(RegistryError::from)?;
    Ok(json!(true))
}

fn nvmf_subsystem_get_controllers(registry: &Registry, mut p: Params) -> Result<Value, MethodError> {
    let nqn = nqn_only(&mut p)?;
    p.finish()?;
    let list = registry.nvmf().controllers(&nqn).map_err(RegistryError::from)?;
    Ok(serde_json::to_value(list).expect("plain data serialises"))
}

fn nvmf_subsystem_get_qpairs(registry: &Registry, mut p: Params) -> Result<Value, MethodError> {
    let nqn = nqn_only(&mut p)?;
    p.finish()?;
    let list = registry.nvmf().qpairs(&nqn).map_err(RegistryError::from)?;
    Ok(serde_json::to_value(list).expect("plain data serialises"))
}

/// SPDK's shape as far as it maps: `tick_rate` and one poll group per reactor (named as the
/// queue pairs' `thread`) with the admin and I/O queue pairs it serves now; SPDK's cumulative
/// counts and transport internals have no counterpart. flashpath's own counters follow, per
/// subsystem and namespace: `subsystems: [{nqn, controllers, qpairs, namespaces: [{nsid,
/// read_ops, ...}]}]`.
fn nvmf_get_stats(registry: &Registry, mut p: Params) -> Result<Value, MethodError> {
    target_name(&mut p)?;
    p.finish()?;
    let target = registry.nvmf();
    let mut groups: Vec<(String, u64, u64)> = registry
        .reactor_handles()
        .iter()
        .map(|r| (format!("nvmf_tgt_poll_group_{}", r.id()), 0, 0))
        .collect();
    let nqns: Vec<String> = target.subsystems().into_iter().map(|s| s.nqn).collect();
    for qpair in nqns.iter().filter_map(|nqn| target.qpairs(nqn).ok()).flatten() {
        if let Some(g) = groups.iter_mut().find(|g| g.0 == qpair.thread) {
            if qpair.qid == 0 {
                g.1 += 1;
            } else {
                g.2 += 1;
            }
        }
    }
    let poll_groups: Vec<Value> = groups
        .into_iter()
        .map(|(name, admin, io)| {
            json!({ "name": name, "current_admin_qpairs": admin, "current_io_qpairs": io,
                    "transports": [{ "trtype": "TCP" }] })
        })
        .collect();
    Ok(json!({
        // Nanoseconds, as framework_get_reactors reports.
        "tick_rate": 1_000_000_000u64,
        "poll_groups": poll_groups,
        "subsystems": target.stats(),
    }))
}
