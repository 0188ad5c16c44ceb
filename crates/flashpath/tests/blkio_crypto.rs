//! The crypto bdev end to end: a vhost-user client writes through a crypto bdev over a file
//! disk; Python's `cryptography` (an independent AES-XTS, dm-crypt's aes-xts-plain64 format)
//! decrypts the file, and what Python encrypts into the file reads back through the daemon.

mod common;

use std::os::unix::fs::FileExt;
use std::time::Duration;

use common::{bounded, pattern, BlkClient, Daemon};
use serde_json::json;

const DISK: u64 = 4 << 20;
const K1: &str = "603deb1015ca71be2b73aef0857d77811f352c073b6108d72d9810a30914dff4";
const K2: &str = "0f1e2d3c4b5a69788796a5b4c3d2e1f000112233445566778899aabbccddeeff";

/// dm-crypt's aes-xts-plain64 (Python's) with this file's key.
fn python_xts(mode: &str, unit: usize, first: u64, data: &[u8]) -> Vec<u8> {
    common::xts::python_xts(mode, &format!("{K1}{K2}"), unit, first, data)
}

fn crypto_over_a_file(block_size: u32) {
    let mut d = Daemon::start("0");
    let file = d.backing_file("base.img", DISK);
    d.uring("base", &file, Some(block_size));
    d.call("accel_crypto_key_create", json!({"cipher": "AES_XTS", "key": K1, "key2": K2, "name": "k"}));
    d.call("bdev_crypto_create", json!({"base_bdev_name": "base", "name": "c0", "key_name": "k"}));
    let sock = d.controller("vhost.0", "c0", Some(1), false);
    let bs = block_size as usize;
    let (at, len) = (5 * bs as u64, 40 * bs);
    let data = pattern(7, at, len);
    let written = data.clone();
    let (theirs_at, theirs) = (100 * bs as u64, pattern(9, 0, 16 * bs));
    let cipher = python_xts("enc", bs, theirs_at / 512, &theirs);
    let f = file.clone();
    let back = bounded(Duration::from_secs(120), "crypto i/o", move || {
        let mut c = BlkClient::open(&sock, 1);
        c.write_all(at, &written);
        assert_eq!(c.flush(0), 0);
        assert_eq!(c.read_all(at, written.len()), written, "read back through the crypto bdev");
        // Python's ciphertext, put in the file behind the daemon, reads back as plaintext.
        std::fs::File::options().write(true).open(&f).unwrap().write_all_at(&cipher, theirs_at).unwrap();
        c.read_all(theirs_at, 16 * bs)
    });
    assert!(back == theirs, "{block_size}: Python's ciphertext read through flashpath differs");
    let mut stored = vec![0u8; len];
    std::fs::File::open(&file).unwrap().read_exact_at(&mut stored, at).unwrap();
    assert!(stored != data, "the file holds plaintext");
    assert!(
        python_xts("dec", bs, at / 512, &stored) == data,
        "{block_size}: Python decrypts what flashpath wrote"
    );
    d.assert_alive();
}

#[test]
fn crypto_512_byte_blocks_match_python() {
    crypto_over_a_file(512);
}

#[test]
fn crypto_4096_byte_blocks_match_python() {
    crypto_over_a_file(4096);
}
