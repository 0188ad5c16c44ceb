//! NBD test helpers: starting exports over RPC, running the real NBD tools (qemu-img, nbdinfo,
//! nbdcopy, nbdsh) against them with a time limit, a certificate authority made at test time,
//! and a minimal NBD client written for the tests (fixed newstyle handshake, simple replies) that
//! the hostile tests use to send exactly the bytes they mean.
//!
//! The protocol constants are the NBD protocol document's (doc/proto.md of the NBD project),
//! declared here again on purpose rather than imported from `fp_nbd::proto`: a client that
//! shares the server's values could not catch a wrong one.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::Daemon;

pub const NBDMAGIC: u64 = 0x4e42_444d_4147_4943;
pub const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
pub const OPT_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;

pub const FLAG_FIXED_NEWSTYLE: u16 = 1;
pub const FLAG_NO_ZEROES: u16 = 2;

pub const OPT_EXPORT_NAME: u32 = 1;
pub const OPT_ABORT: u32 = 2;
pub const OPT_LIST: u32 = 3;
pub const OPT_STARTTLS: u32 = 5;
pub const OPT_INFO: u32 = 6;
pub const OPT_GO: u32 = 7;
pub const OPT_STRUCTURED_REPLY: u32 = 8;

pub const REP_ACK: u32 = 1;
pub const REP_SERVER: u32 = 2;
pub const REP_INFO: u32 = 3;
pub const REP_ERR: u32 = 1 << 31;
pub const REP_ERR_UNSUP: u32 = REP_ERR | 1;
pub const REP_ERR_INVALID: u32 = REP_ERR | 3;
pub const REP_ERR_TLS_REQD: u32 = REP_ERR | 5;
pub const REP_ERR_UNKNOWN: u32 = REP_ERR | 6;

pub const INFO_EXPORT: u16 = 0;
pub const INFO_BLOCK_SIZE: u16 = 3;

pub const CMD_READ: u16 = 0;
pub const CMD_WRITE: u16 = 1;
pub const CMD_DISC: u16 = 2;
pub const CMD_FLUSH: u16 = 3;
pub const CMD_TRIM: u16 = 4;
pub const CMD_WRITE_ZEROES: u16 = 6;
pub const CMD_FLAG_FUA: u16 = 1;

pub const TF_HAS_FLAGS: u16 = 1;
pub const TF_READ_ONLY: u16 = 1 << 1;
pub const TF_SEND_FLUSH: u16 = 1 << 2;
pub const TF_SEND_FUA: u16 = 1 << 3;
pub const TF_SEND_TRIM: u16 = 1 << 5;
pub const TF_SEND_WRITE_ZEROES: u16 = 1 << 6;
pub const TF_CAN_MULTI_CONN: u16 = 1 << 8;
pub const TF_SEND_CACHE: u16 = 1 << 10;
pub const TF_SEND_FAST_ZERO: u16 = 1 << 11;

pub const EPERM: u32 = 1;
pub const EINVAL: u32 = 22;

/// How long a tool run or a protocol exchange may take before the test fails.
pub const TOOL_TIMEOUT: Duration = Duration::from_secs(60);

/// `nbd_start_disk`; returns the RPC's result (the `nbd_device` string).
pub fn start_export(daemon: &Daemon, bdev: &str, device: &str, readonly: bool) -> String {
    let r =
        daemon.call("nbd_start_disk", json!({"bdev_name": bdev, "nbd_device": device, "readonly": readonly}));
    assert_eq!(r, json!(device), "nbd_start_disk returns the nbd_device it was given");
    device.to_string()
}

/// A TCP port on 127.0.0.1 that nothing listened on a moment ago.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").expect("binding 127.0.0.1:0").local_addr().unwrap().port()
}

/// The NBD URI of export `name` on Unix socket `sock`.
pub fn unix_uri(name: &str, sock: &Path) -> String {
    format!("nbd+unix:///{name}?socket={}", sock.display())
}

/// Runs `cmd` with stdin closed, bounded by [`TOOL_TIMEOUT`]; returns its output.
pub fn run_tool(cmd: &mut Command) -> Output {
    let what = format!("{cmd:?}");
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {what}: {e} (./run test installs the NBD tools)"));
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(TOOL_TIMEOUT) {
        Ok(out) => out.unwrap_or_else(|e| panic!("{what}: {e}")),
        Err(_) => {
            // SAFETY: kill(2) on the child this function spawned; no memory is involved.
            unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
            panic!("{what} did not finish within {TOOL_TIMEOUT:?}")
        }
    }
}

/// Runs `cmd` and returns its stdout; panics with its stderr if it fails.
pub fn tool_ok(cmd: &mut Command) -> String {
    let what = format!("{cmd:?}");
    let out = run_tool(cmd);
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8 tool output")
}

/// `nbdsh -c SCRIPT` with `env` in its environment. nbdsh runs the first `python3` on the PATH,
/// which must be the one python3-libnbd installed its module for: the system's.
pub fn nbdsh(script: &str, env: &[(&str, &str)]) -> Output {
    let path = format!("/usr/bin:/bin:{}", std::env::var("PATH").unwrap_or_default());
    let mut cmd = Command::new("nbdsh");
    cmd.arg("-c").arg(script).env("PATH", path);
    for (k, v) in env {
        cmd.env(k, v);
    }
    run_tool(&mut cmd)
}

/// [`nbdsh`] that must succeed and print `OK` last; returns its stdout.
pub fn nbdsh_ok(script: &str, env: &[(&str, &str)]) -> String {
    let out = nbdsh(script, env);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success() && stdout.trim_end().ends_with("OK"),
        "nbdsh script failed ({}):\n{stdout}{}\nscript:\n{script}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// One extent of `nbdinfo --map --json`: offset, length, type (0 data, 3 hole+zero, ...).
pub type MapExtent = (u64, u64, u64);

/// `nbdinfo --map --json URI`, adjacent extents of one type merged (a server may describe a
/// run in several pieces, one per cluster say; the allocation is what counts).
pub fn nbdinfo_map(uri: &str) -> Vec<MapExtent> {
    let out = tool_ok(Command::new("nbdinfo").args(["--map", "--json", uri]));
    let v: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("nbdinfo --map --json: {e}: {out}"));
    let mut merged: Vec<MapExtent> = Vec::new();
    let mut next = 0;
    for e in v.as_array().expect("an array of extents") {
        let (off, len, ty) =
            (e["offset"].as_u64().unwrap(), e["length"].as_u64().unwrap(), e["type"].as_u64().unwrap());
        assert_eq!(off, next, "nbdinfo --map: extents not contiguous: {out}");
        next = off + len;
        match merged.last_mut() {
            Some(last) if last.2 == ty => last.1 += len,
            _ => merged.push((off, len, ty)),
        }
    }
    merged
}

/// A certificate authority made at test time with certtool, its server certificate (IP SAN
/// 127.0.0.1, DNS localhost) and a client certificate, laid out in the directories QEMU's
/// `tls-creds-x509` and libnbd's `tls-certificates` read: `client/` holds `ca-cert.pem`,
/// `client-cert.pem` and `client-key.pem`; `client-nocert/` only `ca-cert.pem`.
pub struct TestPki {
    pub dir: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    pub ca_cert: PathBuf,
    pub client_dir: PathBuf,
    pub client_nocert_dir: PathBuf,
    /// A client directory whose certificate another CA signed (and which trusts our CA).
    pub client_foreign_dir: PathBuf,
}

impl TestPki {
    pub fn create(dir: &Path) -> TestPki {
        std::fs::create_dir_all(dir).unwrap();
        let w = |name: &str, text: &str| std::fs::write(dir.join(name), text).unwrap();
        w("ca.info", "cn = flashpath test CA\nca\ncert_signing_key\nexpiration_days = 2\n");
        w(
            "server.info",
            "organization = flashpath test\ncn = localhost\nip_address = 127.0.0.1\ndns_name = localhost\n\
             tls_www_server\nencryption_key\nsigning_key\nexpiration_days = 2\n",
        );
        w(
            "client.info",
            "organization = flashpath test\ncn = client\ntls_www_client\nencryption_key\nsigning_key\n\
             expiration_days = 2\n",
        );
        let certtool = |args: &[&str]| {
            tool_ok(Command::new("certtool").current_dir(dir).args(args));
        };
        let key = |name: &str| {
            certtool(&["--generate-privkey", "--key-type=rsa", "--bits=2048", "--no-text", "--outfile", name])
        };
        let ca = |key_file: &str, out: &str| {
            certtool(&[
                "--generate-self-signed",
                "--load-privkey",
                key_file,
                "--template",
                "ca.info",
                "--outfile",
                out,
            ])
        };
        let sign = |key_file: &str, template: &str, ca_cert: &str, ca_key: &str, out: &str| {
            certtool(&[
                "--generate-certificate",
                "--load-privkey",
                key_file,
                "--load-ca-certificate",
                ca_cert,
                "--load-ca-privkey",
                ca_key,
                "--template",
                template,
                "--outfile",
                out,
            ])
        };
        key("ca-key.pem");
        ca("ca-key.pem", "ca-cert.pem");
        key("server-key.pem");
        sign("server-key.pem", "server.info", "ca-cert.pem", "ca-key.pem", "server-cert.pem");
        key("client-key.pem");
        sign("client-key.pem", "client.info", "ca-cert.pem", "ca-key.pem", "client-cert.pem");
        key("other-ca-key.pem");
        ca("other-ca-key.pem", "other-ca-cert.pem");
        sign(
            "client-key.pem",
            "client.info",
            "other-ca-cert.pem",
            "other-ca-key.pem",
            "foreign-client-cert.pem",
        );

        let client_dir = dir.join("client");
        let client_nocert_dir = dir.join("client-nocert");
        let client_foreign_dir = dir.join("client-foreign");
        for d in [&client_dir, &client_nocert_dir, &client_foreign_dir] {
            std::fs::create_dir_all(d).unwrap();
            std::fs::copy(dir.join("ca-cert.pem"), d.join("ca-cert.pem")).unwrap();
        }
        std::fs::copy(dir.join("client-cert.pem"), client_dir.join("client-cert.pem")).unwrap();
        std::fs::copy(dir.join("client-key.pem"), client_dir.join("client-key.pem")).unwrap();
        std::fs::copy(dir.join("foreign-client-cert.pem"), client_foreign_dir.join("client-cert.pem"))
            .unwrap();
        std::fs::copy(dir.join("client-key.pem"), client_foreign_dir.join("client-key.pem")).unwrap();
        TestPki {
            dir: dir.to_path_buf(),
            server_cert: dir.join("server-cert.pem"),
            server_key: dir.join("server-key.pem"),
            ca_cert: dir.join("ca-cert.pem"),
            client_dir,
            client_nocert_dir,
            client_foreign_dir,
        }
    }
}

/// Where an export listens.
#[derive(Debug, Clone)]
pub enum Endpoint {
    Unix(PathBuf),
    Tcp(std::net::SocketAddr),
}

/// A Unix or TCP stream.
#[derive(Debug)]
pub enum Sock {
    Unix(UnixStream),
    Tcp(TcpStream),
}

impl Sock {
    pub fn connect(ep: &Endpoint) -> std::io::Result<Sock> {
        let s = match ep {
            Endpoint::Unix(p) => Sock::Unix(UnixStream::connect(p)?),
            Endpoint::Tcp(a) => {
                let s = TcpStream::connect(a)?;
                s.set_nodelay(true)?;
                Sock::Tcp(s)
            }
        };
        s.set_timeout(Some(Duration::from_secs(10)))?;
        Ok(s)
    }

    pub fn set_timeout(&self, t: Option<Duration>) -> std::io::Result<()> {
        match self {
            Sock::Unix(s) => {
                s.set_read_timeout(t)?;
                s.set_write_timeout(t)
            }
            Sock::Tcp(s) => {
                s.set_read_timeout(t)?;
                s.set_write_timeout(t)
            }
        }
    }

    pub fn shutdown(&self, how: Shutdown) -> std::io::Result<()> {
        match self {
            Sock::Unix(s) => s.shutdown(how),
            Sock::Tcp(s) => s.shutdown(how),
        }
    }

    pub fn try_clone(&self) -> std::io::Result<Sock> {
        Ok(match self {
            Sock::Unix(s) => Sock::Unix(s.try_clone()?),
            Sock::Tcp(s) => Sock::Tcp(s.try_clone()?),
        })
    }

    /// Reads and discards until the peer closes; `Ok(bytes discarded)` if it closed (EOF or
    /// reset) within `limit`, `Err` with what arrived if it was still open then.
    pub fn wait_closed(&mut self, limit: Duration) -> Result<usize, String> {
        let deadline = Instant::now() + limit;
        let mut n = 0;
        let mut buf = [0u8; 4096];
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(format!("the connection was still open after {limit:?} ({n} bytes read)"));
            }
            self.set_timeout(Some(left)).unwrap();
            match self.read(&mut buf) {
                Ok(0) => return Ok(n),
                Ok(k) => n += k,
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return Ok(n),
                Err(e)
                    if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
                Err(e) => return Err(format!("read error {e} ({n} bytes read)")),
            }
        }
    }
}

impl Read for Sock {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Sock::Unix(s) => s.read(buf),
            Sock::Tcp(s) => s.read(buf),
        }
    }
}

impl Write for Sock {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Sock::Unix(s) => s.write(buf),
            Sock::Tcp(s) => s.write(buf),
        }
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn be_u16(b: &[u8]) -> u16 {
    u16::from_be_bytes(b[..2].try_into().unwrap())
}
fn be_u32(b: &[u8]) -> u32 {
    u32::from_be_bytes(b[..4].try_into().unwrap())
}
fn be_u64(b: &[u8]) -> u64 {
    u64::from_be_bytes(b[..8].try_into().unwrap())
}

/// One option reply: the option it answers, its type and its data.
#[derive(Debug, Clone)]
pub struct OptReply {
    pub option: u32,
    pub kind: u32,
    pub data: Vec<u8>,
}

/// Reads the server's greeting and sends the client flags (fixed newstyle, no zeroes); returns
/// the server's handshake flags.
pub fn greet(s: &mut Sock) -> std::io::Result<u16> {
    let mut hello = [0u8; 18];
    s.read_exact(&mut hello)?;
    assert_eq!(be_u64(&hello[0..]), NBDMAGIC, "server greeting magic");
    assert_eq!(be_u64(&hello[8..]), IHAVEOPT, "server is not (fixed) newstyle");
    let flags = be_u16(&hello[16..]);
    assert!(flags & FLAG_FIXED_NEWSTYLE != 0, "server without fixed newstyle: {flags:#x}");
    s.write_all(&u32::from((FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES) & flags).to_be_bytes())?;
    Ok(flags)
}

/// Sends one option with a length field of `data.len()`.
pub fn send_option(s: &mut Sock, option: u32, data: &[u8]) -> std::io::Result<()> {
    s.write_all(&option_bytes(option, data.len() as u32, data))
}

/// The bytes of one option; `len` is what the length field says, whatever `data` holds.
pub fn option_bytes(option: u32, len: u32, data: &[u8]) -> Vec<u8> {
    let mut b = Vec::with_capacity(16 + data.len());
    b.extend_from_slice(&IHAVEOPT.to_be_bytes());
    b.extend_from_slice(&option.to_be_bytes());
    b.extend_from_slice(&len.to_be_bytes());
    b.extend_from_slice(data);
    b
}

/// Reads one option reply.
pub fn read_opt_reply(s: &mut Sock) -> std::io::Result<OptReply> {
    let mut h = [0u8; 20];
    s.read_exact(&mut h)?;
    assert_eq!(be_u64(&h), OPT_REPLY_MAGIC, "option reply magic");
    let len = be_u32(&h[16..]);
    assert!(len <= 64 << 10, "option reply of {len} bytes");
    let mut data = vec![0u8; len as usize];
    s.read_exact(&mut data)?;
    Ok(OptReply { option: be_u32(&h[8..]), kind: be_u32(&h[12..]), data })
}

/// NBD_OPT_GO's (and INFO's) data: the name and the information requests.
pub fn go_data(name: &str, infos: &[u16]) -> Vec<u8> {
    let mut d = Vec::new();
    d.extend_from_slice(&(name.len() as u32).to_be_bytes());
    d.extend_from_slice(name.as_bytes());
    d.extend_from_slice(&(infos.len() as u16).to_be_bytes());
    for i in infos {
        d.extend_from_slice(&i.to_be_bytes());
    }
    d
}

/// A connection in transmission phase, simple replies only.
pub struct NbdConn {
    pub sock: Sock,
    pub size: u64,
    pub flags: u16,
    /// INFO_BLOCK_SIZE's minimum, preferred and maximum, if the server sent it.
    pub block_sizes: Option<(u32, u32, u32)>,
    next_cookie: u64,
}

impl NbdConn {
    /// Connects and negotiates export `name` with NBD_OPT_GO (asking for the block sizes).
    pub fn connect(ep: &Endpoint, name: &str) -> std::io::Result<NbdConn> {
        let mut sock = Sock::connect(ep)?;
        greet(&mut sock)?;
        NbdConn::go(sock, name)
    }

    /// NBD_OPT_GO on a greeted socket; panics if the server refuses.
    pub fn go(mut sock: Sock, name: &str) -> std::io::Result<NbdConn> {
        send_option(&mut sock, OPT_GO, &go_data(name, &[INFO_BLOCK_SIZE]))?;
        let mut size_flags = None;
        let mut block_sizes = None;
        loop {
            let r = read_opt_reply(&mut sock)?;
            assert_eq!(r.option, OPT_GO, "reply to another option: {r:?}");
            match r.kind {
                REP_ACK => break,
                REP_INFO if be_u16(&r.data) == INFO_EXPORT => {
                    size_flags = Some((be_u64(&r.data[2..]), be_u16(&r.data[10..])));
                }
                REP_INFO if be_u16(&r.data) == INFO_BLOCK_SIZE => {
                    block_sizes = Some((be_u32(&r.data[2..]), be_u32(&r.data[6..]), be_u32(&r.data[10..])));
                }
                REP_INFO => {}
                _ => panic!("NBD_OPT_GO '{name}' refused: {r:?} ({})", String::from_utf8_lossy(&r.data)),
            }
        }
        let (size, flags) = size_flags.expect("NBD_OPT_GO acknowledged without NBD_INFO_EXPORT");
        sock.set_timeout(Some(Duration::from_secs(30)))?;
        Ok(NbdConn { sock, size, flags, block_sizes, next_cookie: 1 })
    }

    /// The bytes of one request header.
    pub fn header(flags: u16, kind: u16, cookie: u64, offset: u64, len: u32) -> [u8; 28] {
        let mut h = [0u8; 28];
        h[0..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
        h[4..6].copy_from_slice(&flags.to_be_bytes());
        h[6..8].copy_from_slice(&kind.to_be_bytes());
        h[8..16].copy_from_slice(&cookie.to_be_bytes());
        h[16..24].copy_from_slice(&offset.to_be_bytes());
        h[24..28].copy_from_slice(&len.to_be_bytes());
        h
    }

    /// Sends one request (and its payload); returns its cookie.
    pub fn send(
        &mut self,
        flags: u16,
        kind: u16,
        offset: u64,
        len: u32,
        payload: &[u8],
    ) -> std::io::Result<u64> {
        let cookie = self.next_cookie;
        self.next_cookie += 1;
        let mut b = Vec::with_capacity(28 + payload.len());
        b.extend_from_slice(&NbdConn::header(flags, kind, cookie, offset, len));
        b.extend_from_slice(payload);
        self.sock.write_all(&b)?;
        Ok(cookie)
    }

    /// Reads one simple reply to the request `cookie`; `data_len` bytes of data follow a
    /// successful read. Returns the error field and the data.
    pub fn reply(&mut self, cookie: u64, data_len: usize) -> std::io::Result<(u32, Vec<u8>)> {
        let (got, err, data) = self.any_reply(data_len)?;
        assert_eq!(got, cookie, "reply cookie");
        Ok((err, data))
    }

    /// Reads one simple reply to any request; `data_len` bytes of data follow a successful one.
    /// Returns its cookie, error field and data.
    pub fn any_reply(&mut self, data_len: usize) -> std::io::Result<(u64, u32, Vec<u8>)> {
        let mut h = [0u8; 16];
        self.sock.read_exact(&mut h)?;
        assert_eq!(be_u32(&h), SIMPLE_REPLY_MAGIC, "simple reply magic");
        let err = be_u32(&h[4..]);
        let mut data = Vec::new();
        if err == 0 && data_len > 0 {
            data = vec![0u8; data_len];
            self.sock.read_exact(&mut data)?;
        }
        Ok((be_u64(&h[8..]), err, data))
    }

    /// A read; `Err(errno)` if the server refused it.
    pub fn read(&mut self, offset: u64, len: u32) -> std::io::Result<Result<Vec<u8>, u32>> {
        let c = self.send(0, CMD_READ, offset, len, &[])?;
        let (err, data) = self.reply(c, len as usize)?;
        Ok(if err == 0 { Ok(data) } else { Err(err) })
    }

    /// A write of `data`; returns the reply's error field.
    pub fn write(&mut self, offset: u64, data: &[u8], flags: u16) -> std::io::Result<u32> {
        let c = self.send(flags, CMD_WRITE, offset, data.len() as u32, data)?;
        Ok(self.reply(c, 0)?.0)
    }

    /// A command without payload or data (flush, trim, write zeroes, cache).
    pub fn command(&mut self, kind: u16, flags: u16, offset: u64, len: u32) -> std::io::Result<u32> {
        let c = self.send(flags, kind, offset, len, &[])?;
        Ok(self.reply(c, 0)?.0)
    }

    /// NBD_CMD_DISC, then waits for the server to close.
    pub fn disconnect(mut self) {
        self.send(0, CMD_DISC, 0, 0, &[]).expect("sending NBD_CMD_DISC");
        self.sock.wait_closed(Duration::from_secs(10)).expect("the server closes after NBD_CMD_DISC");
    }
}

/// What the daemon logged after `mark` (a length of its stderr file, from [`log_mark`]).
pub fn log_since(daemon: &Daemon, mark: usize) -> String {
    let all = daemon.stderr();
    all.get(mark..).unwrap_or("").to_string()
}

/// The current length of the daemon's log, for [`log_since`].
pub fn log_mark(daemon: &Daemon) -> usize {
    daemon.stderr().len()
}

/// Waits up to 5 s for a line of the daemon's log after `mark` that contains one of `words`
/// (case-insensitive); returns that line, or panics showing the log.
pub fn wait_log_line(daemon: &Daemon, mark: usize, words: &[&str]) -> String {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let text = log_since(daemon, mark);
        if let Some(line) = text.lines().find(|l| {
            let l = l.to_lowercase();
            words.iter().any(|w| l.contains(&w.to_lowercase()))
        }) {
            return line.to_string();
        }
        if Instant::now() > deadline {
            panic!("the daemon logged no line with any of {words:?}; its log since the case began:\n{text}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// VmRSS of process `pid` in KiB.
pub fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("reading /proc/<pid>/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/<pid>/status")
}

/// A file of `len` random bytes from `seed`.
pub fn random_file(path: &Path, seed: u64, len: usize) -> Vec<u8> {
    use rand::{RngCore, SeedableRng};
    let mut data = vec![0u8; len];
    rand::rngs::StdRng::seed_from_u64(seed).fill_bytes(&mut data);
    std::fs::write(path, &data).expect("writing the random file");
    data
}
