//! fp-luks against the real tools, both ways, on volumes in files: cryptsetup (package
//! cryptsetup-bin) for LUKS1 and LUKS2, QEMU's `luks` driver (qemu-img / qemu-io, package
//! qemu-utils) for LUKS1. The KDFs are cheap (PBKDF2 at 1000 iterations, Argon2id at 32 KiB
//! and 4 passes) so the tests take seconds.

use fp_luks::{format, FormatOptions, Kdf, LuksError, MetaIo, Version, Volume};
use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::process::Command;

const PASS: &[u8] = b"correct horse";
const MIB: u64 = 1 << 20;

/// A tool's path; a missing tool fails the test, naming the package that has it.
fn tool(name: &str, package: &str) -> PathBuf {
    for dir in ["/usr/sbin", "/usr/bin", "/sbin", "/bin"] {
        let path = Path::new(dir).join(name);
        if path.exists() {
            return path;
        }
    }
    panic!("{name} is not installed: install the Debian package {package} (scripts/install.sh does)");
}

fn cryptsetup(args: &[&str]) -> std::process::Output {
    Command::new(tool("cryptsetup", "cryptsetup-bin")).args(args).output().expect("run cryptsetup")
}

fn ok(out: std::process::Output, what: &str) -> String {
    assert!(
        out.status.success(),
        "{what} failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

struct Disk {
    _dir: tempfile::TempDir,
    path: PathBuf,
    key_file: PathBuf,
}

impl Disk {
    fn new(size: u64) -> Disk {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("disk.img");
        File::create(&path).and_then(|f| f.set_len(size)).expect("disk file");
        let key_file = dir.path().join("pass");
        std::fs::write(&key_file, PASS).expect("key file");
        Disk { _dir: dir, path, key_file }
    }
    fn p(&self) -> &str {
        self.path.to_str().expect("utf-8 path")
    }
    fn k(&self) -> &str {
        self.key_file.to_str().expect("utf-8 path")
    }
    fn key_file_with(&self, name: &str, pass: &[u8]) -> String {
        let path = self._dir.path().join(name);
        std::fs::write(&path, pass).expect("key file");
        path.to_str().expect("utf-8 path").to_owned()
    }
    fn io(&self) -> File {
        OpenOptions::new().read(true).write(true).open(&self.path).expect("open disk")
    }
    /// cryptsetup's view of the volume key (hex, no spaces).
    fn dumped_key(&self) -> String {
        let out = ok(
            cryptsetup(&["luksDump", "--dump-volume-key", "--batch-mode", "--key-file", self.k(), self.p()]),
            "luksDump --dump-volume-key",
        );
        let start = out.find("MK dump:").expect("MK dump in luksDump's output") + "MK dump:".len();
        out[start..]
            .chars()
            .take_while(|c| c.is_ascii_hexdigit() || c.is_whitespace())
            .filter(|c| !c.is_whitespace())
            .collect()
    }
    fn cryptsetup_opens(&self, key_file: &str, slot: Option<u32>) -> bool {
        let slot_s = slot.map(|s| s.to_string());
        let mut args = vec!["open", "--test-passphrase", "--batch-mode", "--key-file", key_file];
        if let Some(s) = &slot_s {
            args.extend(["--key-slot", s]);
        }
        args.push(self.p());
        cryptsetup(&args).status.success()
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn pbkdf2() -> Kdf {
    Kdf::Pbkdf2 { hash: "sha256".into(), iterations: 1000 }
}

fn opts(version: Version, sector_size: u32, kdf: Kdf) -> FormatOptions {
    FormatOptions {
        version,
        cipher: "aes-xts-plain64".into(),
        key_bits: 512,
        sector_size,
        kdf,
        label: None,
        uuid: None,
    }
}

fn cryptsetup_format(disk: &Disk, kind: &str, extra: &[&str]) {
    let mut args = vec!["luksFormat", "--type", kind, "--batch-mode", "--key-file", disk.k()];
    args.extend_from_slice(extra);
    args.push(disk.p());
    ok(cryptsetup(&args), "luksFormat");
}

const FAST_PBKDF2: [&str; 4] = ["--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000"];

fn check_cryptsetup_made(kind: &str, extra: &[&str], version: Version, sector: u32) {
    let disk = Disk::new(32 * MIB);
    cryptsetup_format(&disk, kind, extra);
    let mut io = disk.io();
    let vol = Volume::load(&mut io).expect("load a cryptsetup volume");
    assert_eq!(vol.version(), version);
    assert_eq!(vol.sector_size(), sector);
    assert_eq!(vol.cipher(), "aes-xts-plain64");
    assert_eq!(vol.key_bits(), 512);
    let (key, slot) = vol.unlock(&mut io, PASS, None).expect("unlock");
    assert_eq!(slot, 0);
    assert_eq!(hex(key.as_bytes()), disk.dumped_key());
    assert!(matches!(vol.unlock(&mut io, b"wrong", None), Err(LuksError::WrongPassphrase)));
}

#[test]
fn cryptsetup_luks2_512_opens_here() {
    let mut extra = FAST_PBKDF2.to_vec();
    extra.extend(["--sector-size", "512"]);
    check_cryptsetup_made("luks2", &extra, Version::Luks2, 512);
}

#[test]
fn cryptsetup_luks2_4096_opens_here() {
    let mut extra = FAST_PBKDF2.to_vec();
    extra.extend(["--sector-size", "4096"]);
    check_cryptsetup_made("luks2", &extra, Version::Luks2, 4096);
}

#[test]
fn cryptsetup_luks2_argon2id_opens_here() {
    let extra = [
        "--pbkdf",
        "argon2id",
        "--pbkdf-memory",
        "32",
        "--pbkdf-force-iterations",
        "4",
        "--sector-size",
        "512",
    ];
    check_cryptsetup_made("luks2", &extra, Version::Luks2, 512);
}

#[test]
fn cryptsetup_luks1_opens_here() {
    check_cryptsetup_made("luks1", &FAST_PBKDF2, Version::Luks1, 512);
}

#[test]
fn cryptsetup_luks1_sha1_opens_here() {
    let extra = ["--hash", "sha1", "--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000"];
    check_cryptsetup_made("luks1", &extra, Version::Luks1, 512);
}

fn check_ours_opens_there(o: FormatOptions) {
    let disk = Disk::new(32 * MIB);
    let mut io = disk.io();
    let (vol, key) = format(&mut io, &o, PASS).expect("format");
    drop(io);
    let dump = ok(cryptsetup(&["luksDump", disk.p()]), "luksDump");
    assert!(dump.contains(vol.uuid()), "luksDump shows our UUID: {dump}");
    assert!(disk.cryptsetup_opens(disk.k(), None), "cryptsetup open --test-passphrase");
    assert_eq!(disk.dumped_key(), hex(key.as_bytes()));
    let wrong = disk.key_file_with("wrong", b"wrong");
    assert!(!disk.cryptsetup_opens(&wrong, None));
}

#[test]
fn our_luks2_opens_in_cryptsetup() {
    let mut o = opts(Version::Luks2, 512, pbkdf2());
    o.label = Some("fp-test".into());
    check_ours_opens_there(o);
    check_ours_opens_there(opts(Version::Luks2, 4096, pbkdf2()));
    check_ours_opens_there(opts(
        Version::Luks2,
        4096,
        Kdf::Argon2 { id: true, time: 4, memory_kib: 32, parallel: 1 },
    ));
    check_ours_opens_there(opts(
        Version::Luks2,
        512,
        Kdf::Argon2 { id: false, time: 4, memory_kib: 64, parallel: 2 },
    ));
}

#[test]
fn our_luks1_opens_in_cryptsetup() {
    check_ours_opens_there(opts(Version::Luks1, 512, pbkdf2()));
    let mut o = opts(Version::Luks1, 512, Kdf::Pbkdf2 { hash: "sha1".into(), iterations: 1000 });
    o.key_bits = 256;
    check_ours_opens_there(o);
}

fn slots_both_ways(version: Version, kind: &str) {
    let disk = Disk::new(32 * MIB);
    let mut io = disk.io();
    let (mut vol, key) = format(&mut io, &opts(version, 512, pbkdf2()), PASS).expect("format");
    // We add slot 3; cryptsetup opens with it.
    let second = disk.key_file_with("second", b"second pass");
    assert_eq!(vol.add_keyslot(&mut io, &key, b"second pass", Some(3), &pbkdf2()).expect("add"), 3);
    assert!(disk.cryptsetup_opens(&second, Some(3)));
    // We remove slot 0; cryptsetup no longer opens with its passphrase.
    vol.remove_keyslot(&mut io, 0).expect("remove");
    assert!(!disk.cryptsetup_opens(disk.k(), None), "slot 0 is gone");
    assert!(matches!(vol.remove_keyslot(&mut io, 3), Err(LuksError::LastSlot)));
    // cryptsetup adds slot 5 and kills slot 3; we see both changes.
    let third = disk.key_file_with("third", b"third pass");
    let mut add = vec!["luksAddKey", "--batch-mode", "--key-file", second.as_str(), "--key-slot", "5"];
    add.extend_from_slice(&FAST_PBKDF2);
    add.extend([disk.p(), third.as_str()]);
    ok(cryptsetup(&add), "luksAddKey");
    ok(cryptsetup(&["luksKillSlot", "--batch-mode", "--key-file", &third, disk.p(), "3"]), "luksKillSlot");
    let vol = Volume::load(&mut io).expect("reload");
    let slots: Vec<u32> = vol.keyslots().iter().map(|k| k.slot).collect();
    assert_eq!(slots, vec![5], "{kind}");
    let (k2, slot) = vol.unlock(&mut io, b"third pass", None).expect("unlock slot 5");
    assert_eq!(slot, 5);
    assert_eq!(k2.as_bytes(), key.as_bytes());
    assert!(matches!(vol.unlock(&mut io, b"second pass", None), Err(LuksError::WrongPassphrase)));
    assert!(matches!(vol.unlock(&mut io, b"third pass", Some(3)), Err(LuksError::NoSuchSlot(3))));
}

#[test]
fn key_slots_luks2_both_ways() {
    slots_both_ways(Version::Luks2, "luks2");
}

#[test]
fn key_slots_luks1_both_ways() {
    slots_both_ways(Version::Luks1, "luks1");
}

#[test]
fn luks2_damaged_primary_falls_back_to_secondary() {
    let disk = Disk::new(32 * MIB);
    let mut extra = FAST_PBKDF2.to_vec();
    extra.extend(["--sector-size", "512"]);
    cryptsetup_format(&disk, "luks2", &extra);
    let mut io = disk.io();
    io.write_at(0, &[0u8; 0x4000]).expect("zero the primary copy");
    let vol = Volume::load(&mut io).expect("the secondary copy loads");
    let (key, _) = vol.unlock(&mut io, PASS, None).expect("unlock");
    // cryptsetup too opens it, from the secondary.
    assert_eq!(hex(key.as_bytes()), disk.dumped_key());
    // A flipped byte in the primary's JSON: its checksum fails, the secondary is used.
    let disk = Disk::new(32 * MIB);
    cryptsetup_format(&disk, "luks2", &extra);
    let mut io = disk.io();
    io.write_at(5000, b"#").expect("flip");
    Volume::load(&mut io).expect("secondary");
    // Both copies damaged.
    io.write_at(0x4000 + 5000, b"#").expect("flip");
    match Volume::load(&mut io) {
        Err(LuksError::Damaged { copy: "both", .. }) => {}
        other => panic!("expected Damaged {{ both }}, got {other:?}"),
    }
}

#[test]
fn qemu_luks1_opens_here() {
    let disk = Disk::new(0);
    std::fs::remove_file(&disk.path).expect("qemu-img makes the file");
    let secret = format!("secret,id=s0,data={}", std::str::from_utf8(PASS).expect("ascii"));
    let out = Command::new(tool("qemu-img", "qemu-utils"))
        .args([
            "create",
            "-f",
            "luks",
            "--object",
            &secret,
            "-o",
            "key-secret=s0,iter-time=10",
            disk.p(),
            "8M",
        ])
        .output()
        .expect("run qemu-img");
    ok(out, "qemu-img create -f luks");
    let mut io = disk.io();
    let vol = Volume::load(&mut io).expect("load qemu's LUKS1");
    assert_eq!(vol.version(), Version::Luks1);
    let (key, _) = vol.unlock(&mut io, PASS, None).expect("unlock qemu's volume");
    assert_eq!(hex(key.as_bytes()), disk.dumped_key());
}

/// Our LUKS1 volume written through QEMU's `luks` driver decrypts, with our key and the
/// data-area IV convention (512-byte sector number from the data offset), to what was written.
#[test]
fn qemu_writes_our_luks1() {
    let disk = Disk::new(4 * MIB);
    let mut io = disk.io();
    let (vol, key) = format(&mut io, &opts(Version::Luks1, 512, pbkdf2()), PASS).expect("format");
    drop(io);
    let secret = format!("secret,id=s0,data={}", std::str::from_utf8(PASS).expect("ascii"));
    let opts = format!("driver=luks,key-secret=s0,file.filename={}", disk.p());
    // 0x5a over 64 KiB at byte 4096 of the data area, 0xc3 over the next 4 KiB.
    let out = Command::new(tool("qemu-io", "qemu-utils"))
        .args([
            "--object",
            &secret,
            "--image-opts",
            &opts,
            "-c",
            "write -P 0x5a 4096 65536",
            "-c",
            "write -P 0xc3 69632 4096",
        ])
        .output()
        .expect("run qemu-io");
    ok(out, "qemu-io write");
    let mut io = disk.io();
    let mut data = vec![0u8; 69632 + 4096 - 4096];
    io.read_at(vol.data_offset() + 4096, &mut data).expect("read the data area");
    decrypt_plain64(key.as_bytes(), &mut data, 4096 / 512);
    assert!(data[..65536].iter().all(|&b| b == 0x5a), "qemu's 0x5a pattern");
    assert!(data[65536..].iter().all(|&b| b == 0xc3), "qemu's 0xc3 pattern");
}

/// aes-xts-plain64 decryption of 512-byte sectors, the first having IV `first_sector`.
fn decrypt_plain64(key: &[u8], buf: &mut [u8], first_sector: u128) {
    use aes::cipher::KeyInit;
    let half = key.len() / 2;
    let xts = xts_mode::Xts128::new(
        aes::Aes256::new_from_slice(&key[..half]).expect("key"),
        aes::Aes256::new_from_slice(&key[half..]).expect("key"),
    );
    xts.decrypt_area(buf, 512, first_sector, xts_mode::get_tweak_default);
}

/// Writes the `luks_header` fuzz target's seeds (fuzz/regressions/luks_header/): real headers
/// made by cryptsetup and QEMU, and ours: the first 32 KiB of small LUKS2 volumes (both
/// copies), the first 4 KiB of LUKS1 ones, each after the target's flag byte 0 (no re-seal).
/// Run by hand after a format change: `cargo test -p fp-luks --test tools -- --ignored
/// write_fuzz_seeds`.
#[test]
#[ignore]
fn write_fuzz_seeds() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/regressions/luks_header");
    std::fs::create_dir_all(&dir).expect("seed dir");
    let seed = |name: &str, disk: &Disk, len: usize| {
        let mut head = vec![0u8; len];
        disk.io().read_at(0, &mut head).expect("read the header");
        // Each seed is a header that loads: the fuzzer starts past the checks.
        Volume::load(&mut fp_luks::MemIo(head.clone())).unwrap_or_else(|e| panic!("{name}: {e}"));
        std::fs::write(dir.join(name), [&[0u8][..], &head].concat()).expect("write seed");
    };
    let mut luks2 = FAST_PBKDF2.to_vec();
    luks2.extend(["--sector-size", "4096", "--label", "seed"]);
    let disk = Disk::new(20 * MIB);
    cryptsetup_format(&disk, "luks2", &luks2);
    let second = disk.key_file_with("second", b"second");
    let mut add = vec!["luksAddKey", "--batch-mode", "--key-file", disk.k()];
    add.extend_from_slice(&FAST_PBKDF2);
    add.extend([disk.p(), second.as_str()]);
    ok(cryptsetup(&add), "luksAddKey");
    seed("seed-cryptsetup-luks2-two-slots", &disk, 32 << 10);
    // (name, type, luksFormat options, bytes kept)
    let plain: [(&str, &str, &[&str], usize); 4] = [
        (
            "seed-cryptsetup-luks2-argon2id",
            "luks2",
            &["--pbkdf", "argon2id", "--pbkdf-memory", "32", "--pbkdf-force-iterations", "4"],
            32 << 10,
        ),
        (
            "seed-cryptsetup-luks2-32k-metadata",
            "luks2",
            &["--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000", "--luks2-metadata-size", "32k"],
            96 << 10,
        ),
        ("seed-cryptsetup-luks1", "luks1", &FAST_PBKDF2, 4096),
        (
            "seed-cryptsetup-luks1-sha1",
            "luks1",
            &["--hash", "sha1", "--key-size", "256", "--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000"],
            4096,
        ),
    ];
    for (name, kind, options, len) in plain {
        let disk = Disk::new(20 * MIB);
        cryptsetup_format(&disk, kind, options);
        seed(name, &disk, len);
    }
    let disk = Disk::new(20 * MIB);
    cryptsetup_format(&disk, "luks2", &FAST_PBKDF2);
    disk.io().write_at(0, &[0u8; 4096]).expect("zero the primary");
    seed("seed-cryptsetup-luks2-primary-zeroed", &disk, 32 << 10);
    let disk = Disk::new(20 * MIB);
    let mut o = opts(Version::Luks2, 512, Kdf::Argon2 { id: true, time: 4, memory_kib: 32, parallel: 1 });
    o.label = Some("flashpath".into());
    format(&mut disk.io(), &o, PASS).expect("format");
    seed("seed-flashpath-luks2", &disk, 32 << 10);
    let disk = Disk::new(4 * MIB);
    format(&mut disk.io(), &opts(Version::Luks1, 512, pbkdf2()), PASS).expect("format");
    seed("seed-flashpath-luks1", &disk, 4096);
}
