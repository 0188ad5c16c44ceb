//! A blocking JSON-RPC client over a Unix socket, for the CLI and tests.

use std::io::{self, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::de::IoRead;
use serde_json::{json, StreamDeserializer, Value};

use crate::RpcError;

#[derive(Debug, thiserror::Error)]
pub enum RpcClientError {
    #[error("cannot connect to {}: {source}", path.display())]
    Connect {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("RPC connection to {}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("the server at {} closed the connection without answering", path.display())]
    Closed { path: PathBuf },
    #[error("malformed response from {}: {detail}", path.display())]
    BadResponse { path: PathBuf, detail: String },
    /// The server answered with a JSON-RPC error.
    #[error("{}", .0.message)]
    Rpc(RpcError),
}

/// One connection; calls are made one at a time.
pub struct RpcClient {
    path: PathBuf,
    writer: UnixStream,
    responses: StreamDeserializer<'static, IoRead<BufReader<UnixStream>>, Value>,
    next_id: u64,
}

impl RpcClient {
    pub fn connect(path: &Path) -> Result<RpcClient, RpcClientError> {
        let connect_err = |source| RpcClientError::Connect { path: path.to_path_buf(), source };
        let writer = UnixStream::connect(path).map_err(connect_err)?;
        let reader = writer.try_clone().map_err(connect_err)?;
        Ok(RpcClient {
            path: path.to_path_buf(),
            writer,
            responses: serde_json::Deserializer::from_reader(BufReader::new(reader)).into_iter(),
            next_id: 1,
        })
    }

    /// Bounds how long one call may wait for the server (`None`: forever, the default).
    pub fn set_timeout(&mut self, timeout: Option<Duration>) -> Result<(), RpcClientError> {
        // Both handles share one socket, so its options cover the reader too.
        self.writer
            .set_read_timeout(timeout)
            .and_then(|_| self.writer.set_write_timeout(timeout))
            .map_err(|source| self.io_err(source))
    }

    fn io_err(&self, source: io::Error) -> RpcClientError {
        RpcClientError::Io { path: self.path.clone(), source }
    }

    fn send(&mut self, mut request: Value, params: Option<Value>) -> Result<(), RpcClientError> {
        if let Some(p) = params {
            request["params"] = p;
        }
        let mut buf = serde_json::to_vec(&request).expect("a JSON value always serialises");
        buf.push(b'\n');
        self.writer.write_all(&buf).map_err(|e| self.io_err(e))
    }

    /// Calls `method` and waits for its result.
    pub fn call(&mut self, method: &str, params: Option<Value>) -> Result<Value, RpcClientError> {
        let id = self.next_id;
        self.next_id += 1;
        self.send(json!({ "jsonrpc": "2.0", "id": id, "method": method }), params)?;
        let bad =
            |path: &Path, detail: String| RpcClientError::BadResponse { path: path.to_path_buf(), detail };
        let mut response = match self.responses.next() {
            None => return Err(RpcClientError::Closed { path: self.path.clone() }),
            Some(Err(e)) if e.is_io() => return Err(self.io_err(e.into())),
            Some(Err(e)) if e.is_eof() => return Err(RpcClientError::Closed { path: self.path.clone() }),
            Some(Err(e)) => return Err(bad(&self.path, e.to_string())),
            Some(Ok(v)) => v,
        };
        let error = response.get_mut("error").map(Value::take);
        // A transport-level error (parse error, server busy) carries a null id.
        let id_ok =
            response.get("id").is_some_and(|v| v.as_u64() == Some(id) || (v.is_null() && error.is_some()));
        if !id_ok {
            return Err(bad(&self.path, format!("expected a response to id {id}, got {response}")));
        }
        match (error, response.get_mut("result").map(Value::take)) {
            (Some(err), _) => {
                let code = err.get("code").and_then(Value::as_i64).and_then(|c| i32::try_from(c).ok());
                let message = err.get("message").and_then(Value::as_str);
                match (code, message) {
                    (Some(code), Some(message)) => Err(RpcClientError::Rpc(RpcError {
                        code,
                        message: message.to_string(),
                        data: err.get("data").cloned(),
                    })),
                    _ => Err(bad(&self.path, format!("error object without code and message: {err}"))),
                }
            }
            (None, Some(result)) => Ok(result),
            (None, None) => Err(bad(&self.path, "response has neither result nor error".into())),
        }
    }

    /// Sends a notification: the server runs it and answers nothing.
    pub fn notify(&mut self, method: &str, params: Option<Value>) -> Result<(), RpcClientError> {
        self.send(json!({ "jsonrpc": "2.0", "method": method }), params)
    }
}
