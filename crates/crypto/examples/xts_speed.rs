//! AES-XTS throughput of the crypto bdev's cipher on one core, for `bench.py --only crypto`,
//! which compares it with `openssl speed -evp aes-256-xts` (docs/crypto.md#performance).
//!
//! `xts_speed [--bytes N[,N...]] [--seconds S] [--key-bits 256|512] [--engine rust]` encrypts
//! and then decrypts
//! one buffer of N bytes (a whole number of data units of `--unit` bytes, 512 or 4096, default
//! the smaller of N and 4096) over and over for S seconds each, and prints one JSON line per
//! operation and size: `{"engine":"openssl","op":"encrypt","bytes":4096,"unit":4096,
//! "key_bits":512,"bytes_per_sec":…,"ns_per_buffer":…,"bytes_per_cpu_sec":…}` (per wall-clock
//! second, as `openssl speed -elapsed` counts, and per second of this process's CPU time, as
//! `openssl speed` counts by default). The engine is the one the crypto bdev's
//! channels use on this host (OpenSSL's when libcrypto is there), or `--engine rust`, the `aes`
//! crate's.

use std::time::Instant;

use std::sync::Arc;

use fp_crypto::{CryptoKey, XtsEngine};

fn arg<'a>(args: &'a [String], name: &str) -> Option<&'a str> {
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).map(String::as_str)
}

/// This process's CPU time in seconds (user and system): what `openssl speed` counts unless
/// given `-elapsed`, so a busy machine does not lower either figure.
fn cpu_seconds() -> f64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: a valid clock id and a timespec to fill.
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let sizes: Vec<usize> = arg(&args, "--bytes")
        .unwrap_or("512,4096,16384")
        .split(',')
        .map(|s| s.parse().expect("--bytes: a list of sizes in bytes"))
        .collect();
    let seconds: f64 = arg(&args, "--seconds").map_or(2.0, |s| s.parse().expect("--seconds: a number"));
    let bits: usize = arg(&args, "--key-bits").map_or(512, |s| s.parse().expect("--key-bits: 256 or 512"));
    let half: Vec<u8> = (0..bits / 16).map(|i| i as u8).collect();
    let half2: Vec<u8> = half.iter().map(|b| b ^ 0x5a).collect();
    let key = Arc::new(CryptoKey::new("speed", &half, &half2).expect("--key-bits: 256 or 512"));
    let mut xts = match arg(&args, "--engine") {
        Some("rust") => XtsEngine::rust(key),
        None | Some("openssl") => XtsEngine::new(key),
        Some(other) => panic!("--engine: {other} is not rust or openssl"),
    };
    let engine = xts.name();
    for &bytes in &sizes {
        let unit: usize =
            arg(&args, "--unit").map_or(bytes.min(4096), |s| s.parse().expect("--unit: 512 or 4096"));
        assert!(
            bytes % unit == 0 && (unit == 512 || unit == 4096),
            "--bytes {bytes} is not whole units of {unit}"
        );
        let mut buf = vec![0xa5u8; bytes];
        for op in ["encrypt", "decrypt"] {
            let start = Instant::now();
            let cpu_start = cpu_seconds();
            let mut rounds = 0u64;
            while start.elapsed().as_secs_f64() < seconds {
                for r in 0..256u64 {
                    let first = (rounds + r) * (bytes / 512) as u64;
                    for (k, u) in buf.chunks_exact_mut(unit).enumerate() {
                        let sector = first + (k * unit / 512) as u64;
                        if op == "encrypt" {
                            xts.encrypt(u, sector);
                        } else {
                            xts.decrypt(u, sector);
                        }
                    }
                }
                rounds += 256;
            }
            let secs = start.elapsed().as_secs_f64();
            let cpu = cpu_seconds() - cpu_start;
            println!(
                "{{\"engine\":\"{engine}\",\"op\":\"{op}\",\"bytes\":{bytes},\"unit\":{unit},\"key_bits\":{bits},\"bytes_per_sec\":{:.0},\"ns_per_buffer\":{:.1},\"bytes_per_cpu_sec\":{:.0}}}",
                rounds as f64 * bytes as f64 / secs,
                secs * 1e9 / rounds as f64,
                rounds as f64 * bytes as f64 / cpu
            );
        }
    }
}
