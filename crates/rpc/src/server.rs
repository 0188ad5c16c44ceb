//! The JSON-RPC server: one accept thread, one thread per connection.
//!
//! Requests are parsed with serde_json's streaming deserializer straight off the socket, so
//! requests written back to back without delimiters (as SPDK's `rpc.py` does) and newline
//! separated ones both work, and each request is answered as soon as its closing brace arrives.
//!
//! Resource bounds, so one client cannot starve the others or the process:
//! * at most [`ServerConfig::max_connections`] connections; more are answered with a
//!   `-32000` error and closed;
//! * a request (or batch) larger than [`ServerConfig::max_request_bytes`] is answered with
//!   `-32600` and the connection closed;
//! * a request must arrive completely within [`ServerConfig::request_timeout`] of its first
//!   byte, and an idle connection is closed after [`ServerConfig::idle_timeout`];
//! * responses are written with [`ServerConfig::write_timeout`], so a client that never reads
//!   cannot park a thread forever.

use std::cell::Cell;
use std::collections::HashMap;
use std::io::{self, BufReader, Read, Write};
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::io::{AsRawFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::{codes, RpcError, DEFAULT_MAX_REQUEST_BYTES};

/// Runs one call: `(method, params) -> result`. Called on connection threads, concurrently.
pub type Handler = Arc<dyn Fn(&str, Option<Value>) -> Result<Value, RpcError> + Send + Sync>;

/// Limits and timeouts; see the module docs.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub max_connections: usize,
    pub max_request_bytes: usize,
    pub request_timeout: Duration,
    pub idle_timeout: Duration,
    pub write_timeout: Duration,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            max_connections: 64,
            max_request_bytes: DEFAULT_MAX_REQUEST_BYTES,
            request_timeout: Duration::from_secs(10),
            // Long enough for an operator's interactive session or an orchestrator that keeps
            // its connection; an abandoned connection is still reclaimed eventually.
            idle_timeout: Duration::from_secs(600),
            write_timeout: Duration::from_secs(10),
        }
    }
}

/// A running server. [`RpcServer::stop`] (or dropping it) closes every connection, joins every
/// thread and removes the socket file.
pub struct RpcServer {
    path: PathBuf,
    /// Device and inode of the socket file we created, so stop never removes a file that
    /// someone else put at the same path since.
    socket_id: (u64, u64),
    /// Dropping this end wakes the accept thread (its peer reads end-of-file).
    wake: Option<UnixStream>,
    accept: Option<JoinHandle<()>>,
}

impl RpcServer {
    /// Listens on `path` with the default [`ServerConfig`].
    pub fn start(path: &Path, handler: Handler) -> io::Result<RpcServer> {
        RpcServer::start_with(path, handler, ServerConfig::default())
    }

    /// Listens on `path`. A stale socket file (no server answering) is replaced; a live server
    /// or a file that is not a socket is an error.
    pub fn start_with(path: &Path, handler: Handler, config: ServerConfig) -> io::Result<RpcServer> {
        let listener = bind_private(path)?;
        let meta = std::fs::symlink_metadata(path)?;
        listener.set_nonblocking(true)?;
        let (wake, wake_peer) = UnixStream::pair()?;
        let accept = std::thread::Builder::new()
            .name("rpc-accept".into())
            .spawn(move || accept_loop(listener, wake_peer, handler, config))?;
        log::info!("RPC server listening on {}", path.display());
        Ok(RpcServer {
            path: path.to_path_buf(),
            socket_id: (meta.dev(), meta.ino()),
            wake: Some(wake),
            accept: Some(accept),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Stops accepting, closes every connection (a call in progress finishes first), joins the
    /// threads and removes the socket file.
    pub fn stop(mut self) {
        self.stop_inner();
    }

    fn stop_inner(&mut self) {
        let Some(accept) = self.accept.take() else { return };
        drop(self.wake.take());
        let _ = accept.join();
        if let Ok(meta) = std::fs::symlink_metadata(&self.path) {
            if (meta.dev(), meta.ino()) == self.socket_id {
                let _ = std::fs::remove_file(&self.path);
            }
        }
        log::info!("RPC server on {} stopped", self.path.display());
    }
}

impl Drop for RpcServer {
    fn drop(&mut self) {
        self.stop_inner();
    }
}

/// Binds a listening socket at `path` that only its owner can connect to.
///
/// The socket is bound inside a fresh directory of mode 0700 next to `path`, set to 0600 there
/// and then renamed into place. Until the rename no other user can reach it, whatever mode
/// `bind` gave it; from the rename on it is already 0600. Binding at `path` and then calling
/// chmod would leave a window in which the umask's mode applies, and a client that connects in
/// that window stays connected. Setting the umask around `bind` instead would change it for
/// every thread of the process while it is set.
fn bind_private(path: &Path) -> io::Result<UnixListener> {
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => match UnixStream::connect(path) {
            Ok(_) => return Err(in_use(path)),
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                log::info!("removing stale socket {}", path.display());
                std::fs::remove_file(path)?;
            }
            Err(e) => return Err(io::Error::new(e.kind(), format!("{}: {e}", path.display()))),
        },
        Ok(_) => {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("{} exists and is not a socket; not replacing it", path.display()),
            ))
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(io::Error::new(e.kind(), format!("{}: {e}", path.display()))),
    }
    let context =
        |e: io::Error| io::Error::new(e.kind(), format!("cannot listen on {}: {e}", path.display()));
    let staging = PrivateDir::create_next_to(path).map_err(context)?;
    let tmp = staging.path.join("sock");
    let bound = UnixListener::bind(&tmp).map_err(context)?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600)).map_err(context)?;
    match rename_noreplace(&tmp, path) {
        Ok(()) => Ok(bound),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Err(in_use(path)),
        Err(e) => Err(context(e)),
    }
}

fn in_use(path: &Path) -> io::Error {
    io::Error::new(
        io::ErrorKind::AddrInUse,
        format!("{}: another server is already listening there", path.display()),
    )
}

/// A directory only its owner can enter, removed (with what is left in it) when dropped.
struct PrivateDir {
    path: PathBuf,
}

impl PrivateDir {
    /// Creates `.<name>.<pid>.<n>` in the directory of `path`: the same file system, so a rename
    /// from it to `path` is atomic. Names another user created first are skipped, never reused.
    fn create_next_to(path: &Path) -> io::Result<PrivateDir> {
        use std::os::unix::fs::DirBuilderExt;
        let parent = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        let name = path.file_name().ok_or_else(|| io::Error::other("the path has no file name"))?;
        let mut last = None;
        for n in 0..16 {
            let mut dir_name = std::ffi::OsString::from(".");
            dir_name.push(name);
            dir_name.push(format!(".{}.{n}", std::process::id()));
            let dir = parent.join(dir_name);
            // mkdir applies the umask, which can only narrow 0700; the chmod restores the
            // owner's own bits should the umask have removed them.
            match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
                Ok(()) => {
                    let made = PrivateDir { path: dir };
                    std::fs::set_permissions(&made.path, std::fs::Permissions::from_mode(0o700))?;
                    return Ok(made);
                }
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => last = Some(e),
                Err(e) => return Err(e),
            }
        }
        Err(last.unwrap_or_else(|| io::Error::other("no free staging directory name")))
    }
}

impl Drop for PrivateDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// Renames `from` to `to` unless `to` exists, so a server that started at the same moment is
/// never replaced. Falls back to a plain rename on file systems without `RENAME_NOREPLACE`.
fn rename_noreplace(from: &Path, to: &Path) -> io::Result<()> {
    match fp_sys::rename_noreplace(from, to) {
        Err(e) if matches!(e.raw_os_error(), Some(libc::EINVAL) | Some(libc::ENOSYS)) => {
            std::fs::rename(from, to)
        }
        r => r,
    }
}

/// Waits until one of `fds` is readable (or hung up). Returns the readiness of each.
fn wait_readable(fds: &[RawFd; 2]) -> io::Result<[bool; 2]> {
    let ready = fp_sys::wait_readable(fds, None)?;
    Ok([ready[0], ready[1]])
}

/// Second handles on the open connections' sockets, by connection id, to shut them down at
/// stop (which unblocks their threads' reads). A connection's thread removes its own entry as
/// it ends, so the socket is closed as soon as the client is done, not whenever the accept loop
/// next wakes (an idle server would keep it open for as long as it is idle).
type Shutters = Arc<Mutex<HashMap<u64, UnixStream>>>;

fn lock(shutters: &Shutters) -> std::sync::MutexGuard<'_, HashMap<u64, UnixStream>> {
    shutters.lock().unwrap_or_else(|p| p.into_inner())
}

fn accept_loop(listener: UnixListener, wake: UnixStream, handler: Handler, config: ServerConfig) {
    let mut threads: HashMap<u64, JoinHandle<()>> = HashMap::new();
    let shutters: Shutters = Arc::new(Mutex::new(HashMap::new()));
    let mut next_id = 0u64;
    loop {
        let ready = match wait_readable(&[listener.as_raw_fd(), wake.as_raw_fd()]) {
            Ok(r) => r,
            Err(e) => {
                log::error!("RPC server: poll failed, no longer accepting: {e}");
                break;
            }
        };
        if ready[1] {
            break;
        }
        // Join threads that are done so the connection cap counts live clients only. Their
        // sockets are already closed; a finished thread holds no fd.
        threads.retain(|_, t| !t.is_finished());
        let stream = match listener.accept() {
            Ok((s, _)) => s,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted | io::ErrorKind::ConnectionAborted
                ) =>
            {
                continue
            }
            Err(e) => {
                // Typically EMFILE: back off instead of spinning on a listener that stays ready.
                log::warn!("RPC server: accept failed: {e}");
                std::thread::sleep(Duration::from_millis(100));
                continue;
            }
        };
        if threads.len() >= config.max_connections {
            refuse(stream, config.max_connections);
            continue;
        }
        let id = next_id;
        next_id += 1;
        // The shutter is registered before the thread starts, so a thread that ends at once
        // still finds (and drops) it.
        match stream.try_clone() {
            Ok(second) => {
                lock(&shutters).insert(id, second);
            }
            Err(e) => {
                log::warn!("RPC server: cannot start a connection: {e}");
                continue;
            }
        }
        let spawned = {
            let handler = handler.clone();
            let config = config.clone();
            let shutters = shutters.clone();
            std::thread::Builder::new().name(format!("rpc-conn-{id}")).spawn(move || {
                serve_connection(stream, &handler, &config);
                // The thread's own handles are closed; this was the last one.
                drop(lock(&shutters).remove(&id));
            })
        };
        match spawned {
            Ok(t) => {
                threads.insert(id, t);
            }
            Err(e) => {
                drop(lock(&shutters).remove(&id));
                log::warn!("RPC server: cannot start a connection thread: {e}");
            }
        }
    }
    for s in lock(&shutters).values() {
        let _ = s.shutdown(std::net::Shutdown::Both);
    }
    for (_, t) in threads.drain() {
        let _ = t.join();
    }
}

fn refuse(mut stream: UnixStream, limit: usize) {
    log::warn!("RPC server: refusing a connection, {limit} already open");
    let err = RpcError::new(codes::SERVER_BUSY, format!("server busy: {limit} connections already open"));
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_write_timeout(Some(Duration::from_secs(1)));
    let _ = write_value(&mut stream, &error_response(Value::Null, &err));
}

fn write_value(w: &mut impl Write, v: &Value) -> io::Result<()> {
    let mut buf = serde_json::to_vec(v).map_err(io::Error::other)?;
    buf.push(b'\n');
    w.write_all(&buf)
}

fn error_response(id: Value, err: &RpcError) -> Value {
    json!({ "jsonrpc": "2.0", "id": id, "error": err.to_json() })
}

/// Per-connection parsing state shared by the reader layers (one thread, hence `Rc<Cell>`).
#[derive(Default)]
struct RequestState {
    /// Bytes consumed since the last complete request, whitespace included.
    bytes: Cell<usize>,
    /// When the current request's first non-whitespace byte was consumed.
    started: Cell<Option<Instant>>,
    too_large: Cell<bool>,
    timed_out: Cell<bool>,
}

impl RequestState {
    fn request_done(&self) {
        self.bytes.set(0);
        self.started.set(None);
    }
}

/// The socket, read with a timeout that depends on whether a request is under way.
struct TimedSocket {
    stream: UnixStream,
    state: Rc<RequestState>,
    request_timeout: Duration,
    idle_timeout: Duration,
}

impl Read for TimedSocket {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let timeout = match self.state.started.get() {
            Some(t0) => self.request_timeout.checked_sub(t0.elapsed()).unwrap_or_default(),
            None => self.idle_timeout,
        };
        if timeout.is_zero() {
            self.state.timed_out.set(true);
            return Err(io::ErrorKind::TimedOut.into());
        }
        self.stream.set_read_timeout(Some(timeout))?;
        self.stream.read(buf).inspect_err(|e| {
            if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) {
                self.state.timed_out.set(true);
            }
        })
    }
}

/// Counts what the parser consumes (it reads one byte at a time from here) and stops a request
/// at the size bound.
struct Counted<R> {
    inner: R,
    state: Rc<RequestState>,
    max: usize,
}

impl<R: Read> Read for Counted<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        let before = self.state.bytes.get();
        if before + n > self.max {
            self.state.too_large.set(true);
            return Err(io::Error::new(io::ErrorKind::InvalidData, "request too large"));
        }
        self.state.bytes.set(before + n);
        if self.state.started.get().is_none() && buf[..n].iter().any(|b| !b.is_ascii_whitespace()) {
            self.state.started.set(Some(Instant::now()));
        }
        Ok(n)
    }
}

fn serve_connection(stream: UnixStream, handler: &Handler, config: &ServerConfig) {
    let mut writer = match stream.try_clone().and_then(|w| {
        w.set_nonblocking(false)?;
        w.set_write_timeout(Some(config.write_timeout))?;
        Ok(w)
    }) {
        Ok(w) => w,
        Err(e) => {
            log::warn!("RPC connection setup failed: {e}");
            return;
        }
    };
    let state = Rc::new(RequestState::default());
    let socket = TimedSocket {
        stream,
        state: state.clone(),
        request_timeout: config.request_timeout,
        idle_timeout: config.idle_timeout,
    };
    let reader =
        Counted { inner: BufReader::new(socket), state: state.clone(), max: config.max_request_bytes };
    let mut requests = serde_json::Deserializer::from_reader(reader).into_iter::<Value>();
    loop {
        let err = match requests.next() {
            None => return,
            Some(Ok(v)) => {
                state.request_done();
                if let Some(response) = dispatch(v, handler) {
                    if let Err(e) = write_value(&mut writer, &response) {
                        log::debug!("RPC connection: cannot write response: {e}");
                        return;
                    }
                }
                continue;
            }
            Some(Err(e)) => e,
        };
        // Every error ends the connection: after a syntax error or a truncated request there is
        // no reliable place to resume parsing.
        let response = if state.too_large.get() {
            RpcError::invalid_request(format!("request exceeds {} bytes", config.max_request_bytes))
        } else if state.timed_out.get() {
            if state.started.get().is_none() {
                log::debug!("RPC connection idle for {:?}, closing", config.idle_timeout);
                return;
            }
            RpcError::invalid_request(format!("request not complete within {:?}", config.request_timeout))
        } else if err.is_io() {
            log::debug!("RPC connection read failed: {err}");
            return;
        } else {
            RpcError::parse_error(err)
        };
        log::debug!("RPC connection closed after error: {}", response.message);
        let _ = write_value(&mut writer, &error_response(Value::Null, &response));
        discard_pending(&mut writer, config.max_request_bytes);
        return;
    }
}

/// Ends our side and throws away what the client already sent. Closing an AF_UNIX socket with
/// unread bytes queued makes the peer's next read fail with ECONNRESET, possibly before it has
/// seen our error response; with the queue drained it reads the response and then end-of-file.
fn discard_pending(stream: &mut UnixStream, limit: usize) {
    let _ = stream.shutdown(std::net::Shutdown::Write);
    if stream.set_nonblocking(true).is_err() {
        return;
    }
    let mut buf = [0u8; 4096];
    let mut total = 0;
    while total < limit {
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => total += n,
        }
    }
}

/// Handles one parsed value: a request or a batch. Returns the response to write, if any.
fn dispatch(v: Value, handler: &Handler) -> Option<Value> {
    match v {
        Value::Array(items) if items.is_empty() => {
            Some(error_response(Value::Null, &RpcError::invalid_request("empty batch")))
        }
        Value::Array(items) => {
            let responses: Vec<Value> = items.into_iter().filter_map(|i| handle_one(i, handler)).collect();
            (!responses.is_empty()).then_some(Value::Array(responses))
        }
        other => handle_one(other, handler),
    }
}

/// A request object checked against JSON-RPC 2.0.
struct Request {
    /// `None` for a notification.
    id: Option<Value>,
    method: String,
    params: Option<Value>,
}

/// Validates a request object. On error, returns the id to answer with (null when the id itself
/// is unusable) and the error.
fn parse_request(v: Value) -> Result<Request, (Value, RpcError)> {
    let Value::Object(mut obj) = v else {
        return Err((Value::Null, RpcError::invalid_request("expected a request object")));
    };
    let id = obj.remove("id");
    if id.as_ref().is_some_and(|i| !matches!(i, Value::String(_) | Value::Number(_) | Value::Null)) {
        return Err((Value::Null, RpcError::invalid_request("'id' must be a string, a number or null")));
    }
    let reply_id = id.clone().unwrap_or(Value::Null);
    let fail = |msg: String| Err((reply_id.clone(), RpcError::invalid_request(msg)));
    match obj.remove("jsonrpc") {
        Some(Value::String(s)) if s == "2.0" => {}
        _ => return fail("'jsonrpc' must be \"2.0\"".into()),
    }
    let method = match obj.remove("method") {
        Some(Value::String(m)) => m,
        _ => return fail("'method' must be a string".into()),
    };
    let params = match obj.remove("params") {
        None | Some(Value::Null) => None,
        Some(p @ (Value::Object(_) | Value::Array(_))) => Some(p),
        Some(_) => return fail("'params' must be an object or an array".into()),
    };
    if let Some(extra) = obj.keys().next() {
        return fail(format!("unknown member '{extra}' (a request has jsonrpc, id, method, params)"));
    }
    Ok(Request { id, method, params })
}

fn handle_one(v: Value, handler: &Handler) -> Option<Value> {
    let req = match parse_request(v) {
        Ok(r) => r,
        Err((id, err)) => return Some(error_response(id, &err)),
    };
    let started = Instant::now();
    let outcome = catch_unwind(AssertUnwindSafe(|| handler(&req.method, req.params))).unwrap_or_else(|_| {
        log::error!("RPC method '{}' panicked", req.method);
        Err(RpcError::internal(format!("method '{}' failed unexpectedly", req.method)))
    });
    match &outcome {
        Ok(_) => log::debug!("RPC {} ok in {:?}", req.method, started.elapsed()),
        Err(e) => log::debug!("RPC {} failed in {:?}: {e}", req.method, started.elapsed()),
    }
    let id = req.id?;
    Some(match outcome {
        Ok(result) => json!({ "jsonrpc": "2.0", "id": id, "result": result }),
        Err(e) => error_response(id, &e),
    })
}
