//! `crypto luks ...` and `crypto keyring ...`: LUKS volumes on disks (cryptsetup's words:
//! format, dump, add-key, kill-slot, test) and the daemon's keyring, whose keys are their
//! passphrases (docs/crypto.md, "LUKS volumes"). A passphrase is always a keyring key, read by
//! the daemon from an owner-only file, never given on the command line.

use std::path::Path;

use clap::{Args, Subcommand};
use serde_json::{json, Value};

use super::args::u32_arg;
use super::session::{cell, fetch_list, one_call, out, set_given, table, usage, CliError, Session};

#[derive(Debug, Subcommand)]
pub(crate) enum LuksCommand {
    /// Write a new LUKS volume on BASE (not in use) opened by keyring key KEY; prints its UUID
    Format {
        /// The disk to format (its data is lost)
        base: String,
        /// The keyring key whose file's bytes are the first key slot's passphrase
        #[arg(long, value_name = "KEY")]
        passphrase_key: String,
        /// luks2 or luks1 (the one QEMU's luks driver reads) [default: luks2]
        #[arg(long = "type", value_name = "TYPE", value_parser = ["luks2", "luks1"])]
        kind: Option<String>,
        /// Sector size in bytes, 512 to 4096 [default: 4096 for LUKS2, 512 for LUKS1]
        #[arg(long, value_name = "BYTES", value_parser = u32_arg)]
        sector_size: Option<u32>,
        /// Volume key size in bits, 256 or 512 [default: 512]
        #[arg(long, value_name = "BITS", value_parser = u32_arg)]
        key_size: Option<u32>,
        /// The volume's label
        #[arg(long)]
        label: Option<String>,
        /// Overwrite a LUKS header already on BASE
        #[arg(long)]
        force: bool,
        #[command(flatten)]
        kdf: KdfArgs,
    },
    /// Show a LUKS header: of the open LUKS disk NAME, or of --base
    Dump {
        /// An open LUKS crypto disk
        name: Option<String>,
        /// A disk holding a LUKS header (read only)
        #[arg(long, value_name = "BASE", conflicts_with = "name")]
        base: Option<String>,
    },
    /// Which key slot keyring key KEY opens (of NAME, or of --base); fails if none
    Test {
        /// An open LUKS crypto disk
        name: Option<String>,
        /// A disk holding a LUKS header (read only)
        #[arg(long, value_name = "BASE", conflicts_with = "name")]
        base: Option<String>,
        /// The keyring key holding the passphrase
        #[arg(long, value_name = "KEY")]
        passphrase_key: String,
        /// Try this slot only
        #[arg(long, value_name = "SLOT", value_parser = u32_arg)]
        key_slot: Option<u32>,
    },
    /// Add a key slot to the open LUKS disk NAME, opened by keyring key KEY; prints the slot
    AddKey {
        name: String,
        /// The keyring key whose file's bytes are the new slot's passphrase
        #[arg(long, value_name = "KEY")]
        passphrase_key: String,
        /// The slot [default: the first free one]
        #[arg(long, value_name = "SLOT", value_parser = u32_arg)]
        key_slot: Option<u32>,
        #[command(flatten)]
        kdf: KdfArgs,
    },
    /// Wipe key slot SLOT of the open LUKS disk NAME (not its last one)
    KillSlot {
        name: String,
        #[arg(value_parser = u32_arg)]
        slot: u32,
    },
    /// Online re-encryption of a LUKS2 disk to a new volume key: start, status, pause,
    /// resume, cancel, speed
    #[command(subcommand)]
    Reencrypt(ReencryptCommand),
}

#[derive(Debug, Subcommand)]
pub(crate) enum ReencryptCommand {
    /// Re-encrypt the open LUKS2 disk NAME to a new random volume key while it serves I/O;
    /// keyring key KEY gets a slot for the new key (the old slots go when the job ends)
    Start {
        name: String,
        /// The keyring key whose passphrase opens the new key (it may be the current one)
        #[arg(long, value_name = "KEY")]
        passphrase_key: String,
        /// Bytes rewritten per step [default: 1 MiB]
        #[arg(long, value_name = "BYTES", value_parser = super::args::u64_arg)]
        hotzone_size: Option<u64>,
        /// MiB/s at most [default: no limit]
        #[arg(long, value_name = "MIB_S", value_parser = super::args::u64_arg)]
        speed_limit: Option<u64>,
        #[command(flatten)]
        kdf: KdfArgs,
    },
    /// The jobs: state and progress
    Status { name: Option<String> },
    /// Hold the job of NAME between two steps
    Pause { name: String },
    /// Go on after pause
    Resume { name: String },
    /// Stop the job of NAME; the disk keeps serving its two parts, the header records where
    /// it stopped, and reopening the disk resumes it
    Cancel { name: String },
    /// Change the job's speed limit (MiB/s, 0: none)
    Speed {
        name: String,
        #[arg(value_parser = super::args::u64_arg)]
        speed_limit: u64,
    },
}

/// cryptsetup's KDF options.
#[derive(Debug, Args)]
pub(crate) struct KdfArgs {
    /// argon2id, argon2i or pbkdf2 [default: argon2id for LUKS2, pbkdf2 for LUKS1]
    #[arg(long, value_name = "KDF", value_parser = ["argon2id", "argon2i", "pbkdf2"])]
    pbkdf: Option<String>,
    /// Milliseconds one unlock should take, measured on the daemon's host [default: 2000]
    #[arg(long, value_name = "MS", value_parser = u32_arg)]
    iter_time: Option<u32>,
    /// PBKDF2 iterations or Argon2 time cost, instead of measuring
    #[arg(long, value_name = "N", value_parser = u32_arg)]
    pbkdf_force_iterations: Option<u32>,
    /// Argon2 memory in KiB [default: 1048576, at most half the host's memory]
    #[arg(long, value_name = "KIB", value_parser = u32_arg)]
    pbkdf_memory: Option<u32>,
    /// Argon2 lanes [default: 4, at most the host's CPUs]
    #[arg(long, value_name = "N", value_parser = u32_arg)]
    pbkdf_parallel: Option<u32>,
    /// PBKDF2's hash: sha256, sha512, sha1 [default: sha256]
    #[arg(long, value_name = "HASH")]
    hash: Option<String>,
}

impl KdfArgs {
    fn set(&self, params: &mut Value) {
        set_given(params, "pbkdf", self.pbkdf.as_deref());
        set_given(params, "iter_time", self.iter_time);
        set_given(params, "pbkdf_force_iterations", self.pbkdf_force_iterations);
        set_given(params, "pbkdf_memory", self.pbkdf_memory);
        set_given(params, "pbkdf_parallel", self.pbkdf_parallel);
        set_given(params, "hash", self.hash.as_deref());
    }
}

#[derive(Debug, Subcommand)]
pub(crate) enum KeyringCommand {
    /// Add key NAME read by the daemon from FILE (absolute, owner-only, up to 4 KiB)
    Add { name: String, file: String },
    /// Remove key NAME (disks already open keep working)
    Remove { name: String },
    /// List keys: names and files, never their contents
    List,
}

const FLAGS: &[(&str, &str)] = &[
    ("base_bdev_name", "BASE"),
    ("name", "NAME"),
    ("key_name", "--passphrase-key"),
    ("key_slot", "--key-slot"),
    ("type", "--type"),
    ("path", "FILE"),
];

/// Fields whose option is their name with dashes.
const DASHED: &[&str] = &[
    "sector_size",
    "key_size",
    "pbkdf",
    "iter_time",
    "pbkdf_force_iterations",
    "pbkdf_memory",
    "pbkdf_parallel",
    "hash",
    "label",
];

/// `crypto luks ...`.
pub(crate) fn run(rpc: &Path, json: bool, cmd: LuksCommand) -> Result<(), CliError> {
    match cmd {
        LuksCommand::Format { base, passphrase_key, kind, sector_size, key_size, label, force, kdf } => {
            let mut params = json!({"base_bdev_name": base, "key_name": passphrase_key});
            set_given(&mut params, "type", kind);
            set_given(&mut params, "sector_size", sector_size);
            set_given(&mut params, "key_size", key_size);
            set_given(&mut params, "label", label);
            if force {
                params["force"] = Value::Bool(true);
            }
            kdf.set(&mut params);
            call_print(rpc, json, "bdev_luks_format", params)
        }
        LuksCommand::Dump { name, base } => {
            let params = target(name, base)?;
            let h =
                Session::connect(rpc, FLAGS)?.dashed(DASHED).call("bdev_luks_get_header", Some(params))?;
            if json {
                super::session::print_json(&h);
            } else {
                print_header(&h);
            }
            Ok(())
        }
        LuksCommand::Test { name, base, passphrase_key, key_slot } => {
            let mut params = target(name, base)?;
            params["key_name"] = Value::from(passphrase_key);
            set_given(&mut params, "key_slot", key_slot);
            call_print(rpc, json, "bdev_luks_test_key", params)
        }
        LuksCommand::AddKey { name, passphrase_key, key_slot, kdf } => {
            let mut params = json!({"name": name, "key_name": passphrase_key});
            set_given(&mut params, "key_slot", key_slot);
            kdf.set(&mut params);
            call_print(rpc, json, "bdev_luks_add_keyslot", params)
        }
        LuksCommand::Reencrypt(c) => reencrypt(rpc, json, c),
        LuksCommand::KillSlot { name, slot } => {
            one_call(rpc, json, FLAGS, "bdev_luks_remove_keyslot", json!({"name": name, "key_slot": slot}))
        }
    }
}

/// `crypto luks reencrypt ...`.
fn reencrypt(rpc: &Path, json: bool, cmd: ReencryptCommand) -> Result<(), CliError> {
    let simple = |method: &str, name: String| one_call(rpc, json, FLAGS, method, json!({"name": name}));
    match cmd {
        ReencryptCommand::Start { name, passphrase_key, hotzone_size, speed_limit, kdf } => {
            let mut params = json!({"name": name, "key_name": passphrase_key});
            set_given(&mut params, "hotzone_size", hotzone_size);
            set_given(&mut params, "speed_limit", speed_limit);
            kdf.set(&mut params);
            one_call(rpc, json, FLAGS, "bdev_luks_reencrypt_start", params)
        }
        ReencryptCommand::Status { name } => {
            let Some(jobs) = fetch_list(rpc, json, "bdev_luks_reencrypt_get", name)? else { return Ok(()) };
            let rows: Vec<Vec<String>> = jobs
                .iter()
                .map(|j| {
                    let (done, total) =
                        (j["done_bytes"].as_u64().unwrap_or(0), j["total_bytes"].as_u64().unwrap_or(0));
                    let pct = if total == 0 { 100.0 } else { done as f64 * 100.0 / total as f64 };
                    vec![cell(j, "name"), cell(j, "state"), format!("{pct:.1}%"), cell(j, "error")]
                })
                .collect();
            out(&table(&["DISK", "STATE", "DONE", "ERROR"], &rows));
            Ok(())
        }
        ReencryptCommand::Pause { name } => simple("bdev_luks_reencrypt_pause", name),
        ReencryptCommand::Resume { name } => simple("bdev_luks_reencrypt_resume", name),
        ReencryptCommand::Cancel { name } => simple("bdev_luks_reencrypt_cancel", name),
        ReencryptCommand::Speed { name, speed_limit } => one_call(
            rpc,
            json,
            FLAGS,
            "bdev_luks_reencrypt_set_speed",
            json!({"name": name, "speed_limit": speed_limit}),
        ),
    }
}

/// `crypto keyring ...`.
pub(crate) fn run_keyring(rpc: &Path, json: bool, cmd: KeyringCommand) -> Result<(), CliError> {
    match cmd {
        KeyringCommand::Add { name, file } => {
            one_call(rpc, json, FLAGS, "keyring_file_add_key", json!({"name": name, "path": file}))
        }
        KeyringCommand::Remove { name } => {
            one_call(rpc, json, FLAGS, "keyring_file_remove_key", json!({"name": name}))
        }
        KeyringCommand::List => {
            let Some(keys) = fetch_list(rpc, json, "keyring_get_keys", None)? else { return Ok(()) };
            let rows: Vec<Vec<String>> =
                keys.iter().map(|k| vec![cell(k, "name"), cell(k, "path")]).collect();
            out(&table(&["KEY", "FILE"], &rows));
            Ok(())
        }
    }
}

/// `{"name": NAME}` or `{"base_bdev_name": BASE}`: one of the two is needed.
fn target(name: Option<String>, base: Option<String>) -> Result<Value, CliError> {
    match (name, base) {
        (Some(name), None) => Ok(json!({"name": name})),
        (None, Some(base)) => Ok(json!({"base_bdev_name": base})),
        _ => Err(usage("NAME", "give an open LUKS disk's NAME or --base BASE")),
    }
}

/// Calls `method` and prints its answer (a UUID, a slot number).
fn call_print(rpc: &Path, json: bool, method: &str, params: Value) -> Result<(), CliError> {
    let r = Session::connect(rpc, FLAGS)?.dashed(DASHED).call(method, Some(params))?;
    if json {
        super::session::print_json(&r);
    } else {
        match &r {
            Value::String(s) => out(s),
            other => out(&other.to_string()),
        }
    }
    Ok(())
}

/// `luksDump`'s facts, one per line, then one row per key slot.
fn print_header(h: &Value) {
    let mut lines = Vec::new();
    for (label, key) in [
        ("Version", "type"),
        ("UUID", "uuid"),
        ("Label", "label"),
        ("Cipher", "cipher"),
        ("Key bits", "key_size"),
        ("Sector size", "sector_size"),
        ("Data offset", "data_offset"),
        ("Data size", "data_size"),
        ("Opened by slot", "opened_by"),
    ] {
        if !h[key].is_null() {
            lines.push(format!("{label}: {}", cell(h, key)));
        }
    }
    out(&lines.join("\n"));
    let empty = Vec::new();
    let slots = h["keyslots"].as_array().unwrap_or(&empty);
    let rows: Vec<Vec<String>> = slots
        .iter()
        .map(|s| {
            let kdf = &s["kdf"];
            let cost = match kdf["type"].as_str() {
                Some("pbkdf2") => format!("{} iterations, {}", cell(kdf, "iterations"), cell(kdf, "hash")),
                _ => format!(
                    "time {}, {} KiB, {} lanes",
                    cell(kdf, "time"),
                    cell(kdf, "memory"),
                    cell(kdf, "cpus")
                ),
            };
            vec![cell(s, "key_slot"), cell(kdf, "type"), cost]
        })
        .collect();
    out(&table(&["SLOT", "KDF", "COST"], &rows));
}
