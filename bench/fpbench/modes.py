"""What each mode (full, quick, smoke) measures: points, seconds, repetitions per section.
"""

from fpbench.common import GIB, MIB


# Path length of every export (`pathlen`): the short and long server lives' seconds, the
# repetitions and the queue depths (4 KiB randread, null disk). Part of full and quick runs;
# smoke runs have it only with `--only pathlen` (two servers under valgrind per NVMe/TCP run).
PATHLEN = {
    "full": {"short_s": 2.0, "long_s": 8.0, "reps": 3, "qds": [32, 1]},
    "quick": {"short_s": 1.0, "long_s": 4.0, "reps": 3, "qds": [32]},
    "smoke": {"short_s": 0.5, "long_s": 1.5, "reps": 1, "qds": [32]},
}


def pathlen_config(mode):
    return PATHLEN[mode]


# Paths (`--only paths`): NVMe/TCP failover through two relayed paths and the DH-HMAC-CHAP
# connect cost. secs: each failover run (the path broken at secs / 3, back at 2 secs / 3: 12 s
# leaves 4 s between, twice KATO + CQT, so a failover within the goal ends before the restore);
# kato_ms: the initiator's keep_alive_timeout_ms; io_timeout_us: its timeout_us and
# timeout_admin_us (action reset), what notices a stalled path; qds, policies, kinds: the runs
# (4 KiB randrw, verified); reps: repetitions of every run; attaches: timed attach/detach pairs
# per connect variant. Not in any whole run (a benchmark of targets, not CI); smoke takes it
# only with `--only paths`, as a ~30 s check of the pipeline.
PATHS = {
    "full": {"secs": 12.0, "reps": 3, "kato_ms": 1000, "io_timeout_us": 1_000_000, "qds": [1, 16],
             "policies": ["active_passive", "active_active"], "kinds": ["cut", "stall"], "attaches": 20,
             "size_mib": 64},
    "quick": {"secs": 12.0, "reps": 2, "kato_ms": 1000, "io_timeout_us": 1_000_000, "qds": [1, 16],
              "policies": ["active_passive", "active_active"], "kinds": ["cut", "stall"], "attaches": 10,
              "size_mib": 64},
    "smoke": {"secs": 12.0, "reps": 1, "kato_ms": 1000, "io_timeout_us": 1_000_000, "qds": [16],
              "policies": ["active_passive"], "kinds": ["cut", "stall"], "attaches": 3, "size_mib": 16},
}


def paths_config(mode):
    return PATHS[mode]


# TLS (`--only tls`): NVMe/TCP with TLS 1.3 against plain NVMe/TCP through one target and one
# initiator, interleaved run by run. points: (pattern, bs, qd), one queue, the client polling;
# secs: each run; reps: repetitions of every point and variant; size_mib: each RAM disk;
# fill_secs: the sequential write that touches every block first. Not in any whole run (a
# benchmark of a target, not CI).
TLS = {
    "full": {"secs": 5.0, "reps": 5, "points": [["randread", 4096, 32], ["randread", 4096, 1]], "size_mib": 256,
             "fill_secs": 4.0},
    "quick": {"secs": 3.0, "reps": 3, "points": [["randread", 4096, 32], ["randread", 4096, 1]], "size_mib": 128,
              "fill_secs": 3.0},
    "smoke": {"secs": 1.0, "reps": 1, "points": [["randread", 4096, 32]], "size_mib": 32, "fill_secs": 1.0},
}


def tls_config(mode):
    return TLS[mode]


# Backups (`--only backup`). bitmap: part (A), the bitmap's cost: backends (null, ram), points
# (pattern, bs, qd; one queue, the client polling), secs per run, reps (without / with a bitmap,
# alternating), granularity of the bitmap, size_mib of the disk, fill_secs (the RAM disk written
# once), callgrind (instructions per write without / with, the path-length section's short and
# long lives; none in smoke runs). Parts (B)-(D): disk_mib (the 4 GiB in full mode, smaller elsewhere: the ratios
# are what is judged), chunk_size of the backups, changed_frac ("1 % changed"), stores,
# seed of the change offsets, speed (bytes/s) of the backup beside the guest's load,
# guest_point/secs/reps, throughput_chunk, rclone_flags, gets (GETs timed), restore_hold_speed
# (the restore's background copy while its first reads are timed), first_read_secs, timeout_s
# (every job's bound), boot ((D)'s boots: root_mib of the root image, reps of the three
# variants, held_speed of the held restore's copy, mem_mib of the guest, timeout_s per boot). Not in any whole run (a benchmark of targets, not CI).
_BACKUP_JOBS = {"chunk_size": MIB, "changed_frac": 0.01, "seed": 20261130, "granularity": 65536,
                "speed": 50 * MIB, "guest_point": ["randread", 4096, 32], "throughput_chunk": MIB,
                "rclone_flags": ["--s3-upload-concurrency", "4", "--s3-chunk-size", "8M"], "gets": 9,
                "restore_hold_speed": MIB, "first_read_secs": 1.0, "timeout_s": 900,
                "boot": {"root_mib": 256, "reps": 2, "held_speed": MIB, "mem_mib": 256, "timeout_s": 600}}
BACKUP = {
    "full": dict(_BACKUP_JOBS, bitmap={"backends": ["null", "ram"], "points": [["randwrite", 4096, 32],
                                                                            ["randread", 4096, 32]],
                                       "secs": 5.0, "reps": 5, "granularity": 65536, "size_mib": 1024,
                                       "fill_secs": 4.0, "callgrind": {"short_s": 2.0, "long_s": 8.0, "reps": 3}},
                 disk_mib=4096, stores=["file", "rgw"], guest_secs=5.0, guest_reps=3,
                 boot=dict(_BACKUP_JOBS["boot"], reps=3)),
    "quick": dict(_BACKUP_JOBS, bitmap={"backends": ["null"], "points": [["randwrite", 4096, 32],
                                                                         ["randread", 4096, 32]],
                                        "secs": 3.0, "reps": 4, "granularity": 65536, "size_mib": 1024,
                                        "fill_secs": 3.0, "callgrind": {"short_s": 1.0, "long_s": 4.0, "reps": 2}},
                  disk_mib=1024, stores=["file", "rgw"], guest_secs=3.0, guest_reps=2),
    "smoke": dict(_BACKUP_JOBS, bitmap={"backends": ["null"], "points": [["randwrite", 4096, 32]],
                                        "secs": 1.0, "reps": 2, "granularity": 65536, "size_mib": 256,
                                        "fill_secs": 1.0},
                  disk_mib=256, stores=["file"], guest_secs=1.0, guest_reps=1),
}


def backup_config(mode):
    return BACKUP[mode]


def mode_config(mode):
    """What a mode measures. `points` lists (pattern, bs, qd, queues, poll) per backend;
    `callgrind` gives the path-length runs (null backend): the short and long run's seconds,
    the repetitions and the points."""
    full_points = []
    for pattern in ("randread", "randwrite"):
        for queues in (1, 2):
            for qd in (1, 8, 32, 128):
                for poll in (True, False):
                    full_points.append((pattern, 4096, qd, queues, poll))
    for qd in (1, 32):
        for poll in (True, False):
            full_points.append(("read", 65536, qd, 1, poll))
    cg_points = [("randread", 4096, 32, 1, poll) for poll in (True, False)]
    rbd_points = [(pattern, 4096, qd, 1, False) for pattern in ("randread", "randwrite") for qd in (1, 32)]
    # NBD (issue 14): (pattern, bs, qd) through fio's nbd engine, one connection.
    nbd_points = [("randread", 4096, 1), ("randread", 4096, 32), ("read", MIB, 8), ("write", MIB, 8)]
    full = {
        "time": 2.0,
        "reps": 3,
        "idle_time": 5.0,
        "backends": ["null", "ram", "file"],
        "points": full_points,
        "scaling_points": [(qd, poll) for qd in (32, 128) for poll in (True, False)],
        # (qd, poll): fp-load --packed vs split rings on the null disk, interleaved.
        "packed_points": [(1, True), (32, True)],
        # The disk layer's cost (null, 4K randread, QD32, 1 polled queue): counters off
        # (serve --no-iostat), counters on, counters and histograms on, interleaved; reps.
        "iostat_reps": 5,
        # ... and each variant's path length under callgrind (the callgrind section's lengths).
        "iostat_callgrind": True,
        "ceiling_reps": 3,
        "sizes": {"null": GIB, "ram": 512 * MIB, "file": GIB},
        "callgrind": {"short_s": 2.0, "long_s": 8.0, "reps": 3, "points": cg_points},
        "pathlen": PATHLEN["full"],
        # Logical volumes (`--only lvol`): raw malloc vs a thick volume on the same size of
        # malloc, `pairs` runs of each point; first-write and copy-on-write latency on `fw_reps`
        # fresh thin volumes; instructions per I/O with the callgrind settings above.
        # fw_clusters: the cluster sizes of the first-write runs (SPDK's default is 4 MiB).
        "lvol": {"size": 256 * MIB, "cluster": MIB, "pairs": 5, "fw_reps": 3, "callgrind": True,
                 "fw_clusters": [MIB, 4 * MIB],
                 "points": [("randread", 4096, 32, 1, True), ("randwrite", 4096, 32, 1, True),
                            ("randread", 4096, 1, 1, True), ("randwrite", 4096, 1, 1, True)],
                 "cg_size": 64 * MIB},
        # Quality of service (`--only qos`, issue 12). Accuracy: each limit flooded for
        # `acc_secs` with a `window`-second timeline, with 1, 2 and 4 queues on two reactors;
        # bw_limits are (MiB/s, block size). The other parts: see run_qos.
        "qos": {"acc_secs": 10.0, "window": 1.0, "ceiling_secs": 3.0, "queues": [1, 2, 4],
                "iops_limits": [1000, 10_000, 100_000, 1_000_000], "iops_qd": 32,
                "bw_limits": [(1, 4096), (16, 16384), (256, 65536), (2048, 131072)], "bw_qd": 16,
                "burst": {"avg": 5000, "max": 20_000, "length": 3, "secs": 8.0, "window": 1.0, "qd": 32},
                "shares": {"limit": 10_000, "weights": [3, 1], "secs": 10.0, "window": 1.0, "qd": 32},
                "noisy": {"disks": 16, "flood_qd": 128, "qd1_rate": 1000, "qd1_limit": 2000,
                          "flood_limit": 20_000, "group_limit": 40_000, "secs": 10.0, "reps": 3,
                          "scenarios": ["none", "limits", "group"]},
                "overhead": {"reps": 5, "secs": 2.0, "limit": 10_000_000, "limit_mib": 1_000_000}},
        # Ceph RBD (issue 13): one image on a single-node cluster, served by one server at a
        # time (qsd's rbd driver, flashpath's rbd bdev); `rounds` rounds of every point on each
        # server, the order alternating; `secs` per run; `warmup` seconds of writes after each
        # start. Completion-fd client only: a polled client would take the CPU the cluster
        # shares with it. See run_rbd.
        # --spdk: SPDK's vhost target beside flashpath and qsd, one client for all three
        # (fp-load --hugetlb); `reps` interleaved rounds of `secs` per point and server.
        "spdk": {"backends": ["null", "ram"], "sizes": {"null": GIB, "ram": 256 * MIB}, "secs": 3.0, "reps": 3,
                 "points": [("randread", 4096, qd, 1, poll) for qd in (1, 32) for poll in (True, False)]},
        "rbd": {"size_mib": 1024, "secs": 5.0, "rounds": 3, "warmup": 0.5, "points": rbd_points},
        # NBD (issue 14): a RAM disk exported over a Unix socket by flashpath, qsd and nbdkit, all
        # three running, one loaded at a time; `reps` runs of every point on each, interleaved
        # (the order rotating); `secs` per run. See run_nbd.
        "nbd": {"size_mib": 1024, "secs": 5.0, "reps": 3, "points": nbd_points},
        # Live migration (issue 22, `--only migration`). logging: fp-load's own frontend with
        # the dirty log off and on, `reps` interleaved runs of `secs` per pattern and server on
        # a RAM disk. migrate: a TCG guest with `mem_mib` of RAM on a RAM disk, idle and at
        # QD32 4 KiB randwrite, migrated `reps` times per mode and server; `settle_s` seconds of
        # guest progress before, `after_s` after; QEMU's migration parameters `params`
        # (max-bandwidth in bytes/s: the default 128 MiB/s would make RAM copying the whole
        # story). mirror: a `size_mib` RAM disk copied between two daemons over NBD, `reps`
        # times by nbdcopy and by the mirror job, and the source's IOPS for `iops_secs`.
        "migration": {
            "logging": {"size_mib": 512, "qd": 32, "patterns": ["randread", "randwrite"], "reps": 5, "secs": 2.0},
            "migrate": {"size_mib": 1024, "mem_mib": 128, "modes": ["idle", "load"], "reps": 5, "settle_s": 3,
                        "after_s": 2, "boot_timeout": 120, "timeout": 180, "params": {"max-bandwidth": 8 << 30}},
            "mirror": {"size_mib": 1024, "reps": 3, "iops_secs": 2.0, "timeout": 300},
        },
    }
    if mode == "full":
        return full
    if mode == "quick":
        pts = [p for p in full_points if p[0] != "read" and p[2] in (1, 32) and p[3] == 1]
        pts.append(("randread", 4096, 32, 2, True))
        pts.append(("read", 65536, 32, 1, True))
        return dict(full, time=1.0, points=pts, scaling_points=[(32, True)], ceiling_reps=1,
                    sizes={"null": GIB, "ram": 256 * MIB, "file": 256 * MIB},
                    callgrind=dict(full["callgrind"], short_s=1.0, long_s=4.0),
                    pathlen=PATHLEN["quick"],
                    lvol=dict(full["lvol"], pairs=3, fw_reps=2),
                    qos=dict(full["qos"], acc_secs=2.0, ceiling_secs=1.0,
                             burst=dict(full["qos"]["burst"], avg=2000, max=8000, length=2, secs=4.0),
                             shares=dict(full["qos"]["shares"], secs=4.0),
                             noisy=dict(full["qos"]["noisy"], secs=3.0, reps=1),
                             overhead=dict(full["qos"]["overhead"], reps=3, secs=1.0)),
                    rbd=dict(full["rbd"], secs=1.0),
                    spdk=dict(full["spdk"], secs=2.0),
                    nbd=dict(full["nbd"], size_mib=256, secs=1.0, reps=2),
                    migration={"logging": dict(full["migration"]["logging"], size_mib=256, reps=3, secs=1.0),
                               "migrate": dict(full["migration"]["migrate"], reps=2),
                               "mirror": dict(full["migration"]["mirror"], reps=1, iops_secs=1.0)})
    if mode == "smoke":
        # Null backend, A/B, one repetition; one small file point exercises the fio baseline.
        pts = [
            ("randread", 4096, 1, 1, True),
            ("randread", 4096, 1, 1, False),
            ("randread", 4096, 32, 1, True),
            ("randread", 4096, 32, 1, False),
            ("randread", 4096, 32, 2, True),
        ]
        return {
            "time": 1.0,
            "reps": 1,
            "idle_time": 1.0,
            "backends": ["null", "file"],
            "points": pts,
            "file_points": [("randread", 4096, 1, 1, False)],
            "scaling_points": [(32, True)],
            "packed_points": [],
            "iostat_reps": 1,
            "iostat_callgrind": False,  # six more debug servers under valgrind: too slow for CI
            "ceiling_reps": 1,
            "sizes": {"null": GIB, "file": 64 * MIB},
            "callgrind": {"short_s": 0.5, "long_s": 1.5, "reps": 1, "points": cg_points[:1]},
            "lvol": {"size": 32 * MIB, "cluster": MIB, "pairs": 1, "fw_reps": 1, "callgrind": False,
                     "fw_clusters": [MIB],
                     "points": [("randread", 4096, 32, 1, True), ("randwrite", 4096, 32, 1, True)],
                     "cg_size": 32 * MIB},
            # One point of each QoS part, to check the pipeline.
            "qos": {"acc_secs": 1.0, "window": 0.5, "ceiling_secs": 0.5, "queues": [2],
                    "iops_limits": [10_000], "iops_qd": 8, "bw_limits": [(16, 16384)], "bw_qd": 8,
                    "burst": {"avg": 2000, "max": 8000, "length": 1, "secs": 2.0, "window": 0.5, "qd": 8},
                    "shares": {"limit": 10_000, "weights": [3, 1], "secs": 1.5, "window": 0.5, "qd": 8},
                    "noisy": {"disks": 4, "flood_qd": 32, "qd1_rate": 1000, "qd1_limit": 2000,
                              "flood_limit": 20_000, "group_limit": 40_000, "secs": 1.0, "reps": 1,
                              "scenarios": ["none", "limits"]},
                    "overhead": {"reps": 1, "secs": 0.5, "limit": 10_000_000, "limit_mib": 1_000_000}},
            "spdk": {"backends": ["null"], "sizes": {"null": GIB}, "secs": 1.0, "reps": 1,
                     "points": [("randread", 4096, qd, 1, poll) for qd in (1, 32) for poll in (True, False)]},
            # Every RBD point once per server, 1 s each, on a small image (filled in ~0.3 s).
            "rbd": {"size_mib": 64, "secs": 1.0, "rounds": 1, "warmup": 0.2, "points": rbd_points},
            # Every NBD point once per server, 1 s each, on a 64 MiB disk.
            "nbd": {"size_mib": 64, "secs": 1.0, "reps": 1, "points": nbd_points},
            # One of each migration figure, small.
            "migration": {"logging": {"size_mib": 64, "qd": 32, "patterns": ["randwrite"], "reps": 1, "secs": 0.5},
                          "migrate": {"size_mib": 64, "mem_mib": 128, "modes": ["load"], "reps": 1, "settle_s": 2,
                                      "after_s": 1, "boot_timeout": 120, "timeout": 120,
                                      "params": {"max-bandwidth": 8 << 30}},
                          "mirror": {"size_mib": 64, "reps": 1, "iops_secs": 0.5, "timeout": 120}},
        }
    raise ValueError(mode)
