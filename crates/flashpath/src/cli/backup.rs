//! `backup start|jobs|cancel|speed`: backup jobs of a live disk to a store
//! (`bdev_backup_*`), and `backup store add|remove|list`, `backup list|show|verify|delete|gc`:
//! the stores and what they hold (`backup_store_*`, `backup_list|get|verify|delete|gc`).
//! docs/backup.md, "Backup jobs".

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::size::{self, format_size};
use clap::{Args, Subcommand};
use serde_json::{json, Value};
use zeroize::Zeroizing;

use super::session::{
    cell, one_call, out, print_json, set_given, table, u64_field, usage, CliError, Session,
};

#[derive(Debug, Subcommand)]
pub(crate) enum BackupCommand {
    /// Back a disk up to a store while it runs; prints the job's id
    Start(BackupStartArgs),
    /// Jobs: state, chunks read and uploaded, the backup made (or one job)
    Jobs { job_id: Option<String> },
    /// Cancel a running job (its bitmap keeps the changes), or dismiss one that ended
    Cancel { job_id: String },
    /// Limit how fast a job reads the disk, in bytes per second, e.g. 100MiB (0: no limit)
    Speed {
        job_id: String,
        #[arg(value_parser = size::parse_size)]
        rate: u64,
    },
    /// Backup stores: add, remove, list
    #[command(subcommand)]
    Store(StoreCommand),
    /// The backups in a store (of one disk)
    List {
        #[arg(long)]
        store: String,
        bdev: Option<String>,
    },
    /// One backup: kind, size, chunks, parent
    Show(BackupIdArgs),
    /// Check a backup's chunks: fetched and checked, or only asked for with --quick
    Verify {
        #[command(flatten)]
        id: BackupIdArgs,
        /// Only ask whether each chunk is there
        #[arg(long)]
        quick: bool,
        /// The keyring key of an encrypted backup
        #[arg(long, value_name = "NAME")]
        key: Option<String>,
    },
    /// Delete a backup's manifest (`backup gc` collects its chunks)
    Delete(BackupIdArgs),
    /// Delete the chunks no backup refers to, older than the grace period
    Gc {
        #[arg(long)]
        store: String,
        /// Keep chunks younger than this many seconds [default: 3600]
        #[arg(long, value_name = "SECONDS")]
        grace_sec: Option<u64>,
    },
}

#[derive(Debug, Args)]
pub(crate) struct BackupStartArgs {
    /// The disk to back up (it may be exported and busy)
    bdev: String,
    /// The store to write to (`backup store add`)
    #[arg(long)]
    store: String,
    /// Only the chunks the bitmap marked since the last backup taken with it
    #[arg(long)]
    incremental: bool,
    /// The dirty bitmap: an incremental reads what it marked; a full backup clears it (adds it
    /// when absent) so that it tracks the changes since
    #[arg(long, value_name = "NAME")]
    bitmap: Option<String>,
    /// The backup an incremental builds on [default: the one the bitmap was last taken for]
    #[arg(long, value_name = "ID")]
    parent: Option<String>,
    /// Bytes per chunk, a power of two from 64KiB to 16MiB [default: 1MiB]
    #[arg(long, value_name = "SIZE", value_parser = size::parse_size)]
    chunk_size: Option<u64>,
    /// Encrypt with this keyring key (`crypto key create`)
    #[arg(long, value_name = "NAME")]
    key: Option<String>,
    /// Uploads in flight at most [default: 4]
    #[arg(long, value_name = "N")]
    parallel: Option<u64>,
    /// Read at most this many bytes per second, e.g. 50MiB [default: no limit]
    #[arg(long, value_name = "SIZE", value_parser = size::parse_size)]
    speed: Option<u64>,
    /// The job's name [default: the disk's name]
    #[arg(long, value_name = "NAME")]
    job_id: Option<String>,
}

#[derive(Debug, Args)]
pub(crate) struct BackupIdArgs {
    #[arg(long)]
    store: String,
    bdev: String,
    backup_id: String,
}

#[derive(Debug, Subcommand)]
pub(crate) enum StoreCommand {
    /// Add a store: s3://BUCKET[/PREFIX] or file:///DIR; checked with one request
    Add(StoreAddArgs),
    /// Forget a store (its backups stay where they are)
    Remove { name: String },
    /// Stores: name, URL, endpoint (never credentials)
    List,
}

#[derive(Debug, Args)]
pub(crate) struct StoreAddArgs {
    name: String,
    url: String,
    /// The S3 endpoint, e.g. http://rgw.example:8080 [default: AWS]
    #[arg(long)]
    endpoint: Option<String>,
    #[arg(long)]
    region: Option<String>,
    #[arg(long, value_name = "ID")]
    access_key_id: Option<String>,
    /// An owner-only file (chmod 600) holding the secret access key
    #[arg(long, value_name = "FILE")]
    secret_access_key_file: Option<PathBuf>,
    /// Allow a plain-HTTP endpoint
    #[arg(long)]
    allow_http: bool,
    /// Path-style requests (http://endpoint/bucket/key), as Ceph's gateway and MinIO want
    #[arg(long)]
    path_style: bool,
}

/// The backup methods' parameters and the arguments that set them.
const BACKUP_FLAGS: &[(&str, &str)] = &[
    ("bdev", "BDEV"),
    ("store", "--store"),
    ("sync", "--incremental"),
    ("bitmap", "--bitmap"),
    ("parent", "--parent"),
    ("chunk_size", "--chunk-size"),
    ("key", "--key"),
    ("parallel", "--parallel"),
    ("speed", "--speed"),
    ("job_id", "--job-id"),
    ("name", "NAME"),
    ("url", "URL"),
    ("endpoint", "--endpoint"),
    ("region", "--region"),
    ("access_key_id", "--access-key-id"),
    ("secret_access_key", "--secret-access-key-file"),
    ("allow_http", "--allow-http"),
    ("path_style", "--path-style"),
    ("backup_id", "BACKUP_ID"),
    ("quick", "--quick"),
    ("grace_sec", "--grace-sec"),
];

/// `backup ...`.
pub(crate) fn run(rpc: &Path, json: bool, cmd: BackupCommand) -> Result<(), CliError> {
    let call = |method, params| one_call(rpc, json, BACKUP_FLAGS, method, params);
    match cmd {
        BackupCommand::Start(a) => {
            let sync = if a.incremental { "incremental" } else { "full" };
            let mut params = json!({ "bdev": a.bdev, "store": a.store, "sync": sync });
            set_given(&mut params, "bitmap", a.bitmap);
            set_given(&mut params, "parent", a.parent);
            set_given(&mut params, "chunk_size", a.chunk_size);
            set_given(&mut params, "key", a.key);
            set_given(&mut params, "parallel", a.parallel);
            set_given(&mut params, "speed", a.speed);
            set_given(&mut params, "job_id", a.job_id);
            call("bdev_backup_start", params)
        }
        BackupCommand::Jobs { job_id } => jobs(rpc, json, job_id),
        BackupCommand::Cancel { job_id } => call("bdev_backup_cancel", json!({ "job_id": job_id })),
        BackupCommand::Speed { job_id, rate } => {
            call("bdev_backup_set_speed", json!({ "job_id": job_id, "speed": rate }))
        }
        BackupCommand::Store(StoreCommand::Add(a)) => {
            let mut params = json!({ "name": a.name, "url": a.url });
            set_given(&mut params, "endpoint", a.endpoint);
            set_given(&mut params, "region", a.region);
            set_given(&mut params, "access_key_id", a.access_key_id);
            let secret = a.secret_access_key_file.as_deref().map(read_secret_file).transpose()?;
            set_given(&mut params, "secret_access_key", secret.as_deref().map(String::as_str));
            set_given(&mut params, "allow_http", a.allow_http.then_some(true));
            set_given(&mut params, "path_style", a.path_style.then_some(true));
            call("backup_store_add", params)
        }
        BackupCommand::Store(StoreCommand::Remove { name }) => {
            call("backup_store_remove", json!({ "name": name }))
        }
        BackupCommand::Store(StoreCommand::List) => stores(rpc, json),
        BackupCommand::List { store, bdev } => {
            let mut params = json!({ "store": store });
            set_given(&mut params, "bdev", bdev);
            list(rpc, json, params)
        }
        BackupCommand::Show(a) => {
            let r = Session::connect(rpc, BACKUP_FLAGS)?.call("backup_get", Some(id_params(&a)))?;
            if json {
                print_json(&r);
            } else {
                out(&table(HEADERS, &[backup_row(&r)]));
            }
            Ok(())
        }
        BackupCommand::Verify { id, quick, key } => {
            let mut params = id_params(&id);
            set_given(&mut params, "quick", quick.then_some(true));
            set_given(&mut params, "key", key);
            let r = Session::connect(rpc, BACKUP_FLAGS)?.call("backup_verify", Some(params))?;
            if json {
                print_json(&r);
            } else {
                let n = |k: &str| r[k].as_array().map_or(0, Vec::len);
                out(&format!(
                    "{}: {} chunks checked, {} missing, {} corrupt",
                    if r["ok"] == true { "ok" } else { "DAMAGED" },
                    u64_field(&r, "chunks_checked"),
                    n("missing"),
                    n("corrupt")
                ));
            }
            Ok(())
        }
        BackupCommand::Delete(a) => call("backup_delete", id_params(&a)),
        BackupCommand::Gc { store, grace_sec } => {
            let mut params = json!({ "store": store });
            set_given(&mut params, "grace_sec", grace_sec);
            let r = Session::connect(rpc, BACKUP_FLAGS)?.call("backup_gc", Some(params))?;
            if json {
                print_json(&r);
            } else {
                out(&format!(
                    "{} chunks deleted ({}), {} kept young, {} referenced by {} backups",
                    u64_field(&r, "chunks_deleted"),
                    format_size(u64_field(&r, "bytes_deleted")),
                    u64_field(&r, "chunks_young"),
                    u64_field(&r, "chunks_referenced"),
                    u64_field(&r, "manifests")
                ));
            }
            Ok(())
        }
    }
}

fn id_params(a: &BackupIdArgs) -> Value {
    json!({ "store": a.store, "bdev": a.bdev, "backup_id": a.backup_id })
}

/// The secret in an owner-only file, trailing whitespace dropped; refused naming the flag.
fn read_secret_file(path: &Path) -> Result<Zeroizing<String>, CliError> {
    const FLAG: &str = "--secret-access-key-file";
    let shown = path.display();
    let meta = std::fs::metadata(path).map_err(|e| usage(FLAG, format!("{shown}: {e}")))?;
    if !meta.is_file() || meta.mode() & 0o077 != 0 {
        let mode = meta.mode() & 0o777;
        return Err(usage(
            FLAG,
            format!("{shown} must be a regular file, owner-only (chmod 600); its mode is {mode:o}"),
        ));
    }
    let text =
        Zeroizing::new(std::fs::read_to_string(path).map_err(|e| usage(FLAG, format!("{shown}: {e}")))?);
    let secret = Zeroizing::new(text.trim().to_string());
    if secret.is_empty() {
        return Err(usage(FLAG, format!("{shown} is empty")));
    }
    Ok(secret)
}

fn jobs(rpc: &Path, json: bool, job_id: Option<String>) -> Result<(), CliError> {
    let params = job_id.map(|id| json!({ "job_id": id }));
    let list = Session::connect(rpc, BACKUP_FLAGS)?.call("bdev_backup_get_jobs", params)?;
    if json {
        print_json(&list);
        return Ok(());
    }
    let Some(jobs) = list.as_array() else {
        return Err(CliError::Unexpected { method: "bdev_backup_get_jobs", result: list });
    };
    out(&table(
        &["JOB", "BDEV", "STORE", "SYNC", "STATE", "CHUNKS", "READ", "UPLOADED", "BACKUP", "ERROR"],
        &job_rows(jobs),
    ));
    Ok(())
}

fn job_rows(jobs: &[Value]) -> Vec<Vec<String>> {
    jobs.iter()
        .map(|j| {
            let p = &j["progress"];
            vec![
                cell(j, "job_id"),
                cell(j, "bdev"),
                cell(j, "store"),
                cell(j, "sync"),
                cell(j, "state"),
                format!("{}/{}", u64_field(p, "chunks_read"), u64_field(p, "chunks_total")),
                format_size(u64_field(p, "bytes_read")),
                format_size(u64_field(p, "bytes_uploaded")),
                j["backup_id"].as_str().unwrap_or("-").to_string(),
                j["error"].as_str().unwrap_or("-").to_string(),
            ]
        })
        .collect()
}

fn stores(rpc: &Path, json: bool) -> Result<(), CliError> {
    let list = Session::connect(rpc, BACKUP_FLAGS)?.call("backup_store_list", None)?;
    if json {
        print_json(&list);
        return Ok(());
    }
    let Some(stores) = list.as_array() else {
        return Err(CliError::Unexpected { method: "backup_store_list", result: list });
    };
    let rows: Vec<Vec<String>> = stores
        .iter()
        .map(|s| {
            let endpoint = s["endpoint"].as_str().filter(|e| !e.is_empty()).unwrap_or("-");
            vec![cell(s, "name"), cell(s, "url"), endpoint.to_string()]
        })
        .collect();
    out(&table(&["NAME", "URL", "ENDPOINT"], &rows));
    Ok(())
}

const HEADERS: &[&str] =
    &["BDEV", "BACKUP", "KIND", "CREATED", "SIZE", "CHUNK", "CHUNKS", "ZERO", "PARENT", "KEY"];

fn backup_row(b: &Value) -> Vec<String> {
    if let Some(e) = b["error"].as_str() {
        let mut row = vec![cell(b, "bdev"), cell(b, "backup_id"), format!("unreadable: {e}")];
        row.resize(HEADERS.len(), String::new());
        return row;
    }
    let or_dash = |k: &str| b[k].as_str().unwrap_or("-").to_string();
    vec![
        cell(b, "bdev"),
        cell(b, "backup_id"),
        cell(b, "kind"),
        cell(b, "created"),
        format_size(u64_field(b, "size")),
        format_size(u64_field(b, "chunk_size")),
        cell(b, "chunks"),
        cell(b, "zero_chunks"),
        or_dash("parent"),
        or_dash("key"),
    ]
}

fn list(rpc: &Path, json: bool, params: Value) -> Result<(), CliError> {
    let list = Session::connect(rpc, BACKUP_FLAGS)?.call("backup_list", Some(params))?;
    if json {
        print_json(&list);
        return Ok(());
    }
    let Some(backups) = list.as_array() else {
        return Err(CliError::Unexpected { method: "backup_list", result: list });
    };
    out(&table(HEADERS, &backups.iter().map(backup_row).collect::<Vec<_>>()));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_rows_show_progress_and_outcome() {
        let jobs = [json!({ "job_id": "j", "bdev": "vm0", "store": "s", "sync": "incremental",
            "state": "completed", "backup_id": "20261130T101010Z-0a0b0c0d", "error": null,
            "progress": { "chunks_total": 4, "chunks_read": 4, "bytes_read": 4 << 20, "bytes_uploaded": 1 << 20 } })];
        let r = job_rows(&jobs);
        assert_eq!(r[0][..6], ["j", "vm0", "s", "incremental", "completed", "4/4"]);
        assert_eq!(r[0][6], format_size(4 << 20));
        assert_eq!(r[0][8], "20261130T101010Z-0a0b0c0d");
        assert_eq!(r[0][9], "-");
    }

    #[test]
    fn an_unreadable_backup_is_a_row_saying_why() {
        let r = backup_row(&json!({ "bdev": "vm0", "backup_id": "x", "error": "corrupt" }));
        assert_eq!(r.len(), HEADERS.len());
        assert_eq!(r[2], "unreadable: corrupt");
    }

    #[test]
    fn a_secret_file_must_be_owner_only() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("secret");
        std::fs::write(&path, "s3cr3t\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = read_secret_file(&path).unwrap_err().to_string();
        assert!(e.contains("--secret-access-key-file") && e.contains("owner-only"), "{e}");
        assert!(!e.contains("s3cr3t"), "{e}");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(read_secret_file(&path).unwrap().as_str(), "s3cr3t");
    }
}
