//! What the control API is asked for: the target's and the transport's options, subsystem,
//! listener and namespace specifications. Plain values, checked here, below every file that
//! acts on them.

use std::net::IpAddr;

use fp_bdev::Bdev;
use serde::{Deserialize, Serialize};

use crate::error::{invalid, NvmfError};

/// How the target may be reached.
#[derive(Debug, Clone, Copy, Default)]
pub struct TargetOptions {
    /// False: listeners only on loopback addresses.
    pub allow_remote_listeners: bool,
}

/// The TCP transport's settings; field names are SPDK's `nvmf_get_transports` keys, defaults
/// SPDK v23.01's for TCP.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct TransportOptions {
    pub trtype: String,
    pub max_queue_depth: u32,
    pub max_io_qpairs_per_ctrlr: u32,
    pub in_capsule_data_size: u32,
    pub max_io_size: u32,
    pub io_unit_size: u32,
    pub max_aq_depth: u32,
    pub c2h_success: bool,
    pub sock_priority: u32,
    pub abort_timeout_sec: u32,
}

impl Default for TransportOptions {
    fn default() -> Self {
        TransportOptions {
            trtype: "TCP".into(),
            max_queue_depth: 128,
            max_io_qpairs_per_ctrlr: 127,
            in_capsule_data_size: 4096,
            max_io_size: 131072,
            io_unit_size: 131072,
            max_aq_depth: 128,
            c2h_success: true,
            sock_priority: 0,
            abort_timeout_sec: 1,
        }
    }
}

impl TransportOptions {
    pub(crate) fn check(&mut self) -> Result<(), NvmfError> {
        if !self.trtype.eq_ignore_ascii_case("tcp") {
            return Err(invalid("trtype", format!("'{}' is not supported (TCP only)", self.trtype)));
        }
        self.trtype = "TCP".into();
        if !(2..=4096).contains(&self.max_queue_depth) {
            return Err(invalid("max_queue_depth", "must be 2 to 4096"));
        }
        if !(2..=4096).contains(&self.max_aq_depth) {
            return Err(invalid("max_aq_depth", "must be 2 to 4096"));
        }
        if !(1..=65534).contains(&self.max_io_qpairs_per_ctrlr) {
            return Err(invalid("max_io_qpairs_per_ctrlr", "must be 1 to 65534"));
        }
        if self.max_io_size < 4096 || !self.max_io_size.is_multiple_of(4096) || self.max_io_size > (8 << 20) {
            return Err(invalid("max_io_size", "must be a multiple of 4096 from 4096 to 8 MiB"));
        }
        if !self.in_capsule_data_size.is_multiple_of(16) || self.in_capsule_data_size > 131072 {
            return Err(invalid("in_capsule_data_size", "must be a multiple of 16 up to 131072"));
        }
        if self.sock_priority > 16 {
            return Err(invalid("sock_priority", "must be 0 to 16 (above 6 needs CAP_NET_ADMIN)"));
        }
        if self.io_unit_size == 0 {
            return Err(invalid("io_unit_size", "must not be 0"));
        }
        Ok(())
    }
}

/// What `nvmf_create_subsystem` asks for.
#[derive(Debug, Clone, Default)]
pub struct SubsystemSpec {
    pub nqn: String,
    pub serial_number: Option<String>,
    pub model_number: Option<String>,
    pub allow_any_host: bool,
    /// flashpath's own: every host must authenticate (DH-HMAC-CHAP), so only hosts listed
    /// with a `dhchap_key` may connect; `allow_any_host` cannot be on with it.
    pub require_dhchap: bool,
    /// 0: the default, 32.
    pub max_namespaces: u32,
    pub min_cntlid: u16,
    pub max_cntlid: u16,
    /// SPDK's `ana_reporting`: the controllers report ANA groups and their listener's states
    /// (docs/nvmf.md, "Asymmetric Namespace Access").
    pub ana_reporting: bool,
}

/// A listener's address, as SPDK's `listen_address` objects spell it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ListenAddress {
    pub trtype: String,
    pub adrfam: String,
    pub traddr: String,
    pub trsvcid: String,
}

impl ListenAddress {
    /// The socket address, checked: TCP, the family matching the address, a port.
    pub(crate) fn socket_addr(&self) -> Result<std::net::SocketAddr, NvmfError> {
        if !self.trtype.eq_ignore_ascii_case("tcp") {
            return Err(invalid("trtype", format!("'{}' is not supported (TCP only)", self.trtype)));
        }
        let ip: IpAddr = self
            .traddr
            .parse()
            .map_err(|_| invalid("traddr", format!("'{}' is not an IP address", self.traddr)))?;
        let family_ok = match self.adrfam.to_ascii_lowercase().as_str() {
            "ipv4" => ip.is_ipv4(),
            "ipv6" => ip.is_ipv6(),
            _ => return Err(invalid("adrfam", format!("'{}' is not IPv4 or IPv6", self.adrfam))),
        };
        if !family_ok {
            return Err(invalid("adrfam", format!("{} is not an {} address", self.traddr, self.adrfam)));
        }
        let port: u16 = self
            .trsvcid
            .parse()
            .ok()
            .filter(|&p| p != 0)
            .ok_or_else(|| invalid("trsvcid", format!("'{}' is not a port number", self.trsvcid)))?;
        Ok(std::net::SocketAddr::new(ip, port))
    }

    /// The same address spelled as SPDK reports it ("TCP", "IPv4"/"IPv6").
    pub(crate) fn normalized(&self) -> ListenAddress {
        let adrfam = if self.adrfam.eq_ignore_ascii_case("ipv6") { "IPv6" } else { "IPv4" };
        ListenAddress { trtype: "TCP".into(), adrfam: adrfam.into(), ..self.clone() }
    }
}

/// What `nvmf_subsystem_add_ns` asks for.
pub struct NamespaceSpec {
    /// Chosen by the caller (see [`crate::NvmfTarget::free_nsid`]).
    pub nsid: u32,
    pub bdev: Bdev,
    pub bdev_name: String,
    pub uuid: Option<[u8; 16]>,
    pub nguid: Option<[u8; 16]>,
    pub eui64: Option<[u8; 8]>,
    pub read_only: bool,
    /// Its ANA group, 1 to the subsystem's max_namespaces; `None`: the NSID (as SPDK).
    pub anagrpid: Option<u32>,
}
