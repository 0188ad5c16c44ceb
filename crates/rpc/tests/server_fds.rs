//! The server's file descriptors: a connection its client closed is closed in the server too,
//! at once, without waiting for another client to connect. A test binary of its own with one
//! test, so the count of /proc/self/fd is the server's and this client's only.

use std::sync::Arc;
use std::time::{Duration, Instant};

use fp_rpc::{Handler, RpcClient, RpcServer, ServerConfig};
use serde_json::{json, Value};

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").expect("/proc/self/fd").count()
}

/// Waits (bounded: an upper limit, not a speed check) until the process has `want` fds open.
fn assert_fds_return_to(want: usize, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let now = open_fds();
        if now == want {
            return;
        }
        assert!(Instant::now() < deadline, "{what}: {now} fds open, {want} before the connections");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_closed_connection_leaves_no_fd_in_the_server_until_the_next_client() {
    let dir = tempfile::tempdir().unwrap();
    let handler: Handler = Arc::new(|_: &str, params: Option<Value>| Ok(params.unwrap_or(Value::Null)));
    let server =
        RpcServer::start_with(&dir.path().join("rpc.sock"), handler, ServerConfig::default()).unwrap();
    let before = open_fds();

    // One client after another, then none: the last one's socket must not stay open in the
    // server until someone connects again (an idle daemon would hold it for as long as it is
    // idle).
    for i in 0..3 {
        let mut client = RpcClient::connect(server.path()).unwrap();
        assert_eq!(client.call("echo", Some(json!([i]))).unwrap(), json!([i]));
        drop(client);
        assert_fds_return_to(before, &format!("after client {i} left"));
    }

    // Clients that overlap, closed in the opposite order.
    let clients: Vec<RpcClient> = (0..4)
        .map(|i| {
            let mut c = RpcClient::connect(server.path()).unwrap();
            assert_eq!(c.call("echo", Some(json!([i]))).unwrap(), json!([i]));
            c
        })
        .collect();
    for c in clients.into_iter().rev() {
        drop(c);
    }
    assert_fds_return_to(before, "after the overlapping clients left");
    server.stop();
}
