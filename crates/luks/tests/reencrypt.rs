//! Online re-encryption, fp-luks and cryptsetup 2.6 (`cryptsetup reencrypt`, package
//! cryptsetup-bin) resuming each other's jobs on volumes in files. The data area is written and
//! checked here with aes-xts-plain64 (IV: the 512-byte sector number from the data offset);
//! the re-encryption of data the tests do themselves, as fp-crypto's engine would: read the
//! hotzone's old ciphertext, record its checksums, write it under the new key, advance.

use fp_luks::{LuksError, MetaIo, Reencryption, Volume, VolumeKey};
use sha2::{Digest, Sha256};
use std::fs::{File, OpenOptions};
use std::path::PathBuf;
use std::process::{Command, Output};

const PASSPHRASE: &[u8] = b"re-encrypt me";
const MIB: u64 = 1 << 20;
/// Cheap key slots, so that the tests take seconds.
const CHEAP_KDF: [&str; 4] = ["--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000"];

fn kdf() -> fp_luks::Kdf {
    fp_luks::Kdf::Pbkdf2 { hash: "sha256".into(), iterations: 1000 }
}

/// A volume in a file of a tempdir, with its passphrase in a key file next to it.
struct Image {
    dir: tempfile::TempDir,
}

impl Image {
    /// A LUKS2 volume of `size` bytes made by cryptsetup (16 MiB of metadata, as its default).
    fn formatted(size: u64, sector_size: u32) -> Image {
        let image = Image { dir: tempfile::tempdir().expect("tempdir") };
        File::create(image.path()).and_then(|f| f.set_len(size)).expect("image file");
        std::fs::write(image.key_file(), PASSPHRASE).expect("key file");
        let sector = sector_size.to_string();
        let mut args = vec!["luksFormat", "--type", "luks2", "--sector-size", &sector];
        args.extend(CHEAP_KDF);
        image.run(&args, &[]);
        image
    }
    fn path(&self) -> PathBuf {
        self.dir.path().join("volume.img")
    }
    fn key_file(&self) -> PathBuf {
        self.dir.path().join("passphrase")
    }
    /// `cryptsetup <args> --batch-mode --key-file <key> <extra> <image>`, which must succeed.
    fn run(&self, args: &[&str], extra: &[&str]) -> String {
        let out = self.cryptsetup(args, extra);
        assert!(
            out.status.success(),
            "cryptsetup {args:?} {extra:?} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
    fn cryptsetup(&self, args: &[&str], extra: &[&str]) -> Output {
        let key = self.key_file();
        let image = self.path();
        Command::new("cryptsetup")
            .args(args)
            .args(["--batch-mode", "--key-file"])
            .arg(&key)
            .args(extra)
            .arg(&image)
            .output()
            .expect("cryptsetup (Debian package cryptsetup-bin) runs")
    }
    fn file(&self) -> File {
        OpenOptions::new().read(true).write(true).open(self.path()).expect("open the image")
    }
    /// The volume key cryptsetup reads from the header, as bytes.
    fn cryptsetup_key(&self) -> Vec<u8> {
        let dump = self.run(&["luksDump", "--dump-volume-key"], &[]);
        let at = dump.find("MK dump:").expect("luksDump prints the key") + "MK dump:".len();
        let hex: String = dump[at..]
            .chars()
            .take_while(|c| c.is_ascii_hexdigit() || c.is_whitespace())
            .filter(char::is_ascii_hexdigit)
            .collect();
        (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex")).collect()
    }
    /// cryptsetup opens the volume (`open --test-passphrase`).
    fn cryptsetup_opens(&self) -> bool {
        self.cryptsetup(&["open", "--test-passphrase"], &[]).status.success()
    }
}

/// aes-xts-plain64 over whole `unit`-byte sectors of the data area starting `at` bytes into it.
fn xts(key: &[u8], buf: &mut [u8], at: u64, unit: usize, encrypt: bool) {
    use aes::cipher::KeyInit;
    let half = key.len() / 2;
    let xts = xts_mode::Xts128::new(
        aes::Aes256::new_from_slice(&key[..half]).expect("512-bit key"),
        aes::Aes256::new_from_slice(&key[half..]).expect("512-bit key"),
    );
    // The IV counts 512-byte sectors whatever the unit.
    let per_unit = (unit / 512) as u128;
    let tweak = |n: u128| xts_mode::get_tweak_default(n * per_unit);
    let first = u128::from(at) / unit as u128;
    if encrypt {
        xts.encrypt_area(buf, unit, first, tweak);
    } else {
        xts.decrypt_area(buf, unit, first, tweak);
    }
}

/// Plaintext that differs in every block (so that a block left in the wrong key shows).
fn plaintext(len: u64) -> Vec<u8> {
    (0..len).map(|i| (i.wrapping_mul(2_654_435_761) >> 7) as u8 ^ (i >> 12) as u8).collect()
}

/// Fills the data area with `plain` under `key`.
fn write_data(io: &mut File, vol: &Volume, key: &[u8], plain: &[u8]) {
    let mut buf = plain.to_vec();
    xts(key, &mut buf, 0, vol.sector_size() as usize, true);
    io.write_at(vol.data_offset(), &buf).expect("write the data area");
    io.flush().expect("flush");
}

/// The data area decrypted with `key`.
fn read_data(io: &mut File, vol: &Volume, key: &[u8]) -> Vec<u8> {
    let mut buf = vec![0u8; vol.data_size(io.size()) as usize];
    io.read_at(vol.data_offset(), &mut buf).expect("read the data area");
    xts(key, &mut buf, 0, vol.sector_size() as usize, false);
    buf
}

fn checksums(data: &[u8], block: u32) -> Vec<[u8; 32]> {
    data.chunks(block as usize).map(|b| Sha256::digest(b).into()).collect()
}

/// One hotzone as the engine does it: read the old ciphertext, record its checksums, write it
/// under the new key, flush, advance. `crash_after` stops after that many blocks are
/// written, before the advance (a crash in the middle of the hotzone).
fn hotzone(
    io: &mut File,
    vol: &mut Volume,
    keys: (&VolumeKey, &VolumeKey),
    offset: u64,
    len: u64,
    crash_after: Option<usize>,
) {
    let r = vol.reencryption().expect("in re-encryption");
    let unit = vol.sector_size() as usize;
    let mut data = vec![0u8; len as usize];
    io.read_at(vol.data_offset() + offset, &mut data).expect("read the hotzone");
    vol.reencryption_hotzone(io, offset, len, &checksums(&data, r.checksum_block))
        .expect("record the hotzone");
    xts(keys.0.as_bytes(), &mut data, offset, unit, false);
    xts(keys.1.as_bytes(), &mut data, offset, unit, true);
    let written = match crash_after {
        Some(blocks) => blocks * r.checksum_block as usize,
        None => data.len(),
    };
    io.write_at(vol.data_offset() + offset, &data[..written]).expect("write the hotzone");
    io.flush().expect("flush the data");
    if crash_after.is_none() {
        vol.reencryption_advance(io, offset + len).expect("advance");
    }
}

/// Recovers a recorded hotzone as cryptsetup does (a block still matching its checksum is
/// old ciphertext: rewrite it under the new key), then advances past it. Returns how many
/// blocks were still old.
fn recover(io: &mut File, vol: &mut Volume, keys: (&VolumeKey, &VolumeKey)) -> Option<usize> {
    let (offset, len, sums) = vol.reencryption_recovery(io).expect("recovery info")?;
    let block = vol.reencryption().expect("in re-encryption").checksum_block as u64;
    let unit = vol.sector_size() as usize;
    let mut old = 0;
    for (i, sum) in sums.iter().enumerate() {
        let at = offset + i as u64 * block;
        let mut data = vec![0u8; block as usize];
        io.read_at(vol.data_offset() + at, &mut data).expect("read a block");
        if Sha256::digest(&data)[..] == sum[..] {
            old += 1;
            xts(keys.0.as_bytes(), &mut data, at, unit, false);
            xts(keys.1.as_bytes(), &mut data, at, unit, true);
            io.write_at(vol.data_offset() + at, &data).expect("rewrite a block");
        }
    }
    io.flush().expect("flush");
    vol.reencryption_advance(io, offset + len).expect("advance past the recovered hotzone");
    Some(old)
}

/// The rest of the job, in hotzones of `zone` bytes, then its end.
fn finish(io: &mut File, vol: &mut Volume, keys: (&VolumeKey, &VolumeKey), zone: u64) {
    let end = vol.data_size(io.size());
    loop {
        let r = vol.reencryption().expect("in re-encryption");
        if r.finished {
            break;
        }
        hotzone(io, vol, keys, r.boundary, zone.min(end - r.boundary), None);
    }
    vol.finish_reencryption(io, keys.1).expect("finish");
}

#[test]
fn cryptsetup_init_only_is_read_here() {
    let image = Image::formatted(32 * MIB, 4096);
    let before = image.cryptsetup_key();
    let mut args = vec!["reencrypt", "--init-only", "--resilience", "checksum"];
    args.extend(CHEAP_KDF);
    image.run(&args, &[]);

    let mut io = image.file();
    let vol = Volume::load(&mut io).expect("a header in re-encryption loads");
    let r: Reencryption = vol.reencryption().expect("re-encryption reported");
    assert_eq!((r.boundary, r.finished, r.hotzone, r.data_size), (0, false, None, None));
    assert_eq!(r.checksum_block, 4096);
    assert_eq!(r.hotzone_max, 1 << 30, "cryptsetup gives the checksums most of the key slots area");
    match vol.unlock(&mut io, PASSPHRASE, None) {
        Err(e @ LuksError::Reencrypting) => assert!(e.to_string().contains("unlock_reencryption")),
        other => panic!("unlock of a volume in re-encryption: {other:?}"),
    }
    let (old, new) =
        vol.unlock_reencryption(&mut io, PASSPHRASE).expect("both keys, metadata digest checked");
    assert_eq!(old.as_bytes(), &before[..]);
    assert_ne!(old.as_bytes(), new.as_bytes());
    assert!(matches!(vol.unlock_reencryption(&mut io, b"wrong"), Err(LuksError::WrongPassphrase)));
}

/// A job begun here on a volume cryptsetup made, its data area full of plaintext.
struct Begun {
    image: Image,
    io: File,
    vol: Volume,
    old: VolumeKey,
    new: VolumeKey,
    plain: Vec<u8>,
}

fn begun_here(sector_size: u32) -> Begun {
    let image = Image::formatted(24 * MIB, sector_size);
    let mut io = image.file();
    let mut vol = Volume::load(&mut io).expect("load");
    let (old, _) = vol.unlock(&mut io, PASSPHRASE, None).expect("unlock");
    let plain = plaintext(vol.data_size(io.size()));
    write_data(&mut io, &vol, old.as_bytes(), &plain);
    let new = vol.begin_reencryption(&mut io, &old, &[PASSPHRASE], &kdf()).expect("begin");
    Begun { image, io, vol, old, new, plain }
}

/// A job begun by `cryptsetup reencrypt --init-only` on a volume of `size` bytes whose data
/// area is full of plaintext; returns the old key (cryptsetup's) and the plaintext.
fn begun_by_cryptsetup(size: u64, sector_size: u32) -> (Image, Vec<u8>, Vec<u8>) {
    let image = Image::formatted(size, sector_size);
    let old_key = image.cryptsetup_key();
    let mut io = image.file();
    let vol = Volume::load(&mut io).expect("load");
    let plain = plaintext(vol.data_size(io.size()));
    write_data(&mut io, &vol, &old_key, &plain);
    let mut args = vec!["reencrypt", "--init-only", "--resilience", "checksum"];
    args.extend(CHEAP_KDF);
    image.run(&args, &[]);
    (image, old_key, plain)
}

/// The job on the image loaded here, with both keys.
fn take_over(image: &Image) -> (File, Volume, VolumeKey, VolumeKey) {
    let mut io = image.file();
    let vol = Volume::load(&mut io).expect("load the job");
    let (old, new) = vol.unlock_reencryption(&mut io, PASSPHRASE).expect("both keys");
    (io, vol, old, new)
}

/// cryptsetup opens the volume, its key is `key` and the data area decrypts to `plain`.
fn ends_plain_under(image: &Image, key: &[u8], plain: &[u8]) {
    assert!(image.cryptsetup_opens());
    assert_eq!(image.cryptsetup_key(), key, "cryptsetup's volume key");
    let mut io = image.file();
    let vol = Volume::load(&mut io).expect("a plain volume again");
    assert!(vol.reencryption().is_none());
    assert!(read_data(&mut io, &vol, key) == plain, "the data decrypts with the new key");
}

/// `cryptsetup reencrypt --resume-only` on the image (a file is not a block device: cryptsetup
/// must be told it is not in use).
fn cryptsetup_resumes(image: &Image) -> Output {
    image.cryptsetup(&["reencrypt", "--resume-only", "--force-offline-reencrypt"], &[])
}

/// `cryptsetup repair` recovers the hotzone in flight, `--resume-only` finishes the job, and
/// the volume ends under `key` with the data intact.
fn repaired_and_finished_by_cryptsetup(image: &Image, key: &[u8], plain: &[u8]) {
    image.run(&["repair"], &[]);
    let out = cryptsetup_resumes(image);
    assert!(out.status.success(), "{out:?}");
    ends_plain_under(image, key, plain);
}

#[test]
fn begun_and_half_done_here_cryptsetup_finishes() {
    let Begun { image, mut io, mut vol, old, new, plain } = begun_here(4096);
    // cryptsetup takes our header for its own.
    let dump = image.run(&["luksDump"], &[]);
    assert!(dump.contains("online-reencrypt-v2") && dump.contains("reencrypt (unbound)"), "{dump}");
    for i in 0..3 {
        hotzone(&mut io, &mut vol, (&old, &new), i * MIB, MIB, None);
    }
    assert_eq!(Volume::load(&mut io).expect("reload").reencryption().map(|r| r.boundary), Some(3 * MIB));
    drop(io);

    let out = cryptsetup_resumes(&image);
    assert!(out.status.success(), "{out:?}");
    ends_plain_under(&image, new.as_bytes(), &plain);
    let mut io = image.file();
    let (key, _) = Volume::load(&mut io).and_then(|v| v.unlock(&mut io, PASSPHRASE, None)).expect("unlock");
    assert_eq!(key.as_bytes(), new.as_bytes());
}

#[test]
fn crashed_mid_hotzone_here_cryptsetup_recovers_and_finishes() {
    let Begun { image, mut io, mut vol, old, new, plain } = begun_here(4096);
    hotzone(&mut io, &mut vol, (&old, &new), 0, MIB, None);
    // Half of the second hotzone's blocks written, then the crash.
    let blocks = (MIB / 4096) as usize;
    hotzone(&mut io, &mut vol, (&old, &new), MIB, MIB, Some(blocks / 2));
    drop(io);

    // cryptsetup sees the hotzone and will not resume before `repair` recovers it (from our
    // checksums: a block recovered wrongly would not decrypt to the plaintext below).
    let out = cryptsetup_resumes(&image);
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("recovery"), "{out:?}");
    repaired_and_finished_by_cryptsetup(&image, new.as_bytes(), &plain);
}

#[test]
fn cryptsetup_recovers_our_hotzone_of_512_byte_sectors() {
    let Begun { image, mut io, mut vol, old, new, plain } = begun_here(512);
    assert_eq!(vol.reencryption().expect("job").checksum_block, 512);
    hotzone(&mut io, &mut vol, (&old, &new), 0, 4096, Some(3));
    let dump = image.run(&["luksDump"], &[]);
    assert!(dump.contains("in-reencryption"), "{dump}");
    repaired_and_finished_by_cryptsetup(&image, new.as_bytes(), &plain);
}

#[test]
fn begun_by_cryptsetup_finished_here() {
    let (image, old_key, plain) = begun_by_cryptsetup(24 * MIB, 4096);
    let (mut io, mut vol, old, new) = take_over(&image);
    assert_eq!(old.as_bytes(), &old_key[..]);
    assert_eq!(vol.reencryption().expect("job").boundary, 0);
    // A crash in our first hotzone (a quarter written), recovered after a reload: the blocks
    // still matching their checksums are the old ones.
    hotzone(&mut io, &mut vol, (&old, &new), 0, 2 * MIB, Some(128));
    let mut vol = Volume::load(&mut io).expect("load after the crash");
    assert_eq!(vol.reencryption().and_then(|r| r.hotzone), Some((0, 2 * MIB)));
    let still_old = recover(&mut io, &mut vol, (&old, &new));
    assert_eq!(still_old, Some(512 - 128), "the unwritten blocks match their checksums");
    finish(&mut io, &mut vol, (&old, &new), 3 * MIB);
    drop(io);

    let dump = image.run(&["luksDump", "--dump-json-metadata"], &[]);
    assert!(!dump.contains("reencrypt") && !dump.contains("backup-"), "a plain volume again: {dump}");
    ends_plain_under(&image, new.as_bytes(), &plain);
}

#[test]
fn begun_by_cryptsetup_on_512_byte_sectors_finished_here() {
    // cryptsetup checksums blocks of the file's block size (4096), not of the data's sectors.
    let (image, _, plain) = begun_by_cryptsetup(24 * MIB, 512);
    let (mut io, mut vol, old, new) = take_over(&image);
    assert_eq!((vol.sector_size(), vol.reencryption().expect("job").checksum_block), (512, 4096));
    finish(&mut io, &mut vol, (&old, &new), 3 * MIB);
    drop(io);
    ends_plain_under(&image, new.as_bytes(), &plain);
}

#[test]
fn cryptsetup_job_hashed_in_512_byte_sectors_here_and_finished_there() {
    // The checksum block set to the data's sector size (the metadata digest written again),
    // two hotzones, a crash in the third; cryptsetup recovers and finishes.
    let (image, _, plain) = begun_by_cryptsetup(24 * MIB, 512);
    let (mut io, mut vol, old, new) = take_over(&image);
    vol.reencryption_set_checksum_block(&mut io, (&old, &new), 512).expect("512-byte blocks");
    let mut vol = Volume::load(&mut io).expect("reload");
    assert_eq!(vol.reencryption().expect("job").checksum_block, 512);
    vol.unlock_reencryption(&mut io, PASSPHRASE).expect("the new metadata digest holds");
    hotzone(&mut io, &mut vol, (&old, &new), 0, MIB, None);
    hotzone(&mut io, &mut vol, (&old, &new), MIB, 64 * 1024, None);
    hotzone(&mut io, &mut vol, (&old, &new), MIB + 64 * 1024, 64 * 1024, Some(37));
    drop(io);
    repaired_and_finished_by_cryptsetup(&image, new.as_bytes(), &plain);
}

#[test]
fn cryptsetup_interrupted_part_way_finished_here() {
    let (image, old_key, plain) = begun_by_cryptsetup(24 * MIB, 4096);
    let mut io = image.file();

    // cryptsetup in 4 KiB hotzones (a header write each), stopped with SIGINT once its header
    // shows progress; it finishes the hotzone in hand and leaves a clean boundary.
    let key = image.key_file();
    let mut child = Command::new("cryptsetup")
        .args(["reencrypt", "--resume-only", "--force-offline-reencrypt", "--hotzone-size", "4096"])
        .args(["--batch-mode", "--key-file"])
        .arg(&key)
        .arg(image.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("cryptsetup runs");
    let started = std::time::Instant::now();
    loop {
        // A header read while cryptsetup writes it may be torn: such reads are skipped.
        let progress = Volume::load(&mut io).ok().and_then(|v| v.reencryption()).map(|r| r.boundary);
        if progress.is_none_or(|b| b > 0) || child.try_wait().expect("wait").is_some() {
            break;
        }
        assert!(started.elapsed() < std::time::Duration::from_secs(120), "cryptsetup made no progress");
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    let pid = child.id().to_string();
    let _ = Command::new("kill").args(["-INT", &pid]).status();
    let out = child.wait_with_output().expect("cryptsetup ends");

    let mut vol = Volume::load(&mut io).expect("load what cryptsetup left");
    let end = vol.data_size(io.size());
    match vol.reencryption() {
        Some(r) => {
            assert!(String::from_utf8_lossy(&out.stderr).contains("interrupted"), "{out:?}");
            assert!(r.boundary > 0 && r.boundary < end && r.hotzone.is_none(), "{r:?}");
            eprintln!("cryptsetup stopped at {} of {end} bytes", r.boundary);
            let (old, new) = vol.unlock_reencryption(&mut io, PASSPHRASE).expect("both keys");
            assert_eq!(old.as_bytes(), &old_key[..]);
            finish(&mut io, &mut vol, (&old, &new), 2 * MIB);
            ends_plain_under(&image, new.as_bytes(), &plain);
        }
        // A machine fast enough to finish before the signal: nothing left to carry on.
        None => {
            assert!(out.status.success(), "{out:?}");
            ends_plain_under(&image, &image.cryptsetup_key(), &plain);
        }
    }
}
