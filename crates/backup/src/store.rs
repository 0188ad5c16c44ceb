//! The store handle: an object store, the small runtime that drives it, the retry policy, and
//! the in-process rule that a GC never runs beside a backup on the same store.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use futures::TryStreamExt;
use object_store::path::Path;
use object_store::{ObjectMeta, ObjectStore, ObjectStoreExt, PutPayload};

use crate::config::StoreConfig;
use crate::error::{BackupError, ErrorKind, Result};

/// How store requests are retried: `attempts` tries in all, waiting `first_backoff`, then twice
/// as long each time, at most `max_backoff`. A request the store answered with "not found" or
/// "refused" is not retried. The default: 5 attempts, 200 ms doubling to 3.2 s (6 s of waiting
/// at most, on top of the requests' own timeouts).
#[derive(Debug, Clone, Copy)]
pub struct RetryPolicy {
    /// Tries in all (at least 1).
    pub attempts: u32,
    /// The first wait.
    pub first_backoff: Duration,
    /// The longest wait.
    pub max_backoff: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            attempts: 5,
            first_backoff: Duration::from_millis(200),
            max_backoff: Duration::from_millis(3200),
        }
    }
}

/// What runs on a store now, per store location, in this process: backups (a count) or a GC.
#[derive(Default)]
struct Activity {
    backups: u32,
    gc: bool,
}

fn activity() -> &'static Mutex<HashMap<String, Activity>> {
    static ACTIVITY: OnceLock<Mutex<HashMap<String, Activity>>> = OnceLock::new();
    ACTIVITY.get_or_init(Default::default)
}

/// Held while a backup or a GC runs; lets go on drop.
pub(crate) struct ActivityGuard {
    location: String,
    gc: bool,
}

impl Drop for ActivityGuard {
    fn drop(&mut self) {
        let mut map = activity().lock().unwrap_or_else(|p| p.into_inner());
        if let Some(a) = map.get_mut(&self.location) {
            if self.gc {
                a.gc = false;
            } else {
                a.backups -= 1;
            }
            if !a.gc && a.backups == 0 {
                map.remove(&self.location);
            }
        }
    }
}

struct Inner {
    objects: Arc<dyn ObjectStore>,
    /// Always `Some` until the drop.
    runtime: Option<tokio::runtime::Runtime>,
    /// The store for messages, and the key of the in-process activity rule.
    location: String,
    retry: RetryPolicy,
}

impl Drop for Inner {
    fn drop(&mut self) {
        // The last handle may go inside one of the runtime's own tasks (a `read_async` that
        // held the last clone): a plain drop of a runtime there panics, this does not.
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// An open backup store. Cheap to clone (an `Arc`); usable from any control-plane thread.
///
/// Its methods block: call them from plain threads, never from an async task or a reactor.
/// The handle owns a two-worker tokio runtime that runs the requests (and a backup's parallel
/// uploads); dropping the last clone stops it.
#[derive(Clone)]
pub struct Store {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("location", &self.inner.location).finish_non_exhaustive()
    }
}

impl Store {
    /// Opens the store `config` names. Makes no request: a wrong endpoint or credentials show
    /// at the first operation.
    pub fn open(config: &StoreConfig) -> Result<Store> {
        Store::with_object_store(config.build()?, &config.describe(), RetryPolicy::default())
    }

    /// A store over any [`ObjectStore`] (tests: `object_store::memory::InMemory`, a fault
    /// injector). `location` names it in messages and keys the GC/backup rule: give two
    /// handles on the same objects the same location.
    pub fn with_object_store(
        objects: Arc<dyn ObjectStore>,
        location: &str,
        retry: RetryPolicy,
    ) -> Result<Store> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("fp-backup-io")
            .enable_all()
            .build()
            .map_err(|e| BackupError::Store {
                kind: ErrorKind::Other,
                object: location.to_string(),
                what: "start the runtime",
                attempts: 1,
                reason: e.to_string(),
            })?;
        let retry = RetryPolicy { attempts: retry.attempts.max(1), ..retry };
        Ok(Store {
            inner: Arc::new(Inner { objects, runtime: Some(runtime), location: location.to_string(), retry }),
        })
    }

    /// The store's location (URL, endpoint; no credentials).
    pub fn location(&self) -> &str {
        &self.inner.location
    }

    pub(crate) fn objects(&self) -> &Arc<dyn ObjectStore> {
        &self.inner.objects
    }

    pub(crate) fn retry(&self) -> RetryPolicy {
        self.inner.retry
    }

    /// Runs `future` on the store's runtime and waits for it (a control thread's call).
    pub(crate) fn block_on<F: Future>(&self, future: F) -> F::Output {
        self.runtime().block_on(future)
    }

    pub(crate) fn runtime(&self) -> &tokio::runtime::Runtime {
        self.inner.runtime.as_ref().expect("the runtime lives until the drop")
    }

    /// Asks the store one question, once, within `bound`: the first page of the listing under
    /// `backups/` (a missing prefix is an empty answer, not an error). Wrong or missing
    /// credentials, a missing bucket or an endpoint that does not answer show here, when a
    /// store is added, rather than at its first backup. Not retried: the caller is waiting.
    pub fn check(&self, bound: Duration) -> Result<()> {
        let object = format!("{} (backups/)", self.location());
        let path = Path::from("backups/");
        let objects = self.objects().clone();
        let first = async move { objects.list(Some(&path)).try_next().await };
        match self.block_on(async { tokio::time::timeout(bound, first).await }) {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(store_error(&object, "list", 1, e)),
            Err(_) => Err(BackupError::Store {
                kind: ErrorKind::Unavailable,
                object,
                what: "list",
                attempts: 1,
                reason: format!("no answer within {} s", bound.as_secs_f64()),
            }),
        }
    }

    /// Registers a backup on this store; refused while a GC runs here.
    pub(crate) fn begin_backup(&self) -> Result<ActivityGuard> {
        let mut map = activity().lock().unwrap_or_else(|p| p.into_inner());
        let a = map.entry(self.inner.location.clone()).or_default();
        if a.gc {
            return Err(BackupError::Busy {
                store: self.inner.location.clone(),
                reason: "a garbage collection runs on this store; back up after it".into(),
            });
        }
        a.backups += 1;
        Ok(ActivityGuard { location: self.inner.location.clone(), gc: false })
    }

    /// Registers a GC on this store; refused while a backup or another GC runs here.
    pub(crate) fn begin_gc(&self) -> Result<ActivityGuard> {
        let mut map = activity().lock().unwrap_or_else(|p| p.into_inner());
        let a = map.entry(self.inner.location.clone()).or_default();
        if a.gc || a.backups > 0 {
            let reason = if a.gc {
                "a garbage collection already runs on this store".to_string()
            } else {
                format!("{} backup(s) run on this store; collect garbage after them", a.backups)
            };
            return Err(BackupError::Busy { store: self.inner.location.clone(), reason });
        }
        a.gc = true;
        Ok(ActivityGuard { location: self.inner.location.clone(), gc: true })
    }
}

/// The error of a store request that failed, after `attempts` tries.
fn store_error(object: &str, what: &'static str, attempts: u32, e: object_store::Error) -> BackupError {
    if let object_store::Error::NotFound { .. } = e {
        return BackupError::NotFound { object: object.to_string() };
    }
    let kind = classify(&e);
    BackupError::Store { kind, object: object.to_string(), what, attempts, reason: e.to_string() }
}

fn classify(e: &object_store::Error) -> ErrorKind {
    match e {
        object_store::Error::NotFound { .. } => ErrorKind::NotFound,
        object_store::Error::PermissionDenied { .. } | object_store::Error::Unauthenticated { .. } => {
            ErrorKind::Refused
        }
        // Timeouts, refused connections and 5xx answers come as Generic.
        object_store::Error::Generic { .. } | object_store::Error::JoinError { .. } => ErrorKind::Unavailable,
        _ => ErrorKind::Other,
    }
}

/// Runs `op` with the store's retry policy. Not found, refused and unsupported are final.
pub(crate) async fn with_retry<T, F, Fut>(
    retry: RetryPolicy,
    object: &str,
    what: &'static str,
    mut op: F,
) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = object_store::Result<T>>,
{
    let mut backoff = retry.first_backoff;
    let mut attempt = 0;
    loop {
        attempt += 1;
        match op().await {
            Ok(v) => return Ok(v),
            Err(e) if classify(&e) != ErrorKind::Unavailable || attempt >= retry.attempts => {
                return Err(store_error(object, what, attempt, e));
            }
            Err(e) => {
                log::warn!(
                    "{object}: {what} failed (attempt {attempt} of {}): {e}; retrying",
                    retry.attempts
                );
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(retry.max_backoff);
            }
        }
    }
}

/// Async requests on a store's objects, each retried.
pub(crate) async fn get(objects: &Arc<dyn ObjectStore>, retry: RetryPolicy, key: &str) -> Result<Bytes> {
    let path = Path::from(key);
    with_retry(retry, key, "get", || async { objects.get(&path).await?.bytes().await }).await
}

pub(crate) async fn head(
    objects: &Arc<dyn ObjectStore>,
    retry: RetryPolicy,
    key: &str,
) -> Result<Option<ObjectMeta>> {
    let path = Path::from(key);
    match with_retry(retry, key, "head", || objects.head(&path)).await {
        Ok(meta) => Ok(Some(meta)),
        Err(BackupError::NotFound { .. }) => Ok(None),
        Err(e) => Err(e),
    }
}

pub(crate) async fn put(
    objects: &Arc<dyn ObjectStore>,
    retry: RetryPolicy,
    key: &str,
    bytes: Bytes,
) -> Result<()> {
    let path = Path::from(key);
    with_retry(retry, key, "put", || objects.put(&path, PutPayload::from_bytes(bytes.clone())))
        .await
        .map(|_| ())
}

pub(crate) async fn delete(objects: &Arc<dyn ObjectStore>, retry: RetryPolicy, key: &str) -> Result<()> {
    let path = Path::from(key);
    match with_retry(retry, key, "delete", || objects.delete(&path)).await {
        Ok(()) | Err(BackupError::NotFound { .. }) => Ok(()),
        Err(e) => Err(e),
    }
}

/// Every object below `prefix` (retried as a whole: a listing is restarted, not resumed).
pub(crate) async fn list(
    objects: &Arc<dyn ObjectStore>,
    retry: RetryPolicy,
    prefix: &str,
) -> Result<Vec<ObjectMeta>> {
    let path = Path::from(prefix);
    with_retry(retry, prefix, "list", || objects.list(Some(&path)).try_collect::<Vec<_>>()).await
}
