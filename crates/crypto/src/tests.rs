//! The crypto bdev against Python's `cryptography` (an independent AES-XTS), both ways, and the
//! key rules.

use std::os::unix::fs::PermissionsExt;
use std::process::Command;
use std::sync::Arc;

use super::*;
use crate::keyring::Keyring;
use crate::*;
use fp_bdev::conformance::{read_range, write_range};
use fp_bdev::RamDevice;

const K1: &str = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";
const K2: &str = "ffeeddccbbaa99887766554433221100f0e1d2c3b4a5968778695a4b3c2d1e0f";

/// The independent AES-XTS (Python's `cryptography`), shared with the other crypto tests.
const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/xts_plain64.py");

/// Encrypts (`enc`) or decrypts (`dec`) `input` as dm-crypt's aes-xts-plain64 with units of
/// `unit` bytes starting at 512-byte sector `first`, in Python.
fn python_xts(mode: &str, key: &str, key2: &str, unit: usize, first: u64, input: &[u8]) -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let (inp, out) = (dir.path().join("in"), dir.path().join("out"));
    std::fs::write(&inp, input).unwrap();
    let status = Command::new("python3")
        .arg(SCRIPT)
        .args([mode, &format!("{key}{key2}"), &unit.to_string(), &first.to_string()])
        .arg(&inp)
        .arg(&out)
        .status()
        .expect("python3 (with the cryptography package) runs");
    assert!(status.success(), "python3 failed");
    std::fs::read(&out).unwrap()
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 9) as u8).collect()
}

#[test]
fn ciphertext_matches_an_independent_aes_xts_both_ways() {
    for (bs, k1, k2) in
        [(512u32, &K1[..32], &K2[..32]), (512, K1, K2), (4096, &K1[..32], &K2[..32]), (4096, K1, K2)]
    {
        let base: Bdev = Arc::new(RamDevice::new("ram", bs, 64).unwrap());
        let key = Arc::new(CryptoKey::from_hex("k", k1, k2).unwrap());
        let dev = CryptoDevice::new("c", base.clone(), key).unwrap();
        let mut ch = dev.open_channel().unwrap();
        let mut below = base.open_channel().unwrap();
        let bsz = bs as usize;
        // flashpath writes blocks 3..11; Python decrypts what the base holds.
        let plain = pattern(8 * bsz, bs as u8);
        write_range(&mut *ch, 3 * bsz as u64, &plain);
        let stored = read_range(&mut *below, 3 * bsz as u64, plain.len());
        assert_ne!(stored, plain, "{bs}: the base holds plaintext");
        let first = 3 * u64::from(bs) / 512;
        assert_eq!(
            python_xts("dec", k1, k2, bsz, first, &stored),
            plain,
            "{bs}-byte blocks, decrypted by Python"
        );
        // Python encrypts blocks 20..24; flashpath reads them back.
        let plain2 = pattern(4 * bsz, 77);
        let first = 20 * u64::from(bs) / 512;
        let cipher = python_xts("enc", k1, k2, bsz, first, &plain2);
        write_range(&mut *below, 20 * bsz as u64, &cipher);
        assert_eq!(
            read_range(&mut *ch, 20 * bsz as u64, plain2.len()),
            plain2,
            "{bs}: Python's ciphertext read"
        );
    }
}

#[test]
fn writes_leave_the_callers_buffer_and_split_blocks_decrypt() {
    let base: Bdev = Arc::new(RamDevice::new("ram", 4096, 2048).unwrap());
    let key = Arc::new(CryptoKey::from_hex("k", K1, K2).unwrap());
    let dev = CryptoDevice::new("c", base, key).unwrap();
    let mut ch = dev.open_channel().unwrap();
    // A write longer than the whole buffer pool goes down in pieces; the source is unchanged.
    let data = pattern(CHUNK * CHUNKS + 3 * 4096, 5);
    let copy = data.clone();
    write_range(&mut *ch, 0, &data);
    assert_eq!(data, copy);
    // Read through iovecs that cut blocks at odd bytes.
    let len = 3 * 4096;
    let mut buf = vec![0u8; len];
    let cuts = [0, 100, 4097, 9000, len];
    let iov: Vec<libc::iovec> = cuts
        .windows(2)
        // SAFETY: every cut is inside `buf`.
        .map(|w| libc::iovec { iov_base: unsafe { buf.as_mut_ptr().add(w[0]) }.cast(), iov_len: w[1] - w[0] })
        .collect();
    // SAFETY: the test keeps the buffers and their iovecs until the request completes.
    let req = unsafe { fp_bdev::conformance::rw(0, IoOp::Read, 4096, &iov) };
    assert_eq!(fp_bdev::conformance::run(&mut *ch, req), IoStatus::Success);
    assert_eq!(buf, data[4096..4096 + len]);
}

#[test]
fn writes_through_iovecs_that_split_blocks_store_what_whole_ones_do() {
    let base: Bdev = Arc::new(RamDevice::new("ram", 512, 64).unwrap());
    let key = Arc::new(CryptoKey::from_hex("k", K1, K2).unwrap());
    let dev = CryptoDevice::new("c", base.clone(), key.clone()).unwrap();
    let mut ch = dev.open_channel().unwrap();
    let mut below = base.open_channel().unwrap();
    let len = 4 * 512;
    let mut data = pattern(len, 9);
    // What blocks 8..12 hold: each encrypted whole with its sector's tweak.
    let mut expected = data.clone();
    let mut xts = XtsEngine::rust(key);
    for (k, unit) in expected.chunks_exact_mut(512).enumerate() {
        xts.encrypt(unit, 8 + k as u64);
    }
    // The same bytes to blocks 8..12, cut at odd bytes (blocks in one iovec and across two).
    let cuts = [0, 700, 701, 1536, 1800, len];
    let p = data.as_mut_ptr();
    let iov: Vec<libc::iovec> = cuts
        .windows(2)
        .map(|w| libc::iovec { iov_base: p.wrapping_add(w[0]).cast(), iov_len: w[1] - w[0] })
        .collect();
    // SAFETY: the test keeps the buffers and their iovecs until the request completes.
    let req = unsafe { fp_bdev::conformance::rw(0, IoOp::Write, 8 * 512, &iov) };
    assert_eq!(fp_bdev::conformance::run(&mut *ch, req), IoStatus::Success);
    assert_eq!(read_range(&mut *below, 8 * 512, len), expected);
    assert_eq!(read_range(&mut *ch, 8 * 512, len), data);
}

#[test]
fn key_sizes_and_equal_halves_are_refused_naming_the_field() {
    let field = |r: Result<CryptoKey, BdevError>| match r {
        Err(BdevError::InvalidParam { field, reason }) => {
            assert!(!reason.contains(&K1[..8]) && !reason.contains(&K2[..8]), "key material in '{reason}'");
            field
        }
        other => panic!("{other:?}"),
    };
    assert_eq!(field(CryptoKey::from_hex("k", &K1[..30], &K2[..30])), "key");
    assert_eq!(field(CryptoKey::from_hex("k", &K1[..48], &K2[..48])), "key");
    assert_eq!(field(CryptoKey::from_hex("k", K1, &K2[..32])), "key2");
    assert_eq!(field(CryptoKey::from_hex("k", K1, K1)), "key2");
    assert_eq!(field(CryptoKey::from_hex("k", "zz112233445566778899aabbccddeeff", &K2[..32])), "key");
    assert_eq!(field(CryptoKey::from_hex("k", &K1[..31], &K2[..32])), "key");
    let k = CryptoKey::from_hex("k", K1, K2).unwrap();
    assert_eq!(k.bits(), 512);
    let shown = format!("{k:?}");
    assert!(!shown.contains("0011") && shown.contains("512"), "{shown}");
}

#[test]
fn a_key_in_use_is_not_destroyed() {
    let store = AccelKeys::default();
    store.add_accel(CryptoKey::from_hex("k", K1, K2).unwrap()).unwrap();
    assert!(store.add_accel(CryptoKey::from_hex("k", K1, K2).unwrap()).is_err());
    let base: Bdev = Arc::new(RamDevice::new("ram", 512, 64).unwrap());
    let dev = CryptoDevice::new("c", base, store.accel_key("k").unwrap()).unwrap();
    store.note_user("c", "k");
    store.note_user("gone", "k");
    let e = store.destroy_accel("k", &|b| b == "c").unwrap_err();
    assert!(e.to_string().contains("key_name") && e.to_string().contains("in use by 'c'"), "{e}");
    drop(dev);
    store.destroy_accel("k", &|_| false).unwrap();
    assert!(store.accel_key("k").unwrap_err().to_string().contains("key_name"));
}

#[test]
fn key_files_must_be_owner_only_regular_files() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("key");
    std::fs::write(&path, b"NVMeTLSkey-1:01:secret:").unwrap();
    let p = path.to_str().unwrap();
    for mode in [0o644, 0o640, 0o604] {
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        let e = FileKey::read(p).err().unwrap();
        assert!(e.to_string().contains("path") && e.to_string().contains("owner-only"), "{e}");
    }
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    let key = FileKey::read(p).unwrap();
    assert_eq!(key.len(), 23);
    let e = FileKey::read(dir.path().to_str().unwrap()).err().unwrap();
    assert!(e.to_string().contains("not a regular file"), "{e}");
    let link = dir.path().join("link");
    std::os::unix::fs::symlink(&path, &link).unwrap();
    assert!(FileKey::read(link.to_str().unwrap()).err().unwrap().to_string().contains("path"));
    assert!(FileKey::read("relative/key").err().unwrap().to_string().contains("absolute"));
    let store = Keyring::default();
    store.add_file_key("tls", key).unwrap();
    assert!(store.remove_file_key("tls").is_ok());
    assert!(store.remove_file_key("tls").unwrap_err().to_string().contains("name"));
}

/// A key file is not read through a symlink anywhere in its path (a linked directory
/// included), nor past the size limit, whatever the file's size says.
#[test]
fn key_files_are_not_read_through_a_symlinked_directory_nor_without_a_bound() {
    let dir = tempfile::tempdir().unwrap();
    let real = dir.path().join("real");
    std::fs::create_dir(&real).unwrap();
    let path = real.join("key");
    std::fs::write(&path, b"0123456789abcdef").unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    assert_eq!(FileKey::read(path.to_str().unwrap()).unwrap().len(), 16);
    let linked = dir.path().join("linked");
    std::os::unix::fs::symlink(&real, &linked).unwrap();
    let through = linked.join("key");
    let e = FileKey::read(through.to_str().unwrap()).err().unwrap().to_string();
    assert!(e.contains("parameter path: ") && e.contains("symbolic link") && e.contains("linked"), "{e}");
    // `..` is resolved component by component too: it cannot reach back through the link.
    let dotdot = real.join("..").join("linked").join("key");
    let e = FileKey::read(dotdot.to_str().unwrap()).err().unwrap().to_string();
    assert!(e.contains("symbolic link"), "{e}");
    // A huge (sparse) file is refused, naming the limit; so is a source that never ends.
    let huge = real.join("huge");
    let f = std::fs::File::create(&huge).unwrap();
    f.set_len(1 << 30).unwrap();
    std::fs::set_permissions(&huge, std::fs::Permissions::from_mode(0o600)).unwrap();
    let e = FileKey::read(huge.to_str().unwrap()).err().unwrap().to_string();
    assert!(e.contains("parameter path: ") && e.contains("4096"), "{e}");
    let e = crate::keyring::read_key_material(&mut std::io::repeat(7), "/endless").err().unwrap().to_string();
    assert!(e.contains("parameter path: ") && e.contains("more than 4096"), "{e}");
}

#[test]
fn block_sizes_above_4096_are_refused() {
    let base: Bdev = Arc::new(RamDevice::new("ram", 8192, 64).unwrap());
    let key = Arc::new(CryptoKey::from_hex("k", K1, K2).unwrap());
    let e = CryptoDevice::new("c", base, key).err().unwrap();
    assert!(e.to_string().contains("base_bdev_name") && e.to_string().contains("8192"), "{e}");
}

#[test]
fn a_full_channel_says_busy_and_takes_more_once_writes_complete() {
    use fp_bdev::{DelayDevice, DelayLatency};
    use std::time::Duration;
    // A base that holds every request 20 ms, so nothing completes while we fill the channel.
    let d = Duration::from_millis(20);
    let latency = DelayLatency { avg_read: d, p99_read: d, avg_write: d, p99_write: d };
    let ram: Bdev = Arc::new(RamDevice::new("ram", 512, 1024).unwrap());
    let base: Bdev = Arc::new(DelayDevice::new("slow", ram, latency).unwrap());
    let key = Arc::new(CryptoKey::from_hex("k", K1, K2).unwrap());
    let dev = CryptoDevice::new("c", base, key).unwrap();
    let mut ch = dev.open_channel().unwrap();
    let mut buf = vec![9u8; 512];
    let iov = [libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: 512 }];
    let mut taken = 0u32;
    loop {
        // SAFETY: the test keeps the buffers and their iovecs until the request completes.
        let req =
            unsafe { fp_bdev::conformance::rw(taken, IoOp::Write, u64::from(taken % 1024) * 512, &iov) };
        match ch.submit(&req) {
            Ok(()) => taken += 1,
            Err(SubmitError::Busy) => break,
            Err(e) => panic!("{e}"),
        }
        assert!(taken <= 4096, "never Busy");
    }
    assert_eq!(taken as usize, WRITES, "writes accepted before Busy");
    assert_eq!(ch.in_flight(), WRITES);
    let done = fp_bdev::conformance::poll_until(&mut *ch, WRITES);
    assert!(done.iter().all(|&(_, s)| s == IoStatus::Success));
    assert_eq!(ch.in_flight(), 0);
    // The source buffer was never encrypted in place.
    assert_eq!(buf, vec![9u8; 512]);
    assert_eq!(read_range(&mut *ch, 0, 512), vec![9u8; 512]);
}

#[test]
fn a_grown_base_grows_the_crypto_bdev_and_keeps_its_blocks() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("disk.img");
    std::fs::File::create(&path).unwrap().set_len(64 * 512).unwrap();
    let base: Bdev = Arc::new(fp_bdev::UringDevice::new("u", &path, None, false).unwrap());
    let key = Arc::new(CryptoKey::from_hex("k", K1, K2).unwrap());
    let dev = CryptoDevice::new("c", base.clone(), key).unwrap();
    let mut ch = dev.open_channel().unwrap();
    let data = pattern(4 * 512, 3);
    write_range(&mut *ch, 60 * 512, &data);
    std::fs::File::options().write(true).open(&path).unwrap().set_len(128 * 512).unwrap();
    base.resize(128).unwrap();
    assert_eq!(dev.info().num_blocks(), 128);
    // The tweak is the absolute sector: old blocks read back, new ones are writable.
    assert_eq!(read_range(&mut *ch, 60 * 512, data.len()), data);
    write_range(&mut *ch, 120 * 512, &data);
    assert_eq!(read_range(&mut *ch, 120 * 512, data.len()), data);
}

/// The batched XTS against the `xts-mode` crate (one block per call, no shared code) for both
/// key sizes, units of 16 bytes to 4 KiB (odd batch remainders included), in place, out of
/// place and back, with tweaks whose α-multiplication carries out of the top bit.
#[test]
fn batched_xts_matches_the_xts_mode_crate() {
    use aes::cipher::KeyInit;
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(27);
    for half in [16usize, 32] {
        for _ in 0..40 {
            let k1: Vec<u8> = (0..half).map(|_| rng.gen()).collect();
            let k2: Vec<u8> = (0..half).map(|_| rng.gen()).collect();
            let key = CryptoKey::new("x", &k1, &k2).unwrap();
            let len = 16 * rng.gen_range(1..=256usize);
            let sector: u64 = if rng.gen_bool(0.2) { u64::MAX - rng.gen_range(0..4u64) } else { rng.gen() };
            let plain: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
            let mut want = plain.clone();
            let tweak = u128::from(sector).to_le_bytes();
            if half == 16 {
                let x = xts_mode::Xts128::new(
                    aes::Aes128::new_from_slice(&k1).unwrap(),
                    aes::Aes128::new_from_slice(&k2).unwrap(),
                );
                x.encrypt_sector(&mut want, tweak);
            } else {
                let x = xts_mode::Xts128::new(
                    aes::Aes256::new_from_slice(&k1).unwrap(),
                    aes::Aes256::new_from_slice(&k2).unwrap(),
                );
                x.encrypt_sector(&mut want, tweak);
            }
            let mut in_place = plain.clone();
            key.encrypt(&mut in_place, sector);
            assert_eq!(in_place, want, "in place, {half}-byte halves, {len} bytes, sector {sector}");
            let mut out = vec![0u8; len];
            key.encrypt_to(&plain, &mut out, sector);
            assert_eq!(out, want, "out of place, {half}-byte halves, {len} bytes");
            key.decrypt(&mut out, sector);
            assert_eq!(out, plain, "decrypted, {half}-byte halves, {len} bytes");
            // OpenSSL's, as the channels run it.
            let mut evp = XtsEngine::new(Arc::new(key));
            assert_eq!(evp.name(), "openssl");
            let mut got = vec![0u8; len];
            evp.encrypt_to(&plain, &mut got, sector);
            assert_eq!(got, want, "OpenSSL out of place, {half}-byte halves, {len} bytes");
            evp.decrypt(&mut got, sector);
            assert_eq!(got, plain, "OpenSSL decrypted, {half}-byte halves, {len} bytes");
            got.copy_from_slice(&plain);
            evp.encrypt(&mut got, sector);
            assert_eq!(got, want, "OpenSSL in place, {half}-byte halves, {len} bytes");
        }
    }
}

/// The engine a channel picks is OpenSSL's on a host with libcrypto (every Debian host: the
/// test suite's Python `cryptography` needs it too), so the benchmark measures that one.
#[test]
fn channels_use_openssl_where_libcrypto_is_installed() {
    assert!(openssl_available(), "libcrypto.so.3 (Debian package libssl3) did not load");
    let key = Arc::new(CryptoKey::from_hex("k", K1, K2).unwrap());
    assert_eq!(XtsEngine::new(key.clone()).name(), "openssl");
    assert_eq!(XtsEngine::rust(key).name(), "rust");
}

/// Sleeps until `fd` is readable, at most 5 s; whether it was.
fn sleep_on(fd: std::os::fd::RawFd) -> bool {
    let mut p = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
    // SAFETY: one valid pollfd.
    unsafe { libc::poll(&mut p, 1, 5000) == 1 }
}

/// Polls `ch` until `tag` completes, sleeping on `fd` whenever the channel says it may; whether
/// it slept (a request that completes during the first poll never does).
fn complete_sleeping(ch: &mut Box<dyn IoChannel>, fd: std::os::fd::RawFd, tag: u32) -> bool {
    let mut done = Vec::new();
    let mut slept = false;
    loop {
        ch.poll(&mut |t, s| done.push((t, s)));
        if !done.is_empty() {
            assert_eq!(done, [(tag, IoStatus::Success)]);
            return slept;
        }
        if ch.arm_completion_fd() {
            slept = true;
            assert!(sleep_on(fd), "request {tag} completed without signalling the fd");
        }
    }
}

/// Stacked on a device whose completions signal an fd (io_uring with O_DIRECT, so requests
/// take a trip through the block layer), the crypto channel offers that fd: a caller arms it,
/// sleeps on it with a write or a read in flight, wakes when the base completes it, and the
/// read comes back decrypted. With a completion held in its own list (a discard), arming says
/// "poll first".
#[test]
fn a_caller_may_sleep_on_the_bases_completion_fd() {
    // Not /tmp, which may be a tmpfs without O_DIRECT.
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let path = dir.path().join("f");
    std::fs::File::create(&path).unwrap().set_len(1 << 20).unwrap();
    let base: Bdev = Arc::new(fp_bdev::UringDevice::new("u", &path, Some(4096), true).unwrap());
    let key = Arc::new(CryptoKey::from_hex("k", K1, K2).unwrap());
    let dev = CryptoDevice::new("c", base, key).unwrap();
    let mut ch = dev.open_channel().unwrap();
    let fd = ch.completion_fd().expect("io_uring's eventfd, passed up");
    assert!(!ch.sleeps_in_flight(), "io_uring's own choice: poll while in flight");

    let mut buf = fp_bdev::AlignedBuf::zeroed(8192);
    let mut slept = 0;
    for round in 0..16u8 {
        let data = pattern(8192, round);
        let offset = u64::from(round) * 8192;
        // SAFETY: our buffer of 8192 bytes.
        let bytes = unsafe { std::slice::from_raw_parts_mut(buf.as_mut_ptr(), 8192) };
        bytes.copy_from_slice(&data);
        let iov = [libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: 8192 }];
        // SAFETY: the test keeps the buffers and their iovecs until the request completes.
        let write = IoRequest {
            tag: 1,
            op: IoOp::Write,
            offset,
            len: 8192,
            // SAFETY: the test keeps the buffers and their iovecs until the request completes.
            iov: unsafe { Iovecs::from_raw(iov.as_ptr(), 1) },
        };
        ch.submit(&write).unwrap();
        slept += usize::from(complete_sleeping(&mut ch, fd, 1));
        // SAFETY: as above.
        let bytes = unsafe { std::slice::from_raw_parts_mut(buf.as_mut_ptr(), 8192) };
        assert_eq!(&bytes[..], &data[..], "the caller's buffer is never changed");
        bytes.fill(0);
        // SAFETY: the test keeps the buffers and their iovecs until the request completes.
        let read = IoRequest {
            tag: 2,
            op: IoOp::Read,
            offset,
            len: 8192,
            // SAFETY: the test keeps the buffers and their iovecs until the request completes.
            iov: unsafe { Iovecs::from_raw(iov.as_ptr(), 1) },
        };
        ch.submit(&read).unwrap();
        slept += usize::from(complete_sleeping(&mut ch, fd, 2));
        // SAFETY: as above.
        let bytes = unsafe { std::slice::from_raw_parts(buf.as_mut_ptr(), 8192) };
        assert_eq!(bytes, &data[..], "decrypted in place");
    }
    assert!(slept > 0, "no request was still in flight after a poll: nothing slept");

    // A discard completes from the channel's own list: not a time to sleep.
    let discard = IoRequest { tag: 3, op: IoOp::Discard, offset: 0, len: 4096, iov: Iovecs::NONE };
    ch.submit(&discard).unwrap();
    assert!(!ch.arm_completion_fd(), "a ready completion must be polled, not slept on");
    let mut done = Vec::new();
    ch.poll(&mut |t, s| done.push((t, s)));
    assert_eq!(done, [(3, IoStatus::Success)]);
}

/// A RAM disk that lets its caller sleep with requests in flight (as RBD does) and refuses
/// submissions as busy while `busy` is set (as the error bdev's `nomem` does).
struct SleepyBase {
    inner: RamDevice,
    busy: Arc<std::sync::atomic::AtomicBool>,
}

struct SleepyChannel {
    inner: Box<dyn IoChannel>,
    busy: Arc<std::sync::atomic::AtomicBool>,
}

impl BlockDevice for SleepyBase {
    fn info(&self) -> &BdevInfo {
        self.inner.info()
    }
    fn open_channel(&self) -> Result<Box<dyn IoChannel>, BdevError> {
        Ok(Box::new(SleepyChannel { inner: self.inner.open_channel()?, busy: self.busy.clone() }))
    }
}

impl IoChannel for SleepyChannel {
    fn submit(&mut self, req: &IoRequest) -> Result<(), SubmitError> {
        if self.busy.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(SubmitError::Busy);
        }
        self.inner.submit(req)
    }
    fn poll(&mut self, done: &mut dyn FnMut(u32, IoStatus)) -> usize {
        self.inner.poll(done)
    }
    fn in_flight(&self) -> usize {
        self.inner.in_flight()
    }
    fn sleeps_in_flight(&self) -> bool {
        true
    }
}

/// A write whose pieces the base refused as busy waits in the crypto channel, with nothing at
/// the base to signal a completion: its caller must keep polling, not sleep on the fd.
#[test]
fn a_write_the_base_refused_as_busy_keeps_its_caller_polling() {
    let busy = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let base: Bdev =
        Arc::new(SleepyBase { inner: RamDevice::new("ram", 512, 1024).unwrap(), busy: busy.clone() });
    let key = Arc::new(CryptoKey::from_hex("k", K1, K2).unwrap());
    let dev = CryptoDevice::new("c", base, key).unwrap();
    let mut ch = dev.open_channel().unwrap();
    assert!(ch.sleeps_in_flight(), "as its base, while nothing waits");
    let mut buf = vec![7u8; 4096];
    let iov = [libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: 4096 }];
    // SAFETY: the test keeps the buffers and their iovecs until the request completes.
    let req = unsafe { fp_bdev::conformance::rw(3, IoOp::Write, 8192, &iov) };
    ch.submit(&req).expect("the write is taken and waits for the base");
    assert_eq!(ch.poll(&mut |_, _| panic!("nothing reached the base")), 0);
    assert_eq!(ch.in_flight(), 1);
    assert!(
        !(ch.sleeps_in_flight() && ch.arm_completion_fd()),
        "the caller may sleep with a write that only a poll hands to the base"
    );
    busy.store(false, std::sync::atomic::Ordering::Relaxed);
    let done = fp_bdev::conformance::poll_until(&mut *ch, 1);
    assert_eq!(done, [(3, IoStatus::Success)]);
    assert!(ch.sleeps_in_flight());
    assert_eq!(read_range(&mut *ch, 8192, 4096), vec![7u8; 4096]);
}

/// The reference AES-XTS (the `xts-mode` crate, no code shared with the engines): `plain`
/// encrypted in units of `unit` bytes, the first unit's tweak being 512-byte sector `first`.
fn reference_xts(k1: &str, k2: &str, unit: usize, first: u64, plain: &[u8]) -> Vec<u8> {
    use aes::cipher::KeyInit;
    let (k1, k2) = (decode_hex("key", k1).unwrap(), decode_hex("key2", k2).unwrap());
    let x = xts_mode::Xts128::new(
        aes::Aes256::new_from_slice(&k1).unwrap(),
        aes::Aes256::new_from_slice(&k2).unwrap(),
    );
    let mut out = plain.to_vec();
    for (k, u) in out.chunks_exact_mut(unit).enumerate() {
        x.encrypt_sector(u, u128::from(first + (k * unit / 512) as u64).to_le_bytes());
    }
    out
}

/// A LUKS-style layout: data after an offset, sectors of 512 or 4096 bytes over 512-byte
/// bases (and 4096 over 4096). What the base holds at the offset is the reference XTS with the
/// tweak counted from the offset; the size is what follows the offset in whole sectors.
#[test]
fn a_data_offset_and_larger_sectors_store_the_reference_xts_after_the_offset() {
    for (base_bs, sector, offset) in
        [(512u32, 512u32, 16384u64), (512, 4096, 16384), (4096, 4096, 8192), (512, 4096, 0)]
    {
        // 256 KiB plus a tail shorter than a sector, which the crypto bdev must not count.
        let base: Bdev =
            Arc::new(RamDevice::new("ram", base_bs, (256 << 10) / u64::from(base_bs) + 1).unwrap());
        let key = Arc::new(CryptoKey::from_hex("k", K1, K2).unwrap());
        let layout = CryptoLayout { data_offset: offset, sector_size: sector };
        let dev = CryptoDevice::with_layout("c", base.clone(), key, layout).unwrap();
        assert_eq!(dev.layout(), layout);
        let what = format!("{base_bs}-byte base, {sector}-byte sectors at {offset}");
        assert_eq!(dev.info().block_size, sector, "{what}");
        let base_bytes = base.info().size_bytes();
        assert_eq!(dev.info().num_blocks(), (base_bytes - offset) / u64::from(sector), "{what}");
        let mut ch = dev.open_channel().unwrap();
        let mut below = base.open_channel().unwrap();
        // Sectors 2..6 of the crypto bdev.
        let s = u64::from(sector);
        let plain = pattern(4 * sector as usize, 5);
        write_range(&mut *ch, 2 * s, &plain);
        let stored = read_range(&mut *below, offset + 2 * s, plain.len());
        assert_eq!(stored, reference_xts(K1, K2, sector as usize, 2 * s / 512, &plain), "{what}");
        // The reference's ciphertext placed on the base reads back through the bdev, the last
        // sector included.
        let last = (dev.info().num_blocks() - 1) * s;
        let plain2 = pattern(sector as usize, 9);
        write_range(&mut *below, offset + last, &reference_xts(K1, K2, sector as usize, last / 512, &plain2));
        assert_eq!(read_range(&mut *ch, last, plain2.len()), plain2, "{what}");
        // Nothing before the offset was touched.
        if offset > 0 {
            assert!(read_range(&mut *below, 0, offset as usize).iter().all(|&b| b == 0), "{what}");
        }
        // Out of range: past the last whole sector, and requests not sector aligned.
        let buf = vec![0u8; base_bs as usize];
        let iov = [libc::iovec { iov_base: buf.as_ptr() as *mut _, iov_len: buf.len() }];
        // SAFETY: the buffer outlives the request, which is refused at submit.
        let req = unsafe { fp_bdev::conformance::rw(1, IoOp::Read, last + s, &iov) };
        assert_eq!(ch.submit(&req).err(), Some(SubmitError::OutOfRange), "{what}");
        if sector > base_bs {
            // SAFETY: as above.
            let req = unsafe { fp_bdev::conformance::rw(1, IoOp::Read, u64::from(base_bs), &iov) };
            assert_eq!(ch.submit(&req).err(), Some(SubmitError::OutOfRange), "{what}: part of a sector");
        }
    }
}

#[test]
fn a_layout_follows_a_resized_base_in_whole_sectors() {
    let base: Bdev = Arc::new(RamDevice::with_reserve("ram", 512, 64, 1 << 20).unwrap());
    let key = Arc::new(CryptoKey::from_hex("k", K1, K2).unwrap());
    let layout = CryptoLayout { data_offset: 8192, sector_size: 4096 };
    let dev = CryptoDevice::with_layout("c", base.clone(), key, layout).unwrap();
    // 32 KiB - 8 KiB = 6 sectors.
    assert_eq!(dev.info().num_blocks(), 6);
    let mut ch = dev.open_channel().unwrap();
    let data = pattern(4096, 1);
    write_range(&mut *ch, 5 * 4096, &data);
    // 64 + 15 base blocks: 7.5 sectors after the offset, rounded down to 7.
    base.resize(64 + 15).unwrap();
    assert_eq!(dev.info().num_blocks(), 7);
    assert_eq!(read_range(&mut *ch, 5 * 4096, 4096), data, "old sectors keep their data");
    write_range(&mut *ch, 6 * 4096, &data);
    assert_eq!(read_range(&mut *ch, 6 * 4096, 4096), data, "the new sector takes data");
}

#[test]
fn layouts_that_do_not_fit_the_base_are_refused_naming_the_field() {
    let key = Arc::new(CryptoKey::from_hex("k", K1, K2).unwrap());
    let ram512: Bdev = Arc::new(RamDevice::new("ram", 512, 64).unwrap());
    let ram4k: Bdev = Arc::new(RamDevice::new("ram4k", 4096, 64).unwrap());
    let refused = |base: &Bdev, data_offset: u64, sector_size: u32| {
        let layout = CryptoLayout { data_offset, sector_size };
        CryptoDevice::with_layout("c", base.clone(), key.clone(), layout).err().expect("refused").to_string()
    };
    for bad in [256, 1536, 8192] {
        let e = refused(&ram512, 0, bad);
        assert!(e.contains("sector_size") && e.contains(&bad.to_string()), "{e}");
    }
    let e = refused(&ram4k, 0, 512);
    assert!(e.contains("sector_size") && e.contains("ram4k"), "a sector smaller than the base's blocks: {e}");
    let e = refused(&ram512, 512, 4096);
    assert!(e.contains("data_offset") && e.contains("512"), "an offset inside a sector: {e}");
    let e = refused(&ram4k, 512 * 3, 4096);
    assert!(e.contains("data_offset"), "an offset inside a base block: {e}");
    // 32 KiB: an offset of 32 KiB leaves nothing, of 28 KiB one 4 KiB sector.
    let e = refused(&ram512, 32768, 512);
    assert!(e.contains("base_bdev_name") && e.contains("ram"), "nothing after the offset: {e}");
    let ram_short: Bdev = Arc::new(RamDevice::new("short", 512, 63).unwrap());
    let e = refused(&ram_short, 28672, 4096);
    assert!(
        e.contains("base_bdev_name") && e.contains("short"),
        "less than one sector after the offset: {e}"
    );
    let layout = CryptoLayout { data_offset: 28672, sector_size: 4096 };
    let dev = CryptoDevice::with_layout("c", ram512.clone(), key.clone(), layout).unwrap();
    assert_eq!(dev.info().num_blocks(), 1);
}
