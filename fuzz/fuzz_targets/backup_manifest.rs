//! Fuzz the backup store's manifest decoder (`fp_backup::Manifest::decode`): manifests come back
//! from an object store that anyone with its credentials can write, and listing, GC and restore
//! read every one of them.
//!
//! Input: one selector byte, then the object's bytes. Selector 0 decodes without a key (as
//! listing and GC do); any other value decodes with the backup key named `fuzz` whose material
//! is 32 bytes of the selector's value (the seeds' authenticated manifest uses 0x42).
//!
//! Invariants: decoding never panics, and decompresses at most `MAX_MANIFEST_JSON` bytes; a
//! manifest that decodes passes its own consistency check (one id per chunk of its size, a
//! valid chunk size, names and ids), and encodes (with the same key) to an object that decodes
//! to an equal manifest.
#![no_main]

use fp_backup::{BackupKey, Manifest};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&selector, object)) = data.split_first() else { return };
    let key = (selector != 0).then(|| BackupKey::new("fuzz", &[selector; 32]).expect("a valid key"));
    let Ok(manifest) = Manifest::decode("fuzz", object, key.as_ref()) else { return };
    manifest.check("fuzz").expect("a decoded manifest checks");
    // Re-encode with the key it names: without a key for a plain manifest; a manifest decoded
    // without a key may still be authenticated (listing reads those), so re-key it by name.
    let rekey = manifest.key_id.as_deref().map(|name| BackupKey::new(name, &[selector.max(1); 32]).expect("key"));
    let bytes = manifest.encode(rekey.as_ref()).expect("encodes");
    assert_eq!(Manifest::decode("fuzz", &bytes, rekey.as_ref()).expect("decodes again"), manifest);
});
