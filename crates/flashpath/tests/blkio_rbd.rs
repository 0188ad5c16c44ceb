//! The rbd module end to end (issue 13): a real one-monitor, one-OSD Ceph cluster
//! (common/ceph.rs), a daemon, and libblkio as the VM.
//!
//! * the data path on 2 queues: random writes verified by reads, vectored requests, flush,
//!   discard, write-zeroes, and an online resize that `rbd info` and a reconnected client see;
//! * the image is the disk: what `rbd import` wrote reads back through flashpath, what flashpath
//!   wrote comes back from `rbd export`;
//! * the RPC methods' shapes and errors, and a cluster whose monitor never answers;
//! * the fault: a stopped OSD makes rbd requests fail with an I/O error after
//!   `rados_osd_op_timeout` while a RAM disk on the same reactors keeps its pace and RPCs answer;
//!   a continued OSD serves again, with the data from before intact.
//!
//! Each test has a cluster of its own (about 2 s to start): the fault test stops its OSD, and
//! the others must not depend on the order they run in.

mod common;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::ceph::CephCluster;
use common::{assert_same, bounded, pattern, random_write_verify, BlkClient, Daemon, Op, OpKind};
use serde_json::{json, Value};

const MIB: u64 = 1 << 20;
const IMAGE_MIB: u64 = 32;
const CLUSTER: &str = "c0";
/// librbd's default object size: a discard of a whole object removes it.
const OBJECT: u64 = 4 * MIB;

/// The cluster, or `None` when the test is skipped (Ceph missing, FLASHPATH_SKIP_CEPH=1).
fn cluster() -> Option<CephCluster> {
    CephCluster::start()
}

/// Registers `c` as [`CLUSTER`] with extra `config_param`s.
fn register(d: &Daemon, c: &CephCluster, config_param: Value) {
    let r = d.call("bdev_rbd_register_cluster", c.register_params(CLUSTER, config_param));
    assert_eq!(r, json!(CLUSTER), "bdev_rbd_register_cluster returns the cluster's name");
}

/// `bdev_rbd_create` of image `image` on [`CLUSTER`] as bdev `name`.
fn rbd_bdev(d: &Daemon, name: &str, image: &str) {
    let r = d.call(
        "bdev_rbd_create",
        json!({"name": name, "pool_name": "rbd", "rbd_name": image, "cluster_name": CLUSTER}),
    );
    assert_eq!(r, json!(name), "bdev_rbd_create returns the bdev name");
}

fn bdev(d: &Daemon, name: &str) -> Value {
    let all = d.call("bdev_get_bdevs", json!({"name": name}));
    assert_eq!(all.as_array().map(Vec::len), Some(1), "bdev_get_bdevs {name}: {all}");
    all[0].clone()
}

/// Writes `data` at `offset` and asserts success.
fn write_ok(c: &mut BlkClient, queue: usize, offset: u64, data: &[u8]) {
    let r = c.write(queue, offset, data);
    assert_eq!(r, 0, "write of {} bytes at {offset} on queue {queue}", data.len());
}

fn read_ok(c: &mut BlkClient, queue: usize, offset: u64, len: usize) -> Vec<u8> {
    c.read(queue, offset, len)
        .unwrap_or_else(|r| panic!("read of {len} bytes at {offset} on queue {queue}: ret {r}"))
}

#[test]
fn data_path_on_two_queues_flush_discard_write_zeroes_and_resize() {
    let Some(ceph) = cluster() else { return };
    ceph.create_image("disk", IMAGE_MIB);
    let info = ceph.image_info("disk");
    assert_eq!(info["size"], json!(IMAGE_MIB * MIB), "rbd info after rbd create: {info}");

    let d = Daemon::start("0,1");
    register(&d, &ceph, json!({}));
    rbd_bdev(&d, "rbd0", "disk");
    let b = bdev(&d, "rbd0");
    assert_eq!(b["num_blocks"], json!(IMAGE_MIB * MIB / 512), "{b}");
    assert_eq!(b["block_size"], json!(512), "block_size defaults to 512: {b}");
    let sock = d.controller("vhost.rbd", "rbd0", Some(2), false);

    let s = sock.clone();
    bounded(Duration::from_secs(240), "rbd data path", move || {
        let mut c = BlkClient::open(&s, 2);
        assert_eq!(c.capacity, IMAGE_MIB * MIB, "capacity seen by libblkio");
        assert_eq!(c.num_queues(), 2);
        // A fresh image reads as zeroes; random extents on both queues over the first half.
        let compared = random_write_verify(&mut c, 13, 6, 0, IMAGE_MIB * MIB / 2, Some(0));
        assert!(compared >= IMAGE_MIB * MIB / 2, "only {compared} bytes compared");
        assert_eq!(c.flush(0), 0, "flush on queue 0");
        assert_eq!(c.flush(1), 0, "flush on queue 1");

        // Vectored requests: segments of unequal sizes scattered over the arena go out as one
        // request each (zero copy: librbd's readv/writev on the same segments).
        let base = 20 * MIB;
        let want = pattern(21, base, 12 * 1024);
        let segs = [(0usize, 512usize), (64 << 10, 7 * 512), (128 << 10, 4096), (256 << 10, 4096)];
        let mut at = 0;
        for &(buf, len) in &segs {
            c.arena()[buf..buf + len].copy_from_slice(&want[at..at + len]);
            at += len;
        }
        assert_eq!(at, want.len());
        assert_eq!(c.vectored(1, true, base, &segs), 0, "a 4-segment writev on queue 1");
        let got = read_ok(&mut c, 0, base, want.len());
        assert_same("a plain read of a vectored write", base, &got, &want);
        let read_segs = [(512usize << 10, 1536usize), (1 << 20, want.len() - 1536)];
        c.arena()[512 << 10..(1 << 20) + want.len()].fill(0xee);
        assert_eq!(c.vectored(0, false, base, &read_segs), 0, "a 2-segment readv on queue 0");
        let mut got = c.arena()[512 << 10..(512 << 10) + 1536].to_vec();
        got.extend_from_slice(&c.arena()[1 << 20..(1 << 20) + want.len() - 1536]);
        assert_same("a vectored read", base, &got, &want);

        // Write-zeroes (with and without unmap) reads back zeroes, its neighbours untouched.
        let base = 24 * MIB;
        let data = pattern(24, base, MIB as usize);
        write_ok(&mut c, 0, base, &data);
        assert_eq!(c.write_zeroes(1, base + 64 * 1024, 256 * 1024, false), 0, "write-zeroes (no unmap)");
        assert_eq!(c.write_zeroes(0, base + 512 * 1024, 128 * 1024, true), 0, "write-zeroes (unmap)");
        let mut want = data.clone();
        want[64 * 1024..320 * 1024].fill(0);
        want[512 * 1024..640 * 1024].fill(0);
        let got = read_ok(&mut c, 1, base, MIB as usize);
        assert_same("after write-zeroes", base, &got, &want);

        // Discard: librbd removes whole objects (a discard that never reached it would leave
        // the pattern) and may keep partial ones; the blocks around it are untouched.
        let base = 2 * OBJECT;
        let before = pattern(25, base - 4096, 4096);
        let after = pattern(25, base + OBJECT, 4096);
        write_ok(&mut c, 0, base - 4096, &before);
        write_ok(&mut c, 0, base + OBJECT, &after);
        c.write_all(base, &pattern(26, base, OBJECT as usize));
        assert_eq!(c.discard(1, base, OBJECT as usize), 0, "discard of one whole object");
        assert_eq!(c.discard(0, base + OBJECT + 8192, 4096), 0, "a small discard");
        let got = c.read_all(base, OBJECT as usize);
        assert!(got.iter().all(|&b| b == 0), "a discarded whole object does not read back as zeroes");
        assert_same("before the discard", base - 4096, &read_ok(&mut c, 1, base - 4096, 4096), &before);
        assert_same("after the discard", base + OBJECT, &read_ok(&mut c, 1, base + OBJECT, 4096), &after);
        assert_eq!(c.flush(1), 0);
    });

    // Grow the image online through the bdev, with the client connected.
    let grown = IMAGE_MIB + 16;
    assert_eq!(d.call("bdev_rbd_resize", json!({"name": "rbd0", "new_size": grown})), json!(true));
    assert_eq!(ceph.image_info("disk")["size"], json!(grown * MIB), "rbd info after bdev_rbd_resize");
    assert_eq!(bdev(&d, "rbd0")["num_blocks"], json!(grown * MIB / 512));
    // Shrinking a disk that a controller exports is refused and changes nothing.
    let e =
        d.try_call("bdev_rbd_resize", json!({"name": "rbd0", "new_size": 8})).expect_err("a shrink in use");
    assert!(e.message.contains("shrink"), "{}", e.message);
    assert_eq!(ceph.image_info("disk")["size"], json!(grown * MIB), "a refused shrink resized the image");
    assert_eq!(bdev(&d, "rbd0")["num_blocks"], json!(grown * MIB / 512));

    bounded(Duration::from_secs(60), "rbd after the resize", move || {
        let mut c = BlkClient::open(&sock, 2);
        assert_eq!(c.capacity, grown * MIB, "capacity after a reconnect");
        let tail = grown * MIB - 64 * 1024;
        let data = pattern(30, tail, 64 * 1024);
        write_ok(&mut c, 1, tail, &data);
        assert_same("the grown tail", tail, &read_ok(&mut c, 0, tail, data.len()), &data);
        // The new space between the old end and the tail reads as zeroes.
        let gap = read_ok(&mut c, 0, IMAGE_MIB * MIB, 64 * 1024);
        assert!(gap.iter().all(|&b| b == 0), "the grown space is not zeroes");
        assert_same(
            "the vectored write after the resize",
            20 * MIB,
            &read_ok(&mut c, 1, 20 * MIB, 512),
            &pattern(21, 20 * MIB, 512),
        );
    });
    d.call("vhost_delete_controller", json!({"ctrlr": "vhost.rbd"}));
    assert_eq!(d.call("bdev_rbd_delete", json!({"name": "rbd0"})), json!(true));
}

/// Random bytes (not [`pattern`]: another tool writes them, no structure to lean on).
fn random_bytes(seed: u64, len: usize) -> Vec<u8> {
    use rand::{RngCore, SeedableRng};
    let mut v = vec![0u8; len];
    rand::rngs::StdRng::seed_from_u64(seed).fill_bytes(&mut v);
    v
}

#[test]
fn rbd_import_reads_back_through_flashpath_and_flashpath_writes_come_back_from_rbd_export() {
    let Some(ceph) = cluster() else { return };
    let len = 12 * MIB as usize + 3 * 512; // not a whole number of objects
    let data = random_bytes(41, len);
    let src = ceph.dir().join("import.bin");
    std::fs::write(&src, &data).unwrap();
    ceph.rbd(&["import", src.to_str().unwrap(), "rbd/imported"]);
    assert_eq!(ceph.image_info("imported")["size"], json!(len));

    let d = Daemon::start("0,1");
    register(&d, &ceph, json!({}));
    rbd_bdev(&d, "imp", "imported");
    let sock = d.controller("vhost.imp", "imp", Some(2), false);
    // What flashpath writes: random extents over the image, through both queues.
    let writes: Vec<(u64, Vec<u8>)> = (0..24u64)
        .map(|i| {
            let blocks = 1 + (i * 37) % 300;
            let off = ((i * 7919 * 512 * 11) % (len as u64 - blocks * 512)) / 512 * 512;
            (off, random_bytes(100 + i, (blocks * 512) as usize))
        })
        .collect();
    let to_write = writes.clone();
    let want_import = data.clone();
    bounded(Duration::from_secs(120), "import/export", move || {
        let mut c = BlkClient::open(&sock, 2);
        assert_eq!(c.capacity, len as u64, "the imported image's size");
        let got = c.read_all(0, len);
        assert_same("the rbd-imported image read through flashpath", 0, &got, &want_import);
        for (i, (off, bytes)) in to_write.iter().enumerate() {
            write_ok(&mut c, i % 2, *off, bytes);
        }
        assert_eq!(c.flush(0), 0);
    });
    let mut want = data;
    for (off, bytes) in &writes {
        want[*off as usize..*off as usize + bytes.len()].copy_from_slice(bytes);
    }
    let dst = ceph.dir().join("export.bin");
    ceph.rbd(&["export", "rbd/imported", dst.to_str().unwrap()]);
    let got = std::fs::read(&dst).unwrap();
    assert_same("rbd export of what flashpath wrote", 0, &got, &want);

    // The reactors sleep while the cluster works, and wake about twice per request (the
    // guest's kick, the completion's eventfd), not over and over: a stale eventfd once woke
    // a reactor 30 times per request, sleep after sleep.
    let sleeps = |d: &Daemon| -> u64 {
        let r = d.call("framework_get_reactors", json!({}));
        r["reactors"].as_array().unwrap().iter().map(|r| r["sleeps"].as_u64().unwrap()).sum()
    };
    const READS: u64 = 300;
    let sock = d.dir.path().join("vhost.imp");
    let before = sleeps(&d);
    bounded(Duration::from_secs(120), "QD1 reads", move || {
        let mut c = BlkClient::open(&sock, 1);
        for i in 0..READS {
            read_ok(&mut c, 0, (i * 7919 % 2048) * 4096, 4096);
        }
    });
    let per_request = (sleeps(&d) - before) as f64 / READS as f64;
    eprintln!("{per_request:.2} reactor sleeps per QD1 request");
    assert!((0.5..8.0).contains(&per_request), "{per_request:.1} sleeps per QD1 request");
}

#[test]
fn rpc_shapes_errors_and_an_unreachable_monitor() {
    let Some(ceph) = cluster() else { return };
    ceph.create_image("img", 8);
    let mut d = Daemon::start("0");
    register(&d, &ceph, json!({"rados_osd_op_timeout": "20"}));

    // bdev_rbd_get_clusters_info: all (an array) and one (an object), SPDK's keys.
    let conf = ceph.conf().to_str().unwrap();
    let one =
        json!({"cluster_name": CLUSTER, "config_file": conf, "config_param": {"rados_osd_op_timeout": "20"}});
    assert_eq!(d.call("bdev_rbd_get_clusters_info", Value::Null), json!([one.clone()]));
    assert_eq!(d.call("bdev_rbd_get_clusters_info", json!({"name": CLUSTER})), one);
    let e = d.try_call("bdev_rbd_get_clusters_info", json!({"name": "nope"})).expect_err("unknown cluster");
    assert!(e.message.contains("name") && e.message.contains("nope"), "{}", e.message);
    let e =
        d.try_call("bdev_rbd_register_cluster", ceph.register_params(CLUSTER, json!({}))).expect_err("twice");
    assert!(e.message.contains("already registered"), "{}", e.message);

    // bdev_rbd_create: the default name and block size, bdev_get_bdevs' shape.
    let name =
        d.call("bdev_rbd_create", json!({"pool_name": "rbd", "rbd_name": "img", "cluster_name": CLUSTER}));
    assert_eq!(name, json!("Ceph0"), "the first unnamed rbd bdev");
    let b = bdev(&d, "Ceph0");
    assert_eq!(b["product_name"], json!("Ceph Rbd Disk"), "{b}");
    assert_eq!(b["block_size"], json!(512), "{b}");
    assert_eq!(b["num_blocks"], json!(8 * MIB / 512), "{b}");
    for t in ["read", "write", "flush", "unmap", "write_zeroes"] {
        assert_eq!(b["supported_io_types"][t], json!(true), "supported_io_types.{t}: {b}");
    }
    assert_eq!(
        b["driver_specific"]["rbd"],
        json!({"pool_name": "rbd", "rbd_name": "img", "cluster_name": CLUSTER, "read_only": false}),
        "{b}"
    );
    // A read-only bdev of the same image, 4 KiB blocks.
    d.call(
        "bdev_rbd_create",
        json!({"name": "ro", "pool_name": "rbd", "rbd_name": "img", "cluster_name": CLUSTER,
               "read_only": true, "block_size": 4096}),
    );
    let b = bdev(&d, "ro");
    assert_eq!(
        (b["block_size"].clone(), b["num_blocks"].clone()),
        (json!(4096), json!(8 * MIB / 4096)),
        "{b}"
    );
    assert_eq!(b["driver_specific"]["rbd"]["read_only"], json!(true), "{b}");
    assert_eq!(b["supported_io_types"]["write"], json!(false), "{b}");

    // Bad input names the field and creates nothing.
    let bad = [
        (json!({"pool_name": "rbd", "rbd_name": "img", "cluster_name": "nope"}), "cluster_name"),
        (json!({"rbd_name": "img", "cluster_name": CLUSTER}), "pool_name"),
        (json!({"pool_name": "rbd", "cluster_name": CLUSTER}), "rbd_name"),
        (json!({"pool_name": "rbd", "rbd_name": "missing", "cluster_name": CLUSTER}), "rbd_name"),
        (json!({"pool_name": "nopool", "rbd_name": "img", "cluster_name": CLUSTER}), "pool_name"),
        (json!({"pool_name": "rbd", "rbd_name": "img", "cluster_name": CLUSTER, "user_id": "x"}), "user_id"),
        (
            json!({"pool_name": "rbd", "rbd_name": "img", "cluster_name": CLUSTER, "block_size": 100}),
            "block_size",
        ),
    ];
    for (params, field) in bad {
        let mut p = params.clone();
        p["name"] = json!("bad");
        let e = d.try_call("bdev_rbd_create", p).expect_err(&format!("bdev_rbd_create {params}"));
        assert!(e.message.contains(field), "bdev_rbd_create {params}: {} does not name {field}", e.message);
        assert_eq!(e.code, -32602, "bdev_rbd_create {params}: {}", e.message);
        assert!(d.try_call("bdev_get_bdevs", json!({"name": "bad"})).is_err(), "{params} created a bdev");
    }
    let e = d.try_call("bdev_rbd_resize", json!({"name": "Ceph0"})).expect_err("resize without a size");
    assert!(e.message.contains("new_size"), "{}", e.message);

    // A cluster is kept while bdevs use it.
    let e = d.try_call("bdev_rbd_unregister_cluster", json!({"name": CLUSTER})).expect_err("in use");
    assert!(e.message.contains("used by 2"), "{}", e.message);
    assert_eq!(d.call("bdev_rbd_get_clusters_info", Value::Null).as_array().map(Vec::len), Some(1));
    assert_eq!(d.call("bdev_rbd_delete", json!({"name": "Ceph0"})), json!(true));
    assert!(d.try_call("bdev_rbd_unregister_cluster", json!({"name": CLUSTER})).is_err(), "still used by ro");
    assert_eq!(d.call("bdev_rbd_delete", json!({"name": "ro"})), json!(true));
    let e = d.try_call("bdev_rbd_delete", json!({"name": "ro"})).expect_err("deleted twice");
    assert!(e.message.contains("ro"), "{}", e.message);
    assert_eq!(d.call("bdev_rbd_unregister_cluster", json!({"name": CLUSTER})), json!(true));
    assert_eq!(d.call("bdev_rbd_get_clusters_info", Value::Null), json!([]));
    let e = d.try_call("bdev_rbd_unregister_cluster", json!({"name": CLUSTER})).expect_err("twice");
    assert!(e.message.contains("name"), "{}", e.message);

    // A monitor that never answers: a clear error naming the cluster after
    // client_mount_timeout, while a disk on the daemon keeps serving.
    register(&d, &ceph, json!({}));
    rbd_bdev(&d, "live", "img");
    let sock = d.controller("vhost.live", "live", None, false);
    let dead = ceph.dead_monitor_conf();
    let params = json!({"name": "dead", "config_file": dead, "config_param": {"client_mount_timeout": "3"}});
    let rpc = d.rpc.clone();
    let started = Instant::now();
    let register_dead =
        std::thread::spawn(move || common::rpc_call(&rpc, "bdev_rbd_register_cluster", Some(params)));
    let served = bounded(Duration::from_secs(30), "I/O during a blocked register", move || {
        let mut c = BlkClient::open(&sock, 1);
        let mut n = 0;
        while n < 5 || started.elapsed() < Duration::from_secs(2) {
            let data = pattern(n, 4096 * (n % 64), 4096);
            write_ok(&mut c, 0, 4096 * (n % 64), &data);
            assert_same(
                "I/O while a register blocks",
                4096 * (n % 64),
                &read_ok(&mut c, 0, 4096 * (n % 64), 4096),
                &data,
            );
            n += 1;
        }
        n
    });
    let still_connecting = !register_dead.is_finished();
    let r = bounded(Duration::from_secs(30), "register with a dead monitor", move || {
        register_dead.join().unwrap()
    });
    let took = started.elapsed();
    let e = r.expect("the RPC transport").expect_err("registering a cluster whose monitor is dead");
    eprintln!("dead monitor: {} after {took:?} ({served} I/Os meanwhile)", e.message);
    assert!(e.message.contains("dead"), "the error does not name the cluster: {}", e.message);
    assert!(took < Duration::from_secs(3 + 10), "a dead monitor took {took:?} with client_mount_timeout 3");
    assert!(still_connecting, "the register returned before 2 s of I/O: {took:?}, {}", e.message);
    assert_eq!(
        d.call("bdev_rbd_get_clusters_info", Value::Null).as_array().map(Vec::len),
        Some(1),
        "dead was kept"
    );
    // A bdev with its own connection to the dead monitor fails the same way.
    let dead_mon = std::fs::read_to_string(ceph.dead_monitor_conf()).unwrap();
    let mon_host = dead_mon.lines().find_map(|l| l.strip_prefix("mon host = ")).unwrap().to_string();
    let e = d
        .try_call(
            "bdev_rbd_create",
            json!({"name": "own", "pool_name": "rbd", "rbd_name": "img",
                   "config": {"mon_host": mon_host, "client_mount_timeout": "2", "auth_client_required": "none"}}),
        )
        .expect_err("own connection to a dead monitor");
    assert!(e.message.contains("cannot connect"), "{}", e.message);
    d.assert_alive();
    assert!(
        d.try_call("bdev_get_bdevs", json!({"name": "own"})).is_err(),
        "a bdev without a cluster was created"
    );
    // Its own connection to the live monitor: `config` replaces ceph.conf and is reported back.
    let config = json!({"mon_host": ceph.mon_host(), "auth_client_required": "none"});
    let r = d.call(
        "bdev_rbd_create",
        json!({"name": "own", "pool_name": "rbd", "rbd_name": "img", "config": config}),
    );
    assert_eq!(r, json!("own"));
    assert_eq!(
        bdev(&d, "own")["driver_specific"]["rbd"],
        json!({"pool_name": "rbd", "rbd_name": "img", "config": config, "read_only": false})
    );
    assert_eq!(d.call("bdev_rbd_delete", json!({"name": "own"})), json!(true));
}

/// Sends `sig` to `pid`.
fn signal(pid: u32, sig: i32) {
    // SAFETY: kill(2) has no memory effects; the pid is the test cluster's OSD.
    let r = unsafe { libc::kill(pid as libc::pid_t, sig) };
    assert_eq!(r, 0, "kill({pid}, {sig}): {}", std::io::Error::last_os_error());
}

/// Waits until every thread of `pid` is in the stopped state: kill(2) returns before each
/// thread has taken the stop, and a thread still running could answer one request (a read
/// once came back successful with the OSD "stopped").
fn wait_all_threads_stopped(pid: u32) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let running: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/task"))
            .expect("the OSD's threads")
            .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("stat")).ok())
            .filter(|stat| {
                // The state follows the command's closing parenthesis.
                let state = stat.rsplit_once(") ").and_then(|(_, rest)| rest.chars().next());
                !matches!(state, Some('T') | Some('t') | None)
            })
            .collect();
        if running.is_empty() {
            return;
        }
        assert!(Instant::now() < deadline, "OSD threads not stopped after SIGSTOP: {running:?}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Continues the OSD when dropped, so a failing assertion does not leave it stopped.
struct Stopped(u32);

impl Drop for Stopped {
    fn drop(&mut self) {
        // SAFETY: as in `signal`.
        unsafe { libc::kill(self.0 as libc::pid_t, libc::SIGCONT) };
    }
}

/// A RAM disk's client: 64 KiB writes read back and checked, over and over, each round's end
/// time and length recorded, until `stop`.
fn ram_load(sock: PathBuf, stop: Arc<AtomicBool>, rounds: Arc<Mutex<Vec<(Instant, Duration)>>>) {
    let mut c = BlkClient::open(&sock, 1);
    let mut i = 0u64;
    while !stop.load(Ordering::Acquire) {
        let t = Instant::now();
        let off = (i % 128) * 64 * 1024;
        let data = pattern(i, off, 64 * 1024);
        write_ok(&mut c, 0, off, &data);
        assert_same("the RAM disk", off, &read_ok(&mut c, 0, off, data.len()), &data);
        rounds.lock().unwrap().push((Instant::now(), t.elapsed()));
        i += 1;
    }
}

#[test]
fn stopped_osd_fails_rbd_io_in_bounded_time_while_a_ram_disk_keeps_going() {
    const OSD_TIMEOUT: u64 = 3;
    let Some(ceph) = cluster() else { return };
    ceph.create_image("disk", IMAGE_MIB);
    let mut d = Daemon::start("0,1");
    register(&d, &ceph, json!({"rados_osd_op_timeout": OSD_TIMEOUT.to_string()}));
    rbd_bdev(&d, "rbd0", "disk");
    d.malloc("ram0", 16 * MIB / 512, 512);
    let rbd_sock = d.controller("vhost.rbd", "rbd0", Some(2), false);
    let ram_sock = d.controller("vhost.ram", "ram0", Some(1), false);

    // Data acknowledged and flushed before the fault.
    let before = pattern(50, 0, 2 * MIB as usize);
    let mut c = {
        let (s, data) = (rbd_sock.clone(), before.clone());
        bounded(Duration::from_secs(60), "rbd writes before the fault", move || {
            let mut c = BlkClient::open(&s, 2);
            c.write_all(0, &data);
            assert_eq!(c.flush(1), 0);
            c
        })
    };

    let stop = Arc::new(AtomicBool::new(false));
    let rounds = Arc::new(Mutex::new(Vec::new()));
    let load = {
        let (stop, rounds) = (stop.clone(), rounds.clone());
        std::thread::spawn(move || ram_load(ram_sock, stop, rounds))
    };
    let wait_start = Instant::now();
    while rounds.lock().unwrap().len() < 20 {
        assert!(wait_start.elapsed() < Duration::from_secs(20), "the RAM disk's load did not start");
        std::thread::sleep(Duration::from_millis(5));
    }

    let osd = ceph.osd_pid();
    signal(osd, libc::SIGSTOP);
    let stopped = Stopped(osd);
    wait_all_threads_stopped(osd);
    let t_stop = Instant::now();
    // Requests on both queues, in two batches timed apart: reads of the data above and a
    // write into its object (one OSD operation each), then writes to new objects (two OSD
    // operations in turn: the object map's update, then the data; measured 2 x 3 s). The
    // writes stay away from the data above: one the OSD finds in its socket once continued
    // may still land. (No flush: with rbd_cache off it has nothing to send and succeeds.)
    let faulted = std::thread::spawn(move || {
        let w = pattern(51, 8 * MIB, 64 * 1024);
        c.arena()[..w.len()].copy_from_slice(&w);
        let one_op = [
            Op { queue: 1, kind: OpKind::Read, offset: 0, len: 64 * 1024, buf: 1 << 20 },
            Op { queue: 0, kind: OpKind::Read, offset: MIB, len: 64 * 1024, buf: 2 << 20 },
            Op { queue: 0, kind: OpKind::Write, offset: 3 * MIB, len: w.len(), buf: 0 },
        ];
        let t = Instant::now();
        let one = c.run(&one_op);
        let one_took = t.elapsed();
        let two_ops = [
            Op { queue: 0, kind: OpKind::Write, offset: 8 * MIB, len: w.len(), buf: 0 },
            Op { queue: 1, kind: OpKind::Write, offset: 12 * MIB, len: w.len(), buf: 0 },
        ];
        let t = Instant::now();
        let two = c.run(&two_ops);
        (c, [(one, one_took), (two, t.elapsed())], t_stop.elapsed())
    });
    // The control plane answers throughout.
    let mut rpcs = 0;
    let mut slowest_rpc = Duration::ZERO;
    while !faulted.is_finished() && t_stop.elapsed() < Duration::from_secs(3 * OSD_TIMEOUT + 30) {
        let t = Instant::now();
        let b = bdev(&d, "rbd0");
        assert_eq!(b["name"], json!("rbd0"));
        slowest_rpc = slowest_rpc.max(t.elapsed());
        rpcs += 1;
        std::thread::sleep(Duration::from_millis(100));
    }
    let (mut c, batches, took) =
        bounded(Duration::from_secs(5), "the faulted requests", move || faulted.join().unwrap());
    let ram: Vec<(Instant, Duration)> =
        rounds.lock().unwrap().iter().filter(|(end, _)| *end > t_stop).copied().collect();
    eprintln!(
        "stopped OSD: rbd requests returned {batches:?}; meanwhile {} RAM-disk rounds (slowest {:?}), \
         {rpcs} RPCs (slowest {slowest_rpc:?})",
        ram.len(),
        ram.iter().map(|r| r.1).max()
    );
    for (b, (rets, took)) in batches.iter().enumerate() {
        let ops = b as u64 + 1;
        for (i, r) in rets.iter().enumerate() {
            assert_eq!(*r, -libc::EIO, "batch {b} request {i} with the OSD stopped: ret {r} (want -EIO)");
        }
        // Nothing fails before one timeout (a request that fails sooner did not wait for the
        // OSD); the upper bound allows each operation its timeout.
        assert!(
            *took >= Duration::from_secs(OSD_TIMEOUT) - Duration::from_millis(500),
            "batch {b} failed before the timeout: {took:?}"
        );
        let timeout = Duration::from_secs(ops * OSD_TIMEOUT);
        assert!(
            *took <= timeout + Duration::from_secs(5),
            "batch {b} ({ops} OSD operations per request) took {took:?} with rados_osd_op_timeout {OSD_TIMEOUT}"
        );
    }
    // The reactors kept serving the RAM disk: rounds all along, none stalled by the rbd disk.
    assert!(ram.len() >= 20, "only {} RAM-disk rounds in {took:?}", ram.len());
    let slowest = ram.iter().map(|r| r.1).max().unwrap();
    assert!(slowest < Duration::from_secs(1), "a RAM-disk round took {slowest:?} with the OSD stopped");
    assert!(rpcs >= 5 && slowest_rpc < Duration::from_secs(1), "{rpcs} RPCs, slowest {slowest_rpc:?}");
    let last_ram = ram.last().unwrap().0;
    assert!(
        last_ram + Duration::from_secs(1) > t_stop + took,
        "the RAM disk stalled before the rbd requests failed"
    );

    signal(osd, libc::SIGCONT);
    drop(stopped);
    stop.store(true, Ordering::Release);
    bounded(Duration::from_secs(10), "the RAM disk's load", move || load.join().unwrap());
    bounded(Duration::from_secs(60), "rbd after the OSD is back", move || {
        let t = Instant::now();
        let data = pattern(52, 16 * MIB, 64 * 1024);
        write_ok(&mut c, 0, 16 * MIB, &data);
        eprintln!("the first write after SIGCONT took {:?}", t.elapsed());
        assert_same(
            "a write after the OSD is back",
            16 * MIB,
            &read_ok(&mut c, 1, 16 * MIB, data.len()),
            &data,
        );
        let got = c.read_all(0, before.len());
        assert_same("data flushed before the OSD stopped", 0, &got, &before);
        for off in [3 * MIB, 8 * MIB, 12 * MIB] {
            let data = pattern(53, off, 64 * 1024);
            write_ok(&mut c, 1, off, &data);
            assert_same("a region whose write failed", off, &read_ok(&mut c, 0, off, data.len()), &data);
        }
        assert_eq!(c.flush(0), 0);
    });
    d.assert_alive();
}
