//! Fuzz fp-luks's LUKS2 online re-encryption metadata (crates/luks/src/reencrypt.rs): a header
//! in re-encryption is whatever cryptsetup, a crash or a hostile image left, and it is read
//! whenever the volume is opened.
//!
//! Input layout: the whole input is the JSON area of a LUKS2 primary header (cut at 12,287
//! bytes, NUL-terminated). The harness writes it behind a valid binary header (magic, version
//! 2, a 16 KiB copy, sha256 checksum computed), so mutations reach the JSON and re-encryption
//! checks instead of stopping at the checksum, on a 2 MiB device.
//!
//! Invariants: loading never panics; a job that loads reloads the same from its own encoding;
//! a hotzone in flight has one checksum per block in its recovery info (or an I/O error past
//! the device's end); a job between steps takes its next hotzone (one checksum block at the
//! boundary) and the advance past it, each reloading to exactly that state.
#![no_main]

use fp_luks::{MemIo, MetaIo, Volume};
use libfuzzer_sys::fuzz_target;
use sha2::{Digest, Sha256};

const COPY: usize = 0x4000;
const DEVICE: usize = 2 << 20;

fn image(json: &[u8]) -> MemIo {
    let mut dev = vec![0u8; DEVICE];
    let copy = &mut dev[..COPY];
    copy[..6].copy_from_slice(b"LUKS\xba\xbe");
    copy[6..8].copy_from_slice(&2u16.to_be_bytes());
    copy[8..16].copy_from_slice(&(COPY as u64).to_be_bytes());
    copy[16..24].copy_from_slice(&1u64.to_be_bytes());
    copy[72..78].copy_from_slice(b"sha256");
    copy[168..204].copy_from_slice(b"6c9a04a5-2b3c-4f53-9b7a-5b8e8c1f2d10");
    let n = json.len().min(COPY - 4096 - 1);
    copy[4096..4096 + n].copy_from_slice(&json[..n]);
    let sum = Sha256::digest(&copy[..]);
    copy[448..480].copy_from_slice(&sum);
    MemIo(dev)
}

/// The job as reported after loading `io` again.
fn reload(io: &mut MemIo) -> Option<fp_luks::Reencryption> {
    Volume::load(io).expect("a header fp-luks wrote loads again").reencryption()
}

fuzz_target!(|data: &[u8]| {
    let mut io = image(data);
    let Ok(mut vol) = Volume::load(&mut io) else { return };
    let Some(job) = vol.reencryption() else { return };

    // The header as fp-luks encodes it reloads to the same job.
    let mut copy = MemIo(vec![0u8; DEVICE]);
    for (offset, bytes) in vol.encode_header().expect("a loaded header encodes") {
        copy.write_at(offset, &bytes).expect("inside the device");
    }
    assert_eq!(reload(&mut copy), Some(job.clone()));

    let block = u64::from(job.checksum_block);
    match vol.reencryption_recovery(&mut io) {
        Ok(Some((offset, len, sums))) => {
            assert_eq!(job.hotzone, Some((offset, len)));
            assert_eq!(sums.len() as u64, len / block);
        }
        Ok(None) => assert_eq!(job.hotzone, None),
        Err(e) => assert!(matches!(e.kind(), fp_luks::ErrorKind::Io), "{e}"),
    }

    if job.hotzone.is_some() || job.finished {
        return;
    }
    let end = vol.data_size(io.size());
    let len = block.min(end.saturating_sub(job.boundary));
    if vol.reencryption_hotzone(&mut io, job.boundary, len, &[[0u8; 32]]).is_err() {
        return;
    }
    let hot = reload(&mut io).expect("still in re-encryption");
    assert_eq!((hot.boundary, hot.hotzone), (job.boundary, Some((job.boundary, len))));
    vol.reencryption_advance(&mut io, job.boundary + len).expect("advance past the recorded hotzone");
    let next = reload(&mut io).expect("still in re-encryption");
    assert_eq!(next.hotzone, None);
    assert!(next.finished || next.boundary == job.boundary + len, "{next:?}");
});
