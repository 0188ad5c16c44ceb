//! Fuzz the backup store's chunk object decoder (`fp_backup::decode_chunk_unchecked`): chunk
//! objects come back from an object store that anyone with its credentials can write.
//!
//! Input: one selector byte, then the object's bytes. Selector 0 decodes without a key; any
//! other value decodes with the backup key named `fuzz` whose material is 32 bytes of the
//! selector's value (the seeds' encrypted chunks use 0x42).
//!
//! Invariants: decoding never panics and never allocates more than the header's plaintext
//! length (at most 16 MiB); what decodes is 1 byte to 16 MiB, passes the content-address check
//! against its own id, and re-encodes (with the same key) to an object that decodes to the same
//! plaintext.
#![no_main]

use fp_backup::{decode_chunk, decode_chunk_unchecked, encode_chunk, BackupKey, ChunkId, MAX_CHUNK_SIZE};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&selector, object)) = data.split_first() else { return };
    let key = (selector != 0).then(|| BackupKey::new("fuzz", &[selector; 32]).expect("a valid key"));
    let Ok(plain) = decode_chunk_unchecked("fuzz", object, key.as_ref()) else { return };
    assert!(!plain.is_empty() && plain.len() as u64 <= MAX_CHUNK_SIZE);
    let id = ChunkId::of(&plain, key.as_ref());
    assert_eq!(decode_chunk("fuzz", object, &id, key.as_ref()).expect("decodes again"), plain);
    let again = encode_chunk(&plain, key.as_ref());
    assert_eq!(decode_chunk("fuzz", &again, &id, key.as_ref()).expect("re-encoded"), plain);
});
