//! Reading a backup's chunks back: a full restore, and the live-restore bdev.

use std::future::Future;
use std::sync::Arc;

use crate::chunk::decode_chunk;
use crate::error::{corrupt, invalid, key_error, Result};
use crate::key::BackupKey;
use crate::manifest::Manifest;
use crate::store::{self, Store};

/// Fetches and checks the chunks of one backup. Cheap to clone, `Send + Sync`: share it across
/// a thread pool. Every chunk returned was checked against its content address: a damaged or
/// substituted chunk is an error, never data.
#[derive(Clone, Debug)]
pub struct ChunkReader {
    store: Store,
    manifest: Arc<Manifest>,
    key: Option<Arc<BackupKey>>,
}

impl ChunkReader {
    /// A reader of `manifest`'s chunks; `key` must be the one the backup was made with (by
    /// name), or `None` for a backup that is not encrypted.
    pub fn new(store: &Store, manifest: Arc<Manifest>, key: Option<Arc<BackupKey>>) -> Result<ChunkReader> {
        let object = manifest.object_key();
        match (&manifest.key_id, key.as_deref()) {
            (None, None) => {}
            (Some(id), Some(k)) if id == k.name() => {}
            (Some(id), Some(k)) => {
                return Err(key_error(&object, format!("made with key {id}, not {}", k.name())))
            }
            (Some(id), None) => {
                return Err(key_error(&object, format!("encrypted with key {id}; no key given")))
            }
            (None, Some(_)) => return Err(key_error(&object, "not encrypted, but a key was given")),
        }
        Ok(ChunkReader { store: store.clone(), manifest, key })
    }

    /// The backup.
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// The number of chunks.
    pub fn chunk_count(&self) -> u64 {
        self.manifest.chunks.len() as u64
    }

    /// Fetches chunk `index` and returns its plaintext (the chunk's length: the last one may be
    /// short; a zero chunk is zeroes, no request). Blocks: for control threads.
    pub fn read(&self, index: u64) -> Result<Vec<u8>> {
        self.store.block_on(self.fetch(index))
    }

    /// Starts fetching chunk `index` on the store's runtime and calls `done` there with the
    /// result: for a caller that must not block (the live-restore bdev hands the result to
    /// its reactor). `done` should be quick (queue the result and wake the owner).
    pub fn read_async(&self, index: u64, done: impl FnOnce(Result<Vec<u8>>) + Send + 'static) {
        let fetch = self.fetch(index);
        self.store.runtime().spawn(async move { done(fetch.await) });
    }

    /// The future that fetches chunk `index` (for a caller with an async runtime of its own:
    /// it needs a tokio runtime with time and I/O enabled).
    pub fn fetch(&self, index: u64) -> impl Future<Output = Result<Vec<u8>>> + Send + 'static {
        let reader = self.clone();
        async move {
            let manifest = &reader.manifest;
            let Some(entry) = manifest.chunks.get(index as usize) else {
                return Err(invalid("index", format!("chunk {index} of {}", manifest.chunks.len())));
            };
            let len = manifest.chunk_len(index) as usize;
            let Some(id) = entry else {
                return Ok(vec![0u8; len]);
            };
            let object = id.object_key();
            let bytes = store::get(reader.store.objects(), reader.store.retry(), &object).await?;
            let key = reader.key.clone();
            let id = *id;
            // Decompression and the checks are CPU work: off the runtime's workers.
            let plain =
                tokio::task::spawn_blocking(move || decode_chunk(&object, &bytes, &id, key.as_deref()))
                    .await
                    .map_err(|e| corrupt(&id.object_key(), format!("decoding task failed: {e}")))??;
            if plain.len() != len {
                return Err(corrupt(
                    &id.object_key(),
                    format!(
                        "{} bytes where chunk {index} of {} has {len}",
                        plain.len(),
                        manifest.object_key()
                    ),
                ));
            }
            Ok(plain)
        }
    }
}
