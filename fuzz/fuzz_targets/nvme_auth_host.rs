//! Fuzz the NVMe/TCP host's side of a DH-HMAC-CHAP transaction (`fp_nvme::tcp`'s
//! `HostTransaction`, which every queue runs at its Connect and the admin queue again after
//! `bdev_nvme_set_keys`) with arbitrary controller messages.
//!
//! Input encoding:
//!
//! | bytes | meaning |
//! |---|---|
//! | 1 | bit 0: the host asks the controller to authenticate itself (a controller key) |
//! | 2 | the Challenge's length, little-endian (cut to what follows) |
//!
//! then the DH-HMAC-CHAP_Challenge as the controller would answer the host's AUTH_Negotiate
//! (T_ID 7; the host offers every hash, the null group and ffdhe2048), then the rest as the
//! DH-HMAC-CHAP_Success1 (or AUTH_Failure1) answering the host's Reply.
//!
//! Checked (by `fp_nvme::tcp::fuzz::auth_host`): no panic; every message the host sends parses,
//! is of its transaction and fits an Authentication Receive buffer; a refusal tells the
//! controller why (AUTH_Failure2) unless the controller refused first.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    fp_nvme::tcp::fuzz::auth_host(data);
});
