//! The catalogue: list, inspect, verify and delete backups; collect garbage.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;

use crate::chunk::decode_chunk;
use crate::chunk_id::ChunkId;
use crate::error::{invalid, BackupError, Result};
use crate::key::BackupKey;
use crate::manifest::{check_backup_id, check_name, manifest_key, BackupKind, Manifest};
use crate::store::{self, Store};

/// Chunks younger than this (by the store's last-modified time) are never collected: a backup
/// running in another process uploads its chunks before its manifest. 1 hour.
pub const GC_GRACE: Duration = Duration::from_secs(3600);

/// Requests in flight during a verify or a GC.
const CATALOGUE_PARALLEL: usize = 8;

/// One backup in a listing.
#[derive(Debug, Clone)]
pub struct BackupInfo {
    /// The disk.
    pub disk: String,
    /// The backup's id.
    pub id: String,
    /// The manifest object's size in bytes.
    pub manifest_bytes: u64,
    /// The manifest, or why it could not be read (the listing goes on past a damaged one).
    pub manifest: std::result::Result<Arc<Manifest>, String>,
}

impl BackupInfo {
    /// Full or incremental, when the manifest was read.
    pub fn kind(&self) -> Option<BackupKind> {
        self.manifest.as_ref().ok().map(|m| m.kind)
    }
}

/// What a verify found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VerifyReport {
    /// Distinct chunks checked.
    pub chunks_checked: u64,
    /// Chunks not in the store: (the first index that refers to it, its id).
    pub missing: Vec<(u64, ChunkId)>,
    /// Chunks that failed their checks: (the first index, its id, what is wrong).
    pub corrupt: Vec<(u64, ChunkId, String)>,
}

impl VerifyReport {
    /// Whether every chunk checked out.
    pub fn is_ok(&self) -> bool {
        self.missing.is_empty() && self.corrupt.is_empty()
    }
}

/// What a GC did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GcReport {
    /// Manifests read.
    pub manifests: u64,
    /// Chunk objects listed.
    pub chunks_seen: u64,
    /// Chunk objects some manifest refers to.
    pub chunks_referenced: u64,
    /// Chunk objects no manifest refers to but younger than the grace period: kept.
    pub chunks_young: u64,
    /// Chunk objects deleted.
    pub chunks_deleted: u64,
    /// Their bytes.
    pub bytes_deleted: u64,
    /// Objects under `chunks/` that are not chunk objects: left alone.
    pub foreign_objects: u64,
}

impl Store {
    /// The backups in the store, of `disk` or of every disk, sorted by disk then id (oldest
    /// first). Each manifest is read (without a key: ids and sizes are not secret).
    pub fn list(&self, disk: Option<&str>) -> Result<Vec<BackupInfo>> {
        let prefix = match disk {
            Some(disk) => {
                check_name("disk", disk)?;
                format!("backups/{disk}/")
            }
            None => "backups/".to_string(),
        };
        let objects = self.block_on(store::list(self.objects(), self.retry(), &prefix))?;
        let mut found = BTreeMap::new();
        for meta in objects {
            if let Some(key) = parse_manifest_key(&meta.location) {
                found.insert(key, meta.size);
            }
        }
        let mut out = Vec::with_capacity(found.len());
        for ((disk, id), size) in found {
            let manifest = self.manifest(&disk, &id, None).map(Arc::new).map_err(|e| e.to_string());
            out.push(BackupInfo { disk, id, manifest_bytes: size, manifest });
        }
        Ok(out)
    }

    /// Loads and checks backup `id` of `disk`. With `key`, an encrypted backup's manifest is
    /// authenticated (and the key's name checked); without, its checksum only.
    pub fn manifest(&self, disk: &str, id: &str, key: Option<&BackupKey>) -> Result<Manifest> {
        check_name("disk", disk)?;
        check_backup_id(id)?;
        let object = manifest_key(disk, id);
        let bytes = self.block_on(store::get(self.objects(), self.retry(), &object))?;
        let manifest = Manifest::decode(&object, &bytes, key)?;
        if manifest.disk != disk || manifest.id != id {
            return Err(crate::error::corrupt(
                &object,
                format!("records backup {} of {}", manifest.id, manifest.disk),
            ));
        }
        Ok(manifest)
    }

    /// Checks that every chunk `manifest` refers to is in the store: `quick` asks with a HEAD
    /// only; otherwise each is fetched and decoded (an encrypted backup needs its key) and its
    /// content checked against its id. Store errors other than "not found" fail the verify.
    pub fn verify(&self, manifest: &Manifest, key: Option<&BackupKey>, quick: bool) -> Result<VerifyReport> {
        if !quick && manifest.key_id.is_some() && key.is_none() {
            return Err(invalid(
                "key",
                format!("{} is encrypted: a full verify needs its key", manifest.object_key()),
            ));
        }
        let mut first_use: BTreeMap<ChunkId, u64> = BTreeMap::new();
        for (index, id) in manifest.chunks.iter().enumerate() {
            if let Some(id) = id {
                first_use.entry(*id).or_insert(index as u64);
            }
        }
        let mut report = VerifyReport::default();
        let (objects, retry) = (self.objects().clone(), self.retry());
        let results: Vec<_> = self.block_on(
            futures::stream::iter(first_use.into_iter().map(|(id, index)| {
                let objects = objects.clone();
                async move {
                    let object = id.object_key();
                    let outcome = if quick {
                        store::head(&objects, retry, &object).await.map(|m| m.map(|_| Ok(())))
                    } else {
                        match store::get(&objects, retry, &object).await {
                            Ok(bytes) => Ok(Some(decode_chunk(&object, &bytes, &id, key).map(|_| ()))),
                            Err(BackupError::NotFound { .. }) => Ok(None),
                            Err(e) => Err(e),
                        }
                    };
                    (index, id, outcome)
                }
            }))
            .buffer_unordered(CATALOGUE_PARALLEL)
            .collect(),
        );
        for (index, id, outcome) in results {
            report.chunks_checked += 1;
            match outcome? {
                Some(Ok(())) => {}
                Some(Err(e)) => report.corrupt.push((index, id, e.to_string())),
                None => report.missing.push((index, id)),
            }
        }
        report.missing.sort();
        report.corrupt.sort();
        Ok(report)
    }

    /// Deletes backup `id` of `disk`: its manifest only. Its chunks stay until a [`Store::gc`]
    /// finds no other backup refers to them. An incremental backup does not need its parent:
    /// deleting a parent loses nothing of its children.
    pub fn delete(&self, disk: &str, id: &str) -> Result<()> {
        check_name("disk", disk)?;
        check_backup_id(id)?;
        let object = manifest_key(disk, id);
        if self.block_on(store::head(self.objects(), self.retry(), &object))?.is_none() {
            return Err(BackupError::NotFound { object });
        }
        self.block_on(store::delete(self.objects(), self.retry(), &object))?;
        log::info!("deleted backup {object} from {}", self.location());
        Ok(())
    }

    /// Collects garbage: deletes the chunk objects that no manifest refers to and that are
    /// older than `grace` (normally [`GC_GRACE`]). Refuses to run beside a backup on this store
    /// in this process (and a backup refuses to start during it), and refuses to run at all when
    /// a manifest cannot be read: its chunks would look unreferenced. Each chunk is asked again
    /// (HEAD) right before its delete, and kept if it was written since the listing.
    pub fn gc(&self, grace: Duration) -> Result<GcReport> {
        let _guard = self.begin_gc()?;
        let mut report = GcReport::default();
        let manifests = self.block_on(store::list(self.objects(), self.retry(), "backups/"))?;
        let mut referenced: HashSet<ChunkId> = HashSet::new();
        for meta in &manifests {
            // Only `backups/<disk>/<id>` can be a manifest of ours; anything else there is not
            // ours to read (nor a reason to stop).
            if parse_manifest_key(&meta.location).is_none() {
                continue;
            }
            let object = meta.location.to_string();
            let bytes = self.block_on(store::get(self.objects(), self.retry(), &object))?;
            let manifest = Manifest::decode(&object, &bytes, None).map_err(|e| {
                crate::error::corrupt(
                    &object,
                    format!(
                        "garbage collection refused, a manifest is unreadable ({e}): repair or delete it"
                    ),
                )
            })?;
            referenced.extend(manifest.chunks.iter().flatten());
            report.manifests += 1;
        }
        let chunks = self.block_on(store::list(self.objects(), self.retry(), "chunks/"))?;
        let now = chrono::Utc::now();
        let grace = chrono::Duration::from_std(grace).map_err(|_| invalid("grace", "too long"))?;
        let mut doomed = Vec::new();
        for meta in chunks {
            report.chunks_seen += 1;
            let parts: Vec<_> = meta.location.parts().collect();
            // Only objects named exactly as a chunk (`chunks/<2 hex>/<64 lower-case hex>`) are
            // ours to collect.
            let id = match parts.as_slice() {
                [_, fan, name] => ChunkId::from_hex(name.as_ref())
                    .filter(|id| id.to_hex() == name.as_ref() && id.to_hex()[..2] == *fan.as_ref()),
                _ => None,
            };
            let Some(id) = id else {
                report.foreign_objects += 1;
                continue;
            };
            if referenced.contains(&id) {
                report.chunks_referenced += 1;
            } else if now.signed_duration_since(meta.last_modified) < grace {
                report.chunks_young += 1;
            } else {
                doomed.push(id);
            }
        }
        let (objects, retry) = (self.objects().clone(), self.retry());
        let results: Vec<Result<Option<u64>>> = self.block_on(
            futures::stream::iter(doomed.into_iter().map(|id| {
                let objects = objects.clone();
                async move {
                    let object = id.object_key();
                    match store::head(&objects, retry, &object).await? {
                        Some(meta)
                            if chrono::Utc::now().signed_duration_since(meta.last_modified) >= grace =>
                        {
                            store::delete(&objects, retry, &object).await?;
                            Ok(Some(meta.size))
                        }
                        _ => Ok(None),
                    }
                }
            }))
            .buffer_unordered(CATALOGUE_PARALLEL)
            .collect(),
        );
        for result in results {
            match result? {
                Some(bytes) => {
                    report.chunks_deleted += 1;
                    report.bytes_deleted += bytes;
                }
                None => report.chunks_young += 1,
            }
        }
        log::info!(
            "gc of {}: {} manifests, {} chunks, {} deleted ({} bytes), {} young kept",
            self.location(),
            report.manifests,
            report.chunks_seen,
            report.chunks_deleted,
            report.bytes_deleted,
            report.chunks_young
        );
        Ok(report)
    }
}

/// The disk and id of a manifest's object key `backups/<disk>/<id>`, if it is one.
fn parse_manifest_key(location: &object_store::path::Path) -> Option<(String, String)> {
    let parts: Vec<_> = location.parts().collect();
    let [first, disk, id] = parts.as_slice() else { return None };
    let (disk, id) = (disk.as_ref().to_string(), id.as_ref().to_string());
    let ours =
        first.as_ref() == "backups" && check_name("disk", &disk).is_ok() && check_backup_id(&id).is_ok();
    ours.then_some((disk, id))
}
