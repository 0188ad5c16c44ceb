//! `crypto create|delete|list` and `crypto key create|destroy|list`: disks encrypted with
//! AES-XTS over another disk, and their keys (the crypto bdev, `bdev_crypto_create`, and
//! `accel_crypto_key_create`; docs/crypto.md). A key is read from an owner-only file, never
//! from the command line, where other users' `ps` would see it.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use clap::Subcommand;
use serde_json::json;
use zeroize::Zeroizing;

use super::luks::{KeyringCommand, LuksCommand};
use super::session::{cell, fetch_list, one_call, out, set_given, table, usage, CliError, Session};

#[derive(Debug, Subcommand)]
pub(crate) enum CryptoCommand {
    /// Make disk NAME, which stores every block of BASE encrypted with KEY, or opens the LUKS
    /// volume on BASE with --luks-key; prints NAME
    Create {
        /// The crypto disk's name
        name: String,
        /// The disk below (claimed by the crypto disk)
        base: String,
        /// The key's name (`crypto key create`)
        #[arg(long, value_name = "KEY", required_unless_present = "luks_key", conflicts_with = "luks_key")]
        key: Option<String>,
        /// BASE holds a LUKS volume: open it with this keyring key's passphrase
        /// (`crypto keyring add`)
        #[arg(long, value_name = "KEY")]
        luks_key: Option<String>,
        /// With --luks-key: try this key slot only
        #[arg(long, value_name = "SLOT", requires = "luks_key", value_parser = super::args::u32_arg)]
        key_slot: Option<u32>,
    },
    /// Delete a crypto disk (its base keeps the ciphertext)
    Delete { name: String },
    /// List crypto disks (or show one)
    List { name: Option<String> },
    /// Keys: create from a file, destroy, list (never showing key material)
    #[command(subcommand)]
    Key(KeyCommand),
    /// LUKS volumes: format, dump, test, add-key, kill-slot
    #[command(subcommand)]
    Luks(LuksCommand),
    /// The daemon's keyring (passphrases of LUKS volumes, PSKs): add, remove, list
    #[command(subcommand)]
    Keyring(KeyringCommand),
}

#[derive(Debug, Subcommand)]
pub(crate) enum KeyCommand {
    /// Create AES-XTS key NAME from FILE: owner-only, holding the whole XTS key in hex (64 or
    /// 128 digits: the first half is `key`, the second `key2`, as cryptsetup's key file)
    Create {
        /// The key's name
        name: String,
        /// The key file
        #[arg(long, value_name = "FILE")]
        key_file: PathBuf,
    },
    /// Destroy a key; refused while a crypto disk uses it
    Destroy { name: String },
    /// List keys: names, cipher, size
    List,
}

const FLAGS: &[(&str, &str)] = &[
    ("name", "NAME"),
    ("base_bdev_name", "BASE"),
    ("key_name", "--key"),
    ("luks_key_name", "--luks-key"),
    ("luks_key_slot", "--key-slot"),
    ("key", "--key-file"),
    ("key2", "--key-file"),
];

/// `crypto ...`.
pub(crate) fn run(rpc: &Path, json: bool, cmd: CryptoCommand) -> Result<(), CliError> {
    match cmd {
        CryptoCommand::Create { name, base, key, luks_key, key_slot } => {
            let mut params = json!({"name": name, "base_bdev_name": base});
            set_given(&mut params, "key_name", key);
            set_given(&mut params, "luks_key_name", luks_key);
            set_given(&mut params, "luks_key_slot", key_slot);
            one_call(rpc, json, FLAGS, "bdev_crypto_create", params)
        }
        CryptoCommand::Delete { name } => {
            one_call(rpc, json, FLAGS, "bdev_crypto_delete", json!({"name": name}))
        }
        CryptoCommand::List { name } => list(rpc, json, name),
        CryptoCommand::Luks(c) => super::luks::run(rpc, json, c),
        CryptoCommand::Keyring(c) => super::luks::run_keyring(rpc, json, c),
        CryptoCommand::Key(KeyCommand::Create { name, key_file }) => {
            let hex = read_key_file(&key_file)?;
            let (key, key2) = hex.split_at(hex.len() / 2);
            // The request's JSON copies the key; it lives for this short process only.
            let params = json!({"cipher": "AES_XTS", "key": key, "key2": key2, "name": name});
            let r = Session::connect(rpc, FLAGS)?.call("accel_crypto_key_create", Some(params))?;
            if json {
                super::session::print_json(&r);
            }
            Ok(())
        }
        CryptoCommand::Key(KeyCommand::Destroy { name }) => one_call(
            rpc,
            json,
            &[("key_name", "NAME")],
            "accel_crypto_key_destroy",
            json!({"key_name": name}),
        ),
        CryptoCommand::Key(KeyCommand::List) => {
            let Some(keys) = fetch_list(rpc, json, "accel_crypto_keys_get", None)? else { return Ok(()) };
            let rows: Vec<Vec<String>> =
                keys.iter().map(|k| vec![cell(k, "name"), cell(k, "cipher"), cell(k, "key_bits")]).collect();
            out(&table(&["KEY", "CIPHER", "BITS"], &rows));
            Ok(())
        }
    }
}

/// The hex digits of an owner-only key file, whitespace dropped; refused naming `--key-file`.
fn read_key_file(path: &Path) -> Result<Zeroizing<String>, CliError> {
    let shown = path.display();
    let meta = std::fs::metadata(path).map_err(|e| usage("--key-file", format!("{shown}: {e}")))?;
    if !meta.is_file() || meta.mode() & 0o077 != 0 {
        return Err(usage(
            "--key-file",
            format!(
                "{shown} must be a regular file, owner-only (chmod 600); its mode is {:o}",
                meta.mode() & 0o777
            ),
        ));
    }
    let text = Zeroizing::new(
        std::fs::read_to_string(path).map_err(|e| usage("--key-file", format!("{shown}: {e}")))?,
    );
    let hex: Zeroizing<String> = Zeroizing::new(text.chars().filter(|c| !c.is_whitespace()).collect());
    if hex.len() != 64 && hex.len() != 128 {
        return Err(usage(
            "--key-file",
            format!(
                "{shown} holds {} characters: 64 or 128 hex digits expected (256- or 512-bit XTS)",
                hex.len()
            ),
        ));
    }
    Ok(hex)
}

/// One row per crypto disk: its base and key.
fn list(rpc: &Path, json: bool, name: Option<String>) -> Result<(), CliError> {
    let Some(bdevs) = fetch_list(rpc, json, "bdev_get_bdevs", name)? else { return Ok(()) };
    let rows: Vec<Vec<String>> = bdevs
        .iter()
        .filter_map(|b| {
            let d = b["driver_specific"].get("crypto")?;
            let size = b["num_blocks"].as_u64().unwrap_or(0) * b["block_size"].as_u64().unwrap_or(0);
            Some(vec![
                cell(b, "name"),
                cell(d, "base_bdev_name"),
                cell(d, "key_name"),
                size.to_string(),
                cell(b, "block_size"),
            ])
        })
        .collect();
    out(&table(&["DISK", "BASE", "KEY", "BYTES", "BLOCK"], &rows));
    Ok(())
}
