//! Where a store is: a URL and the options S3 needs. Credentials never leave this type: its
//! `Debug` and [`StoreConfig::describe`] leave them out.

use std::sync::Arc;
use std::time::Duration;

use object_store::aws::AmazonS3Builder;
use object_store::local::LocalFileSystem;
use object_store::prefix::PrefixStore;
use object_store::{ClientOptions, ObjectStore, RetryConfig};

use crate::error::{invalid, BackupError, Result};

/// A backup store's location: `s3://bucket[/prefix]` (S3, or Ceph's RADOS Gateway with
/// `endpoint` and `path_style`) or `file:///dir` (a local directory, which must exist).
#[derive(Clone, Default)]
pub struct StoreConfig {
    /// `s3://bucket[/prefix]` or `file:///absolute/dir`.
    pub url: String,
    /// S3 endpoint, e.g. `http://127.0.0.1:7480` for RGW; empty for AWS.
    pub endpoint: String,
    /// S3 region (RGW ignores it; `us-east-1` when empty).
    pub region: String,
    /// S3 access key id. Required for `s3://`.
    pub access_key: String,
    /// S3 secret key. Required for `s3://`.
    pub secret_key: String,
    /// Allow an `http://` endpoint (RGW in tests); refused otherwise.
    pub allow_http: bool,
    /// Path-style requests (`endpoint/bucket/key`), which RGW needs; otherwise virtual-hosted
    /// style (`bucket.endpoint/key`).
    pub path_style: bool,
}

impl std::fmt::Debug for StoreConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreConfig")
            .field("url", &self.url)
            .field("endpoint", &self.endpoint)
            .field("region", &self.region)
            .field("allow_http", &self.allow_http)
            .field("path_style", &self.path_style)
            .finish_non_exhaustive()
    }
}

/// A request to S3 that has not finished in this long is abandoned (and retried by the store's
/// own retry, [`crate::RetryPolicy`]).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// Connecting to S3 gives up after this long.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

impl StoreConfig {
    /// The store for logs and errors: the URL and endpoint, no credentials.
    pub fn describe(&self) -> String {
        if self.endpoint.is_empty() {
            self.url.clone()
        } else {
            format!("{} at {}", self.url, self.endpoint)
        }
    }

    /// Builds the object store (no request is made).
    pub(crate) fn build(&self) -> Result<Arc<dyn ObjectStore>> {
        if let Some(dir) = self.url.strip_prefix("file://") {
            if !dir.starts_with('/') {
                return Err(invalid("url", "file:// takes an absolute path (file:///dir)"));
            }
            let fs = LocalFileSystem::new_with_prefix(dir)
                .map_err(|e| invalid("url", format!("{dir}: {e}")))?
                // Removing the last chunk of a fan-out directory removes the directory.
                .with_automatic_cleanup(true);
            return Ok(Arc::new(fs));
        }
        let Some(rest) = self.url.strip_prefix("s3://") else {
            return Err(invalid("url", format!("{}: neither s3:// nor file://", self.url)));
        };
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return Err(invalid("url", "s3:// needs a bucket"));
        }
        if self.access_key.is_empty() || self.secret_key.is_empty() {
            return Err(BackupError::Store {
                kind: crate::ErrorKind::Refused,
                object: self.describe(),
                what: "open",
                attempts: 0,
                reason: "missing credentials (access key and secret key)".into(),
            });
        }
        if self.endpoint.starts_with("http://") && !self.allow_http {
            return Err(invalid("endpoint", "http:// needs allow_http"));
        }
        install_tls_provider();
        let mut builder = AmazonS3Builder::new()
            .with_bucket_name(bucket)
            .with_region(if self.region.is_empty() { "us-east-1" } else { &self.region })
            .with_access_key_id(&self.access_key)
            .with_secret_access_key(&self.secret_key)
            .with_allow_http(self.allow_http)
            .with_virtual_hosted_style_request(!self.path_style)
            .with_client_options(
                ClientOptions::new()
                    .with_allow_http(self.allow_http)
                    .with_timeout(REQUEST_TIMEOUT)
                    .with_connect_timeout(CONNECT_TIMEOUT),
            )
            // Our own retry (RetryPolicy) names the object and bounds the attempts; object_store's
            // is kept short so the two do not multiply into minutes.
            .with_retry(RetryConfig {
                max_retries: 2,
                retry_timeout: Duration::from_secs(30),
                ..Default::default()
            });
        if !self.endpoint.is_empty() {
            builder = builder.with_endpoint(&self.endpoint);
        }
        let s3 = builder.build().map_err(|e| invalid("url", format!("{}: {e}", self.describe())))?;
        let prefix = prefix.trim_matches('/');
        if prefix.is_empty() {
            Ok(Arc::new(s3))
        } else {
            Ok(Arc::new(PrefixStore::new(s3, prefix)))
        }
    }
}

/// Installs rustls's ring provider as the process default when none is: reqwest (object_store's
/// HTTPS) is built without a provider of its own. fp-nbd and fp-crypto name theirs explicitly.
fn install_tls_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Losing a race to another installer is fine: a provider is installed either way.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}
