//! The host's side of the guest's `migrate` scenario (tests/guest/init): its console commands
//! (`check N`, `resume N`, `done`), the results it prints, and the same check of stamped blocks
//! done from the host on a backing file.
//!
//! A stamped block (`fpio stamp-write`, tests/guest/fpio.c) is 4 KiB of
//! [`crate::common::pattern`]`(seq, block offset)` whose first four words are replaced by a
//! magic, the block index, `seq` and `!seq`; a block never written is zeroes (seq 0). Each
//! writer's `stamp-verify` line carries a digest over its blocks' seqs (FNV-1a, 8 little-endian
//! bytes each, in block order), which [`disk_digest`] computes from a file.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::{Vm, VmConfig, RESULT_MARKER};

pub const BLOCK: u64 = 4096;
const MAGIC: u64 = 0x4b4c_4247_4d49_5046;
/// How long the guest gets to stop its writers and re-read the disk.
const CHECK_TIMEOUT: Duration = Duration::from_secs(60);
/// Guest RAM, all of which each migration copies: about the least the image boots in. The
/// kernel needs room for the initramfs twice over while it unpacks it: with 256 MiB it could
/// not unpack the 86 MiB one, and 320 MiB stopped being enough for the 90 MiB one that has
/// nvme-cli ("Initramfs unpacking failed: write error", then no writable /tmp).
pub const GUEST_MIB: u32 = 384;
/// How long the writers run before a migration starts, and on the destination before a check.
pub const WRITE_PHASE: Duration = Duration::from_millis(1500);
/// A bound on a whole chain for each VM (QEMU's start to the guest's result).
pub const VM_TIMEOUT: Duration = Duration::from_secs(400);

/// A VM of a migration chain: the `migrate` scenario on one disk (found in the guest by
/// `serial`), with QMP and console input; a destination when `incoming`. Every VM of a chain
/// gets the same kernel line and devices, as QEMU requires of source and destination.
pub fn vm_config(name: &str, socket: PathBuf, serial: &str, incoming: bool) -> VmConfig {
    VmConfig {
        name: Some(name.into()),
        mem_mib: GUEST_MIB,
        kernel_args: vec![format!("fp.disk={serial}")],
        timeout: VM_TIMEOUT,
        qmp: true,
        incoming,
        console_input: true,
        ..VmConfig::new("migrate", vec![socket])
    }
}

/// Lets the writers run for [`WRITE_PHASE`], then checks the disk from the guest (`check n`)
/// and from the host (the file `image` returns, read while the writers stand still), and starts
/// the writers again (`resume n`).
pub fn check_and_resume(vm: &mut Vm, n: u32, what: &str, image: impl FnOnce() -> PathBuf) -> Vec<StampCheck> {
    std::thread::sleep(WRITE_PHASE);
    let checks = check(vm, n);
    assert_image_matches(&image(), &checks, what);
    resume(vm, n);
    checks
}

/// One writer's `stamp-verify` line at a check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StampCheck {
    pub writer: u32,
    /// The writer's blocks: [first, first + count).
    pub first: u64,
    pub count: u64,
    /// Blocks that hold a stamp.
    pub written: u64,
    /// Acknowledged writes since the boot.
    pub writes: u64,
    /// Blocks of the write in flight at the stop that hold its new stamp (0 after a clean stop).
    pub newer: u64,
    pub digest: u64,
}

/// The `key=value` words of a line.
fn field<'a>(line: &'a str, key: &str) -> &'a str {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(key).and_then(|r| r.strip_prefix('=')))
        .unwrap_or_else(|| panic!("no {key}= in the guest's line: {line}"))
}

fn num(line: &str, key: &str) -> u64 {
    let v = field(line, key);
    v.parse().unwrap_or_else(|_| panic!("{key}={v} is not a number in: {line}"))
}

/// Panics (printing the console on drop) if `line` is the guest's result line.
fn not_a_result(vm: &Vm, line: &str, waiting_for: &str) {
    assert!(
        !line.contains(RESULT_MARKER),
        "guest '{}' ended while the host waited for {waiting_for}: {line}",
        vm.name()
    );
}

/// Waits for the guest's `mig writing N`.
pub fn wait_writing(vm: &mut Vm, n: u32) {
    let want = format!("mig writing {n}");
    let line = vm.wait_for(&want, |l| l.ends_with(&want) || l.contains(RESULT_MARKER), CHECK_TIMEOUT);
    not_a_result(vm, &line, &want);
}

/// `check N`: the guest stops its writers and re-reads every block. Returns each writer's
/// result; panics if the guest found a block that is not its last acknowledged stamp (its
/// FAIL line says which) or a writer wrote nothing since the last check.
pub fn check(vm: &mut Vm, n: u32) -> Vec<StampCheck> {
    vm.send_line(&format!("check {n}"));
    let (wrote_p, check_p, done) =
        (format!("mig wrote {n} w"), format!("mig check {n} w"), format!("mig checked {n}"));
    let mut lines = Vec::new();
    let last = vm.wait_for(
        &done,
        |l| {
            if l.contains(&wrote_p) || l.contains(&check_p) {
                lines.push(l.to_string());
            }
            l.ends_with(&done) || l.contains(RESULT_MARKER)
        },
        CHECK_TIMEOUT,
    );
    not_a_result(vm, &last, &done);
    let mut checks = Vec::new();
    for l in &lines {
        if l.contains(&wrote_p) {
            // "stamp-write first=F count=C seqs=A..B writes=W": this phase's seqs.
            let seqs = field(l, "seqs");
            let (a, b) = seqs.split_once("..").unwrap_or_else(|| panic!("bad seqs= in {l}"));
            let (a, b): (u64, u64) = (a.parse().unwrap(), b.parse().unwrap());
            assert!(b >= a, "check {n}: a writer wrote nothing since the last check: {l}");
        } else {
            let i = l.find(&check_p).expect("kept above");
            let writer = l[i + check_p.len()..].split_whitespace().next().and_then(|w| w.parse().ok());
            checks.push(StampCheck {
                writer: writer.unwrap_or_else(|| panic!("bad writer in {l}")),
                first: num(l, "first"),
                count: num(l, "count"),
                written: num(l, "written"),
                writes: num(l, "writes"),
                newer: num(l, "newer"),
                digest: u64::from_str_radix(field(l, "digest"), 16)
                    .unwrap_or_else(|_| panic!("bad digest in {l}")),
            });
        }
    }
    assert_eq!(checks.len(), 2, "check {n}: expected both writers' lines, got {lines:?}");
    eprintln!(
        "check {n} on {}: {}",
        vm.name(),
        checks
            .iter()
            .map(|c| format!(
                "writer {}: {} writes, {} of {} blocks stamped",
                c.writer, c.writes, c.written, c.count
            ))
            .collect::<Vec<_>>()
            .join("; ")
    );
    checks
}

/// `resume N`: the writers start again.
pub fn resume(vm: &mut Vm, n: u32) {
    vm.send_line(&format!("resume {n}"));
    wait_writing(vm, n);
}

/// `done`: the guest passes and powers off.
pub fn done(vm: &mut Vm) {
    vm.send_line("done");
    let r = vm.wait_result();
    assert!(r.passed, "guest '{}' failed: {}", vm.name(), r.detail);
    vm.wait_exit(super::EXIT_TIMEOUT);
}

/// Block `block` stamped with `seq` (0: zeroes), as fpio writes it.
pub fn stamped_block(block: u64, seq: u64) -> Vec<u8> {
    if seq == 0 {
        return vec![0; BLOCK as usize];
    }
    let mut b = crate::common::pattern(seq, block * BLOCK, BLOCK as usize);
    for (i, w) in [MAGIC, block, seq, !seq].into_iter().enumerate() {
        b[8 * i..8 * i + 8].copy_from_slice(&w.to_le_bytes());
    }
    b
}

/// The digest of blocks [first, first + count) of `image` (a file, or a disk read out to one),
/// checking that every block is a whole stamp of its own index or zeroes.
pub fn disk_digest(image: &Path, first: u64, count: u64) -> u64 {
    let f = File::open(image).unwrap_or_else(|e| panic!("opening {}: {e}", image.display()));
    let mut buf = vec![0u8; BLOCK as usize];
    let mut digest: u64 = 0xcbf2_9ce4_8422_2325;
    for block in first..first + count {
        f.read_exact_at(&mut buf, block * BLOCK)
            .unwrap_or_else(|e| panic!("reading block {block} of {}: {e}", image.display()));
        let seq = if u64::from_le_bytes(buf[..8].try_into().unwrap()) == MAGIC {
            u64::from_le_bytes(buf[16..24].try_into().unwrap())
        } else {
            0
        };
        assert!(
            buf == stamped_block(block, seq),
            "block {block} of {} is neither zeroes nor a whole stamp of itself (seq {seq})",
            image.display()
        );
        for byte in seq.to_le_bytes() {
            digest = (digest ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3);
        }
    }
    digest
}

/// Asserts that `image` holds exactly what the guest found at a check: per writer, the same
/// digest over the same blocks.
pub fn assert_image_matches(image: &Path, checks: &[StampCheck], what: &str) {
    for c in checks {
        let got = disk_digest(image, c.first, c.count);
        assert_eq!(
            got,
            c.digest,
            "{what}: {} blocks [{}, +{}) (writer {}) differ from what the guest verified",
            image.display(),
            c.first,
            c.count,
            c.writer
        );
    }
}
