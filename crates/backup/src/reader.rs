//! Reading a backup's chunks back: a full restore, and the live-restore bdev.

use std::future::Future;
use std::sync::Arc;

use bytes::Bytes;

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
    /// result: for a caller that must not block. `done` should be quick (queue the result and
    /// wake the owner).
    pub fn read_async(&self, index: u64, done: impl FnOnce(Result<Vec<u8>>) + Send + 'static) {
        let fetch = self.fetch(index);
        self.store.runtime().spawn(async move { done(fetch.await) });
    }

    /// Like [`ChunkReader::read_async`], but `done` gets the chunk as fetched, for the caller
    /// to check and decode with [`ChunkReader::decode`] on a thread of its own: the live
    /// restore's worker does, which spares each chunk two hops between the runtime's threads
    /// (to a blocking thread and back) on the way to a guest's waiting read.
    pub fn read_raw_async(&self, index: u64, done: impl FnOnce(Result<RawChunk>) + Send + 'static) {
        let fetch = self.fetch_raw(index);
        self.store.runtime().spawn(async move { done(fetch.await) });
    }

    /// The future that fetches chunk `index` (for a caller with an async runtime of its own:
    /// it needs a tokio runtime with time and I/O enabled).
    pub fn fetch(&self, index: u64) -> impl Future<Output = Result<Vec<u8>>> + Send + 'static {
        let reader = self.clone();
        let raw = self.fetch_raw(index);
        async move {
            let raw = raw.await?;
            if raw.bytes.is_none() {
                return reader.decode(raw);
            }
            // Decompression and the checks are CPU work: off the runtime's workers. The blocking
            // task holds no handle of the store: the last one must end on a runtime worker
            // (dropping it ends the runtime), which is where `reader` goes out of scope.
            let (manifest, key) = (reader.manifest.clone(), reader.key.clone());
            tokio::task::spawn_blocking(move || decode(&manifest, key.as_deref(), raw))
                .await
                .map_err(|e| corrupt("chunk", format!("decoding task failed: {e}")))?
        }
    }

    fn fetch_raw(&self, index: u64) -> impl Future<Output = Result<RawChunk>> + Send + 'static {
        let reader = self.clone();
        async move {
            let manifest = &reader.manifest;
            let Some(entry) = manifest.chunks.get(index as usize) else {
                return Err(invalid("index", format!("chunk {index} of {}", manifest.chunks.len())));
            };
            let Some(id) = entry else {
                return Ok(RawChunk { index, bytes: None });
            };
            let bytes = store::get(reader.store.objects(), reader.store.retry(), &id.object_key()).await?;
            Ok(RawChunk { index, bytes: Some(bytes) })
        }
    }

    /// Checks chunk `raw` against its content address and decodes it: its plaintext, of the
    /// chunk's length (a zero chunk is zeroes). CPU work (a hash, decompression, decryption).
    pub fn decode(&self, raw: RawChunk) -> Result<Vec<u8>> {
        decode(&self.manifest, self.key.as_deref(), raw)
    }
}

fn decode(manifest: &Manifest, key: Option<&BackupKey>, raw: RawChunk) -> Result<Vec<u8>> {
    let index = raw.index;
    let len = manifest.chunk_len(index) as usize;
    let (Some(bytes), Some(Some(id))) = (raw.bytes, manifest.chunks.get(index as usize)) else {
        return Ok(vec![0u8; len]);
    };
    let object = id.object_key();
    let plain = decode_chunk(&object, &bytes, id, key)?;
    if plain.len() != len {
        return Err(corrupt(
            &object,
            format!("{} bytes where chunk {index} of {} has {len}", plain.len(), manifest.object_key()),
        ));
    }
    Ok(plain)
}

/// A chunk as [`ChunkReader::read_raw_async`] fetched it: not checked or decoded yet.
#[derive(Debug)]
pub struct RawChunk {
    index: u64,
    /// The object's bytes; `None` for a zero chunk (nothing fetched).
    bytes: Option<Bytes>,
}

impl RawChunk {
    /// Which chunk of the backup it is.
    pub fn index(&self) -> u64 {
        self.index
    }
}
