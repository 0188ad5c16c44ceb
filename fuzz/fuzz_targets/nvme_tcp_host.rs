//! Fuzz the NVMe/TCP host's receive path (`fp_nvme::tcp`): an I/O queue with four commands in
//! flight (a 4 KiB read, an 8 KiB write, a Flush, a 1 KiB read in two iovecs, every buffer
//! between guard bytes) fed the input as the controller's byte stream over a socket pair, in
//! pieces between polls.
//!
//! Input encoding:
//!
//! | bytes | meaning |
//! |---|---|
//! | 1 | setup: bit 0 header digests, bit 1 data digests, bit 2 no in-capsule data (the write goes by R2T), bit 3 MAXH2CDATA 8 KiB (else 4 KiB), bits 7:4 the first piece's size |
//!
//! then the stream: PDUs as a controller would send them (CapsuleResp, C2HData, R2T,
//! C2HTermReq), or anything. The input's end is the connection's end.
//!
//! Checked (by `fp_nvme::tcp::fuzz::receive_path`): no panic; no byte written outside the
//! commands' buffers; a queue that failed stays failed; every command either completes once or
//! is given back once by drain.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = fp_nvme::tcp::fuzz::receive_path(data);
});
