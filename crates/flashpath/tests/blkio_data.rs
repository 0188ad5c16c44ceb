//! Data-path correctness through libblkio: random writes verified by reads over 1, 2 and 4
//! queues on a RAM disk and a file disk; flush; discard and write-zeroes.

mod common;

use std::time::Duration;

use common::{assert_same, bounded, pattern, random_write_verify, BlkClient, Daemon};

const DISK: u64 = 16 << 20;

#[derive(Clone, Copy, Debug)]
enum Disk {
    Ram,
    File,
}

/// Creates bdev `d0` of `DISK` bytes with `block_size`-byte blocks.
fn make_disk(daemon: &Daemon, kind: Disk, block_size: u32) {
    match kind {
        Disk::Ram => daemon.malloc("d0", DISK / u64::from(block_size), block_size),
        Disk::File => {
            let f = daemon.backing_file("d0.img", DISK);
            daemon.uring("d0", &f, Some(block_size));
        }
    }
}

fn random_io(kind: Disk, block_size: u32, queues: u16, cpus: &str, seed: u64) {
    let mut daemon = Daemon::start(cpus);
    make_disk(&daemon, kind, block_size);
    let sock = daemon.controller("vhost.0", "d0", Some(queues), false);
    let compared = bounded(Duration::from_secs(180), "random io", move || {
        let mut c = BlkClient::open(&sock, queues as usize);
        assert_eq!(c.capacity, DISK, "capacity seen by libblkio");
        assert_eq!(c.block_size, block_size as usize, "request-alignment seen by libblkio");
        assert_eq!(c.max_queues, queues as usize, "max-queues seen by libblkio");
        assert_eq!(c.num_queues(), queues as usize);
        // Both backends start out reading zeroes (fresh anonymous memory, a sparse file).
        random_write_verify(&mut c, seed, 10, 0, DISK, Some(0))
    });
    assert!(compared >= DISK, "only {compared} bytes were compared");
    daemon.assert_alive();
}

#[test]
fn ram_random_write_verify_1_queue() {
    random_io(Disk::Ram, 512, 1, "0", 1);
}

#[test]
fn ram_random_write_verify_2_queues_4k_blocks() {
    random_io(Disk::Ram, 4096, 2, "0", 2);
}

#[test]
fn ram_random_write_verify_4_queues_2_cores() {
    random_io(Disk::Ram, 512, 4, "0,1", 4);
}

#[test]
fn file_random_write_verify_1_queue() {
    random_io(Disk::File, 512, 1, "0", 11);
}

#[test]
fn file_random_write_verify_2_queues_4k_blocks() {
    random_io(Disk::File, 4096, 2, "0,1", 12);
}

#[test]
fn file_random_write_verify_4_queues_2_cores() {
    random_io(Disk::File, 512, 4, "0,1", 14);
}

#[test]
fn flush_succeeds_and_file_writes_reach_the_backing_file() {
    let mut daemon = Daemon::start("0");
    let file = daemon.backing_file("f.img", DISK);
    daemon.uring("file0", &file, None);
    daemon.malloc("ram0", 2048, 512);
    let fsock = daemon.controller("vf", "file0", Some(2), false);
    let rsock = daemon.controller("vr", "ram0", Some(1), false);
    let extents: Vec<(u64, usize)> = vec![(0, 4096), (1 << 20, 65536), (DISK - 8192, 8192), (3 * 512, 512)];
    let written = extents.clone();
    bounded(Duration::from_secs(60), "flush", move || {
        let mut c = BlkClient::open(&fsock, 2);
        for (i, &(off, len)) in written.iter().enumerate() {
            assert_eq!(c.write(i % 2, off, &pattern(7, off, len)), 0, "write at {off}");
        }
        assert_eq!(c.flush(0), 0, "flush on queue 0");
        assert_eq!(c.flush(1), 0, "flush on queue 1");
        let mut r = BlkClient::open(&rsock, 1);
        assert_eq!(r.write(0, 0, &pattern(8, 0, 512)), 0);
        assert_eq!(r.flush(0), 0, "flush on the RAM disk");
    });
    // After a completed flush the data is in the file, whatever caching the backend uses.
    let contents = std::fs::read(&file).expect("reading the backing file");
    assert_eq!(contents.len() as u64, DISK, "the backing file changed size");
    for (off, len) in extents {
        let got = &contents[off as usize..off as usize + len];
        assert_same("backing file after flush", off, got, &pattern(7, off, len));
    }
    assert!(contents[4096..8192].iter().all(|&b| b == 0), "bytes never written are not zero");
    daemon.assert_alive();
}

/// Writes a pattern over 512 KiB, zeroes parts of it with write-zeroes (with and without
/// unmap) and discard, and checks exactly those parts read back as zeroes.
fn zeroing(kind: Disk) {
    let mut daemon = Daemon::start("0");
    make_disk(&daemon, kind, 512);
    let sock = daemon.controller("vhost.0", "d0", Some(1), false);
    bounded(Duration::from_secs(60), "zeroing", move || {
        let mut c = BlkClient::open(&sock, 1);
        let b = c.blkio();
        let max_wz = b.get_u64("max-write-zeroes-len").expect("max-write-zeroes-len");
        let max_discard = b.get_u64("max-discard-len").expect("max-discard-len");
        assert!(max_wz >= 64 << 10, "write-zeroes not offered or tiny: max {max_wz}");
        assert!(max_discard >= 64 << 10, "discard not offered or tiny: max {max_discard}");

        let base = 1 << 20;
        let len = 512 << 10;
        let data = pattern(21, base, len);
        c.write_all(base, &data);
        // (offset within the range, length, operation)
        let wz_keep = (64 << 10, 96 << 10);
        let wz_unmap = (200 << 10, 8 << 10);
        let discard = (300 << 10, 64 << 10);
        let odd = (400 << 10, 512); // a single block
        assert_eq!(c.write_zeroes(0, base + wz_keep.0, wz_keep.1, false), 0, "write-zeroes (no unmap)");
        assert_eq!(c.write_zeroes(0, base + wz_unmap.0, wz_unmap.1, true), 0, "write-zeroes (unmap)");
        assert_eq!(c.discard(0, base + discard.0, discard.1), 0, "discard");
        assert_eq!(c.write_zeroes(0, base + odd.0, odd.1, false), 0, "one-block write-zeroes");

        let mut want = data.clone();
        for (o, l) in [wz_keep, wz_unmap, discard, odd] {
            want[o as usize..o as usize + l].fill(0);
        }
        let got = c.read_all(base, len);
        assert_same("after write-zeroes/discard", base, &got, &want);

        // The zeroed ranges are writable again.
        let again = pattern(22, base + discard.0, discard.1);
        assert_eq!(c.write(0, base + discard.0, &again), 0);
        assert_eq!(c.read(0, base + discard.0, discard.1).expect("read"), again);
    });
    daemon.assert_alive();
}

/// The RAM backend documents that discarded and write-zeroed ranges read back as zeroes.
#[test]
fn ram_discard_and_write_zeroes_read_back_zeroes() {
    zeroing(Disk::Ram);
}

/// The file backend punches holes (discard) and zeroes ranges (write-zeroes) in a regular file;
/// both read back as zeroes on Linux filesystems.
#[test]
fn file_discard_and_write_zeroes_read_back_zeroes() {
    zeroing(Disk::File);
}
