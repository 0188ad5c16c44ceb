//! The store table: the daemon's named backup stores (`backup_store_add`), one per registry,
//! kept among the registry's module states as the keyring is. Whoever needs a store by name
//! (the catalogue methods, the live-restore bdev, the backup jobs) asks [`stores`]; whoever
//! needs a backup key by keyring name asks [`backup_key`].
//!
//! Secrets (the S3 secret key) live only inside the open [`Store`]: an entry keeps the URL and
//! the endpoint for listings, no message quotes a secret, and `backup_store_list` shows neither
//! key.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fp_backup::{BackupError, BackupKey, ErrorKind, Store, StoreConfig};
use fp_bdev::module::{ModuleError, ModuleHost};
use fp_rpc::ParamError;

/// The name the table is kept under among the registry's module states.
const STATE: &str = "backup_stores";

/// How long `backup_store_add` waits for the store's answer to its one question.
pub const CHECK_BOUND: Duration = Duration::from_secs(15);

/// The daemon's store table, made on first use. Every caller of one registry gets the same one.
pub fn stores(host: &dyn ModuleHost) -> Arc<Stores> {
    let state = host.module_state(STATE, &|| Arc::new(Stores::default()));
    state.downcast::<Stores>().unwrap_or_else(|_| panic!("the '{STATE}' state is a Stores"))
}

/// The backup key derived from the keyring key `name` (errors name the field `key`): what an
/// encrypted backup is made or read with.
pub fn backup_key(host: &dyn ModuleHost, name: &str) -> Result<Arc<BackupKey>, ModuleError> {
    let file_key = fp_crypto::keyring(host).key(name)?;
    let key = file_key.with_material(|material| BackupKey::new(name, material));
    key.map(Arc::new).map_err(|e| match e {
        BackupError::Invalid { reason, .. } => ParamError::new("key", format!("'{name}': {reason}")).into(),
        other => crate::backup_error(other),
    })
}

/// One named store: the open handle and where it is (never its credentials).
pub struct StoreEntry {
    /// The open store.
    pub store: Arc<Store>,
    /// Its URL (`s3://bucket/prefix`, `file:///dir`).
    pub url: String,
    /// Its S3 endpoint; empty for AWS and for a directory.
    pub endpoint: String,
}

/// The named stores ([`stores`]).
#[derive(Default)]
pub struct Stores {
    map: Mutex<BTreeMap<String, Arc<StoreEntry>>>,
}

impl Stores {
    /// The store `name` (field `store` in the error).
    pub fn get(&self, name: &str) -> Result<Arc<Store>, ModuleError> {
        let map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        map.get(name)
            .map(|e| e.store.clone())
            .ok_or_else(|| ParamError::new("store", format!("no backup store named '{name}'")).into())
    }

    /// Opens the store `config` names, asks it one question ([`Store::check`], at most
    /// [`CHECK_BOUND`]) and keeps it as `name`. Errors name the parameter at fault (`url`,
    /// `endpoint`, `access_key_id`, `secret_access_key`) and never quote the secret.
    pub fn add(&self, name: &str, config: &StoreConfig) -> Result<(), ModuleError> {
        if name.is_empty() || name.len() > 255 || name.contains(|c: char| c.is_control()) {
            return Err(ParamError::new("name", "1 to 255 bytes without control characters").into());
        }
        self.refuse_taken(name)?;
        let store = Store::open(config).map_err(|e| store_param_error(config, e))?;
        // Without the table's lock: the question may take the bound.
        store.check(CHECK_BOUND).map_err(|e| store_param_error(config, e))?;
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        if map.contains_key(name) {
            return Err(taken(name));
        }
        let entry =
            StoreEntry { store: Arc::new(store), url: config.url.clone(), endpoint: config.endpoint.clone() };
        map.insert(name.to_string(), Arc::new(entry));
        Ok(())
    }

    fn refuse_taken(&self, name: &str) -> Result<(), ModuleError> {
        let map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        if map.contains_key(name) {
            return Err(taken(name));
        }
        Ok(())
    }

    /// Forgets the store `name`. Whoever holds it (a restore, a job) keeps its handle until it
    /// lets go.
    pub fn remove(&self, name: &str) -> Result<(), ModuleError> {
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        map.remove(name)
            .map(drop)
            .ok_or_else(|| ParamError::new("name", format!("no backup store named '{name}'")).into())
    }

    /// Each store's name and entry, by name.
    pub fn list(&self) -> Vec<(String, Arc<StoreEntry>)> {
        let map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        map.iter().map(|(name, e)| (name.clone(), e.clone())).collect()
    }
}

fn taken(name: &str) -> ModuleError {
    ParamError::new("name", format!("a backup store named '{name}' exists")).into()
}

/// Why a store could not be added, as the parameter at fault. The store's own message is kept
/// (it says what the store answered) with the secret key scrubbed, should a store ever echo it.
fn store_param_error(config: &StoreConfig, e: BackupError) -> ModuleError {
    let scrub = |text: String| {
        if config.secret_key.is_empty() {
            text
        } else {
            text.replace(&config.secret_key, "<secret>")
        }
    };
    let (field, reason) = match e {
        BackupError::Invalid { field, reason } => (field, reason),
        BackupError::NotFound { object } => {
            ("url", format!("{object}: the store has no such bucket or directory"))
        }
        e if e.kind() == ErrorKind::Refused => {
            let text = e.to_string();
            let field = if config.access_key.is_empty() || text.contains("InvalidAccessKeyId") {
                "access_key_id"
            } else {
                // Missing secret, a signature that does not match, or a key without access.
                "secret_access_key"
            };
            (field, format!("the store refused the credentials: {text}"))
        }
        e if e.kind() == ErrorKind::Unavailable && !config.endpoint.is_empty() => {
            ("endpoint", format!("the store does not answer: {e}"))
        }
        e => ("url", e.to_string()),
    };
    let field = match field {
        "access key" => "access_key_id",
        "secret key" => "secret_access_key",
        other => other,
    };
    ParamError::new(field, scrub(reason)).into()
}
