//! JSON-RPC error objects.

use serde_json::{json, Value};

/// The error codes JSON-RPC 2.0 reserves, plus the server-error code flashpath uses for
/// transport-level refusals.
pub mod codes {
    /// The bytes received are not JSON.
    pub const PARSE_ERROR: i32 = -32700;
    /// The JSON is not a valid request object (or the request is too large).
    pub const INVALID_REQUEST: i32 = -32600;
    pub const METHOD_NOT_FOUND: i32 = -32601;
    pub const INVALID_PARAMS: i32 = -32602;
    pub const INTERNAL_ERROR: i32 = -32603;
    /// The server refuses the connection (too many clients) — in the "server error" range.
    pub const SERVER_BUSY: i32 = -32000;
}

/// An error returned by a method, or produced by the server for a malformed request.
///
/// Method failures that are not about the request's shape use a negative errno as the code, as
/// SPDK does (-17 for an existing name, -19 for a missing device).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{message} (code {code})")]
pub struct RpcError {
    pub code: i32,
    pub message: String,
    /// Optional structured detail (the `data` member).
    pub data: Option<Value>,
}

impl RpcError {
    pub fn new(code: i32, message: impl Into<String>) -> RpcError {
        RpcError { code, message: message.into(), data: None }
    }

    pub fn parse_error(detail: impl std::fmt::Display) -> RpcError {
        RpcError::new(codes::PARSE_ERROR, format!("Parse error: {detail}"))
    }

    pub fn invalid_request(detail: impl std::fmt::Display) -> RpcError {
        RpcError::new(codes::INVALID_REQUEST, format!("Invalid request: {detail}"))
    }

    pub fn method_not_found(method: &str) -> RpcError {
        RpcError::new(codes::METHOD_NOT_FOUND, format!("Method not found: '{method}'"))
    }

    pub fn invalid_params(detail: impl Into<String>) -> RpcError {
        RpcError::new(codes::INVALID_PARAMS, detail)
    }

    pub fn internal(detail: impl std::fmt::Display) -> RpcError {
        RpcError::new(codes::INTERNAL_ERROR, format!("Internal error: {detail}"))
    }

    /// The `error` member of a response.
    pub fn to_json(&self) -> Value {
        let mut v = json!({ "code": self.code, "message": self.message });
        if let Some(data) = &self.data {
            v["data"] = data.clone();
        }
        v
    }
}
