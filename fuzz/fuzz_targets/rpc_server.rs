//! Fuzz `fp_rpc`'s request framing: the input is written verbatim to a
//! connection of a real `RpcServer` (one per process, on a Unix socket in a
//! private temporary directory), whose handler decodes `params` with
//! `fp_rpc::Params`. The whole response stream is read back and must be a
//! sequence of JSON-RPC 2.0 response objects (or arrays of them, for batches).
#![no_main]

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use fp_rpc::{Handler, Params, RpcError, RpcServer, ServerConfig};
use libfuzzer_sys::fuzz_target;
use serde_json::{json, Value};

fn handler() -> Handler {
    Arc::new(|method: &str, params: Option<Value>| -> Result<Value, RpcError> {
        match method {
            "echo" => {
                let mut p = Params::new(params)?;
                let name = p.required_str("name")?;
                let size = p.optional_uint("size", u64::from(u32::MAX))?;
                let ro = p.optional_bool("read_only")?;
                p.unsupported("md_size", Some(json!(0)))?;
                p.finish()?;
                Ok(json!({ "name": name, "size": size, "read_only": ro }))
            }
            "fail" => Err(RpcError::internal("requested failure")),
            "none" => Ok(Value::Null),
            other => Err(RpcError::method_not_found(other)),
        }
    })
}

struct Server {
    path: PathBuf,
    _server: RpcServer,
}

fn server() -> &'static Server {
    static SERVER: OnceLock<Server> = OnceLock::new();
    SERVER.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("fp-fuzz-rpc-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir).expect("create socket directory");
        let path = dir.join("rpc.sock");
        let config = ServerConfig {
            max_connections: 64,
            max_request_bytes: 64 * 1024,
            request_timeout: Duration::from_secs(5),
            idle_timeout: Duration::from_secs(5),
            write_timeout: Duration::from_secs(5),
        };
        let server = RpcServer::start_with(&path, handler(), config).expect("start RPC server");
        Server { path, _server: server }
    })
}

fn check_response(v: &Value) {
    match v {
        Value::Array(items) => {
            assert!(!items.is_empty(), "empty batch response");
            for item in items {
                assert!(item.is_object(), "batch response item is not an object: {item}");
                check_response(item);
            }
        }
        Value::Object(o) => {
            assert_eq!(o.get("jsonrpc"), Some(&json!("2.0")), "response without jsonrpc 2.0: {v}");
            assert!(
                o.contains_key("result") != o.contains_key("error"),
                "response needs exactly one of result / error: {v}"
            );
        }
        other => panic!("response is not an object or array: {other}"),
    }
}

/// Appended to every input. The server does not close a connection whose
/// client ended cleanly until it accepts the next one (it keeps a second
/// handle on it), so reading to end-of-file would stall; we stop at this
/// request's response instead (or at end-of-file after a parse error, or at
/// the read timeout).
const SENTINEL: &[u8] = b"\n{\"jsonrpc\":\"2.0\",\"id\":\"__fuzz_end\",\"method\":\"none\"}\n";

fn is_sentinel(v: &Value) -> bool {
    v.get("id") == Some(&json!("__fuzz_end"))
}

fuzz_target!(|data: &[u8]| {
    let srv = server();
    let Ok(stream) = UnixStream::connect(&srv.path) else { return };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    // Write from another thread so a large batch of responses cannot deadlock
    // against our own blocked write.
    let mut writer = stream.try_clone().expect("clone stream");
    let mut input = data.to_vec();
    input.extend_from_slice(SENTINEL);
    let w = std::thread::spawn(move || {
        let _ = writer.write_all(&input);
        let _ = writer.shutdown(std::net::Shutdown::Write);
    });
    for v in serde_json::Deserializer::from_reader(std::io::BufReader::new(&stream)).into_iter::<Value>() {
        match v {
            Ok(v) => {
                check_response(&v);
                if is_sentinel(&v) {
                    break;
                }
            }
            // Timeout, reset or a response cut short: no verdict.
            Err(e) if e.is_io() || e.is_eof() => break,
            Err(e) => panic!("server wrote invalid JSON: {e}"),
        }
    }
    let _ = stream.shutdown(std::net::Shutdown::Both);
    let _ = w.join();
});
