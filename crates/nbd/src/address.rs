//! Where an export listens: `nbd_start_disk`'s `nbd_device`. SPDK names a kernel `/dev/nbdX`
//! there; flashpath serves instead of driving the kernel's client, so the string is the
//! listener: an absolute Unix socket path, or an NBD URI (the NBD project's doc/uri.md) that
//! also names the export.

use std::fmt;
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;

/// The IANA port for NBD, used when a URI names none.
pub const DEFAULT_PORT: u16 = 10809;

/// A listener's address.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Address {
    Unix(PathBuf),
    Tcp { host: String, port: u16 },
}

impl fmt::Display for Address {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Address::Unix(p) => write!(f, "unix:{}", p.display()),
            Address::Tcp { host, port } if host.contains(':') => write!(f, "[{host}]:{port}"),
            Address::Tcp { host, port } => write!(f, "{host}:{port}"),
        }
    }
}

impl Address {
    /// The socket addresses a TCP address resolves to (one lookup; "localhost" included).
    pub fn resolve(&self) -> Result<Vec<SocketAddr>, String> {
        match self {
            Address::Unix(_) => Ok(Vec::new()),
            Address::Tcp { host, port } => {
                let addrs: Vec<SocketAddr> = (host.as_str(), *port)
                    .to_socket_addrs()
                    .map_err(|e| format!("cannot resolve '{host}': {e}"))?
                    .collect();
                if addrs.is_empty() {
                    return Err(format!("'{host}' resolves to no address"));
                }
                Ok(addrs)
            }
        }
    }

    /// Whether only this host can reach it: a Unix socket, or TCP on loopback addresses only.
    pub fn is_local(&self) -> Result<bool, String> {
        match self {
            Address::Unix(_) => Ok(true),
            Address::Tcp { .. } => Ok(self.resolve()?.iter().all(|a| a.ip().is_loopback())),
        }
    }
}

/// A parsed `nbd_device`: the listener and, when the string names it, the export name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Device {
    pub address: Address,
    pub name: Option<String>,
}

/// Parses `nbd_device`: `/abs/path.sock`, `nbd+unix:///NAME?socket=/abs/path` or
/// `nbd://HOST[:PORT][/NAME]` (an IPv6 host in brackets).
pub fn parse_device(s: &str) -> Result<Device, String> {
    if s.starts_with('/') {
        return Ok(Device { address: Address::Unix(unix_path(s)?), name: None });
    }
    if let Some(rest) = s.strip_prefix("nbd+unix://") {
        let (path_part, query) = rest.split_once('?').ok_or("nbd+unix:// needs ?socket=/path")?;
        if !path_part.is_empty() && !path_part.starts_with('/') {
            return Err("nbd+unix:// takes no host (nbd+unix:///NAME?socket=/path)".into());
        }
        let socket = query
            .split('&')
            .find_map(|kv| kv.strip_prefix("socket="))
            .ok_or("nbd+unix:// needs ?socket=/path")?;
        let name = decode(path_part.strip_prefix('/').unwrap_or(""))?;
        let address = Address::Unix(unix_path(&decode(socket)?)?);
        return Ok(Device { address, name: (!name.is_empty()).then_some(name) });
    }
    if let Some(rest) = s.strip_prefix("nbd://") {
        let (authority, name) = match rest.split_once('/') {
            Some((a, n)) => (a, decode(n)?),
            None => (rest, String::new()),
        };
        if name.contains('?') || authority.contains('?') {
            return Err("nbd:// URIs take no query here".into());
        }
        let (host, port) = split_host_port(authority)?;
        if host.is_empty() {
            return Err("nbd:// needs a host (127.0.0.1 for loopback only)".into());
        }
        let address = Address::Tcp { host, port };
        return Ok(Device { address, name: (!name.is_empty()).then_some(name) });
    }
    Err(format!(
        "'{s}' is not an absolute socket path, nbd://HOST[:PORT]/NAME or nbd+unix:///NAME?socket=PATH"
    ))
}

fn unix_path(s: &str) -> Result<PathBuf, String> {
    // sun_path holds 108 bytes, the terminating NUL included.
    if !s.starts_with('/') || s.len() > 107 || s.contains('\0') {
        return Err(format!("socket path '{s}' must be absolute and at most 107 bytes"));
    }
    Ok(PathBuf::from(s))
}

fn split_host_port(authority: &str) -> Result<(String, u16), String> {
    let (host, port) = if let Some(rest) = authority.strip_prefix('[') {
        let (host, after) = rest.split_once(']').ok_or("unclosed '[' in the host")?;
        (host, after.strip_prefix(':'))
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (authority, None),
        }
    };
    let port = match port {
        None => DEFAULT_PORT,
        Some(p) => p.parse::<u16>().ok().filter(|&p| p != 0).ok_or(format!("bad port '{p}'"))?,
    };
    Ok((host.to_string(), port))
}

/// Undoes URI percent-encoding.
fn decode(s: &str) -> Result<String, String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = s.get(i + 1..i + 3).ok_or("truncated %-escape")?;
            out.push(u8::from_str_radix(hex, 16).map_err(|_| format!("bad %-escape '%{hex}'"))?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| "the URI's name is not UTF-8".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_form_parses() {
        assert_eq!(
            parse_device("/run/fp/a.sock"),
            Ok(Device { address: Address::Unix("/run/fp/a.sock".into()), name: None })
        );
        assert_eq!(
            parse_device("nbd+unix:///disk%201?socket=/tmp/s"),
            Ok(Device { address: Address::Unix("/tmp/s".into()), name: Some("disk 1".into()) })
        );
        assert_eq!(
            parse_device("nbd://127.0.0.1/x"),
            Ok(Device {
                address: Address::Tcp { host: "127.0.0.1".into(), port: DEFAULT_PORT },
                name: Some("x".into())
            })
        );
        assert_eq!(
            parse_device("nbd://[::1]:9000"),
            Ok(Device { address: Address::Tcp { host: "::1".into(), port: 9000 }, name: None })
        );
    }

    #[test]
    fn bad_forms_say_why() {
        for bad in [
            "rel/path",
            "nbd://:1/x",
            "nbd://h:0/x",
            "nbd://h:99999",
            "nbd+unix:///x",
            "nbd://h/%zz",
            "http://x",
        ] {
            assert!(parse_device(bad).is_err(), "{bad}");
        }
        assert!(parse_device(&format!("/{}", "a".repeat(120))).is_err());
    }

    #[test]
    fn loopback_is_local_and_wildcards_are_not() {
        assert_eq!(parse_device("nbd://127.0.0.1:1").unwrap().address.is_local(), Ok(true));
        assert_eq!(parse_device("nbd://0.0.0.0:1").unwrap().address.is_local(), Ok(false));
        assert_eq!(parse_device("/x").unwrap().address.is_local(), Ok(true));
    }
}
