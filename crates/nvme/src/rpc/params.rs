//! The parameters of `bdev_nvme_attach_controller` and `bdev_nvme_set_options`, decoded and
//! checked one named field at a time (SPDK's names, doc/jsonrpc.md), before anything is
//! connected. Every refusal names its field.

use std::net::IpAddr;

use fp_nvme_spec::auth::{DhGroupId, HashId};
use fp_rpc::{Neutral, ParamError, Params};

use crate::bdev::paths::{Policy, Selector};
use crate::tcp::DhchapOffer;

/// SPDK's `trtype`: how the controller is reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trtype {
    /// A PCI function bound to vfio-pci.
    Pcie,
    /// An NVMe/TCP target.
    Tcp,
}

impl Trtype {
    /// As SPDK spells it in `trid.trtype`.
    pub fn as_str(self) -> &'static str {
        match self {
            Trtype::Pcie => "PCIe",
            Trtype::Tcp => "TCP",
        }
    }
}

/// SPDK's `adrfam` for TCP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddressFamily {
    /// An IPv4 address.
    IPv4,
    /// An IPv6 address.
    IPv6,
}

impl AddressFamily {
    /// As SPDK spells it in `trid.adrfam`.
    pub fn as_str(self) -> &'static str {
        match self {
            AddressFamily::IPv4 => "IPv4",
            AddressFamily::IPv6 => "IPv6",
        }
    }
}

/// The NVMe/TCP well-known port (NVMe/TCP transport 1.0, 7.4.9.1 of NVMe-oF 1.1: 4420 for I/O
/// controllers), used when `trsvcid` is left out.
pub const DEFAULT_TRSVCID: u16 = 4420;

/// What happens when a controller is lost (SPDK's I/O error resiliency triple).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reconnect {
    /// How long to keep trying to reconnect before deleting the controller; -1 forever, 0
    /// never try.
    pub ctrlr_loss_timeout_sec: i64,
    /// The wait between reconnect attempts.
    pub reconnect_delay_sec: u32,
    /// After this long without the controller, queued I/O fails instead of waiting; 0 never.
    pub fast_io_fail_timeout_sec: u32,
}

impl Default for Reconnect {
    /// SPDK's defaults: no reconnect.
    fn default() -> Reconnect {
        Reconnect { ctrlr_loss_timeout_sec: 0, reconnect_delay_sec: 0, fast_io_fail_timeout_sec: 0 }
    }
}

/// `Reconnect`'s fields as a method gave them (each overrides its default alone).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReconnectParams {
    ctrlr_loss_timeout_sec: Option<i64>,
    reconnect_delay_sec: Option<u32>,
    fast_io_fail_timeout_sec: Option<u32>,
}

impl ReconnectParams {
    fn take(p: &mut Params) -> Result<ReconnectParams, ParamError> {
        Ok(ReconnectParams {
            ctrlr_loss_timeout_sec: p.optional_int("ctrlr_loss_timeout_sec", -1, i64::from(i32::MAX))?,
            reconnect_delay_sec: p
                .optional_uint("reconnect_delay_sec", u64::from(u32::MAX))?
                .map(|v| v as u32),
            fast_io_fail_timeout_sec: p
                .optional_uint("fast_io_fail_timeout_sec", u64::from(u32::MAX))?
                .map(|v| v as u32),
        })
    }

    /// `defaults` with the fields given here replaced, checked as SPDK checks them together.
    pub fn over(&self, defaults: Reconnect) -> Result<Reconnect, ParamError> {
        let r = Reconnect {
            ctrlr_loss_timeout_sec: self.ctrlr_loss_timeout_sec.unwrap_or(defaults.ctrlr_loss_timeout_sec),
            reconnect_delay_sec: self.reconnect_delay_sec.unwrap_or(defaults.reconnect_delay_sec),
            fast_io_fail_timeout_sec: self
                .fast_io_fail_timeout_sec
                .unwrap_or(defaults.fast_io_fail_timeout_sec),
        };
        check_reconnect(&r)?;
        Ok(r)
    }
}

/// SPDK's rules for the triple (bdev_nvme's io error resiliency check): with a loss timeout,
/// a non-zero delay no longer than it; without one (0), no delay and no fast failure; a fast
/// failure timeout, when set, from the delay up to the loss timeout.
fn check_reconnect(r: &Reconnect) -> Result<(), ParamError> {
    let (loss, delay, fail) = (r.ctrlr_loss_timeout_sec, r.reconnect_delay_sec, r.fast_io_fail_timeout_sec);
    if loss == 0 {
        if delay != 0 {
            return Err(ParamError::new(
                "reconnect_delay_sec",
                format!("must be 0 when ctrlr_loss_timeout_sec is 0 (no reconnect), got {delay}"),
            ));
        }
        if fail != 0 {
            return Err(ParamError::new(
                "fast_io_fail_timeout_sec",
                format!("must be 0 when ctrlr_loss_timeout_sec is 0 (no reconnect), got {fail}"),
            ));
        }
        return Ok(());
    }
    if delay == 0 {
        return Err(ParamError::new(
            "reconnect_delay_sec",
            format!("must not be 0 when ctrlr_loss_timeout_sec is {loss} (reconnects are tried)"),
        ));
    }
    if loss > 0 && i64::from(delay) > loss {
        return Err(ParamError::new(
            "reconnect_delay_sec",
            format!("{delay} is more than ctrlr_loss_timeout_sec {loss}"),
        ));
    }
    if fail != 0 {
        if fail < delay {
            return Err(ParamError::new(
                "fast_io_fail_timeout_sec",
                format!("{fail} is less than reconnect_delay_sec {delay}"),
            ));
        }
        if loss > 0 && i64::from(fail) > loss {
            return Err(ParamError::new(
                "fast_io_fail_timeout_sec",
                format!("{fail} is more than ctrlr_loss_timeout_sec {loss}"),
            ));
        }
    }
    Ok(())
}

/// Where a controller is, as `bdev_nvme_attach_controller` gave it, checked and normalised.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Address {
    /// A PCI function: `traddr` as "dddd:bb:dd.f" (lower-case hex, domain included).
    Pcie {
        /// The function's address.
        traddr: String,
    },
    /// An NVMe/TCP subsystem.
    Tcp {
        /// The target's IP address.
        traddr: IpAddr,
        /// Its port.
        trsvcid: u16,
        /// The subsystem.
        subnqn: String,
        /// This host's NQN, when given (else the module's own).
        hostnqn: Option<String>,
        /// Header digests (CRC-32C) on every PDU.
        hdgst: bool,
        /// Data digests on every data PDU.
        ddgst: bool,
    },
}

impl Address {
    /// SPDK's `trtype`.
    pub fn trtype(&self) -> Trtype {
        match self {
            Address::Pcie { .. } => Trtype::Pcie,
            Address::Tcp { .. } => Trtype::Tcp,
        }
    }

    /// SPDK's `traddr`.
    pub fn traddr(&self) -> String {
        match self {
            Address::Pcie { traddr } => traddr.clone(),
            Address::Tcp { traddr, .. } => traddr.to_string(),
        }
    }
}

/// `bdev_nvme_attach_controller`'s parameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttachParams {
    /// The controller's name, its namespaces' bdevs' prefix (`<name>n<nsid>`).
    pub name: String,
    /// Where it is.
    pub address: Address,
    /// The reconnect fields given (over `bdev_nvme_set_options`' defaults).
    pub reconnect: ReconnectParams,
    /// DH-HMAC-CHAP: the keyring name of the host's key (`dhchap_key`).
    pub dhchap_key: Option<String>,
    /// The keyring name of the controller's key (`dhchap_ctrlr_key`): authenticate the
    /// controller too.
    pub dhchap_ctrlr_key: Option<String>,
    /// TLS: the keyring name of the PSK (`psk`, the interchange format `NVMeTLSkey-1:...`).
    pub psk: Option<String>,
    /// What a taken `name` means (`multipath`); none when not given.
    pub multipath: Option<MultipathMode>,
    /// The namespaces' multipath policy (`multipath_opts`, SPDK's newest client), when given.
    pub policy: Option<Policy>,
}

/// A multipath policy from SPDK's fields: `policy`, `selector` (active_active only) and the
/// round-robin count (`rr_min_io`, or `min_io` in `multipath_opts`; round_robin only). `names`
/// are the three fields as the method calls them, for the refusals.
pub fn parse_policy(
    policy: &str,
    selector: Option<&str>,
    min_io: Option<u64>,
    names: [&'static str; 3],
) -> Result<Policy, ParamError> {
    let [policy_field, selector_field, min_io_field] = names;
    match policy {
        "active_passive" => {
            if let Some(s) = selector {
                return Err(ParamError::new(
                    selector_field,
                    format!("'{s}': a selector is for active_active only"),
                ));
            }
            if min_io.is_some() {
                return Err(ParamError::new(min_io_field, "for active_active round_robin only"));
            }
            Ok(Policy::ActivePassive)
        }
        "active_active" => {
            let selector = match selector {
                None | Some("round_robin") => Selector::RoundRobin,
                Some("queue_depth") => Selector::QueueDepth,
                Some(other) => {
                    return Err(ParamError::new(
                        selector_field,
                        format!("'{other}' is not one of round_robin, queue_depth"),
                    ))
                }
            };
            if min_io.is_some() && selector != Selector::RoundRobin {
                return Err(ParamError::new(min_io_field, "for active_active round_robin only"));
            }
            let rr_min_io = match min_io {
                Some(0) => return Err(ParamError::new(min_io_field, "must be at least 1")),
                Some(n) => n as u32,
                None => 1,
            };
            Ok(Policy::ActiveActive { selector, rr_min_io })
        }
        other => Err(ParamError::new(
            policy_field,
            format!("'{other}' is not one of active_passive, active_active"),
        )),
    }
}

/// `multipath_opts` of `bdev_nvme_attach_controller`: `{policy, selector?, min_io?}`.
fn multipath_opts(opts: serde_json::Map<String, serde_json::Value>) -> Result<Policy, ParamError> {
    let mut p = Params::new(Some(serde_json::Value::Object(opts)))
        .map_err(|e| ParamError::new("multipath_opts", e.to_string()))?;
    let policy =
        p.required_str("policy").map_err(|e| ParamError::new("multipath_opts.policy", e.to_string()))?;
    let selector =
        p.optional_str("selector").map_err(|e| ParamError::new("multipath_opts.selector", e.to_string()))?;
    let min_io = p
        .optional_uint("min_io", u64::from(u32::MAX))
        .map_err(|e| ParamError::new("multipath_opts.min_io", e.to_string()))?;
    p.finish().map_err(|e| ParamError::new("multipath_opts", e.to_string()))?;
    parse_policy(
        &policy,
        selector.as_deref(),
        min_io,
        ["multipath_opts.policy", "multipath_opts.selector", "multipath_opts.min_io"],
    )
}

/// SPDK's `multipath` of `bdev_nvme_attach_controller`: what attaching under a name already
/// taken does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MultipathMode {
    /// Refused: one path per name.
    Disable,
    /// Another path, used only while the paths before it are down (the namespaces' policy
    /// becomes active_passive).
    Failover,
    /// Another path, used as the namespaces' policy says.
    Multipath,
}

impl MultipathMode {
    /// SPDK's name.
    pub fn as_str(self) -> &'static str {
        match self {
            MultipathMode::Disable => "disable",
            MultipathMode::Failover => "failover",
            MultipathMode::Multipath => "multipath",
        }
    }
}

/// SPDK parameters of `bdev_nvme_attach_controller` flashpath does not implement: accepted
/// only at the value SPDK's client sends by default (or absent).
const ATTACH_SPDK_ONLY: &[(&str, Neutral)] = &[
    ("prchk_reftag", Neutral::Bool(false)),
    ("prchk_guard", Neutral::Bool(false)),
    ("allow_unrecognized_csi", Neutral::Bool(false)),
    ("disable_sq_flow_control", Neutral::Bool(false)),
    ("fabrics_connect_timeout_us", Neutral::Absent),
    ("num_io_queues", Neutral::Absent),
    ("priority", Neutral::Absent),
    ("max_bdevs", Neutral::Absent),
];

impl AttachParams {
    /// Decodes and checks `p` (refusing what is left over).
    pub fn decode(mut p: Params) -> Result<AttachParams, ParamError> {
        let name = p.required_str("name")?;
        let trtype = p.required_str("trtype")?;
        let traddr = p.required_str("traddr")?;
        let adrfam = p.optional_str("adrfam")?;
        let trsvcid = p.optional_str("trsvcid")?;
        let subnqn = p.optional_str("subnqn")?;
        let hostnqn = p.optional_str("hostnqn")?;
        let hdgst = p.optional_bool("hdgst")?.unwrap_or(false);
        let ddgst = p.optional_bool("ddgst")?.unwrap_or(false);
        let reconnect = ReconnectParams::take(&mut p)?;
        let dhchap_key = p.optional_str("dhchap_key")?;
        let dhchap_ctrlr_key = p.optional_str("dhchap_ctrlr_key")?;
        let psk = p.optional_str("psk")?;
        // Named refusals for what a second path or a chosen source address would need.
        for (field, reason) in [
            ("hostaddr", "not supported: the connection's source address is the kernel's choice"),
            ("hostsvcid", "not supported: the connection's source port is the kernel's choice"),
        ] {
            p.unsupported(field, None).map_err(|_| ParamError::new(field, reason))?;
        }
        let multipath = match p.optional_str("multipath")?.as_deref().map(str::to_ascii_lowercase).as_deref()
        {
            None => None,
            Some("disable") => Some(MultipathMode::Disable),
            Some("failover") => Some(MultipathMode::Failover),
            Some("multipath") => Some(MultipathMode::Multipath),
            Some(other) => {
                return Err(ParamError::new(
                    "multipath",
                    format!("'{other}' is not one of disable, failover, multipath"),
                ))
            }
        };
        let policy = p.optional_object("multipath_opts")?.map(multipath_opts).transpose()?;
        p.spdk_only(ATTACH_SPDK_ONLY)?;
        p.finish()?;

        check_name(&name)?;
        let address = match parse_trtype(&trtype)? {
            Trtype::Pcie => {
                let tcp_only = [
                    ("adrfam", adrfam.is_some()),
                    ("trsvcid", trsvcid.is_some()),
                    ("subnqn", subnqn.is_some()),
                    ("hostnqn", hostnqn.is_some()),
                    ("hdgst", hdgst),
                    ("ddgst", ddgst),
                    ("dhchap_key", dhchap_key.is_some()),
                    ("dhchap_ctrlr_key", dhchap_ctrlr_key.is_some()),
                    ("psk", psk.is_some()),
                ];
                if let Some((field, _)) = tcp_only.iter().find(|(_, given)| *given) {
                    return Err(ParamError::new(*field, "only for trtype TCP"));
                }
                Address::Pcie { traddr: parse_pci_address(&traddr)? }
            }
            Trtype::Tcp => {
                let ip: IpAddr = traddr.parse().map_err(|_| {
                    ParamError::new("traddr", format!("'{traddr}' is not an IPv4 or IPv6 address"))
                })?;
                if let Some(adrfam) = adrfam {
                    let family = parse_adrfam(&adrfam)?;
                    if family != family_of(&ip) {
                        return Err(ParamError::new(
                            "adrfam",
                            format!("{} does not match traddr {ip}", family.as_str()),
                        ));
                    }
                }
                let trsvcid = match trsvcid {
                    None => DEFAULT_TRSVCID,
                    Some(s) => match s.parse::<u16>() {
                        Ok(port) if port != 0 => port,
                        _ => {
                            return Err(ParamError::new(
                                "trsvcid",
                                format!("'{s}' is not a port number from 1 to 65535"),
                            ))
                        }
                    },
                };
                let subnqn = subnqn.ok_or_else(|| {
                    ParamError::new("subnqn", "required for trtype TCP (the subsystem to connect to)")
                })?;
                check_nqn("subnqn", &subnqn)?;
                if let Some(h) = &hostnqn {
                    check_nqn("hostnqn", h)?;
                }
                Address::Tcp { traddr: ip, trsvcid, subnqn, hostnqn, hdgst, ddgst }
            }
        };
        if dhchap_ctrlr_key.is_some() && dhchap_key.is_none() {
            return Err(ParamError::new(
                "dhchap_ctrlr_key",
                "needs dhchap_key (the controller is authenticated in the host's transaction)",
            ));
        }
        Ok(AttachParams { name, address, reconnect, dhchap_key, dhchap_ctrlr_key, psk, multipath, policy })
    }
}

/// A controller name: printable, no spaces, short enough for its bdevs' names.
fn check_name(name: &str) -> Result<(), ParamError> {
    if name.is_empty() || name.len() > 64 || name.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return Err(ParamError::new(
            "name",
            "must be 1 to 64 bytes without spaces or control characters (e.g. Nvme0)",
        ));
    }
    Ok(())
}

/// `trtype`, case-insensitive as SPDK's `spdk_nvme_transport_id_parse_trtype`.
fn parse_trtype(s: &str) -> Result<Trtype, ParamError> {
    match s.to_ascii_lowercase().as_str() {
        "pcie" => Ok(Trtype::Pcie),
        "tcp" => Ok(Trtype::Tcp),
        "rdma" | "fc" | "vfiouser" | "custom" => {
            Err(ParamError::new("trtype", format!("'{s}' is not supported: PCIe or TCP")))
        }
        _ => Err(ParamError::new("trtype", format!("'{s}' is not a transport: PCIe or TCP"))),
    }
}

/// `adrfam`, case-insensitive.
fn parse_adrfam(s: &str) -> Result<AddressFamily, ParamError> {
    match s.to_ascii_lowercase().as_str() {
        "ipv4" => Ok(AddressFamily::IPv4),
        "ipv6" => Ok(AddressFamily::IPv6),
        _ => Err(ParamError::new("adrfam", format!("'{s}' is not supported: IPv4 or IPv6"))),
    }
}

/// The family of `ip`.
pub fn family_of(ip: &IpAddr) -> AddressFamily {
    match ip {
        IpAddr::V4(_) => AddressFamily::IPv4,
        IpAddr::V6(_) => AddressFamily::IPv6,
    }
}

/// An NQN as the Connect command carries it (Base 4.5): "nqn." and at most 223 bytes.
fn check_nqn(field: &'static str, nqn: &str) -> Result<(), ParamError> {
    if !nqn.starts_with("nqn.")
        || nqn.len() > fp_nvme_spec::fabrics::NQN_MAX_LEN
        || nqn.chars().any(char::is_control)
    {
        return Err(ParamError::new(
            field,
            format!("'{nqn}' is not an NQN (nqn.yyyy-mm.<domain>..., at most 223 bytes)"),
        ));
    }
    Ok(())
}

/// A PCI address, "dddd:bb:dd.f" or "bb:dd.f" (domain 0), normalised to the first form.
pub fn parse_pci_address(s: &str) -> Result<String, ParamError> {
    let bad = || {
        ParamError::new(
            "traddr",
            format!("'{s}' is not a PCI address (domain:bus:device.function, e.g. 0000:00:04.0)"),
        )
    };
    let hex = |t: &str, max: u32| {
        if t.is_empty() || t.len() > 4 || !t.chars().all(|c| c.is_ascii_hexdigit()) {
            return None;
        }
        u32::from_str_radix(t, 16).ok().filter(|v| *v <= max)
    };
    let parts: Vec<&str> = s.split(':').collect();
    let (domain, bus, rest) = match parts.as_slice() {
        [d, b, r] => (hex(d, 0xffff).ok_or_else(bad)?, *b, *r),
        [b, r] => (0, *b, *r),
        _ => return Err(bad()),
    };
    let bus = hex(bus, 0xff).ok_or_else(bad)?;
    let (dev, func) = rest.split_once('.').ok_or_else(bad)?;
    let dev = hex(dev, 0x1f).ok_or_else(bad)?;
    let func = hex(func, 7).ok_or_else(bad)?;
    Ok(format!("{domain:04x}:{bus:02x}:{dev:02x}.{func:x}"))
}

/// What to do with a command that outlived `timeout_us` (SPDK's `action_on_timeout`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnTimeout {
    /// Only log it.
    None,
    /// Abort it (Base 5.1), then reset the controller if it is still there.
    Abort,
    /// Reset the controller.
    Reset,
}

impl OnTimeout {
    /// SPDK's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            OnTimeout::None => "none",
            OnTimeout::Abort => "abort",
            OnTimeout::Reset => "reset",
        }
    }
}

/// The module's options (`bdev_nvme_set_options`), for the controllers attached afterwards.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Options {
    /// An I/O command's timeout in microseconds; 0: none.
    pub timeout_us: u64,
    /// An admin command's timeout in microseconds; 0: `timeout_us`.
    pub timeout_admin_us: u64,
    /// What a timeout does.
    pub action_on_timeout: OnTimeout,
    /// The Keep Alive Timeout asked for at connect (Base 5.27.1.12), in ms; 0: none.
    pub keep_alive_timeout_ms: u32,
    /// The reconnect defaults of `bdev_nvme_attach_controller`.
    pub reconnect: Reconnect,
    /// Requests one channel (one I/O queue pair) takes at once; 0: the driver's default.
    pub io_queue_requests: u32,
    /// How often a controller's thread looks for asynchronous events, in microseconds.
    pub nvme_adminq_poll_period_us: u64,
    /// SPDK's `enable_flush`: a controller's volatile write cache is flushed (namespaces report
    /// flush and send Flush); off, flush is neither reported nor sent.
    pub enable_flush: bool,
    /// The DH-HMAC-CHAP hashes and groups offered (`dhchap_digests`, `dhchap_dhgroups`).
    pub dhchap: DhchapOffer,
}

/// SPDK's default admin queue poll period (10 ms).
pub const DEFAULT_ADMINQ_POLL_PERIOD_US: u64 = 10_000;

/// The most requests a channel may be given (each is preallocated, per reactor and namespace).
pub const MAX_IO_QUEUE_REQUESTS: u64 = 65_536;

/// The longest admin queue poll period: 10 s, beyond which events would arrive late enough to
/// look lost.
pub const MAX_ADMINQ_POLL_PERIOD_US: u64 = 10_000_000;

/// SPDK's default keep-alive timeout (10 s).
pub const DEFAULT_KEEP_ALIVE_TIMEOUT_MS: u32 = 10_000;

impl Default for Options {
    /// SPDK's defaults: no timeouts, 10 s keep-alive, no reconnect; except `enable_flush`,
    /// which is on (SPDK's is off): a daemon that was never told otherwise flushes caches.
    fn default() -> Options {
        Options {
            timeout_us: 0,
            timeout_admin_us: 0,
            action_on_timeout: OnTimeout::None,
            keep_alive_timeout_ms: DEFAULT_KEEP_ALIVE_TIMEOUT_MS,
            reconnect: Reconnect::default(),
            io_queue_requests: 0,
            nvme_adminq_poll_period_us: DEFAULT_ADMINQ_POLL_PERIOD_US,
            enable_flush: true,
            dhchap: DhchapOffer::default(),
        }
    }
}

/// SPDK options of `bdev_nvme_set_options` flashpath does not implement: accepted only at the
/// value SPDK's client sends by default (or SPDK's own default), refused by name otherwise.
const OPTIONS_SPDK_ONLY: &[(&str, Neutral)] = &[
    // flashpath always batches submissions: one doorbell (or send) per poll round.
    ("delay_cmd_submit", Neutral::Bool(true)),
    ("disable_auto_failback", Neutral::Bool(false)),
    ("generate_uuids", Neutral::Bool(false)),
    ("nvme_error_stat", Neutral::Bool(false)),
    ("io_path_stat", Neutral::Bool(false)),
    ("allow_accel_sequence", Neutral::Bool(false)),
    ("arbitration_burst", Neutral::Int(0)),
    ("low_priority_weight", Neutral::Int(0)),
    ("medium_priority_weight", Neutral::Int(0)),
    ("high_priority_weight", Neutral::Int(0)),
    // I/O queues are polled every reactor round.
    ("nvme_ioq_poll_period_us", Neutral::Int(0)),
    ("transport_ack_timeout", Neutral::Int(0)),
    ("transport_tos", Neutral::Int(0)),
    ("rdma_srq_size", Neutral::Int(0)),
    ("rdma_max_cq_size", Neutral::Int(0)),
    ("tcp_connect_timeout_ms", Neutral::Int(0)),
    ("retry_count", Neutral::Absent),
    ("transport_retry_count", Neutral::Absent),
    ("bdev_retry_count", Neutral::Absent),
    ("rdma_cm_event_timeout_ms", Neutral::Absent),
    ("rdma_umr_per_io", Neutral::Absent),
    ("multipath_opts", Neutral::Absent),
];

/// `bdev_nvme_set_options`' parameters: each given field replaces the current value.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OptionsParams {
    timeout_us: Option<u64>,
    timeout_admin_us: Option<u64>,
    action_on_timeout: Option<OnTimeout>,
    keep_alive_timeout_ms: Option<u32>,
    reconnect: ReconnectParams,
    io_queue_requests: Option<u32>,
    nvme_adminq_poll_period_us: Option<u64>,
    enable_flush: Option<bool>,
    dhchap_digests: Option<Vec<HashId>>,
    dhchap_dhgroups: Option<Vec<DhGroupId>>,
    /// The first field given, to name in a refusal that is about the call as a whole.
    pub first_field: Option<&'static str>,
}

/// The most microseconds a timeout may be (about 1.2 days): beyond, a command is better
/// considered lost by the reconnect timeouts.
const MAX_TIMEOUT_US: u64 = 100_000_000_000;

impl OptionsParams {
    /// Decodes `p` (refusing what is left over).
    pub fn decode(mut p: Params) -> Result<OptionsParams, ParamError> {
        let timeout_us = p.optional_uint("timeout_us", MAX_TIMEOUT_US)?;
        let timeout_admin_us = p.optional_uint("timeout_admin_us", MAX_TIMEOUT_US)?;
        let action_on_timeout = match p.optional_str("action_on_timeout")? {
            None => None,
            Some(a) => Some(match a.to_ascii_lowercase().as_str() {
                "none" => OnTimeout::None,
                "abort" => OnTimeout::Abort,
                "reset" => OnTimeout::Reset,
                _ => {
                    return Err(ParamError::new(
                        "action_on_timeout",
                        format!("'{a}' is not one of none, abort, reset"),
                    ))
                }
            }),
        };
        let keep_alive_timeout_ms =
            p.optional_uint("keep_alive_timeout_ms", u64::from(u32::MAX))?.map(|v| v as u32);
        let reconnect = ReconnectParams::take(&mut p)?;
        let io_queue_requests =
            p.optional_uint("io_queue_requests", MAX_IO_QUEUE_REQUESTS)?.map(|v| v as u32);
        let nvme_adminq_poll_period_us =
            p.optional_uint("nvme_adminq_poll_period_us", MAX_ADMINQ_POLL_PERIOD_US)?;
        let enable_flush = p.optional_bool("enable_flush")?;
        let dhchap_digests = names_of(&mut p, "dhchap_digests", HashId::ALL, HashId::name)?;
        let dhchap_dhgroups = names_of(&mut p, "dhchap_dhgroups", DhGroupId::ALL, DhGroupId::name)?;
        p.spdk_only(OPTIONS_SPDK_ONLY)?;
        p.finish()?;
        let given = [
            ("timeout_us", timeout_us.is_some()),
            ("timeout_admin_us", timeout_admin_us.is_some()),
            ("action_on_timeout", action_on_timeout.is_some()),
            ("keep_alive_timeout_ms", keep_alive_timeout_ms.is_some()),
            ("ctrlr_loss_timeout_sec", reconnect.ctrlr_loss_timeout_sec.is_some()),
            ("reconnect_delay_sec", reconnect.reconnect_delay_sec.is_some()),
            ("fast_io_fail_timeout_sec", reconnect.fast_io_fail_timeout_sec.is_some()),
            ("io_queue_requests", io_queue_requests.is_some()),
            ("nvme_adminq_poll_period_us", nvme_adminq_poll_period_us.is_some()),
            ("enable_flush", enable_flush.is_some()),
            ("dhchap_digests", dhchap_digests.is_some()),
            ("dhchap_dhgroups", dhchap_dhgroups.is_some()),
        ];
        let first_field = given.iter().find(|(_, g)| *g).map(|(f, _)| *f);
        Ok(OptionsParams {
            timeout_us,
            timeout_admin_us,
            action_on_timeout,
            keep_alive_timeout_ms,
            reconnect,
            io_queue_requests,
            nvme_adminq_poll_period_us,
            enable_flush,
            dhchap_digests,
            dhchap_dhgroups,
            first_field,
        })
    }

    /// `current` with the given fields replaced, checked as a whole.
    pub fn over(&self, current: Options) -> Result<Options, ParamError> {
        let o = Options {
            timeout_us: self.timeout_us.unwrap_or(current.timeout_us),
            timeout_admin_us: self.timeout_admin_us.unwrap_or(current.timeout_admin_us),
            action_on_timeout: self.action_on_timeout.unwrap_or(current.action_on_timeout),
            keep_alive_timeout_ms: self.keep_alive_timeout_ms.unwrap_or(current.keep_alive_timeout_ms),
            reconnect: self.reconnect.over(current.reconnect)?,
            io_queue_requests: self.io_queue_requests.unwrap_or(current.io_queue_requests),
            nvme_adminq_poll_period_us: self
                .nvme_adminq_poll_period_us
                .unwrap_or(current.nvme_adminq_poll_period_us),
            enable_flush: self.enable_flush.unwrap_or(current.enable_flush),
            dhchap: DhchapOffer::new(
                self.dhchap_digests.as_deref().unwrap_or(&current.dhchap.digests()),
                self.dhchap_dhgroups.as_deref().unwrap_or(&current.dhchap.dhgroups()),
            ),
        };
        if o.timeout_us == 0 && o.timeout_admin_us != 0 {
            return Err(ParamError::new(
                "timeout_admin_us",
                "needs timeout_us too (timeout_us 0 turns timeouts off)",
            ));
        }
        if o.timeout_us == 0 && o.action_on_timeout != OnTimeout::None {
            return Err(ParamError::new(
                "action_on_timeout",
                format!("'{}' needs timeout_us (0 turns timeouts off)", o.action_on_timeout.as_str()),
            ));
        }
        Ok(o)
    }
}

/// A list of SPDK's names (`dhchap_digests`, `dhchap_dhgroups`): each one of `all`, at least
/// one.
pub fn names_of<T: Copy>(
    p: &mut Params,
    field: &'static str,
    all: &[T],
    name: fn(T) -> &'static str,
) -> Result<Option<Vec<T>>, ParamError> {
    let Some(list) = p.optional_str_list(field)? else { return Ok(None) };
    if list.is_empty() {
        return Err(ParamError::new(field, "offers nothing: name at least one"));
    }
    let known = || all.iter().map(|v| name(*v)).collect::<Vec<_>>().join(", ");
    list.iter()
        .map(|n| {
            all.iter()
                .copied()
                .find(|v| name(*v) == n)
                .ok_or_else(|| ParamError::new(field, format!("'{n}' is not one of {}", known())))
        })
        .collect::<Result<Vec<T>, ParamError>>()
        .map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn attach(v: Value) -> Result<AttachParams, ParamError> {
        AttachParams::decode(Params::new(Some(v)).unwrap())
    }

    fn refusal(v: Value) -> String {
        attach(v).unwrap_err().to_string()
    }

    #[test]
    fn multipath_mode_and_policy_are_decoded_and_checked() {
        let base = json!({"name": "N", "trtype": "tcp", "traddr": "127.0.0.1", "subnqn": "nqn.x"});
        let with = |extra: Value| {
            let mut v = base.clone();
            v.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
            v
        };
        assert_eq!(attach(base.clone()).unwrap().multipath, None);
        let a = attach(with(json!({"multipath": "Multipath",
            "multipath_opts": {"policy": "active_active", "selector": "round_robin", "min_io": 4}})))
        .unwrap();
        assert_eq!(a.multipath, Some(MultipathMode::Multipath));
        assert_eq!(a.policy, Some(Policy::ActiveActive { selector: Selector::RoundRobin, rr_min_io: 4 }));
        let a =
            attach(with(json!({"multipath": "failover", "multipath_opts": {"policy": "active_passive"}})))
                .unwrap();
        assert_eq!((a.multipath, a.policy), (Some(MultipathMode::Failover), Some(Policy::ActivePassive)));
        for (extra, want) in [
            (json!({"multipath_opts": {"policy": "all"}}), "multipath_opts.policy: 'all' is not one of"),
            (
                json!({"multipath_opts": {"policy": "active_passive", "selector": "queue_depth"}}),
                "multipath_opts.selector: 'queue_depth': a selector is for active_active only",
            ),
            (
                json!({"multipath_opts": {"policy": "active_active", "selector": "queue_depth", "min_io": 2}}),
                "multipath_opts.min_io: for active_active round_robin only",
            ),
            (
                json!({"multipath_opts": {"policy": "active_active", "min_io": 0}}),
                "multipath_opts.min_io: must be at least 1",
            ),
            (json!({"multipath_opts": {"selector": "round_robin"}}), "multipath_opts.policy: "),
            (json!({"multipath_opts": {"policy": "active_active", "weight": 1}}), "multipath_opts: "),
        ] {
            let got = refusal(with(extra));
            assert!(got.starts_with(want), "{got} (wanted {want})");
        }
        assert_eq!(
            parse_policy("active_active", Some("queue_depth"), None, ["policy", "selector", "rr_min_io"]),
            Ok(Policy::ActiveActive { selector: Selector::QueueDepth, rr_min_io: 1 })
        );
    }

    #[test]
    fn a_tcp_attach_is_decoded_with_spdk_defaults() {
        let a = attach(json!({
            "name": "Nvme0", "trtype": "tcp", "traddr": "127.0.0.1", "adrfam": "ipv4",
            "trsvcid": "4421", "subnqn": "nqn.2016-06.io.spdk:cnode1",
            // What SPDK's client sends unasked.
            "prchk_reftag": false, "prchk_guard": false, "hdgst": false, "ddgst": true,
            "allow_unrecognized_csi": false, "disable_sq_flow_control": false,
        }))
        .unwrap();
        assert_eq!(a.name, "Nvme0");
        assert_eq!(
            a.address,
            Address::Tcp {
                traddr: "127.0.0.1".parse().unwrap(),
                trsvcid: 4421,
                subnqn: "nqn.2016-06.io.spdk:cnode1".into(),
                hostnqn: None,
                hdgst: false,
                ddgst: true,
            }
        );
        assert_eq!(a.reconnect.over(Reconnect::default()).unwrap(), Reconnect::default());
        let a = attach(json!({"name": "N", "trtype": "TCP", "traddr": "::1", "subnqn": "nqn.x"})).unwrap();
        assert!(matches!(a.address, Address::Tcp { trsvcid: DEFAULT_TRSVCID, .. }));
        assert_eq!((a.address.trtype().as_str(), a.address.traddr()), ("TCP", "::1".to_string()));
    }

    #[test]
    fn a_pcie_attach_normalises_the_address() {
        for (given, normal) in
            [("0000:00:04.0", "0000:00:04.0"), ("00:1F.7", "0000:00:1f.7"), ("1:ab:1f.7", "0001:ab:1f.7")]
        {
            let a =
                attach(json!({"name": "Nvme0", "trtype": "PCIe", "traddr": given, "hdgst": false})).unwrap();
            assert_eq!(a.address, Address::Pcie { traddr: normal.into() }, "{given}");
        }
        for bad in ["0000:00:20.0", "00:04", "0000:100:04.0", "x:00:04.0", "0000:00:04.8", ""] {
            let e = refusal(json!({"name": "N", "trtype": "pcie", "traddr": bad}));
            assert!(e.starts_with("traddr: '") && e.contains("is not a PCI address"), "{bad}: {e}");
        }
    }

    #[test]
    fn every_refusal_names_its_field() {
        let tcp = |extra: Value| {
            let mut v = json!({"name": "N", "trtype": "TCP", "traddr": "127.0.0.1", "subnqn": "nqn.a"});
            v.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
            refusal(v)
        };
        let cases = [
            (refusal(json!({"trtype": "TCP"})), "name: required parameter missing"),
            (refusal(json!({"name": "N", "traddr": "x"})), "trtype: required parameter missing"),
            (refusal(json!({"name": "N", "trtype": "tcp"})), "traddr: required parameter missing"),
            (tcp(json!({"name": ""})), "name: must be 1 to 64 bytes"),
            (tcp(json!({"name": "a b"})), "name: must be 1 to 64 bytes"),
            (tcp(json!({"trtype": "rdma"})), "trtype: 'rdma' is not supported: PCIe or TCP"),
            (tcp(json!({"trtype": "ip"})), "trtype: 'ip' is not a transport"),
            (tcp(json!({"traddr": "localhost"})), "traddr: 'localhost' is not an IPv4 or IPv6 address"),
            (tcp(json!({"adrfam": "ib"})), "adrfam: 'ib' is not supported: IPv4 or IPv6"),
            (tcp(json!({"adrfam": "IPv6"})), "adrfam: IPv6 does not match traddr 127.0.0.1"),
            (tcp(json!({"trsvcid": "0"})), "trsvcid: '0' is not a port number"),
            (tcp(json!({"trsvcid": 4420})), "trsvcid: expected a string"),
            (tcp(json!({"subnqn": null})), "subnqn: required for trtype TCP"),
            (tcp(json!({"subnqn": "cnode1"})), "subnqn: 'cnode1' is not an NQN"),
            (tcp(json!({"hostnqn": "h"})), "hostnqn: 'h' is not an NQN"),
            (tcp(json!({"hdgst": "yes"})), "hdgst: expected true or false"),
            (tcp(json!({"hostaddr": "127.0.0.2"})), "hostaddr: not supported"),
            (tcp(json!({"hostsvcid": "9"})), "hostsvcid: not supported"),
            (
                tcp(json!({"multipath": "both"})),
                "multipath: 'both' is not one of disable, failover, multipath",
            ),
            (tcp(json!({"prchk_guard": true})), "prchk_guard: not supported by flashpath (only false)"),
            (
                tcp(json!({"ctrlr_loss_timeout_sec": -2})),
                "ctrlr_loss_timeout_sec: expected an integer between -1",
            ),
            (tcp(json!({"reconnect_delay_sec": -1})), "reconnect_delay_sec: expected an integer between 0"),
            (tcp(json!({"queue_depth": 3})), "queue_depth: unknown parameter; accepted: name, trtype"),
            (
                refusal(json!({"name": "N", "trtype": "PCIe", "traddr": "0000:00:04.0", "subnqn": "nqn.a"})),
                "subnqn: only for trtype TCP",
            ),
            (
                refusal(json!({"name": "N", "trtype": "PCIe", "traddr": "0000:00:04.0", "ddgst": true})),
                "ddgst: only for trtype TCP",
            ),
        ];
        for (got, want) in cases {
            assert!(got.starts_with(want), "{got:?} does not start with {want:?}");
        }
    }

    #[test]
    fn the_reconnect_triple_follows_spdks_rules() {
        let r = |loss: i64, delay: u32, fail: u32| {
            let p = ReconnectParams {
                ctrlr_loss_timeout_sec: Some(loss),
                reconnect_delay_sec: Some(delay),
                fast_io_fail_timeout_sec: Some(fail),
            };
            p.over(Reconnect::default()).map_err(|e| e.field)
        };
        assert!(r(0, 0, 0).is_ok());
        assert!(r(-1, 1, 0).is_ok());
        assert!(r(-1, 2, 5).is_ok());
        assert!(r(10, 2, 5).is_ok());
        assert!(r(10, 10, 10).is_ok());
        assert_eq!(r(0, 1, 0).unwrap_err(), "reconnect_delay_sec");
        assert_eq!(r(0, 0, 1).unwrap_err(), "fast_io_fail_timeout_sec");
        assert_eq!(r(-1, 0, 0).unwrap_err(), "reconnect_delay_sec");
        assert_eq!(r(5, 0, 0).unwrap_err(), "reconnect_delay_sec");
        assert_eq!(r(5, 6, 0).unwrap_err(), "reconnect_delay_sec");
        assert_eq!(r(10, 5, 4).unwrap_err(), "fast_io_fail_timeout_sec");
        assert_eq!(r(10, 5, 11).unwrap_err(), "fast_io_fail_timeout_sec");
        assert_eq!(r(-1, 5, 4).unwrap_err(), "fast_io_fail_timeout_sec");
        // A field left out keeps the default it is checked with.
        let defaults =
            Reconnect { ctrlr_loss_timeout_sec: -1, reconnect_delay_sec: 2, fast_io_fail_timeout_sec: 0 };
        let only_loss = ReconnectParams { ctrlr_loss_timeout_sec: Some(1), ..Default::default() };
        assert_eq!(only_loss.over(defaults).unwrap_err().field, "reconnect_delay_sec");
        let only_fail = ReconnectParams { fast_io_fail_timeout_sec: Some(3), ..Default::default() };
        assert_eq!(only_fail.over(defaults).unwrap().fast_io_fail_timeout_sec, 3);
    }

    fn options(v: Value) -> Result<Options, ParamError> {
        OptionsParams::decode(Params::new(Some(v)).unwrap())?.over(Options::default())
    }

    #[test]
    fn set_options_takes_the_implemented_fields_and_spdks_defaults() {
        let o = options(json!({
            "timeout_us": 2_000_000, "timeout_admin_us": 5_000_000, "action_on_timeout": "abort",
            "keep_alive_timeout_ms": 3000, "ctrlr_loss_timeout_sec": -1, "reconnect_delay_sec": 1,
            "io_queue_requests": 2048, "nvme_adminq_poll_period_us": 2000,
            // What SPDK's client sends unasked.
            "delay_cmd_submit": true, "disable_auto_failback": false, "generate_uuids": false,
            "nvme_error_stat": false, "io_path_stat": false, "allow_accel_sequence": false,
            "enable_flush": false,
        }))
        .unwrap();
        // enable_flush is honoured, not merely accepted: false turns the flush off.
        assert_eq!(
            o,
            Options {
                timeout_us: 2_000_000,
                timeout_admin_us: 5_000_000,
                action_on_timeout: OnTimeout::Abort,
                keep_alive_timeout_ms: 3000,
                reconnect: Reconnect {
                    ctrlr_loss_timeout_sec: -1,
                    reconnect_delay_sec: 1,
                    fast_io_fail_timeout_sec: 0
                },
                io_queue_requests: 2048,
                nvme_adminq_poll_period_us: 2000,
                enable_flush: false,
                dhchap: DhchapOffer::default(),
            }
        );
        assert!(Options::default().enable_flush);
        assert!(options(json!({"enable_flush": true})).unwrap().enable_flush);
        assert_eq!(options(json!({})).unwrap(), Options::default());
        let p =
            OptionsParams::decode(Params::new(Some(json!({"keep_alive_timeout_ms": 0}))).unwrap()).unwrap();
        assert_eq!(p.first_field, Some("keep_alive_timeout_ms"));
        assert_eq!(p.over(Options::default()).unwrap().keep_alive_timeout_ms, 0);
    }

    #[test]
    fn set_options_refusals_name_their_field() {
        let cases = [
            (
                json!({"action_on_timeout": "panic"}),
                "action_on_timeout: 'panic' is not one of none, abort, reset",
            ),
            (json!({"action_on_timeout": "reset"}), "action_on_timeout: 'reset' needs timeout_us"),
            (json!({"timeout_admin_us": 5}), "timeout_admin_us: needs timeout_us too"),
            (json!({"timeout_us": -1}), "timeout_us: expected an integer between 0"),
            (json!({"delay_cmd_submit": false}), "delay_cmd_submit: not supported by flashpath (only true)"),
            (
                json!({"io_queue_requests": 70000}),
                "io_queue_requests: expected an integer between 0 and 65536",
            ),
            (json!({"transport_retry_count": 4}), "transport_retry_count: not supported"),
            (
                json!({"reconnect_delay_sec": 3}),
                "reconnect_delay_sec: must be 0 when ctrlr_loss_timeout_sec is 0",
            ),
            (json!({"timeout": 3}), "timeout: unknown parameter; accepted: timeout_us"),
            (
                json!({"dhchap_digests": ["md5"]}),
                "dhchap_digests: 'md5' is not one of sha256, sha384, sha512",
            ),
            (json!({"dhchap_dhgroups": []}), "dhchap_dhgroups: offers nothing"),
            (json!({"dhchap_dhgroups": "null"}), "dhchap_dhgroups: expected a list of strings"),
            (
                json!({"dhchap_dhgroups": ["ffdhe1024"]}),
                "dhchap_dhgroups: 'ffdhe1024' is not one of null, ffdhe2048",
            ),
        ];
        for (v, want) in cases {
            let got = options(v).unwrap_err().to_string();
            assert!(got.starts_with(want), "{got:?} does not start with {want:?}");
        }
    }
}

#[cfg(test)]
mod dhchap_tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn attach_takes_dhchap_key_names_for_tcp_only() {
        let tcp = json!({"name": "N", "trtype": "TCP", "traddr": "127.0.0.1", "subnqn": "nqn.a",
            "dhchap_key": "key0", "dhchap_ctrlr_key": "ckey0"});
        let a = AttachParams::decode(Params::new(Some(tcp)).unwrap()).unwrap();
        assert_eq!((a.dhchap_key.as_deref(), a.dhchap_ctrlr_key.as_deref()), (Some("key0"), Some("ckey0")));
        let only_ctrlr = json!({"name": "N", "trtype": "TCP", "traddr": "127.0.0.1", "subnqn": "nqn.a",
            "dhchap_ctrlr_key": "ckey0"});
        let e = AttachParams::decode(Params::new(Some(only_ctrlr)).unwrap()).unwrap_err().to_string();
        assert!(e.starts_with("dhchap_ctrlr_key: needs dhchap_key"), "{e}");
        let pcie = json!({"name": "N", "trtype": "PCIe", "traddr": "0000:00:04.0", "dhchap_key": "key0"});
        let e = AttachParams::decode(Params::new(Some(pcie)).unwrap()).unwrap_err().to_string();
        assert!(e.starts_with("dhchap_key: only for trtype TCP"), "{e}");
    }

    #[test]
    fn attach_takes_a_psk_key_name_for_tcp_only() {
        let tcp =
            json!({"name": "N", "trtype": "TCP", "traddr": "127.0.0.1", "subnqn": "nqn.a", "psk": "key0"});
        let a = AttachParams::decode(Params::new(Some(tcp)).unwrap()).unwrap();
        assert_eq!(a.psk.as_deref(), Some("key0"));
        let pcie = json!({"name": "N", "trtype": "PCIe", "traddr": "0000:00:04.0", "psk": "key0"});
        let e = AttachParams::decode(Params::new(Some(pcie)).unwrap()).unwrap_err().to_string();
        assert!(e.starts_with("psk: only for trtype TCP"), "{e}");
        let number =
            json!({"name": "N", "trtype": "TCP", "traddr": "127.0.0.1", "subnqn": "nqn.a", "psk": 7});
        let e = AttachParams::decode(Params::new(Some(number)).unwrap()).unwrap_err().to_string();
        assert!(e.starts_with("psk"), "{e}");
    }

    #[test]
    fn set_options_sets_the_dhchap_offer_in_spdks_order() {
        let p = OptionsParams::decode(
            Params::new(Some(
                json!({"dhchap_digests": ["sha512", "sha256"], "dhchap_dhgroups": ["ffdhe4096", "null"]}),
            ))
            .unwrap(),
        )
        .unwrap();
        assert_eq!(p.first_field, Some("dhchap_digests"));
        let o = p.over(Options::default()).unwrap();
        assert_eq!(o.dhchap.digests(), vec![HashId::Sha256, HashId::Sha512]);
        assert_eq!(o.dhchap.dhgroups(), vec![DhGroupId::Null, DhGroupId::Ffdhe4096]);
        // Only the groups given: the digests stay as they were.
        let p = OptionsParams::decode(Params::new(Some(json!({"dhchap_dhgroups": ["ffdhe2048"]}))).unwrap())
            .unwrap();
        let o2 = p.over(o).unwrap();
        assert_eq!(o2.dhchap.digests(), vec![HashId::Sha256, HashId::Sha512]);
        assert_eq!(o2.dhchap.dhgroups(), vec![DhGroupId::Ffdhe2048]);
        assert_eq!(Options::default().dhchap.digests(), HashId::ALL.to_vec());
        assert_eq!(Options::default().dhchap.dhgroups(), DhGroupId::ALL.to_vec());
    }
}
