//! What `nvmf_subsystem_add_ns`'s parameters become ([`NvmfNamespaceSpec`]) and the parsing of
//! its identifiers: below the kind and its methods.

/// What to add for `nvmf_subsystem_add_ns`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NvmfNamespaceSpec {
    /// The subsystem's NQN.
    pub nqn: String,
    /// The namespace ID; `None` takes the lowest free one.
    pub nsid: Option<u32>,
    pub bdev_name: String,
    /// `None`: the bdev's UUID as `bdev_get_bdevs` reports it (as SPDK does).
    pub uuid: Option<[u8; 16]>,
    pub nguid: Option<[u8; 16]>,
    pub eui64: Option<[u8; 8]>,
    /// flashpath's: writes fail with "namespace is write protected" and the bdev is claimed
    /// shared, so read-only exports of other kinds may serve it too.
    pub read_only: bool,
    /// Its ANA group; `None`: the NSID (as SPDK).
    pub anagrpid: Option<u32>,
}

/// RFC 4122 text (8-4-4-4-12 hexadecimal digits) as bytes.
pub(crate) fn parse_uuid(text: &str) -> Option<[u8; 16]> {
    let groups: Vec<&str> = text.split('-').collect();
    if groups.iter().map(|g| g.len()).ne([8, 4, 4, 4, 12]) {
        return None;
    }
    parse_hex::<16>(&groups.concat())
}

/// `2 * N` hexadecimal digits (either case) as `N` bytes.
pub(crate) fn parse_hex<const N: usize>(text: &str) -> Option<[u8; N]> {
    if text.len() != 2 * N || !text.is_ascii() {
        return None;
    }
    let mut out = [0u8; N];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&text[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}
