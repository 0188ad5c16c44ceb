//! LUKS volumes end to end on the host, against the tools users have: flashpath formats a
//! volume that `cryptsetup` dumps and opens (`--test-passphrase`) and whose data decrypts with
//! the volume key cryptsetup reads out of it; key slots added and removed over RPC open and stop
//! opening in cryptsetup; a volume cryptsetup made opens in flashpath; a LUKS1 volume flashpath
//! made reads and writes through QEMU's `luks` driver (`qemu-img`, `qemu-io`); and bad input
//! (a wrong passphrase, a base too small, a damaged header, a format over a volume) is refused
//! naming what is wrong, leaving the base as it was. (dm-crypt itself, which the host kernel
//! lacks, is in the guest test.)

mod common;

use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use common::xts::python_xts;
use common::{pattern, tools_or_skip, BlkClient, Daemon};
use serde_json::{json, Value};

const MIB: u64 = 1 << 20;

/// Cheap KDFs: these tests check formats, not key stretching.
const FAST_KDF: &[&str] = &["--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000"];

fn tools() -> bool {
    tools_or_skip(
        &["cryptsetup", "qemu-img", "qemu-io", "python3"],
        "cryptsetup (cryptsetup-bin), qemu-img and qemu-io (qemu-utils) and python3 are needed",
        "FLASHPATH_SKIP_LUKS",
    )
}

/// An owner-only file holding `bytes`, for the keyring.
fn secret_file(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let path = dir.join(name);
    let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&path).unwrap();
    std::io::Write::write_all(&mut f, bytes).unwrap();
    path
}

/// Keyring key `name` holding passphrase `pass`; returns its file (cryptsetup's `--key-file`).
fn passphrase(d: &Daemon, name: &str, pass: &str) -> PathBuf {
    let path = secret_file(d.dir.path(), &format!("{name}.pass"), pass.as_bytes());
    d.call("keyring_file_add_key", json!({"name": name, "path": path}));
    path
}

/// Runs cryptsetup; its exit status.
fn cryptsetup(args: &[&str]) -> (bool, String) {
    let out = Command::new("cryptsetup").args(args).output().expect("running cryptsetup");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text)
}

/// Whether cryptsetup opens `file` with the passphrase in `key_file` (in `slot` only).
fn cryptsetup_opens(file: &Path, key_file: &Path, slot: Option<u32>) -> bool {
    let (f, k) = (file.to_str().unwrap(), key_file.to_str().unwrap());
    let slot = slot.map(|s| s.to_string());
    let mut args = vec!["open", "--test-passphrase", "--batch-mode", "--key-file", k];
    if let Some(s) = &slot {
        args.extend(["--key-slot", s]);
    }
    args.push(f);
    cryptsetup(&args).0
}

/// The volume key of `file`, as cryptsetup reads it out with the passphrase in `key_file`.
fn cryptsetup_volume_key(file: &Path, key_file: &Path) -> String {
    let (ok, text) = cryptsetup(&[
        "luksDump",
        "--dump-volume-key",
        "--batch-mode",
        "--key-file",
        key_file.to_str().unwrap(),
        file.to_str().unwrap(),
    ]);
    assert!(ok, "cryptsetup luksDump --dump-volume-key: {text}");
    // "MK dump:\t12 34 ...\n\t\t56 78 ..." until the end.
    let start = text.find("MK dump:").expect("an MK dump line") + "MK dump:".len();
    text[start..].split_whitespace().collect()
}

fn read_file_at(file: &Path, offset: u64, len: usize) -> Vec<u8> {
    let mut buf = vec![0; len];
    std::fs::File::open(file).unwrap().read_exact_at(&mut buf, offset).unwrap();
    buf
}

fn refused(r: Result<Value, common::RpcError>, what: &str) -> String {
    match r {
        Ok(v) => panic!("{what}: accepted ({v})"),
        Err(e) => e.message,
    }
}

/// LUKS2 made by flashpath: cryptsetup reads its header, opens its slot, and its data decrypts
/// with the volume key cryptsetup reads out; slots added over RPC open in cryptsetup, removed
/// ones no longer do; the last slot stays.
#[test]
fn flashpath_luks2_opens_in_cryptsetup_and_its_key_slots_follow() {
    if !tools() {
        return;
    }
    let d = Daemon::start("0");
    let file = d.backing_file("luks2.img", 40 * MIB);
    d.uring("f", &file, None);
    let p0 = passphrase(&d, "k0", "correct horse battery staple");
    let p1 = passphrase(&d, "k1", "second passphrase");
    let p2 = passphrase(&d, "k2", "third, with argon2id");

    let uuid = d.call(
        "bdev_luks_format",
        json!({"base_bdev_name": "f", "key_name": "k0", "pbkdf": "pbkdf2", "pbkdf_force_iterations": 1000, "label": "fp-test"}),
    );
    let uuid = uuid.as_str().expect("the volume's UUID").to_string();
    let e = refused(
        d.try_call("bdev_luks_format", json!({"base_bdev_name": "f", "key_name": "k0"})),
        "a second format",
    );
    assert!(e.contains("base_bdev_name") && e.contains("force"), "{e}");

    let (ok, dump) = cryptsetup(&["luksDump", file.to_str().unwrap()]);
    assert!(ok, "cryptsetup luksDump: {dump}");
    assert!(dump.contains("Version:       \t2") || dump.contains("Version:"), "{dump}");
    assert!(dump.contains(&uuid) && dump.contains("fp-test"), "{dump}");
    assert!(cryptsetup_opens(&file, &p0, None), "cryptsetup opens slot 0 with k0");
    assert!(!cryptsetup_opens(&file, &p1, None), "cryptsetup refuses k1 before its slot exists");

    assert_eq!(
        d.call("bdev_crypto_create", json!({"base_bdev_name": "f", "name": "c0", "luks_key_name": "k0"})),
        json!("c0")
    );
    let b = &d.call("bdev_get_bdevs", json!({"name": "c0"}))[0];
    assert_eq!(b["block_size"], 4096, "LUKS2's default sector size: {b}");
    assert_eq!(b["num_blocks"].as_u64().unwrap() * 4096, 40 * MIB - 16 * MIB, "the data segment: {b}");

    // Key slots on the live disk.
    let s1 = d.call(
        "bdev_luks_add_keyslot",
        json!({"name": "c0", "key_name": "k1", "pbkdf": "pbkdf2", "pbkdf_force_iterations": 1000}),
    );
    assert_eq!(s1, json!(1));
    let s2 = d.call(
        "bdev_luks_add_keyslot",
        json!({"name": "c0", "key_name": "k2", "pbkdf": "argon2id", "pbkdf_force_iterations": 4, "pbkdf_memory": 32768, "pbkdf_parallel": 1}),
    );
    assert_eq!(s2, json!(2));
    assert!(cryptsetup_opens(&file, &p1, Some(1)), "cryptsetup opens slot 1 with k1");
    assert!(cryptsetup_opens(&file, &p2, Some(2)), "cryptsetup opens slot 2 (argon2id) with k2");
    assert_eq!(d.call("bdev_luks_test_key", json!({"name": "c0", "key_name": "k2"})), json!(2));
    let h = d.call("bdev_luks_get_header", json!({"name": "c0"}));
    let slots: Vec<u64> =
        h["keyslots"].as_array().unwrap().iter().map(|s| s["key_slot"].as_u64().unwrap()).collect();
    assert_eq!(slots, [0, 1, 2], "{h}");
    assert_eq!(h["keyslots"][2]["kdf"]["type"], "argon2id", "{h}");
    assert!(!h.to_string().contains("salt") && !h.to_string().contains("digest"), "no secrets in {h}");

    d.call("bdev_luks_remove_keyslot", json!({"name": "c0", "key_slot": 1}));
    assert!(!cryptsetup_opens(&file, &p1, None), "cryptsetup no longer opens with k1");
    assert!(
        cryptsetup_opens(&file, &p0, Some(0)) && cryptsetup_opens(&file, &p2, Some(2)),
        "the other slots stay"
    );
    let e =
        refused(d.try_call("bdev_luks_test_key", json!({"name": "c0", "key_name": "k1"})), "a removed slot");
    assert!(e.starts_with("key_name: "), "{e}");
    d.call("bdev_luks_remove_keyslot", json!({"name": "c0", "key_slot": 0}));
    let e = refused(
        d.try_call("bdev_luks_remove_keyslot", json!({"name": "c0", "key_slot": 2})),
        "the last slot",
    );
    assert!(e.starts_with("key_slot: "), "{e}");
    assert!(cryptsetup_opens(&file, &p2, Some(2)), "the last slot still opens");

    // Data: what a client writes is aes-xts-plain64 under cryptsetup's volume key at the data
    // offset, the IV counting 512-byte sectors from there.
    let sock = d.controller("luks", "c0", Some(1), false);
    let mut c = BlkClient::open(&sock, 1);
    let data = pattern(41, 0, 256 << 10);
    c.write_all(MIB, &data);
    assert_eq!(c.flush(0), 0);
    assert_eq!(c.read_all(MIB, data.len()), data);
    let key = cryptsetup_volume_key(&file, &p2);
    let stored = read_file_at(&file, 16 * MIB + MIB, data.len());
    assert_eq!(python_xts("dec", &key, 4096, MIB / 512, &stored), data, "the ciphertext on the file");
}

/// A LUKS2 volume cryptsetup made opens in flashpath with either of its passphrases, reports
/// its slots, and serves data under cryptsetup's key; a wrong passphrase is refused naming
/// the key and writes nothing.
#[test]
fn cryptsetup_luks2_opens_in_flashpath() {
    if !tools() {
        return;
    }
    let d = Daemon::start("0");
    let file = d.backing_file("cs.img", 32 * MIB);
    let p0 = passphrase(&d, "k0", "made by cryptsetup");
    let p1 = passphrase(&d, "k1", "added by cryptsetup");
    let _bad = passphrase(&d, "bad", "not it");
    let f = file.to_str().unwrap();
    let (ok, t) = cryptsetup(
        &[
            &["luksFormat", "--type", "luks2", "--batch-mode", "--sector-size", "512"],
            FAST_KDF,
            &["--key-file", p0.to_str().unwrap(), f],
        ]
        .concat(),
    );
    assert!(ok, "cryptsetup luksFormat: {t}");
    let (ok, t) = cryptsetup(
        &[
            &["luksAddKey", "--batch-mode", "--key-file", p0.to_str().unwrap()],
            FAST_KDF,
            &[f, p1.to_str().unwrap()],
        ]
        .concat(),
    );
    assert!(ok, "cryptsetup luksAddKey: {t}");
    d.uring("f", &file, None);

    let before = std::fs::read(&file).unwrap();
    let e = refused(
        d.try_call(
            "bdev_crypto_create",
            json!({"base_bdev_name": "f", "name": "c0", "luks_key_name": "bad"}),
        ),
        "a wrong passphrase",
    );
    assert!(e.starts_with("luks_key_name: "), "{e}");
    assert!(!e.contains("not it"), "the passphrase is not quoted: {e}");
    assert!(std::fs::read(&file).unwrap() == before, "a refused open wrote to the base");
    assert!(d.try_call("bdev_get_bdevs", json!({"name": "c0"})).is_err(), "no bdev after a refused open");

    assert_eq!(d.call("bdev_luks_test_key", json!({"base_bdev_name": "f", "key_name": "k1"})), json!(1));
    d.call("bdev_crypto_create", json!({"base_bdev_name": "f", "name": "c0", "luks_key_name": "k1"}));
    let h = d.call("bdev_luks_get_header", json!({"name": "c0"}));
    assert_eq!(h["opened_by"], 1, "{h}");
    assert_eq!(h["sector_size"], 512, "{h}");
    let offset = h["data_offset"].as_u64().unwrap();
    let b = &d.call("bdev_get_bdevs", json!({"name": "c0"}))[0];
    assert_eq!(b["num_blocks"].as_u64().unwrap() * 512, 32 * MIB - offset, "{b}");

    let sock = d.controller("luks", "c0", Some(1), false);
    let mut c = BlkClient::open(&sock, 1);
    let data = pattern(42, 0, 128 << 10);
    c.write_all(0, &data);
    assert_eq!(c.flush(0), 0);
    let key = cryptsetup_volume_key(&file, &p0);
    let stored = read_file_at(&file, offset, data.len());
    assert_eq!(python_xts("dec", &key, 512, 0, &stored), data, "the ciphertext on the file");
}

/// LUKS1 for QEMU: a volume flashpath formats reads in `qemu-img` (its `luks` driver) with what
/// flashpath wrote, and what `qemu-io` writes through that driver reads back in flashpath.
#[test]
fn flashpath_luks1_reads_and_writes_through_qemus_luks_driver() {
    if !tools() {
        return;
    }
    let d = Daemon::start("0");
    let file = d.backing_file("luks1.img", 16 * MIB);
    d.uring("f", &file, None);
    let p0 = passphrase(&d, "k0", "qemu secret");
    d.call(
        "bdev_luks_format",
        json!({"base_bdev_name": "f", "key_name": "k0", "type": "luks1", "pbkdf_force_iterations": 1000}),
    );
    d.call("bdev_crypto_create", json!({"base_bdev_name": "f", "name": "c0", "luks_key_name": "k0"}));
    let h = d.call("bdev_luks_get_header", json!({"name": "c0"}));
    assert_eq!(h["type"], "luks1", "{h}");
    let sock = d.controller("luks", "c0", Some(1), false);
    let mut c = BlkClient::open(&sock, 1);
    let data = pattern(43, 0, MIB as usize);
    c.write_all(2 * MIB, &data);
    assert_eq!(c.flush(0), 0);
    drop(c);
    d.call("vhost_delete_controller", json!({"ctrlr": "luks"}));
    d.call("bdev_crypto_delete", json!({"name": "c0"}));

    let secret = format!("secret,id=s0,file={}", p0.display());
    let opts = format!("driver=luks,key-secret=s0,file.driver=file,file.filename={}", file.display());
    let out = d.dir.path().join("plain.raw");
    let st = Command::new("qemu-img")
        .args(["convert", "--object", &secret, "--image-opts", &opts, "-O", "raw"])
        .arg(&out)
        .status()
        .expect("qemu-img");
    assert!(st.success(), "qemu-img convert of flashpath's LUKS1 volume");
    assert_eq!(read_file_at(&out, 2 * MIB, data.len()), data, "QEMU reads what flashpath wrote");

    let st = Command::new("qemu-io")
        .args(["--object", &secret, "--image-opts", &opts, "-c", "write -P 0x5a 4194304 65536"])
        .status()
        .expect("qemu-io");
    assert!(st.success(), "qemu-io write through the luks driver");
    d.call("bdev_crypto_create", json!({"base_bdev_name": "f", "name": "c0", "luks_key_name": "k0"}));
    let sock = d.controller("luks2", "c0", Some(1), false);
    let mut c = BlkClient::open(&sock, 1);
    assert_eq!(c.read_all(4 * MIB, 65536), vec![0x5a; 65536], "flashpath reads what QEMU wrote");
    assert_eq!(c.read_all(2 * MIB, data.len()), data, "and its own data is still there");
}

/// Bad input: a base too small, a base that is not LUKS, a damaged header, unknown options,
/// a key that is not in the keyring. Each refused naming the field, the base unchanged.
#[test]
fn bad_luks_requests_are_refused_naming_the_field() {
    if !tools() {
        return;
    }
    let d = Daemon::start("0");
    passphrase(&d, "k0", "pass");
    let small = d.backing_file("small.img", MIB);
    d.uring("small", &small, None);
    let e = refused(
        d.try_call("bdev_luks_format", json!({"base_bdev_name": "small", "key_name": "k0", "pbkdf": "pbkdf2", "pbkdf_force_iterations": 1000})),
        "a 1 MiB base for LUKS2",
    );
    assert!(e.starts_with("base_bdev_name: "), "{e}");
    assert!(std::fs::read(&small).unwrap().iter().all(|&b| b == 0), "nothing written to a base too small");

    let file = d.backing_file("f.img", 24 * MIB);
    d.uring("f", &file, None);
    let e = refused(
        d.try_call("bdev_crypto_create", json!({"base_bdev_name": "f", "name": "c0", "luks_key_name": "k0"})),
        "opening a base that holds no LUKS volume",
    );
    assert!(e.starts_with("base_bdev_name: "), "{e}");
    for (params, field) in [
        (json!({"type": "luks3"}), "type"),
        (json!({"cipher": "aes-cbc-essiv:sha256"}), "cipher"),
        (json!({"key_size": 384}), "key_size"),
        (json!({"sector_size": 1000}), "sector_size"),
        (json!({"pbkdf": "scrypt"}), "pbkdf"),
        (json!({"type": "luks1", "pbkdf": "argon2id"}), "pbkdf"),
        (json!({"key_name": "nokey"}), "key_name"),
    ] {
        let mut p = json!({"base_bdev_name": "f", "key_name": "k0", "pbkdf_force_iterations": 1000});
        for (k, v) in params.as_object().unwrap() {
            p[k] = v.clone();
        }
        let e = refused(d.try_call("bdev_luks_format", p.clone()), &p.to_string());
        assert!(e.starts_with(&format!("{field}: ")), "{p}: {e}");
    }
    assert!(std::fs::read(&file).unwrap().iter().all(|&b| b == 0), "refused formats wrote nothing");

    // Both header copies damaged: refused naming the base.
    d.call(
        "bdev_luks_format",
        json!({"base_bdev_name": "f", "key_name": "k0", "pbkdf": "pbkdf2", "pbkdf_force_iterations": 1000}),
    );
    let f = std::fs::OpenOptions::new().write(true).open(&file).unwrap();
    f.write_all_at(&[0xff; 64], 200).unwrap();
    f.write_all_at(&[0xff; 64], 16384 + 200).unwrap();
    drop(f);
    let e = refused(
        d.try_call("bdev_crypto_create", json!({"base_bdev_name": "f", "name": "c0", "luks_key_name": "k0"})),
        "a damaged header",
    );
    assert!(e.starts_with("base_bdev_name: "), "{e}");
    let e = refused(d.try_call("bdev_luks_get_header", json!({"base_bdev_name": "f"})), "a damaged header");
    assert!(e.starts_with("base_bdev_name: "), "{e}");
}

/// The job of disk `name` as `bdev_luks_reencrypt_get` shows it.
fn job(d: &Daemon, name: &str) -> Value {
    let jobs = d.call("bdev_luks_reencrypt_get", json!({"name": name}));
    jobs.as_array().and_then(|a| a.first()).cloned().unwrap_or(Value::Null)
}

/// Waits (bounded) until the job of `name` is in `state`; its last view.
fn wait_job(d: &Daemon, name: &str, state: &str) -> Value {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    loop {
        let j = job(d, name);
        if j["state"] == state {
            return j;
        }
        assert!(j["state"] != "failed", "the job failed: {j}");
        assert!(std::time::Instant::now() < deadline, "the job did not reach {state} in 120 s: {j}");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// A LUKS2 disk (40 MiB file: 24 MiB of data at 16 MiB) opened as `c0` with keyring key
/// `k0`, its data filled with pattern 50 through a vhost client; returns the file, the
/// passphrase file and the data.
fn filled_luks2(d: &Daemon) -> (PathBuf, PathBuf, Vec<u8>) {
    let file = d.backing_file("re.img", 40 * MIB);
    d.uring("f", &file, None);
    let p0 = passphrase(d, "k0", "re-encrypt me");
    d.call(
        "bdev_luks_format",
        json!({"base_bdev_name": "f", "key_name": "k0", "pbkdf": "pbkdf2", "pbkdf_force_iterations": 1000}),
    );
    d.call("bdev_crypto_create", json!({"base_bdev_name": "f", "name": "c0", "luks_key_name": "k0"}));
    let data = pattern(50, 0, (24 * MIB) as usize);
    let sock = d.controller("re", "c0", Some(1), false);
    let mut c = BlkClient::open(&sock, 1);
    c.write_all(0, &data);
    assert_eq!(c.flush(0), 0);
    drop(c);
    d.call("vhost_delete_controller", json!({"ctrlr": "re"}));
    (file, p0, data)
}

/// The data area of `file` decrypted with `key` (hex), 4096-byte sectors at 16 MiB.
fn decrypted(file: &Path, key: &str, len: usize) -> Vec<u8> {
    python_xts("dec", key, 4096, 0, &read_file_at(file, 16 * MIB, len))
}

/// Online re-encryption under a verified writer: the job runs while a client overwrites and
/// reads back blocks all over the disk; at the end the header is a plain LUKS2 volume again,
/// cryptsetup opens it with the passphrase, its volume key is a new one, and the whole data
/// area decrypts under it to what the client last wrote.
#[test]
fn online_reencryption_under_a_verified_writer_ends_in_a_volume_cryptsetup_opens() {
    if !tools() {
        return;
    }
    let d = Daemon::start("0");
    let (file, p0, mut data) = filled_luks2(&d);
    let old_key = cryptsetup_volume_key(&file, &p0);
    let sock = d.controller("re", "c0", Some(1), false);
    let mut c = BlkClient::open(&sock, 1);
    d.call(
        "bdev_luks_reencrypt_start",
        json!({"name": "c0", "key_name": "k0", "pbkdf": "pbkdf2", "pbkdf_force_iterations": 1000, "speed_limit": 8}),
    );
    // Writes and reads land before, inside and after the moving boundary until the job ends.
    let mut round = 0u64;
    let mut during = 0;
    loop {
        let state = job(&d, "c0")["state"].clone();
        let at = (round * 7919 % (24 * 16)) * 64 * 1024;
        let piece = pattern(1000 + round, at, 64 << 10);
        c.write_all(at, &piece);
        data[at as usize..at as usize + piece.len()].copy_from_slice(&piece);
        let back_at = (round * 104_729 % (24 * 16)) * 64 * 1024;
        assert_eq!(
            c.read_all(back_at, 64 << 10),
            data[back_at as usize..back_at as usize + (64 << 10)],
            "round {round}"
        );
        round += 1;
        if state == "running" {
            during += 1;
        } else {
            assert_eq!(state, "done", "{}", job(&d, "c0"));
            break;
        }
        assert!(round < 1_000_000, "the job never ended: {}", job(&d, "c0"));
    }
    assert!(during > 0, "no write ran while the job did");
    assert_eq!(c.flush(0), 0);
    assert_eq!(c.read_all(0, data.len()), data, "the disk after the job");
    drop(c);
    d.call("vhost_delete_controller", json!({"ctrlr": "re"}));
    d.call("bdev_crypto_delete", json!({"name": "c0"}));

    let (ok, dump) = cryptsetup(&["luksDump", file.to_str().unwrap()]);
    assert!(ok && !dump.contains("reencrypt"), "a plain LUKS2 volume after the job: {dump}");
    assert!(cryptsetup_opens(&file, &p0, None), "the passphrase opens the new key");
    let new_key = cryptsetup_volume_key(&file, &p0);
    assert_ne!(new_key, old_key, "the volume key changed");
    assert_eq!(decrypted(&file, &new_key, data.len()), data, "the data area under the new key");
}

/// A job paused part way and the daemon killed: the restarted daemon opens the mixed disk,
/// serves it right, resumes from the header's checkpoint and finishes; cryptsetup opens the
/// result. A cancelled job left in the header is resumed the same way on open.
#[test]
fn reencryption_resumes_after_a_kill_and_finishes() {
    if !tools() {
        return;
    }
    let mut d = Daemon::start("0");
    let (file, p0, data) = filled_luks2(&d);
    d.call(
        "bdev_luks_reencrypt_start",
        json!({"name": "c0", "key_name": "k0", "pbkdf": "pbkdf2", "pbkdf_force_iterations": 1000, "speed_limit": 4}),
    );
    // Held between two hotzones, some way in.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while job(&d, "c0")["done_bytes"].as_u64().unwrap_or(0) < 3 * MIB {
        assert!(std::time::Instant::now() < deadline, "no progress: {}", job(&d, "c0"));
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    d.call("bdev_luks_reencrypt_pause", json!({"name": "c0"}));
    std::thread::sleep(std::time::Duration::from_millis(300));
    let held = job(&d, "c0");
    let done = held["done_bytes"].as_u64().unwrap();
    assert!(done > 0 && done < 24 * MIB, "paused part way: {held}");
    d.kill9();
    let (ok, dump) = cryptsetup(&["luksDump", file.to_str().unwrap()]);
    assert!(ok && dump.contains("reencrypt"), "the header records the job: {dump}");

    d.restart();
    d.uring("f", &file, None);
    d.call("keyring_file_add_key", json!({"name": "k0", "path": p0}));
    d.call("bdev_crypto_create", json!({"base_bdev_name": "f", "name": "c0", "luks_key_name": "k0"}));
    let sock = d.controller("re", "c0", Some(1), false);
    let mut c = BlkClient::open(&sock, 1);
    assert_eq!(c.read_all(0, data.len()), data, "the mixed disk after the restart");
    let j = wait_job(&d, "c0", "done");
    assert_eq!(j["done_bytes"], j["total_bytes"], "{j}");
    assert_eq!(c.read_all(0, data.len()), data, "the disk after the resumed job");
    drop(c);
    d.call("vhost_delete_controller", json!({"ctrlr": "re"}));
    d.call("bdev_crypto_delete", json!({"name": "c0"}));
    assert!(cryptsetup_opens(&file, &p0, None), "cryptsetup opens the re-encrypted volume");
    let key = cryptsetup_volume_key(&file, &p0);
    assert_eq!(decrypted(&file, &key, data.len()), data, "the data area under the new key");
}

/// Either tool finishes the other's job: flashpath's job cancelled part way is finished by
/// `cryptsetup reencrypt --resume-only`, and a job `cryptsetup reencrypt --init-only` began is
/// resumed and finished by flashpath when it opens the disk. Both end in volumes whose data
/// decrypts under the new key cryptsetup reads out.
#[test]
fn cryptsetup_and_flashpath_finish_each_others_reencryption() {
    if !tools() {
        return;
    }
    let d = Daemon::start("0");
    let (file, p0, data) = filled_luks2(&d);
    let f = file.to_str().unwrap();
    let k = p0.to_str().unwrap();

    // flashpath's job, cancelled between two hotzones, then cryptsetup's resume.
    d.call(
        "bdev_luks_reencrypt_start",
        json!({"name": "c0", "key_name": "k0", "pbkdf": "pbkdf2", "pbkdf_force_iterations": 1000, "speed_limit": 4}),
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while job(&d, "c0")["done_bytes"].as_u64().unwrap_or(0) < 2 * MIB {
        assert!(std::time::Instant::now() < deadline, "no progress: {}", job(&d, "c0"));
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    d.call("bdev_luks_reencrypt_cancel", json!({"name": "c0"}));
    let j = wait_job(&d, "c0", "cancelled");
    assert!(j["done_bytes"].as_u64().unwrap() < 24 * MIB, "cancelled part way: {j}");
    d.call("bdev_crypto_delete", json!({"name": "c0"}));
    let (ok, t) = cryptsetup(&[
        "reencrypt",
        "--resume-only",
        "--force-offline-reencrypt",
        "--batch-mode",
        "--key-file",
        k,
        f,
    ]);
    assert!(ok, "cryptsetup resumes flashpath's job: {t}");
    let (ok, dump) = cryptsetup(&["luksDump", f]);
    assert!(ok && !dump.contains("reencrypt"), "{dump}");
    let key1 = cryptsetup_volume_key(&file, &p0);
    assert_eq!(
        decrypted(&file, &key1, data.len()),
        data,
        "the data after cryptsetup finished flashpath's job"
    );

    // cryptsetup's job, begun and left, then flashpath's resume at open.
    let (ok, t) = cryptsetup(
        &[
            &["reencrypt", "--init-only", "--resilience", "checksum", "--batch-mode", "--key-file", k],
            FAST_KDF,
            &[f],
        ]
        .concat(),
    );
    assert!(ok, "cryptsetup reencrypt --init-only: {t}");
    d.call("bdev_crypto_create", json!({"base_bdev_name": "f", "name": "c0", "luks_key_name": "k0"}));
    let j = wait_job(&d, "c0", "done");
    assert_eq!(j["done_bytes"], j["total_bytes"], "{j}");
    let sock = d.controller("re2", "c0", Some(1), false);
    let mut c = BlkClient::open(&sock, 1);
    assert_eq!(c.read_all(0, data.len()), data, "flashpath serves the data after finishing cryptsetup's job");
    drop(c);
    d.call("vhost_delete_controller", json!({"ctrlr": "re2"}));
    d.call("bdev_crypto_delete", json!({"name": "c0"}));
    let key2 = cryptsetup_volume_key(&file, &p0);
    assert_ne!(key2, key1, "cryptsetup's job gave a new key");
    assert_eq!(decrypted(&file, &key2, data.len()), data, "the data under the key of cryptsetup's job");
}

/// A configuration file opens a LUKS volume at start: `[[keyring_file_key]]`, the base, and a
/// `[[bdev]]` of type crypto with `luks_key_name`.
#[test]
fn a_configuration_file_opens_a_luks_volume() {
    if !tools() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("cfg.img");
    std::fs::File::create(&file).unwrap().set_len(24 * MIB).unwrap();
    let pass = secret_file(dir.path(), "pass", b"from the config");
    let (ok, t) = cryptsetup(
        &[
            &["luksFormat", "--type", "luks2", "--batch-mode", "--key-file", pass.to_str().unwrap()],
            FAST_KDF,
            &[file.to_str().unwrap()],
        ]
        .concat(),
    );
    assert!(ok, "cryptsetup luksFormat: {t}");
    let (f, p) = (file.clone(), pass.clone());
    let d = Daemon::start_with_config("0", move |_| {
        format!(
            "[[keyring_file_key]]\nname = \"k0\"\npath = \"{}\"\n\n\
             [[bdev]]\ntype = \"uring\"\nname = \"f\"\nfilename = \"{}\"\n\n\
             [[bdev]]\ntype = \"crypto\"\nname = \"c0\"\nbase_bdev_name = \"f\"\nluks_key_name = \"k0\"\n",
            p.display(),
            f.display()
        )
    });
    let h = d.call("bdev_luks_get_header", json!({"name": "c0"}));
    assert_eq!((h["type"].as_str(), h["opened_by"].as_u64()), (Some("luks2"), Some(0)), "{h}");
    let b = &d.call("bdev_get_bdevs", json!({"name": "c0"}))[0];
    assert_eq!(b["num_blocks"].as_u64().unwrap() * b["block_size"].as_u64().unwrap(), 8 * MIB, "{b}");
}

/// A job cryptsetup began on a volume of 512-byte sectors (its checksums in 4096-byte blocks)
/// is switched to sectors at open and finished by flashpath; cryptsetup opens the result.
#[test]
fn flashpath_finishes_cryptsetups_job_on_512_byte_sectors() {
    if !tools() {
        return;
    }
    let d = Daemon::start("0");
    let file = d.backing_file("cs512.img", 24 * MIB);
    let p0 = passphrase(&d, "k0", "five twelve");
    let (f, k) = (file.to_str().unwrap().to_string(), p0.to_str().unwrap().to_string());
    let (ok, t) = cryptsetup(
        &[
            &["luksFormat", "--type", "luks2", "--batch-mode", "--sector-size", "512", "--key-file", &k],
            FAST_KDF,
            &[&f],
        ]
        .concat(),
    );
    assert!(ok, "{t}");
    d.uring("f", &file, None);
    d.call("bdev_crypto_create", json!({"base_bdev_name": "f", "name": "c0", "luks_key_name": "k0"}));
    let sock = d.controller("w", "c0", Some(1), false);
    let mut c = BlkClient::open(&sock, 1);
    let data = pattern(51, 0, (8 * MIB) as usize);
    c.write_all(0, &data);
    assert_eq!(c.flush(0), 0);
    drop(c);
    d.call("vhost_delete_controller", json!({"ctrlr": "w"}));
    d.call("bdev_crypto_delete", json!({"name": "c0"}));
    let (ok, t) = cryptsetup(
        &[
            &["reencrypt", "--init-only", "--resilience", "checksum", "--batch-mode", "--key-file", &k],
            FAST_KDF,
            &[&f],
        ]
        .concat(),
    );
    assert!(ok, "cryptsetup reencrypt --init-only: {t}");
    d.call("bdev_crypto_create", json!({"base_bdev_name": "f", "name": "c0", "luks_key_name": "k0"}));
    wait_job(&d, "c0", "done");
    d.call("bdev_crypto_delete", json!({"name": "c0"}));
    assert!(cryptsetup_opens(&file, &p0, None));
    let key = cryptsetup_volume_key(&file, &p0);
    let stored = read_file_at(&file, 16 * MIB, data.len());
    assert_eq!(python_xts("dec", &key, 512, 0, &stored), data, "the data under the new key");
}
