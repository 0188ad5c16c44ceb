//! `bdev_crypto_create` / `bdev_crypto_delete`, the accel crypto key methods and the
//! `keyring_file` methods, SPDK's names and parameters. Results never carry key material.

use std::any::Any;
use std::sync::Arc;

use fp_rpc::{Neutral, ParamError, Params};
use serde_json::{json, Map, Value};
use zeroize::Zeroizing;

use fp_bdev::module::{BdevModule, ClaimType, ConfigTable, ModuleError, ModuleHost, ModuleMethodFn, NewBdev};
use fp_bdev::BdevInfo;

use crate::keyring::{keyring, FileKey};
use crate::{luks, AccelKeys, CryptoDevice, CryptoKey, CIPHER, TWEAK_MODE};

const MODULE: &str = "crypto";

/// The crypto module: AES-XTS bdevs over another bdev, and the keys they use. It serves the
/// daemon keyring's methods too (the keyring itself is [`crate::keyring()`]'s, shared by every
/// module and export).
pub struct CryptoModule;

/// The module's configuration file tables ([`BdevModule::config_tables`]).
const CONFIG_TABLES: &[ConfigTable] = &[
    ConfigTable::array("keyring_file_key", "keyring_file_add_key"),
    ConfigTable::array("accel_crypto_key", "accel_crypto_key_create").secret(),
];

impl BdevModule for CryptoModule {
    fn name(&self) -> &'static str {
        MODULE
    }

    /// Each `[[keyring_file_key]]` (`keyring_file_add_key`), then each `[[accel_crypto_key]]`
    /// (`accel_crypto_key_create`, key material: the file must be owner-only), before the
    /// crypto bdevs that name them.
    fn config_tables(&self) -> &'static [ConfigTable] {
        CONFIG_TABLES
    }

    fn methods(&self) -> &'static [(&'static str, ModuleMethodFn)] {
        &[
            ("bdev_crypto_create", create),
            ("bdev_crypto_delete", delete),
            ("accel_crypto_key_create", key_create),
            ("accel_crypto_key_destroy", key_destroy),
            ("accel_crypto_keys_get", keys_get),
            ("keyring_file_add_key", keyring_add),
            ("keyring_file_remove_key", keyring_remove),
            ("keyring_get_keys", keyring_get),
            ("bdev_luks_format", luks::format),
            ("bdev_luks_get_header", luks::get_header),
            ("bdev_luks_test_key", luks::test_key),
            ("bdev_luks_add_keyslot", luks::add_keyslot),
            ("bdev_luks_remove_keyslot", luks::remove_keyslot),
            ("bdev_luks_reencrypt_start", luks::reencrypt_start),
            ("bdev_luks_reencrypt_get", luks::reencrypt_get),
            ("bdev_luks_reencrypt_pause", luks::reencrypt_pause),
            ("bdev_luks_reencrypt_resume", luks::reencrypt_resume),
            ("bdev_luks_reencrypt_cancel", luks::reencrypt_cancel),
            ("bdev_luks_reencrypt_set_speed", luks::reencrypt_set_speed),
        ]
    }

    /// SPDK's: the base, the bdev's name and its key's name.
    fn driver_specific(&self, info: &BdevInfo, device: &(dyn Any + Send + Sync)) -> Map<String, Value> {
        let mut out: Map<String, Value> =
            info.driver_specific.iter().map(|(k, v)| (k.clone(), Value::from(v.as_str()))).collect();
        out.insert("name".into(), Value::from(info.name.as_str()));
        if let Some(dev) = device.downcast_ref::<CryptoDevice>() {
            out.insert("key_name".into(), Value::from(dev.key_name()));
        }
        out
    }
}

/// The module's accel keys, one store per registry.
fn store(host: &dyn ModuleHost) -> Arc<dyn Any + Send + Sync> {
    host.module_state(MODULE, &|| Arc::new(AccelKeys::default()))
}

fn with_store<R>(host: &dyn ModuleHost, f: impl FnOnce(&AccelKeys) -> R) -> R {
    let state = store(host);
    f(state.downcast_ref::<AccelKeys>().expect("the crypto module's state"))
}

/// Claims the base exclusively. The key is an accel key (`key_name`, SPDK's), or the base is a
/// LUKS volume opened with keyring key `luks_key_name` (flashpath's; `luks_key_slot` tries one
/// slot only). SPDK's obsolete inline key parameters are refused: keys come from
/// `accel_crypto_key_create`.
fn create(host: &dyn ModuleHost, mut p: Params) -> Result<Value, ModuleError> {
    let base = p.required_str("base_bdev_name")?;
    let name = p.required_str("name")?;
    let key_name = p.optional_str("key_name")?;
    let luks_key = p.optional_str("luks_key_name")?;
    let luks_slot = p.optional_uint("luks_key_slot", 31)?.map(|v| v as u32);
    p.spdk_only(&[
        ("crypto_pmd", Neutral::Absent),
        ("key", Neutral::Absent),
        ("cipher", Neutral::Absent),
        ("key2", Neutral::Absent),
    ])?;
    p.finish()?;
    // The key is checked before the base, so a wrong key is named whatever the base's state.
    let accel_key = match (&key_name, &luks_key) {
        (Some(key_name), None) => {
            if luks_slot.is_some() {
                return Err(ParamError::new("luks_key_slot", "only with luks_key_name").into());
            }
            Some(with_store(host, |s| s.accel_key(key_name))?)
        }
        _ => None,
    };
    host.check_new_bdev(&name)?;
    let base_bdev = host.claimable(&base, ClaimType::ExclusiveWrite)?;
    let dev = match (accel_key, &luks_key) {
        (Some(key), None) => CryptoDevice::new(&name, base_bdev, key)?,
        (None, Some(luks_key)) => luks::open_luks(host, &name, base_bdev, luks_key, luks_slot)?,
        _ => {
            return Err(ParamError::new(
                "key_name",
                "give key_name (an accel crypto key) or luks_key_name (a keyring key opening the base's LUKS header), one of the two",
            )
            .into())
        }
    };
    let added = host.add_bdev(MODULE, NewBdev::new(Arc::new(dev)).claiming(&base, ClaimType::ExclusiveWrite));
    let name = match added {
        Ok(n) => n,
        Err(e) => {
            luks::disks(host).remove(&name);
            return Err(e);
        }
    };
    match (key_name, luks_key) {
        (Some(key_name), _) => {
            with_store(host, |s| s.note_user(&name, &key_name));
            log::info!("bdev '{name}' is a crypto bdev over '{base}' with key '{key_name}'");
        }
        (_, Some(luks_key)) => {
            log::info!(
                "bdev '{name}' is a LUKS crypto bdev over '{base}' opened with keyring key '{luks_key}'"
            );
            // The bdev stands whatever happens here: a job that cannot resume is reported, and
            // the disk serves its mixed state (bdev_luks_reencrypt_get shows no job).
            if let Err(e) = luks::methods::resume_after_open(host, &name) {
                log::warn!("LUKS disk '{name}': the recorded re-encryption did not resume: {e}");
            }
        }
        _ => {}
    }
    Ok(Value::from(name))
}

/// `bdev_crypto_delete`: the bdev goes; an open LUKS disk's key goes with it.
fn delete(host: &dyn ModuleHost, mut p: Params) -> Result<Value, ModuleError> {
    let name = p.required_str("name")?;
    p.finish()?;
    let name = host.bdev_name(&name).unwrap_or(name);
    host.claimable(&name, ClaimType::ExclusiveWrite)?;
    // A re-encryption job holds the base: it stops (its hotzone finished and recorded) first.
    luks::disks(host).remove(&name);
    host.delete_bdev(&name, MODULE)?;
    Ok(Value::Bool(true))
}

/// `cipher` AES_XTS, `key` and `key2` in hex, `tweak_mode` SIMPLE_LBA if given, `name`.
fn key_create(host: &dyn ModuleHost, mut p: Params) -> Result<Value, ModuleError> {
    let cipher = p.required_str("cipher")?;
    let key = Zeroizing::new(p.required_str("key")?);
    let key2 = Zeroizing::new(p.optional_str("key2")?.unwrap_or_default());
    let tweak = p.optional_str("tweak_mode")?;
    let name = p.required_str("name")?;
    p.finish()?;
    if cipher != CIPHER {
        return Err(ParamError::new("cipher", format!("only {CIPHER} is supported")).into());
    }
    if key2.is_empty() {
        return Err(
            ParamError::new("key2", "required for AES_XTS (the second half of the key, in hex)").into()
        );
    }
    if let Some(t) = tweak.filter(|t| t != TWEAK_MODE) {
        return Err(ParamError::new(
            "tweak_mode",
            format!(
                "'{}': only {TWEAK_MODE} (the 512-byte sector number, as dm-crypt's plain64)",
                t.escape_debug()
            ),
        )
        .into());
    }
    if name.is_empty() {
        return Err(ParamError::new("name", "must not be empty").into());
    }
    let k = CryptoKey::from_hex(&name, &key, &key2)?;
    let bits = k.bits();
    with_store(host, |s| s.add_accel(k))?;
    log::info!("crypto key '{name}' created ({CIPHER}, {bits} bits)");
    Ok(Value::Bool(true))
}

fn key_destroy(host: &dyn ModuleHost, mut p: Params) -> Result<Value, ModuleError> {
    let name = p.required_str("key_name")?;
    p.finish()?;
    let is_crypto_bdev = |bdev: &str| host.bdev(bdev).is_some_and(|(_, driver)| driver == MODULE);
    with_store(host, |s| s.destroy_accel(&name, &is_crypto_bdev))?;
    log::info!("crypto key '{name}' destroyed");
    Ok(Value::Bool(true))
}

/// Names, cipher, tweak mode and size; never the key.
fn keys_get(host: &dyn ModuleHost, mut p: Params) -> Result<Value, ModuleError> {
    let only = p.optional_str("key_name")?;
    p.finish()?;
    with_store(host, |s| {
        let keys = s.accel.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = &only {
            if !keys.contains_key(n) {
                return Err(ParamError::new("key_name", format!("no crypto key named '{n}'")).into());
            }
        }
        let list: Vec<Value> = keys
            .values()
            .filter(|k| only.as_deref().is_none_or(|n| n == k.name()))
            .map(|k| json!({"name": k.name(), "cipher": CIPHER, "tweak_mode": TWEAK_MODE, "key_bits": k.bits()}))
            .collect();
        Ok(Value::Array(list))
    })
}

fn keyring_add(host: &dyn ModuleHost, mut p: Params) -> Result<Value, ModuleError> {
    let name = p.required_str("name")?;
    let path = p.required_str("path")?;
    p.finish()?;
    if name.is_empty() {
        return Err(ParamError::new("name", "must not be empty").into());
    }
    let key = FileKey::read(&path)?;
    keyring(host).add_file_key(&name, key)?;
    log::info!("key '{name}' added to the keyring from {path}");
    Ok(Value::Bool(true))
}

fn keyring_remove(host: &dyn ModuleHost, mut p: Params) -> Result<Value, ModuleError> {
    let name = p.required_str("name")?;
    p.finish()?;
    keyring(host).remove_file_key(&name)?;
    log::info!("key '{name}' removed from the keyring");
    Ok(Value::Bool(true))
}

/// SPDK's shape for file keys: name, module, path; never the key.
fn keyring_get(host: &dyn ModuleHost, p: Params) -> Result<Value, ModuleError> {
    p.finish()?;
    let list: Vec<Value> = keyring(host)
        .list()
        .into_iter()
        .map(|(name, path)| json!({"name": name, "module": "keyring_file", "path": path, "removed": false}))
        .collect();
    Ok(Value::Array(list))
}
