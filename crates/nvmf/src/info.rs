//! The objects [`crate::NvmfTarget`] reports, shaped as SPDK's `nvmf_get_subsystems`,
//! `nvmf_subsystem_get_controllers` and `nvmf_subsystem_get_qpairs` results, and the per
//! subsystem and namespace counters.

use serde::Serialize;

use crate::options::ListenAddress;

/// An allowed host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HostInfo {
    pub nqn: String,
    /// The keyring names of its DH-HMAC-CHAP keys, as SPDK shows them (never the secrets).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dhchap_key: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dhchap_ctrlr_key: Option<String>,
    /// The keyring name of its TLS PSK (SPDK's `psk`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub psk: Option<String>,
}

/// A namespace as `nvmf_get_subsystems` lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NamespaceEntry {
    pub nsid: u32,
    pub bdev_name: String,
    pub name: String,
    /// 32 upper-case hex digits.
    pub nguid: String,
    /// 8-4-4-4-12.
    pub uuid: String,
    /// Its ANA group, listed (as SPDK) only when the subsystem reports ANA.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub anagrpid: Option<u32>,
}

/// A subsystem as `nvmf_get_subsystems` lists it; the discovery subsystem has only the first
/// five fields.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SubsystemInfo {
    pub nqn: String,
    /// "Discovery" or "NVMe".
    pub subtype: String,
    pub listen_addresses: Vec<ListenAddress>,
    /// Those of `listen_addresses` that take TLS only (`secure_channel`); the registry marks
    /// them in the listings.
    #[serde(skip)]
    pub secure_listeners: Vec<ListenAddress>,
    pub allow_any_host: bool,
    pub hosts: Vec<HostInfo>,
    /// flashpath's own `require_dhchap`, shown only when on.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub require_dhchap: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub serial_number: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model_number: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_namespaces: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min_cntlid: Option<u16>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_cntlid: Option<u16>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub namespaces: Option<Vec<NamespaceEntry>>,
}

/// A controller as `nvmf_subsystem_get_controllers` lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ControllerInfo {
    pub cntlid: u16,
    pub hostnqn: String,
    /// The host identifier as a UUID string.
    pub hostid: String,
    pub num_io_qpairs: u32,
}

/// A queue pair as `nvmf_subsystem_get_qpairs` lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct QpairInfo {
    pub cntlid: u16,
    pub qid: u16,
    pub state: String,
    /// The reactor serving it, named as SPDK names its poll groups.
    pub thread: String,
    pub listen_address: ListenAddress,
    /// Its DH-HMAC-CHAP transaction, for a queue that authenticated (SPDK's object).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub auth: Option<QpairAuth>,
}

/// A queue pair's last DH-HMAC-CHAP transaction as SPDK shows it: `state` ("completed"),
/// `digest` ("sha384") and `dhgroup` ("ffdhe2048", "null").
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct QpairAuth {
    pub state: String,
    pub digest: String,
    pub dhgroup: String,
}

/// One namespace's I/O since it was attached.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NamespaceStats {
    pub nsid: u32,
    pub bdev_name: String,
    pub read_ops: u64,
    pub write_ops: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
    /// Flush, Write Zeroes, Dataset Management.
    pub other_ops: u64,
    /// Commands completed with an error status.
    pub errors: u64,
}

/// One subsystem's connections and namespaces' counters.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SubsystemStats {
    pub nqn: String,
    pub controllers: u32,
    pub qpairs: u32,
    pub namespaces: Vec<NamespaceStats>,
}

/// 16 bytes as a UUID string (8-4-4-4-12, lower case as SPDK prints them).
pub(crate) fn uuid_string(b: &[u8; 16]) -> String {
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!("{}-{}-{}-{}-{}", &h[0..8], &h[8..12], &h[12..16], &h[16..20], &h[20..32])
}
