//! The RPC server and client over a real Unix socket.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fp_rpc::{codes, Handler, RpcClient, RpcClientError, RpcError, RpcServer, ServerConfig};
use serde_json::{json, Value};

/// `echo` returns its params, `count` counts calls (for notifications), `sleep` blocks for the
/// given milliseconds, `panic` panics; anything else is unknown.
fn handler(counter: Arc<AtomicUsize>) -> Handler {
    Arc::new(move |method: &str, params: Option<Value>| match method {
        "echo" => Ok(params.unwrap_or(Value::Null)),
        "count" => Ok(json!(counter.fetch_add(1, Ordering::SeqCst) + 1)),
        "sleep" => {
            let ms = params.as_ref().and_then(|p| p["ms"].as_u64()).unwrap_or(0);
            std::thread::sleep(Duration::from_millis(ms));
            Ok(json!(true))
        }
        "panic" => panic!("handler panic (expected by the test)"),
        other => Err(RpcError::method_not_found(other)),
    })
}

fn start(dir: &Path, config: ServerConfig) -> (RpcServer, Arc<AtomicUsize>) {
    let counter = Arc::new(AtomicUsize::new(0));
    let server = RpcServer::start_with(&dir.join("rpc.sock"), handler(counter.clone()), config).unwrap();
    (server, counter)
}

/// A raw connection that reads newline-terminated responses.
struct Raw {
    stream: UnixStream,
    lines: BufReader<UnixStream>,
}

impl Raw {
    fn connect(server: &RpcServer) -> Raw {
        let stream = UnixStream::connect(server.path()).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let lines = BufReader::new(stream.try_clone().unwrap());
        Raw { stream, lines }
    }

    fn send(&mut self, bytes: &str) {
        self.stream.write_all(bytes.as_bytes()).unwrap();
    }

    fn response(&mut self) -> Value {
        let mut line = String::new();
        self.lines.read_line(&mut line).unwrap();
        assert!(!line.is_empty(), "connection closed without a response");
        serde_json::from_str(&line).unwrap()
    }

    /// True when the server closed the connection: end-of-file, or a reset when the server
    /// closed with our unread bytes still queued (which is how AF_UNIX reports that).
    fn closed(&mut self) -> bool {
        let mut buf = [0u8; 1];
        match self.lines.read(&mut buf) {
            Ok(0) => true,
            Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
            Ok(_) => false,
        }
    }
}

fn small_config() -> ServerConfig {
    ServerConfig { request_timeout: Duration::from_secs(5), ..ServerConfig::default() }
}

#[test]
fn round_trip_with_client() {
    let dir = tempfile::tempdir().unwrap();
    let (server, _) = start(dir.path(), small_config());
    let mut client = RpcClient::connect(server.path()).unwrap();
    let v = client.call("echo", Some(json!({"a": [1, 2, "x"]}))).unwrap();
    assert_eq!(v, json!({"a": [1, 2, "x"]}));
    assert_eq!(client.call("echo", None).unwrap(), Value::Null);
    match client.call("nope", None) {
        Err(RpcClientError::Rpc(e)) => {
            assert_eq!(e.code, codes::METHOD_NOT_FOUND);
            assert!(e.message.contains("nope"));
        }
        other => panic!("unexpected {other:?}"),
    }
    // The connection survives an error.
    assert_eq!(client.call("count", None).unwrap(), json!(1));
    server.stop();
}

#[test]
fn unknown_method_raw() {
    let dir = tempfile::tempdir().unwrap();
    let (server, _) = start(dir.path(), small_config());
    let mut c = Raw::connect(&server);
    c.send(r#"{"jsonrpc":"2.0","id":"abc","method":"frobnicate"}"#);
    let r = c.response();
    assert_eq!(r["id"], "abc");
    assert_eq!(r["error"]["code"], codes::METHOD_NOT_FOUND);
}

#[test]
fn parse_error_closes_connection() {
    let dir = tempfile::tempdir().unwrap();
    let (server, _) = start(dir.path(), small_config());
    let mut c = Raw::connect(&server);
    c.send(r#"{"jsonrpc":"2.0","id":1,"method":"echo"}{"jsonrpc": oops}"#);
    assert_eq!(c.response()["id"], 1);
    let r = c.response();
    assert_eq!(r["error"]["code"], codes::PARSE_ERROR);
    assert_eq!(r["id"], Value::Null);
    assert!(c.closed());
}

#[test]
fn invalid_requests() {
    let dir = tempfile::tempdir().unwrap();
    let (server, _) = start(dir.path(), small_config());
    let mut c = Raw::connect(&server);
    for (req, id) in [
        (r#"{"id":1,"method":"echo"}"#, json!(1)),
        (r#"{"jsonrpc":"1.0","id":2,"method":"echo"}"#, json!(2)),
        (r#"{"jsonrpc":"2.0","id":3,"method":7}"#, json!(3)),
        (r#"{"jsonrpc":"2.0","id":4,"method":"echo","params":"x"}"#, json!(4)),
        (r#"{"jsonrpc":"2.0","id":5,"method":"echo","extra":1}"#, json!(5)),
        (r#"{"jsonrpc":"2.0","id":{"x":1},"method":"echo"}"#, Value::Null),
        (r#""just a string""#, Value::Null),
        ("[]", Value::Null),
    ] {
        c.send(req);
        let r = c.response();
        assert_eq!(r["error"]["code"], codes::INVALID_REQUEST, "{req} -> {r}");
        assert_eq!(r["id"], id, "{req} -> {r}");
    }
    // Still usable afterwards: shape errors do not end the connection.
    c.send(r#"{"jsonrpc":"2.0","id":9,"method":"echo","params":[1]}"#);
    assert_eq!(c.response()["result"], json!([1]));
}

#[test]
fn batch_mixed() {
    let dir = tempfile::tempdir().unwrap();
    let (server, counter) = start(dir.path(), small_config());
    let mut c = Raw::connect(&server);
    c.send(
        r#"[{"jsonrpc":"2.0","id":1,"method":"echo","params":{"n":1}},
            {"jsonrpc":"2.0","method":"count"},
            {"jsonrpc":"2.0","id":2,"method":"missing"},
            42,
            {"jsonrpc":"2.0","id":3,"method":"echo","params":{"n":3}}]"#,
    );
    let r = c.response();
    let items = r.as_array().unwrap();
    assert_eq!(items.len(), 4, "{r}");
    assert_eq!(items[0]["result"], json!({"n": 1}));
    assert_eq!(items[1]["error"]["code"], codes::METHOD_NOT_FOUND);
    assert_eq!(items[2]["error"]["code"], codes::INVALID_REQUEST);
    assert_eq!(items[3]["result"], json!({"n": 3}));
    assert_eq!(counter.load(Ordering::SeqCst), 1);

    // A batch of notifications only gets no response at all: the next line answers the next
    // request.
    c.send(r#"[{"jsonrpc":"2.0","method":"count"},{"jsonrpc":"2.0","method":"count"}]"#);
    c.send(r#"{"jsonrpc":"2.0","id":7,"method":"count"}"#);
    let r = c.response();
    assert_eq!(r["id"], 7);
    assert_eq!(r["result"], 4);
}

#[test]
fn notification_gets_no_response() {
    let dir = tempfile::tempdir().unwrap();
    let (server, counter) = start(dir.path(), small_config());
    let mut client = RpcClient::connect(server.path()).unwrap();
    client.notify("count", None).unwrap();
    // Errors in notifications are not reported either.
    client.notify("missing", None).unwrap();
    assert_eq!(client.call("count", None).unwrap(), json!(2));
    assert_eq!(counter.load(Ordering::SeqCst), 2);
}

#[test]
fn concatenated_and_fragmented_requests() {
    let dir = tempfile::tempdir().unwrap();
    let (server, _) = start(dir.path(), small_config());
    let mut c = Raw::connect(&server);
    // Back to back with no delimiter, as SPDK's rpc.py writes them.
    c.send(concat!(
        r#"{"jsonrpc":"2.0","id":1,"method":"echo","params":{"v":"a"}}"#,
        r#"{"jsonrpc":"2.0","id":2,"method":"echo","params":{"v":"b"}}"#,
        "\n\n  ",
        r#"{"jsonrpc":"2.0","id":3,"method":"echo","params":{"v":"c"}}"#,
    ));
    for (id, v) in [(1, "a"), (2, "b"), (3, "c")] {
        let r = c.response();
        assert_eq!(r["id"], id);
        assert_eq!(r["result"]["v"], v);
    }
    // One request dribbled in byte by byte is answered once complete, without a delimiter.
    for b in r#"{"jsonrpc":"2.0","id":4,"method":"echo","params":{"v":"d"}}"#.bytes() {
        c.stream.write_all(&[b]).unwrap();
    }
    assert_eq!(c.response()["result"]["v"], "d");
}

#[test]
fn oversized_request_is_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let config = ServerConfig { max_request_bytes: 4096, ..small_config() };
    let (server, _) = start(dir.path(), config);
    let mut c = Raw::connect(&server);
    // Requests up to the bound work, repeatedly on one connection (the count is per request).
    let fits =
        format!(r#"{{"jsonrpc":"2.0","id":1,"method":"echo","params":{{"s":"{}"}}}}"#, "x".repeat(3000));
    for _ in 0..3 {
        c.send(&fits);
        assert_eq!(c.response()["id"], 1);
    }
    let big =
        format!(r#"{{"jsonrpc":"2.0","id":2,"method":"echo","params":{{"s":"{}"}}}}"#, "x".repeat(8000));
    // The server may close before it has read everything: ignore a failed write.
    let _ = c.stream.write_all(big.as_bytes());
    let r = c.response();
    assert_eq!(r["error"]["code"], codes::INVALID_REQUEST);
    assert!(r["error"]["message"].as_str().unwrap().contains("4096"), "{r}");
    assert!(c.closed());
    // Other clients are unaffected.
    let mut client = RpcClient::connect(server.path()).unwrap();
    assert_eq!(client.call("echo", Some(json!([1]))).unwrap(), json!([1]));
}

#[test]
fn socket_is_private_and_removed_on_stop() {
    let dir = tempfile::tempdir().unwrap();
    let (server, _) = start(dir.path(), small_config());
    let path = server.path().to_path_buf();
    let mode = std::fs::metadata(&path).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "mode {mode:o}");
    // Nothing else is left in the directory (the temporary bind name is gone).
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    server.stop();
    assert!(!path.exists());
}

/// Under umask 0, where a plain bind would make a socket anyone may connect to, a watcher that
/// keeps listing the directory during many starts never sees the socket wider than 0600, nor a
/// way to it (the staging directory) wider than 0700.
#[test]
fn socket_is_never_reachable_by_others_while_it_is_set_up() {
    // The umask is process-wide, restored below (other tests in this binary only ever get wider
    // temporary files from it, which none checks).
    let old = fp_sys::set_umask(0);
    let dir = tempfile::tempdir().unwrap();
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watcher = {
        let (dir, done) = (dir.path().to_path_buf(), done.clone());
        std::thread::spawn(move || {
            let mut seen = 0usize;
            while !done.load(Ordering::Relaxed) {
                for entry in std::fs::read_dir(&dir).unwrap().flatten() {
                    let Ok(meta) = std::fs::symlink_metadata(entry.path()) else { continue };
                    let mode = meta.permissions().mode() & 0o777;
                    let want = if meta.is_dir() { 0o700 } else { 0o600 };
                    assert_eq!(mode, want, "{} has mode {mode:o}", entry.path().display());
                    seen += 1;
                }
            }
            seen
        })
    };
    let path = dir.path().join("rpc.sock");
    for _ in 0..50 {
        let server = RpcServer::start(&path, handler(Arc::default())).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "mode {mode:o}");
        server.stop();
    }
    done.store(true, Ordering::Relaxed);
    let seen = watcher.join();
    fp_sys::set_umask(old);
    assert!(seen.unwrap() > 0, "the watcher saw no file at all");
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "staging directories left behind");
}

/// Another user may create the staging directory's name first; the server picks another name and
/// leaves that directory alone.
#[test]
fn a_taken_staging_name_is_skipped() {
    let dir = tempfile::tempdir().unwrap();
    let taken = dir.path().join(format!(".rpc.sock.{}.0", std::process::id()));
    std::fs::create_dir(&taken).unwrap();
    std::fs::write(taken.join("theirs"), b"x").unwrap();
    let (server, _) = start(dir.path(), small_config());
    RpcClient::connect(server.path()).unwrap().call("echo", None).unwrap();
    server.stop();
    assert_eq!(std::fs::read(taken.join("theirs")).unwrap(), b"x");
}

#[test]
fn stale_socket_replaced_live_one_and_files_kept() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rpc.sock");
    // A socket file nobody listens on any more.
    drop(UnixListener::bind(&path).unwrap());
    assert!(path.exists());
    let server = RpcServer::start(&path, handler(Arc::default())).unwrap();
    RpcClient::connect(&path).unwrap().call("echo", None).unwrap();

    // A second server on a live socket is refused and leaves the first one working.
    let err = RpcServer::start(&path, handler(Arc::default())).err().unwrap();
    assert_eq!(err.kind(), std::io::ErrorKind::AddrInUse);
    RpcClient::connect(&path).unwrap().call("echo", None).unwrap();
    server.stop();

    // A regular file at the path is not ours to delete.
    std::fs::write(&path, b"keep me").unwrap();
    assert!(RpcServer::start(&path, handler(Arc::default())).is_err());
    assert_eq!(std::fs::read(&path).unwrap(), b"keep me");
}

#[test]
fn slow_client_does_not_block_others_and_times_out() {
    let dir = tempfile::tempdir().unwrap();
    // Long enough that a fast call finishing first proves it was not queued behind the slow one.
    let config = ServerConfig { request_timeout: Duration::from_millis(1500), ..ServerConfig::default() };
    let (server, _) = start(dir.path(), config);
    let mut slow = Raw::connect(&server);
    slow.send(r#"{"jsonrpc":"2.0","id":1,"meth"#);
    let t0 = Instant::now();
    let mut client = RpcClient::connect(server.path()).unwrap();
    assert_eq!(client.call("echo", Some(json!(["fast"]))).unwrap(), json!(["fast"]));
    assert!(t0.elapsed() < Duration::from_millis(1500), "fast call took {:?}", t0.elapsed());
    // The half-sent request is cut off at the deadline.
    let r = slow.response();
    assert_eq!(r["error"]["code"], codes::INVALID_REQUEST);
    assert!(slow.closed());
}

#[test]
fn connection_cap() {
    let dir = tempfile::tempdir().unwrap();
    let config = ServerConfig { max_connections: 1, ..small_config() };
    let (server, _) = start(dir.path(), config);
    let mut first = RpcClient::connect(server.path()).unwrap();
    first.call("echo", None).unwrap();
    let mut second = RpcClient::connect(server.path()).unwrap();
    match second.call("echo", None) {
        Err(RpcClientError::Rpc(e)) => assert_eq!(e.code, codes::SERVER_BUSY),
        // The refusal may race with our write; a closed connection is a refusal too.
        Err(RpcClientError::Io { .. } | RpcClientError::Closed { .. }) => {}
        other => panic!("unexpected {other:?}"),
    }
    drop(first);
    // The slot frees once the first client is gone (its thread is reaped on the next accept).
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let mut c = RpcClient::connect(server.path()).unwrap();
        if c.call("echo", None).is_ok() {
            break;
        }
        assert!(Instant::now() < deadline, "slot never freed");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn handler_panic_is_internal_error() {
    let dir = tempfile::tempdir().unwrap();
    let (server, _) = start(dir.path(), small_config());
    let mut client = RpcClient::connect(server.path()).unwrap();
    match client.call("panic", None) {
        Err(RpcClientError::Rpc(e)) => assert_eq!(e.code, codes::INTERNAL_ERROR),
        other => panic!("unexpected {other:?}"),
    }
    assert_eq!(client.call("echo", Some(json!([5]))).unwrap(), json!([5]));
}

#[test]
fn stop_with_open_and_busy_connections() {
    let dir = tempfile::tempdir().unwrap();
    let (server, _) = start(dir.path(), small_config());
    let _idle = Raw::connect(&server);
    let mut partial = Raw::connect(&server);
    partial.send("{\"jsonrpc\"");
    let path = server.path().to_path_buf();
    let busy = std::thread::spawn(move || {
        let mut c = RpcClient::connect(&path).unwrap();
        c.call("sleep", Some(json!({"ms": 200})))
    });
    std::thread::sleep(Duration::from_millis(50));
    let t0 = Instant::now();
    server.stop();
    assert!(t0.elapsed() < Duration::from_secs(3), "stop took {:?}", t0.elapsed());
    // The call in progress completed before its connection closed; its reply may or may not
    // have been written, but the client is not left hanging.
    let _ = busy.join().unwrap();
}

#[test]
fn a_client_that_half_closes_sees_the_connection_end_at_once() {
    // Found by the rpc_server fuzz target: the accept loop's copy of the socket kept the
    // connection open until another client connected.
    let dir = tempfile::tempdir().unwrap();
    let (server, _) = start(dir.path(), small_config());
    let mut raw = Raw::connect(&server);
    raw.send("{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"echo\",\"params\":[1]}");
    raw.stream.shutdown(std::net::Shutdown::Write).unwrap();
    assert_eq!(raw.response()["result"], json!([1]));
    let start = Instant::now();
    assert!(raw.closed());
    assert!(start.elapsed() < Duration::from_secs(2), "closed only after {:?}", start.elapsed());
}
