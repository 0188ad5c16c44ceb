//! A new key slot's KDF parameters: the caller's, or cryptsetup's defaults measured on this
//! host (its `--iter-time`): Argon2id with up to 1 GiB and 4 lanes for LUKS2, PBKDF2-SHA256 for
//! LUKS1 (the only KDF it has), each made to take `iter_time` milliseconds here.

use std::time::{Duration, Instant};

use fp_bdev::BdevError;
use fp_luks::{Kdf, Version};
use fp_rpc::{ParamError, Params};

use crate::keys::invalid;

/// The most PBKDF2 iterations a slot may ask of this daemon (about a minute of one core):
/// cryptsetup accepts up to 2^32 - 1, which a hostile header uses to hold the RPC thread for
/// hours.
const MAX_PBKDF2_ITERATIONS: u32 = 100_000_000;
/// The most Argon2 passes a slot may ask (cryptsetup's benchmark gives tens at most).
const MAX_ARGON2_TIME: u32 = 1000;

/// cryptsetup's `--iter-time` default.
pub const DEFAULT_ITER_TIME_MS: u64 = 2000;
/// cryptsetup's Argon2 memory default and ceiling (KiB), held to half the host's memory.
const ARGON2_MEMORY_KIB: u64 = 1 << 20;
/// cryptsetup's Argon2 lane default, held to the host's CPUs.
const ARGON2_LANES: u32 = 4;
/// cryptsetup's smallest Argon2 time cost and PBKDF2 iteration count.
const ARGON2_MIN_TIME: u32 = 4;
const PBKDF2_MIN_ITERATIONS: u32 = 1000;
/// PBKDF2 iterations timed to measure the host's speed.
const PBKDF2_PROBE: u32 = 1 << 16;

/// The KDF parameters of a request (cryptsetup's options by their long names): `pbkdf`
/// (`argon2id`, `argon2i`, `pbkdf2`), `hash` (PBKDF2's), `pbkdf_force_iterations` (PBKDF2's
/// iterations or Argon2's time cost), `pbkdf_memory` (KiB), `pbkdf_parallel`, `iter_time` (ms,
/// used when no count is forced).
pub(crate) struct KdfRequest {
    pbkdf: Option<String>,
    hash: Option<String>,
    iterations: Option<u32>,
    memory_kib: Option<u32>,
    parallel: Option<u32>,
    iter_time_ms: u64,
}

impl KdfRequest {
    /// Takes the KDF parameters out of `p`.
    pub fn take(p: &mut Params) -> Result<KdfRequest, ParamError> {
        Ok(KdfRequest {
            pbkdf: p.optional_str("pbkdf")?,
            hash: p.optional_str("hash")?,
            iterations: p.optional_uint("pbkdf_force_iterations", u64::from(u32::MAX))?.map(|v| v as u32),
            memory_kib: p.optional_uint("pbkdf_memory", 4 << 20)?.map(|v| v as u32),
            parallel: p.optional_uint("pbkdf_parallel", 16)?.map(|v| v as u32),
            iter_time_ms: p.optional_uint("iter_time", 60_000)?.unwrap_or(DEFAULT_ITER_TIME_MS),
        })
    }

    /// The KDF for a new slot of a `version` volume, measured here when no count was forced.
    pub fn resolve(&self, version: Version) -> Result<Kdf, BdevError> {
        let default = match version {
            Version::Luks1 => "pbkdf2",
            Version::Luks2 => "argon2id",
        };
        let name = self.pbkdf.as_deref().unwrap_or(default);
        let target = Duration::from_millis(self.iter_time_ms.max(1));
        match name {
            "pbkdf2" => {
                let hash = self.hash.clone().unwrap_or_else(|| "sha256".into());
                if !matches!(hash.as_str(), "sha1" | "sha256" | "sha512") {
                    return Err(invalid("hash", format!("'{hash}': sha1, sha256 or sha512")));
                }
                let iterations = match self.iterations {
                    Some(n) => n.max(1),
                    None => {
                        let probe = Kdf::Pbkdf2 { hash: hash.clone(), iterations: PBKDF2_PROBE };
                        let took = time_kdf(&probe)?;
                        scale(PBKDF2_PROBE, took, target).max(PBKDF2_MIN_ITERATIONS)
                    }
                };
                Ok(Kdf::Pbkdf2 { hash, iterations })
            }
            "argon2id" | "argon2i" if version == Version::Luks1 => {
                Err(invalid("pbkdf", "LUKS1 key slots take pbkdf2 only"))
            }
            "argon2id" | "argon2i" => {
                if self.hash.is_some() {
                    return Err(invalid("hash", "only for pbkdf2"));
                }
                let memory_kib = self.memory_kib.unwrap_or_else(default_memory_kib).max(8);
                let cpus = std::thread::available_parallelism().map_or(1, |n| n.get() as u32);
                let parallel = self.parallel.unwrap_or(ARGON2_LANES.min(cpus)).max(1);
                let id = name == "argon2id";
                let time = match self.iterations {
                    Some(t) => t.max(1),
                    None => {
                        let probe = Kdf::Argon2 { id, time: ARGON2_MIN_TIME, memory_kib, parallel };
                        let took = time_kdf(&probe)?;
                        scale(ARGON2_MIN_TIME, took, target).max(ARGON2_MIN_TIME)
                    }
                };
                Ok(Kdf::Argon2 { id, time, memory_kib, parallel })
            }
            other => {
                Err(invalid("pbkdf", format!("'{}': argon2id, argon2i or pbkdf2", other.escape_debug())))
            }
        }
    }
}

/// cryptsetup's memory default: 1 GiB, or half the host's memory if that is less.
fn default_memory_kib() -> u32 {
    let half = total_memory_kib().map_or(ARGON2_MEMORY_KIB, |kib| kib / 2);
    half.min(ARGON2_MEMORY_KIB) as u32
}

/// Why this daemon will not run `kdf` to open a slot: more than [`MAX_PBKDF2_ITERATIONS`] or
/// [`MAX_ARGON2_TIME`], or Argon2 memory beyond half the host's (an allocation that would
/// push the daemon, and every disk it serves, out of memory). `None` when it may.
pub(crate) fn too_costly(kdf: &Kdf) -> Option<String> {
    match kdf {
        Kdf::Pbkdf2 { iterations, .. } if *iterations > MAX_PBKDF2_ITERATIONS => {
            Some(format!("{iterations} PBKDF2 iterations (at most {MAX_PBKDF2_ITERATIONS} are run here)"))
        }
        Kdf::Argon2 { time, .. } if *time > MAX_ARGON2_TIME => {
            Some(format!("an Argon2 time cost of {time} (at most {MAX_ARGON2_TIME} is run here)"))
        }
        Kdf::Argon2 { memory_kib, .. } => {
            let half = total_memory_kib().map_or(u64::MAX, |kib| kib / 2);
            (u64::from(*memory_kib) > half)
                .then(|| format!("{memory_kib} KiB of Argon2 memory, more than half this host's"))
        }
        Kdf::Pbkdf2 { .. } => None,
    }
}

/// `MemTotal` of /proc/meminfo, in KiB.
fn total_memory_kib() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// How long one derivation with `kdf` takes here.
fn time_kdf(kdf: &Kdf) -> Result<Duration, BdevError> {
    let mut out = [0u8; 32];
    let start = Instant::now();
    fp_luks::derive_into(kdf, b"flashpath kdf benchmark", &[0x5a; 32], &mut out)
        .map_err(|e| invalid("pbkdf", format!("cannot run the KDF: {e}")))?;
    Ok(start.elapsed())
}

/// The count that takes `target` when `count` took `took`.
fn scale(count: u32, took: Duration, target: Duration) -> u32 {
    let per = took.as_secs_f64().max(1e-9) / f64::from(count);
    (target.as_secs_f64() / per).round().min(f64::from(u32::MAX)) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_scale_with_the_time_asked() {
        assert_eq!(scale(1000, Duration::from_millis(10), Duration::from_millis(100)), 10_000);
        assert_eq!(scale(4, Duration::from_secs(4), Duration::from_secs(2)), 2);
        // A run too short to time counts as a nanosecond: a large count, never a division by zero.
        assert_eq!(scale(1, Duration::ZERO, Duration::from_secs(1)), 1_000_000_000);
        assert_eq!(scale(10, Duration::ZERO, Duration::from_secs(10)), u32::MAX);
    }

    #[test]
    fn slots_beyond_the_bounds_are_not_run() {
        let pbkdf2 = |iterations| Kdf::Pbkdf2 { hash: "sha256".into(), iterations };
        let argon2 = |time, memory_kib| Kdf::Argon2 { id: true, time, memory_kib, parallel: 4 };
        assert_eq!(too_costly(&pbkdf2(2_000_000)), None);
        assert!(too_costly(&pbkdf2(u32::MAX)).is_some_and(|e| e.contains("PBKDF2 iterations")));
        assert_eq!(too_costly(&argon2(4, 1 << 20)), None, "cryptsetup's default on a host of 2 GiB or more");
        assert!(too_costly(&argon2(5000, 1024)).is_some_and(|e| e.contains("time cost")));
        assert!(too_costly(&argon2(4, u32::MAX)).is_some_and(|e| e.contains("memory")));
    }
}
