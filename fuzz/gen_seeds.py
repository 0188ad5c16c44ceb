#!/usr/bin/env python3
"""Writes the committed seeds, regressions/<target>/seed-*. Input layouts: the top of each fuzz_targets/<target>.rs."""
import struct, json, os, pathlib

BASE = 0x10000  # first region's guest address (page 0x10)
R, W, NEXT, IND = 0, 2, 1, 4

def chain_seed(chains, extra=(), qlog=3, flags=0xF):
    # 2 adjacent 64 KiB regions, queue of 1<<qlog, desc @+0, avail @+0x100, used @+0x180
    hdr = bytes([1]) + struct.pack("<H", BASE >> 12) + bytes([15, 15, 15, 0, 0, qlog])
    hdr += struct.pack("<HHHH", 0x0, 0x100, 0x180, 0)
    hdr += bytes([flags]) + struct.pack("<I", 0x10000) + bytes([9, 0])
    assert len(hdr) == 24
    mem = bytearray(0x400)
    descs, heads = [], []
    for c in chains:
        heads.append(len(descs))
        for i, (addr, ln, fl) in enumerate(c):
            nxt = len(descs) + 1 if i + 1 < len(c) else 0
            descs.append(struct.pack("<QIHH", BASE + addr if addr < 0x100000 else addr, ln, fl | (NEXT if i + 1 < len(c) else 0), nxt))
    mem[0:16 * len(descs)] = b"".join(descs)
    mem[0x100:0x104] = struct.pack("<HH", 0, len(heads))
    for i, h in enumerate(heads):
        mem[0x104 + 2 * i:0x106 + 2 * i] = struct.pack("<H", h)
    for off, data in extra:
        mem[off:off + len(data)] = data
    return hdr + bytes(mem)

def req(t, sector):
    return struct.pack("<IIQ", t, 0, sector)

os.chdir(os.path.dirname(os.path.abspath(__file__)))


def write(target, seeds):
    d = pathlib.Path("regressions") / target
    d.mkdir(parents=True, exist_ok=True)
    for name, data in seeds.items():
        (d / name).write_bytes(data)

seeds = {
    # IN 512 bytes, OUT 512 bytes, FLUSH
    "seed-in-out-flush": chain_seed(
        [[(0x200, 16, R), (0x400, 512, W), (0x300, 1, W)],
         [(0x210, 16, R), (0x600, 512, R), (0x301, 1, W)],
         [(0x220, 16, R), (0x302, 1, W)]],
        extra=[(0x200, req(0, 8)), (0x210, req(1, 16)), (0x220, req(4, 0))]),
    # OUT whose data crosses the region boundary; GET_ID with the status inside the data buffer
    "seed-cross-getid": chain_seed(
        [[(0x200, 16, R), (0xff00, 0x200, R), (0x300, 1, W)],
         [(0x210, 16, R), (0x800, 21, W)]],
        extra=[(0x200, req(1, 0)), (0x210, req(8, 0))]),
    # DISCARD and WRITE_ZEROES (header + segment in one descriptor), and an indirect table at +0x280
    "seed-discard-indirect": chain_seed(
        [[(0x200, 32, R), (0x300, 1, W)],
         [(0x280, 48, IND)]],
        extra=[(0x200, req(11, 0) + struct.pack("<QII", 8, 8, 0)),
               (0x280, struct.pack("<QIHH", BASE + 0x220, 32, NEXT, 1) + struct.pack("<QIHH", BASE + 0x400, 0, W | NEXT, 2)
                + struct.pack("<QIHH", BASE + 0x301, 1, W, 0)),
               (0x220, req(13, 16) + struct.pack("<QII", 0, 8, 1))]),
}
write("chain_parser", seeds)

rpc = {
    "seed-create": b'\x00{"name": "Malloc0", "block_size": 512, "num_blocks": 1024, "read_only": false, "md_size": 0}',
    "seed-null": b"\x80null",
    "seed-bad-types": b'\x13{"name": 5, "num_blocks": -1, "ctrlr": [1, 2], "bdev_name": {"a": null}}',
}
write("rpc_params", rpc)

srv = {
    "seed-one": b'{"jsonrpc": "2.0", "id": 1, "method": "echo", "params": {"name": "x", "size": 4096, "md_size": 0}}\n',
    "seed-back-to-back": b'{"jsonrpc":"2.0","id":1,"method":"none"}{"jsonrpc":"2.0","id":"a","method":"fail"}{"jsonrpc":"2.0","method":"echo"}',
    "seed-batch": b'[{"jsonrpc":"2.0","id":1,"method":"echo","params":{"name":"y","read_only":true}},{"jsonrpc":"2.0","method":"none"},1,{"id":2}]',
    "seed-garbage": b'{"jsonrpc":"2.0","id":1,"method":"nope","params":[1]}\n{"jsonrpc": "2.0", "id": null, "method": "echo", ',
}
write("rpc_server", srv)

# config_file: the example of crates/flashpath/src/config.rs's module docs, every bdev type,
# QoS limits and groups (good and refused),
# entries that each method refuses, limits and paths that try to leave the export directory
# ("@" stands for it: see fuzz_targets/config_file.rs).
cfg = {
    "seed-doc-example": b"""rpc = "/var/tmp/flashpath.sock"
vhost_dir = "/var/tmp/flashpath"

[reactor]
cpus = "0-1"
idle_window_us = 200

[[bdev]]
type = "malloc"
name = "ram0"
num_blocks = 262144
block_size = 4096

[[vhost_blk]]
ctrlr = "vhost.0"
dev_name = "ram0"
cpumask = "[0,1]"
num_queues = 2
""",
    "seed-every-type": b"""[[bdev]]
type = "null"
name = "n0"
num_blocks = 1024
block_size = 512
[[bdev]]
type = "malloc"
num_blocks = 64
block_size = 4096
md_size = 0
[[bdev]]
type = "uring"
name = "u0"
filename = "@/disk.img"
direct = false
[[bdev]]
type = "delay"
name = "d0"
base_bdev_name = "n0"
avg_read_latency = 10
p99_read_latency = 20
avg_write_latency = 10
p99_write_latency = 20
[[vhost_blk]]
ctrlr = "v0"
dev_name = "d0"
readonly = true
[[vhost_blk]]
ctrlr = "v1"
dev_name = "Malloc0"
cpumask = "0x1"
num_queues = 1
transport = "vhost_user_blk"
""",
    "seed-refused": b"""[[bdev]]
type = "null"
name = "a"
num_blocks = 8
block_size = 512
[[bdev]]
type = "uring"
name = "u"
filename = "/dev/sda"
block_size = 1000
[[vhost_blk]]
ctrlr = "../x"
dev_name = "zz"
cpumask = "[0,x]"
""",
    "seed-limits-escape": b"""[limits]
max_bdevs = 4
max_controllers = 1
max_malloc_bytes = 1048576
[security]
vhost_socket_mode = 0o660
export_dirs = ["/srv/disks"]
[[bdev]]
type = "uring"
name = "e"
filename = "@/escape"
direct = false
[[bdev]]
type = "uring"
name = "o"
filename = "@/sub/../../outside.img"
direct = false
[[bdev]]
type = "uring"
name = "t"
filename = "@/tiny.img"
[[bdev]]
type = "malloc"
num_blocks = 4096
block_size = 512
""",
    "seed-qos": b"""[[bdev]]
type = "null"
name = "a"
num_blocks = 1024
block_size = 512
[[bdev]]
type = "null"
name = "b"
num_blocks = 1024
block_size = 512
[[qos_limit]]
name = "a"
rw_ios_per_sec = 20000
w_mbytes_per_sec = 0
[[qos_limit]]
name = "b"
rw_ios_per_sec = 999
[[qos_group]]
name = "g"
iops_total = 10000
iops_total_max = 20000
iops_total_max_length = 5
members = [ { bdev_name = "a", weight = 3 }, { bdev_name = "b" }, { bdev_name = "a" } ]
[[qos_group]]
name = "h"
bps_total = 5
bps_read = 7
members = [ { bdev_name = "zz", weight = 0 } ]
""",
    # Ceph: the target points every connection at a closed port, so a cluster table ends the
    # file (after client_mount_timeout, 1 s); the bdevs' own refusals come without one.
    "seed-rbd-cluster": b"""[[rbd_cluster]]
name = "ceph"
user_id = "admin"
config_param = { rados_osd_op_timeout = "3", rbd_cache = false, client_mount_timeout = 30 }
[[rbd_cluster]]
name = "bad"
config_file = "/etc/ceph/ceph.conf"
key_file = "/etc/ceph/ceph.client.admin.keyring"
core_mask = "0x1"
[[bdev]]
type = "rbd"
pool_name = "rbd"
rbd_name = "vm1"
cluster_name = "ceph"
""",
    # NVMe controllers: the target points TCP ones at a closed loopback port and PCIe ones at a
    # function no machine has, so an attach fails at its place; the options' refusals come first.
    "seed-nvme": b"""[nvme_options]
timeout_us = 1000000
action_on_timeout = "abort"
keep_alive_timeout_ms = 5000
io_queue_requests = 256
[[nvme_controller]]
name = "Nvme0"
trtype = "tcp"
traddr = "127.0.0.1"
adrfam = "ipv4"
trsvcid = "4420"
subnqn = "nqn.2016-06.io.spdk:cnode1"
hostnqn = "nqn.2014-08.org.nvmexpress:uuid:6a1f0c2e-5b7d-4c8e-9f10-2b3c4d5e6f70"
ctrlr_loss_timeout_sec = -1
reconnect_delay_sec = 1
fast_io_fail_timeout_sec = 2
[[nvme_controller]]
name = "Nvme1"
trtype = "PCIe"
traddr = "0000:00:04.0"
[[bdev]]
type = "delay"
name = "slow"
base_bdev_name = "Nvme0n1"
avg_read_latency = 1
p99_read_latency = 1
avg_write_latency = 1
p99_write_latency = 1
""",
    "seed-rbd": b"""[[bdev]]
type = "null"
name = "n0"
num_blocks = 1024
block_size = 512
[[bdev]]
type = "rbd"
name = "vm1"
pool_name = "rbd"
rbd_name = "vm1"
cluster_name = "ceph"
block_size = 4096
read_only = true
[[bdev]]
type = "rbd"
pool_name = "rbd"
rbd_name = "vm2"
user_id = "admin"
config = { rbd_cache = "false" }
[[bdev]]
type = "rbd"
pool_name = "rbd"
rbd_name = "vm3"
cluster_name = "nope"
[[vhost_blk]]
ctrlr = "v0"
dev_name = "vm1"
""",
    # NBD exports: every nbd_device form (each confined to the scratch nbd directory by the
    # target), two exports on one listener, a read-only export sharing its disk with a read-only
    # controller, TLS files ("@" is the scratch tls directory), and refusals.
    "seed-nbd": b"""[[bdev]]
type = "malloc"
name = "ram0"
num_blocks = 2048
block_size = 512
[[bdev]]
type = "null"
name = "n0"
num_blocks = 1024
block_size = 4096
[[vhost_blk]]
ctrlr = "v0"
dev_name = "ram0"
readonly = true
[[nbd_disk]]
bdev_name = "ram0"
nbd_device = "/var/tmp/flashpath/ram0.nbd"
readonly = true
[[nbd_disk]]
bdev_name = "n0"
nbd_device = "nbd+unix:///null%20disk?socket=/var/tmp/flashpath/shared.nbd"
[[nbd_disk]]
bdev_name = "ram0"
nbd_device = "nbd+unix:///again?socket=/var/tmp/flashpath/shared.nbd"
readonly = true
[[nbd_disk]]
bdev_name = "ram0"
nbd_device = "nbd://[::1]/loop"
readonly = true
[[nbd_disk]]
bdev_name = "ram0"
nbd_device = "nbd://0.0.0.0:10809/wide"
readonly = true
tls_cert = "@/garbage.pem"
tls_key = "@/empty.pem"
tls_ca = "/etc/ssl/certs/ca-certificates.crt"
""",
    "seed-nbd-refused": b"""[[bdev]]
type = "null"
name = "n0"
num_blocks = 1024
block_size = 512
[[nbd_disk]]
bdev_name = "n0"
nbd_device = "nbd+unix:///x?socket=%2Fetc%2Fpasswd&socket=/tmp/y"
[[nbd_disk]]
bdev_name = "n0"
nbd_device = "relative.sock"
""",
    "seed-syntax": b"""[reactor]
cpus = "0-x"
idle_window_us = "fast"
[[bdev]
a = [
1,
""",
}
write("config_file", cfg)

# vhost_messages: records of (request, flags, fd byte, memfd-size byte, body); see the table at
# the top of fuzz_targets/vhost_messages.rs. Request 0 is a harness operation.
GET_FEATURES, SET_FEATURES, SET_OWNER, RESET_OWNER, SET_MEM_TABLE = 1, 2, 3, 4, 5
SET_VRING_NUM, SET_VRING_ADDR, SET_VRING_BASE, GET_VRING_BASE = 8, 9, 10, 11
SET_VRING_KICK, SET_VRING_CALL, SET_VRING_ERR = 12, 13, 14
GET_PROTOCOL_FEATURES, SET_PROTOCOL_FEATURES, GET_QUEUE_NUM, SET_VRING_ENABLE = 15, 16, 17, 18
GET_CONFIG, GET_INFLIGHT_FD, SET_INFLIGHT_FD = 24, 31, 32
GET_MAX_MEM_SLOTS, ADD_MEM_REG, REM_MEM_REG = 36, 37, 38
SET_LOG_BASE = 6
F_LOG_ALL, PF_LOG_SHMFD, VRING_F_LOG = 1 << 26, 0x2, 1
NEED_REPLY = 8
MEMFD, EVENTFD = 0, 1
UA = 0x7F0000000000  # the VMM's virtual address of guest address 0
F_VERSION_1, F_EVENT_IDX, F_INDIRECT, F_PROTOCOL = 1 << 32, 1 << 29, 1 << 28, 1 << 30
PF = 0x1 | 0x8 | 0x200 | 0x1000 | 0x8000  # MQ, REPLY_ACK, CONFIG, INFLIGHT_SHMFD, CONFIGURE_MEM_SLOTS


def rec(code, body=b"", flags=0, fds=0, fd_kind=MEMFD, mem_pages=15):
    return bytes([code, flags, fds | fd_kind << 3, mem_pages - 1]) + struct.pack("<H", len(body)) + body


def fill(offset, data):
    assert offset % 16 == 0
    return bytes([0, 0]) + struct.pack("<H", offset // 16) + struct.pack("<H", len(data)) + data


def kick():
    return bytes([0, 1, 0, 0, 0, 0])


def vring_state(index, num):
    return struct.pack("<II", index, num)


def region(gpa, size, ua, off=0):
    return struct.pack("<QQQQ", gpa, size, ua, off)


def handshake(features=F_VERSION_1 | F_PROTOCOL | F_EVENT_IDX | F_INDIRECT, pages=16, pf=PF):
    return (rec(GET_FEATURES) + rec(SET_FEATURES, struct.pack("<Q", features))
            + rec(GET_PROTOCOL_FEATURES) + rec(SET_PROTOCOL_FEATURES, struct.pack("<Q", pf))
            + rec(SET_OWNER) + rec(GET_QUEUE_NUM) + rec(GET_MAX_MEM_SLOTS)
            + rec(SET_MEM_TABLE, struct.pack("<II", 1, 0) + region(0, pages * 0x1000, UA), fds=1,
                  mem_pages=pages))


def vring_addr(index, desc, avail, used, flags=0, log=0):
    return rec(SET_VRING_ADDR, struct.pack("<IIQQQQ", index, flags, UA + desc, UA + used, UA + avail, log))


def ring(index=0, size=256, desc=0, avail=0x1000, used=0x2000):
    return (rec(SET_VRING_NUM, vring_state(index, size))
            + vring_addr(index, desc, avail, used)
            + rec(SET_VRING_BASE, vring_state(index, 0))
            + rec(SET_VRING_KICK, struct.pack("<Q", index), fds=1, fd_kind=EVENTFD)
            + rec(SET_VRING_CALL, struct.pack("<Q", index), fds=1, fd_kind=EVENTFD)
            + rec(SET_VRING_ERR, struct.pack("<Q", index | 0x100))
            + rec(SET_VRING_ENABLE, vring_state(index, 1), flags=NEED_REPLY))


def blk_request(rtype, sector, data_len, data_flags):
    # descriptors at 0: header @0x3000, data @0x4000, status @0x5000; avail @0x1000 holds head 0
    descs = (struct.pack("<QIHH", 0x3000, 16, 1, 1) + struct.pack("<QIHH", 0x4000, data_len, 1 | data_flags, 2)
             + struct.pack("<QIHH", 0x5000, 1, 2, 0))
    return (fill(0, descs) + fill(0x1000, struct.pack("<HHH", 0, 1, 0))
            + fill(0x3000, struct.pack("<IIQ", rtype, 0, sector)) + fill(0x4000, b"\xa5" * data_len))


vhost = {
    # The handshake QEMU does, one queue started and stopped, the config space read.
    "seed-handshake": bytes([1]) + handshake() + ring()
    + rec(GET_CONFIG, struct.pack("<III", 0, 60, 0) + bytes(60))
    + rec(GET_VRING_BASE, vring_state(0, 0)),
    # A read and a write through a started queue, then a memory-table change under it.
    "seed-io": bytes([0]) + handshake() + ring() + blk_request(0, 8, 512, 2) + kick()
    + blk_request(1, 16, 512, 0) + fill(0x1000, struct.pack("<HHHH", 0, 2, 0, 0)) + kick()
    + rec(SET_MEM_TABLE, struct.pack("<II", 1, 0) + region(0, 0x10000, UA), fds=1, mem_pages=16)
    + rec(GET_VRING_BASE, vring_state(0, 0)),
    # In-flight tracking, memory slots added and removed, enable/disable, reset.
    "seed-inflight-slots": bytes([1]) + handshake()
    + rec(GET_INFLIGHT_FD, struct.pack("<QQHHI", 0, 0, 2, 256, 0))
    + rec(ADD_MEM_REG, struct.pack("<Q", 0) + region(0x100000, 0x4000, UA + 0x100000), fds=1, mem_pages=4)
    + ring(1, 256, 0, 0x1000, 0x2000)
    + rec(SET_VRING_ENABLE, vring_state(1, 0))
    + rec(REM_MEM_REG, struct.pack("<Q", 0) + region(0x100000, 0x4000, UA + 0x100000))
    + rec(RESET_OWNER) + rec(GET_FEATURES),
    # A live migration: the log (a 4 KiB memfd, 8 bytes used: 64 KiB of memory needs 2), then
    # LOG_ALL and VHOST_VRING_F_LOG on the running queue, a read, logging off again, the ring
    # stopped. The request is laid out before the log's memfd becomes the one `fill` writes.
    "seed-migration": bytes([0]) + handshake(pf=PF | PF_LOG_SHMFD) + ring() + blk_request(0, 8, 512, 2)
    + rec(SET_LOG_BASE, struct.pack("<QQ", 8, 0), fds=1, mem_pages=1)
    + rec(SET_FEATURES, struct.pack("<Q", F_VERSION_1 | F_PROTOCOL | F_EVENT_IDX | F_INDIRECT | F_LOG_ALL),
          flags=NEED_REPLY)
    + vring_addr(0, 0, 0x1000, 0x2000, VRING_F_LOG, 0x2000) + kick()
    + vring_addr(0, 0, 0x1000, 0x2000)
    + rec(SET_FEATURES, struct.pack("<Q", F_VERSION_1 | F_PROTOCOL | F_EVENT_IDX | F_INDIRECT))
    + rec(GET_VRING_BASE, vring_state(0, 0))
    # A log too small for the memory table: refused, the sequence ends.
    + rec(SET_LOG_BASE, struct.pack("<QQ", 1, 0), fds=1, mem_pages=1),
}
write("vhost_messages", vhost)


# lvol_metadata: store images (layout: docs/lvol-format.md; input: the top of the target).
def crc32c(data):
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
    return crc ^ 0xFFFFFFFF


def sealed(page):
    page = bytearray(page.ljust(4096, b"\0"))
    page[12:16] = b"\0\0\0\0"
    page[12:16] = struct.pack("<I", crc32c(page))
    return bytes(page)


LVS_UUID = bytes(range(1, 17))
UNMAPPED = 0xFFFFFFFF


def lvs_stream(vols):
    out = struct.pack("<I", len(vols))
    for uuid, parent, flags, name, cmap, *external in vols:
        out += uuid + parent + struct.pack("<IB", flags, len(name)) + name + struct.pack("<Q", len(cmap))
        out += b"".join(struct.pack("<I", c) for c in cmap)
        # Flag 8: the external parent (its size in clusters, its bdev's name).
        for clusters, bdev in external:
            out += struct.pack("<QB", clusters, len(bdev)) + bdev
    return out


def lvs_area(gen, total, vols, name=b"lvs0", area_pages=2):
    stream = lvs_stream(vols)
    pages = [stream[i:i + 4096].ljust(4096, b"\0") for i in range(0, len(stream), 4096)]
    free = total - sum(1 for v in vols for c in v[4] if c != UNMAPPED)
    sb = (b"FPLVSUPR" + struct.pack("<IIQ", 1, 0, gen) + LVS_UUID + struct.pack("<QIIIIQQQB", 4096, 512, 4096, area_pages, len(pages), total, free, len(stream), len(name))
          + name.ljust(63, b"\0") + bytes(8))
    assert len(sb) == 160
    sb += b"".join(struct.pack("<I", crc32c(p)) for p in pages)
    return [sealed(sb)] + pages + [bytes(4096)] * (area_pages - 1 - len(pages))


def lvs_image(areas, pages=10, area_pages=2):
    label = sealed(b"FPLVLABL" + struct.pack("<II", 1, 0) + LVS_UUID + struct.pack("<QII", 4096, 512, area_pages))
    img = label + b"".join(b"".join(a) for a in areas)
    return img.ljust(pages * 4096, b"\0")


SNAP, VOL, CLONE = b"\x51" * 16, b"\x52" * 16, b"\x53" * 16
NIL = bytes(16)
THIN, RO, SNAPSHOT, EXTERNAL = 1, 2, 4, 8
# 10 pages: label, two areas of 2 pages, 5 data clusters of 4 KiB.
lvs_vols = [
    (SNAP, NIL, RO | SNAPSHOT, b"snap", [0, 1]),
    (VOL, SNAP, THIN, b"vol", [2, UNMAPPED]),
    (CLONE, SNAP, THIN, b"clone", [UNMAPPED, 3]),
]
lvs_good = lvs_image([lvs_area(1, 5, []), lvs_area(2, 5, lvs_vols)])
lvs_torn = bytearray(lvs_good)
lvs_torn[(1 + 2 + 1) * 4096 + 40] ^= 0xFF  # area 1's stream page: back to generation 1
lvs_cycle = [(VOL, CLONE, THIN | RO | SNAPSHOT, b"vol", [2, UNMAPPED]), (CLONE, VOL, THIN | RO | SNAPSHOT, b"clone", [UNMAPPED, 3])]
write("lvol_metadata", {
    # A snapshot with a volume and a clone on it, generation 2; generation 1 (empty) beside it.
    "seed-store": bytes([0]) + lvs_good,
    # Generation 2 torn (a stream page does not match its checksum): loads generation 1.
    "seed-torn": bytes([0]) + bytes(lvs_torn),
    # Re-sealed by the target: parents that form a cycle, refused by the store's checks.
    "seed-cycle": bytes([1]) + lvs_image([lvs_area(1, 5, []), lvs_area(3, 5, lvs_cycle)]),
    # A snapshot reading through an external parent (an esnap), with a clone on it.
    "seed-esnap": bytes([0]) + lvs_image([lvs_area(1, 5, []), lvs_area(2, 5, [
        (SNAP, NIL, THIN | RO | SNAPSHOT | EXTERNAL, b"snap", [0, UNMAPPED], (2, b"golden")),
        (CLONE, SNAP, THIN, b"clone", [UNMAPPED, 3]),
    ])]),
    # Re-sealed noise after a label.
    "seed-noise": bytes([1]) + lvs_good[:4096] + bytes((i * 37 + 11) % 256 for i in range(9 * 4096)),
})

# nbd_protocol: see the table at the top of fuzz_targets/nbd_protocol.rs.
IHAVEOPT_CTL = 1  # control byte: the option magic is IHAVEOPT, 4-byte length


def nbd_opt(option, data=b""):
    return bytes([IHAVEOPT_CTL]) + struct.pack(">II", option, len(data)) + data


def nbd_name(name, infos=()):
    return struct.pack(">I", len(name)) + name + struct.pack(">H", len(infos)) + b"".join(struct.pack(">H", i) for i in infos)


def nbd_req(command, offset, length, flags=0, payload=b""):
    return bytes([1]) + struct.pack(">HHQQI", flags, command, 7, offset, length) + payload


def nbd_meta(name, queries):
    return struct.pack(">I", len(name)) + name + struct.pack(">I", len(queries)) + b"".join(struct.pack(">I", len(q)) + q for q in queries)


meta = struct.pack(">I", 5) + b"disk0" + struct.pack(">I", 1) + struct.pack(">I", 15) + b"base:allocation"
write("nbd_protocol", {
    # What qemu-img sends: structured replies, base:allocation, GO with information requests,
    # then a read, a 512-byte write, block status, flush and disconnect.
    "seed-qemu": bytes([2]) + struct.pack(">I", 3) + nbd_opt(8) + nbd_opt(10, meta)
    + nbd_opt(7, nbd_name(b"disk0", (3, 1, 2)))
    + nbd_req(0, 0, 4096) + nbd_req(1, 512, 512, payload=b"\xab" * 512) + nbd_req(7, 0, 1 << 20)
    + nbd_req(3, 0, 0) + nbd_req(2, 0, 0),
    # A TLS listener: LIST refused, STARTTLS, then LIST, INFO and GO of the only export.
    "seed-tls": bytes([1]) + struct.pack(">I", 1) + nbd_opt(3) + nbd_opt(5) + nbd_opt(3)
    + nbd_opt(6, nbd_name(b"", ())) + nbd_opt(7, nbd_name(b"disk0", ())) + nbd_req(0, 0, 512),
    # The old way in: NBD_OPT_EXPORT_NAME (with the 124 zero bytes), then an oversized read.
    "seed-export-name": bytes([4]) + struct.pack(">I", 1) + nbd_opt(9, meta) + nbd_opt(1, b"d1")
    + nbd_req(0, 0, (32 << 20) + 1),
    # Lengths that lie, an unknown option, then a bad magic.
    "seed-bad-lengths": bytes([2]) + struct.pack(">I", 1) + nbd_opt(7, struct.pack(">I", 100) + b"disk0")
    + nbd_opt(0x4242, b"x") + nbd_opt(6, nbd_name(b"x", (0,))[:-1]) + bytes([0]) + b"NOTMAGIC" + bytes(8),
    # qemu:dirty-bitmap: contexts (three exports; "x" offers bitmaps b0 and b1): LIST by the
    # qemu: and qemu:dirty-bitmap: namespaces, SET of base:allocation, a bitmap and an unknown
    # one, GO, then block status with REQ_ONE.
    "seed-dirty-bitmap": bytes([4]) + struct.pack(">I", 1) + nbd_opt(8)
    + nbd_opt(10, nbd_meta(b"x", [b"qemu:"])) + nbd_opt(10, nbd_meta(b"x", [b"qemu:dirty-bitmap:"]))
    + nbd_opt(11, nbd_meta(b"x", [b"base:allocation", b"qemu:dirty-bitmap:b1", b"qemu:dirty-bitmap:zz"]))
    + nbd_opt(7, nbd_name(b"x", ())) + nbd_req(7, 0, 1 << 20, flags=8),
    # nbd_device strings.
    "seed-device-unix": bytes([8]) + b"nbd+unix:///disk0?socket=/var/tmp/x.sock",
    "seed-device-tcp": bytes([8]) + b"nbd://[::1]:10809/a%20b",
})

# nvmf_pdu: see the table at the top of fuzz_targets/nvmf_pdu.rs.


def crc32c(data):
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def nvmf_pdu(ptype, hdr_rest, data=b"", hd=False, dd=False, flags=0):
    hlen = 8 + len(hdr_rest)
    hdl = 4 if hd else 0
    pdo = hlen + hdl if data else 0
    plen = hlen + hdl + len(data) + (4 if dd and data else 0)
    f = flags | (1 if hd else 0) | (2 if dd and data else 0)
    h = bytes([ptype, f, hlen, pdo]) + struct.pack("<I", plen) + hdr_rest
    out = h + (struct.pack("<I", crc32c(h)) if hd else b"")
    if data:
        out += data + (struct.pack("<I", crc32c(data)) if dd else b"")
    return out


def nvmf_icreq(dgst=0):
    return nvmf_pdu(0, struct.pack("<HBBI", 0, 0, dgst, 0) + bytes(112))


def nvmf_connect(qid, subnqn, hostnqn, cntlid=0xFFFF, hd=False, dd=False):
    sqe = bytes([0x7F, 0x40]) + struct.pack("<H", 1) + bytes([1]) + bytes(19)
    sqe += struct.pack("<QI", 0, 1024) + bytes([0, 0, 0, 0x01])
    sqe += struct.pack("<HHHBB", 0, qid, 127, 0, 0) + struct.pack("<I", 15000) + bytes(12)
    assert len(sqe) == 64
    data = bytes([0x11] * 16) + struct.pack("<H", cntlid) + bytes(238)
    data += subnqn.ljust(256, b"\0") + hostnqn.ljust(256, b"\0") + bytes(256)
    return nvmf_pdu(4, sqe, data, hd, dd)


def nvmf_io(opc, cid, slba, nlb, data=b"", sgl_type=0x01, length=None, hd=False, dd=False):
    ln = len(data) if length is None else length
    sqe = bytes([opc, 0x40]) + struct.pack("<HI", cid, 1) + bytes(16)
    sqe += struct.pack("<QI", 0, ln) + bytes([0, 0, 0, sgl_type])
    sqe += struct.pack("<QI", slba, nlb - 1) + bytes(12)
    return nvmf_pdu(4, sqe, data, hd, dd)


SUB = b"nqn.2016-06.io.spdk:cnode1"
HOST = b"nqn.2014-08.org.nvmexpress:uuid:0"
write("nvmf_pdu", {
    # A Linux host's admin queue: ICReq, Connect, a Property Get.
    "seed-connect": bytes([0]) + nvmf_icreq() + nvmf_connect(0, SUB, HOST),
    # Digests on both ways: an I/O queue's Connect, a 4 KiB in-capsule write, a read asking R2T-less data.
    "seed-digests": bytes([3]) + nvmf_icreq(3) + nvmf_connect(1, SUB, HOST, 1, True, True)
    + nvmf_io(1, 2, 0, 8, b"\xab" * 4096, hd=True, dd=True) + nvmf_io(2, 3, 0, 8, sgl_type=0x5A, length=4096, hd=True),
    # H2CData after an R2T-sized write, then a host term request.
    "seed-h2c": bytes([0]) + nvmf_io(1, 4, 0, 16, sgl_type=0x5A, length=8192)
    + nvmf_pdu(6, struct.pack("<HHII", 4, 1, 0, 4096) + bytes(4), b"\xcd" * 4096, flags=4)
    + nvmf_pdu(2, struct.pack("<HI", 1, 2) + bytes(10)),
    # Lies: a wrong HLEN, then PDO inside the header.
    "seed-bad": bytes([0]) + bytes([4, 0, 71, 0]) + struct.pack("<I", 72) + bytes(64)
    + bytes([4, 0, 72, 8]) + struct.pack("<I", 100) + bytes(92),
})

# nvmf_admin: see the table at the top of fuzz_targets/nvmf_admin.rs. Each command record is
# 0x00, a 64-byte SQE, a data length byte and the data.
def sqe(opcode, cid, nsid=0, cdw=None, fctype=None, flags=0, b40=b""):
    s = bytearray(64)
    s[0], s[1] = opcode, flags
    s[2:4] = struct.pack("<H", cid)
    s[4:8] = struct.pack("<I", nsid)
    if fctype is not None:
        s[4] = fctype
    for n, v in (cdw or {}).items():
        s[40 + (n - 10) * 4:44 + (n - 10) * 4] = struct.pack("<I", v)
    s[40:40 + len(b40)] = b40 or s[40:40 + len(b40)]
    return bytes(s)


def cmd(s, data=b""):
    return bytes([0]) + s + bytes([len(data)]) + data


def prop_get(cid, ofst, eight=False):
    return cmd(sqe(0x7F, cid, fctype=0x04, b40=bytes([1 if eight else 0, 0, 0, 0]) + struct.pack("<I", ofst)))


def prop_set(cid, ofst, value):
    return cmd(sqe(0x7F, cid, fctype=0x00, b40=bytes(4) + struct.pack("<IQ", ofst, value)))


def identify(cid, cns, nsid=0, cdw11=0):
    return cmd(sqe(0x06, cid, nsid, {10: cns, 11: cdw11}))


def get_log(cid, lid, numd, offset=0, rae=False, nsid=0xFFFFFFFF):
    n = numd - 1
    return cmd(sqe(0x02, cid, nsid, {10: lid | (rae << 15) | ((n & 0xFFFF) << 16), 11: n >> 16,
                                      12: offset & 0xFFFFFFFF, 13: offset >> 32}))


def set_feat(cid, fid, value, sv=False):
    return cmd(sqe(0x09, cid, 0, {10: fid | (sv << 31), 11: value}))


def get_feat(cid, fid, sel=0, cdw11=0):
    return cmd(sqe(0x0A, cid, 0, {10: fid | (sel << 8), 11: cdw11}))


def aer(cid):
    return cmd(sqe(0x0C, cid))


def keep_alive(cid):
    return cmd(sqe(0x18, cid))


CC_EN = 1 | (6 << 16) | (4 << 20)
NS_CHANGED = lambda nsid: bytes([1 | (nsid << 2)])
DISC_CHANGED = bytes([2])
PASS = lambda tenths: bytes([3 | (tenths << 2)])
DISCONNECT = cmd(sqe(0x7F, 90, fctype=0x08))

write("nvmf_admin", {
    # What Linux's host does on connect, a namespace change and its AER, keep-alives, shutdown.
    "seed-linux": bytes([5 << 1]) + prop_get(1, 0x00, True) + prop_get(2, 0x08) + prop_set(3, 0x14, CC_EN)
    + prop_get(4, 0x1C) + identify(5, 1) + identify(6, 6) + set_feat(7, 0x07, 1 | (1 << 16))
    + set_feat(8, 0x0B, 1 << 8) + aer(100) + identify(9, 2) + identify(10, 3, 1) + identify(11, 0, 1)
    + identify(12, 0, 2) + get_log(13, 0x02, 128) + get_feat(14, 0x04) + keep_alive(15)
    + NS_CHANGED(2) + get_log(16, 0x04, 1024) + aer(101) + PASS(30) + keep_alive(17)
    + prop_set(18, 0x14, CC_EN | (1 << 14)) + prop_get(19, 0x1C) + DISCONNECT,
    # nvme discover: the header first, the whole page, one entry by offset; a change event.
    "seed-discovery": bytes([1]) + prop_get(1, 0x00, True) + prop_set(2, 0x14, CC_EN) + identify(3, 1)
    + set_feat(4, 0x0B, 1 << 31) + get_feat(5, 0x0F) + aer(50) + get_log(6, 0x70, 4, rae=True, nsid=0)
    + get_log(7, 0x70, 1024, nsid=0) + get_log(8, 0x70, 256, offset=2048, nsid=0) + DISC_CHANGED
    + get_log(9, 0x70, 1024, nsid=0) + aer(51) + keep_alive(10) + PASS(63) + PASS(63),
    # Commands before enable, a bad CC, the AER limit, logs past their end, odd offsets and a
    # huge NUMD, saveable features, unknown opcodes and CNS values, a fused command, Connect.
    "seed-hostile": bytes([1 << 1]) + identify(1, 1) + prop_set(2, 0x14, 1 | (7 << 16)) + prop_get(3, 0x24)
    + prop_set(4, 0x00, 5) + prop_set(5, 0x14, CC_EN) + b"".join(aer(20 + i) for i in range(6))
    + get_log(6, 0x04, 2, offset=4096) + get_log(7, 0x02, 4, offset=2) + get_log(8, 0x01, 1 << 32)
    + get_log(9, 0x70, 4) + set_feat(10, 0x0F, 100, sv=True) + set_feat(11, 0x07, 0xFFFF)
    + get_feat(12, 0x81, cdw11=1) + get_feat(13, 0x81) + get_feat(14, 0x07, sel=3) + get_feat(15, 0x07, sel=7)
    + identify(16, 0, 0xFFFFFFFF) + identify(17, 2, 0xFFFFFFFE) + identify(18, 0x1F) + cmd(sqe(0x06, 19, flags=1))
    + cmd(sqe(0x7F, 21, fctype=0x01), bytes(200)) + cmd(sqe(0xC0, 22)) + cmd(sqe(0x08, 23, cdw={10: 5 << 16}))
    + NS_CHANGED(1) + NS_CHANGED(3) + PASS(40) + prop_set(24, 0x14, 0) + identify(25, 1),
    # ANA reporting with group 1 inaccessible: the notices enabled, Identify, the ANA log page
    # whole and groups only (LSP bit 0), two ANA changes with an AER parked for each.
    "seed-ana": bytes([0x10 | (3 << 5)]) + prop_set(1, 0x14, CC_EN) + identify(2, 1)
    + set_feat(3, 0x0B, (1 << 8) | (1 << 11)) + aer(70) + identify(4, 0, 1) + get_log(5, 0x0C, 64)
    + DISC_CHANGED + cmd(sqe(0x02, 6, 0xFFFFFFFF, {10: 0x0C | (1 << 8) | (15 << 16)})) + aer(71)
    + DISC_CHANGED + get_log(7, 0x0C, 4, offset=16, rae=True),
})

# nvme_tcp_host: see the table at the top of fuzz_targets/nvme_tcp_host.rs. Commands in flight:
# cid 0 a 4 KiB read, 1 an 8 KiB write, 2 a Flush, 3 a 1 KiB read.
def resp(cid, status=0, hd=False):
    return nvmf_pdu(5, struct.pack("<IIHHHH", 0, 0, 0, 1, cid, status), hd=hd)


def c2h(cid, offset, data, flags=0, hd=False, dd=False):
    return nvmf_pdu(7, struct.pack("<HHII", cid, 0, offset, len(data)) + bytes(4), data, hd, dd, flags)


def r2t(cid, offset, length, ttag=1, hd=False):
    return nvmf_pdu(9, struct.pack("<HHII", cid, ttag, offset, length) + bytes(4), hd=hd)


LAST, SUCCESS = 0x04, 0x08
write("nvme_tcp_host", {
    # Everything completes: the 4 KiB read in two C2HData (SUCCESS on the last), the write in
    # capsule, the Flush, the 1 KiB read then its response.
    "seed-complete": bytes([0x30]) + c2h(0, 0, b"\x01" * 2048) + c2h(0, 2048, b"\x02" * 2048, LAST | SUCCESS)
    + resp(1) + resp(2) + c2h(3, 0, b"\x03" * 1024, LAST) + resp(3),
    # Digests on, the write by R2T (two H2CData at MAXH2CDATA 4 KiB), an error status.
    "seed-digests-r2t": bytes([0x07]) + r2t(1, 0, 8192, hd=True) + c2h(0, 0, b"\x05" * 4096, LAST, True, True)
    + resp(0, hd=True) + resp(1, hd=True) + resp(2, 0x4 << 1, hd=True) + resp(3, 0x80 << 1, hd=True),
    # Lies: data for a command not in flight, then past a command's end, then a term request.
    "seed-hostile": bytes([0x04]) + c2h(5, 0, b"\x07" * 16) + c2h(3, 0, b"\x08" * 2048, LAST)
    + r2t(1, 4096, 8192) + nvmf_pdu(3, struct.pack("<HI", 1, 2) + bytes(10)),
})

# nvme_device: see the table at the top of fuzz_targets/nvme_device.rs. The setup byte is the
# queue's entries - 2 (and 32: shadow doorbells, 64: SGLs offered); a completion's CID byte
# below 128 picks a command in flight, 128 + n is the raw ID n (the first command's is 0).
ND_SUBMIT = lambda kind: bytes([0, kind])
ND_FLUSH, ND_POLL, ND_EXPIRED = bytes([1]), bytes([2]), bytes([6])
ND_CQE = lambda cid, sqhd, sc=0, flags=0: bytes([3, cid, sqhd, sc, flags])
ND_RAW = lambda b: bytes([4]) + b
ND_CSTS = lambda v: bytes([5, v])

write("nvme_device", {
    # Eight entries, shadows and SGLs: each kind of command completed in order, a wrap of the
    # ring (the phase flips), an error status, a timeout scan.
    "seed-healthy": bytes([6 | 32 | 64]) + ND_SUBMIT(0) + ND_SUBMIT(1) + ND_SUBMIT(2) + ND_SUBMIT(3) + ND_FLUSH
    + ND_CQE(0, 1) + ND_CQE(1, 2) + ND_POLL + ND_CQE(2, 3, 0x81) + ND_CQE(3, 4) + ND_POLL
    + b"".join(ND_SUBMIT(1) + ND_FLUSH + ND_EXPIRED + ND_CQE(4 + i, (5 + i) % 8) + ND_POLL for i in range(6))
    + ND_EXPIRED,
    # The hostile cases: an unknown CID, a duplicate, an SQ head past the tail, a wrong SQ ID,
    # a wrong phase, raw bytes, a removed device, a fatal one.
    "seed-unknown-cid": bytes([6]) + ND_SUBMIT(1) + ND_SUBMIT(0) + ND_FLUSH + ND_CQE(128 + 7, 1) + ND_POLL + ND_POLL,
    "seed-duplicate": bytes([6]) + ND_SUBMIT(1) + ND_SUBMIT(2) + ND_FLUSH + ND_CQE(128, 1) + ND_POLL
    + ND_CQE(128, 2) + ND_POLL + ND_SUBMIT(0),
    "seed-sqhd": bytes([2]) + ND_SUBMIT(3) + ND_FLUSH + ND_CQE(0, 3) + ND_POLL,
    "seed-unfetched": bytes([6]) + ND_SUBMIT(1) + ND_SUBMIT(1) + ND_FLUSH + ND_CQE(1, 0) + ND_POLL,
    "seed-sqid-phase": bytes([6]) + ND_SUBMIT(0) + ND_FLUSH + ND_CQE(0, 1, 0, 1) + ND_POLL + ND_EXPIRED
    + ND_CQE(0, 1, 0, 2) + ND_POLL,
    "seed-raw": bytes([0]) + ND_SUBMIT(2) + ND_FLUSH + ND_RAW(bytes(range(16))) + ND_POLL
    + ND_RAW(b"\xff" * 16) + ND_POLL,
    "seed-gone": bytes([6]) + ND_SUBMIT(1) + ND_FLUSH + ND_CSTS(0) + b"".join(ND_POLL for _ in range(300)),
    "seed-fatal": bytes([6]) + ND_SUBMIT(3) + ND_FLUSH + ND_CSTS(1) + b"".join(ND_POLL for _ in range(300))
    + ND_SUBMIT(1),
})


# raid_superblock: superblock copies A and B and a bitmap page (layout: docs/raid-format.md;
# input: the top of the target). Pages are sealed here, and the flag byte is 0 (no re-seal), so
# the seeds start from exactly what a raid writes.
RAID_UUID = bytes(range(0x40, 0x50))
RAID_ACTIVE, RAID_FAILED, RAID_REBUILDING = 1, 2, 3


def raid_sealed(page, crc_at):
    page = bytearray(page.ljust(4096, b"\0"))
    page[crc_at:crc_at + 4] = b"\0\0\0\0"
    page[crc_at:crc_at + 4] = struct.pack("<I", crc32c(page))
    return bytes(page)


def raid_sb(seq, slot, slots, clean=0, gib=1, uuid=RAID_UUID, data_offset=1 << 20):
    blocks = gib << 21  # 512-byte blocks
    chunk = 64 << 10
    pages = -(-(-(-(gib << 30) // chunk)) // 32256)
    p = bytearray(4096)
    p[0:8] = b"FPRAIDSB"
    p[8:12] = struct.pack("<I", 1)
    p[16:24] = struct.pack("<Q", seq)
    p[24:40] = uuid
    p[40] = 2
    p[41:43] = b"r1"
    p[104:108] = bytes([2, slot, clean, len(slots)])
    p[108:116] = struct.pack("<II", 0, 512)
    p[120:160] = struct.pack("<QQQQQ", blocks, data_offset, chunk, 2, pages)
    for i, (state, partial, offset) in enumerate(slots):
        at = 256 + 64 * i
        p[at] = state
        p[at + 1] = partial
        p[at + 8:at + 24] = bytes([i + 1] * 16)
        p[at + 24:at + 40] = struct.pack("<QQ", gib << 30, offset)
    return raid_sealed(p, 12)


def raid_bitmap(seq, words, uuid=RAID_UUID, index=0):
    p = bytearray(4096)
    p[0:8] = b"FPRAIDBM"
    p[12:16] = struct.pack("<I", 1)
    p[16:32] = uuid
    p[32:48] = struct.pack("<QQ", seq, index)
    for i, w in enumerate(words):
        p[64 + 8 * i:72 + 8 * i] = struct.pack("<Q", w)
    return raid_sealed(p, 8)


RAID_TWO = [(RAID_ACTIVE, 0, 0), (RAID_FAILED, 0, 0)]
raid_torn = bytearray(raid_sb(8, 0, RAID_TWO))
raid_torn[300:] = bytes(4096 - 300)  # copy A torn inside its slot records: copy B (seq 7) wins
write("raid_superblock", {
    # Copy B newer than A, one failed slot, bits set (a degraded raid1's base).
    "seed-degraded": bytes([0]) + raid_sb(6, 0, RAID_TWO) + raid_sb(7, 0, RAID_TWO)
    + raid_bitmap(7, [0b1011, 0, 1 << 63]),
    "seed-torn": bytes([0]) + bytes(raid_torn) + raid_sb(7, 0, RAID_TWO) + raid_bitmap(7, [1]),
    # Three slots, one being rebuilt partially from 64 MiB, an unclean stop.
    "seed-rebuilding": bytes([0]) + raid_sb(12, 2, [(RAID_ACTIVE, 0, 0), (RAID_ACTIVE, 0, 0), (RAID_REBUILDING, 1, 64 << 20)])
    + raid_sb(11, 2, [(RAID_ACTIVE, 0, 0)] * 3) + raid_bitmap(12, [0xFF] * 8),
    # A bitmap page of another raid, and one newer than its superblock: both refused.
    "seed-foreign-bitmap": bytes([0]) + raid_sb(3, 1, RAID_TWO, clean=1) + bytes(4096)
    + raid_bitmap(3, [5], uuid=bytes(16 * [9])),
    "seed-future-bitmap": bytes([4]) + raid_sb(3, 1, RAID_TWO) + bytes(4096) + raid_bitmap(9, [5]),
    # A crafted data offset (aligned, past the bitmap) whose data end wraps past 2^64: refused,
    # and a raid's I/O could otherwise land over the base's own superblock.
    "seed-offset-wraps": bytes([0]) + raid_sb(5, 0, RAID_TWO, data_offset=(1 << 64) - (1 << 20))
    + raid_sb(4, 0, RAID_TWO) + raid_bitmap(4, [1]),
    # Noise with every page re-sealed: field checks only.
    "seed-noise": bytes([7]) + bytes((i * 7919 + 13) % 256 for i in range(3 * 4096)),
})

# nvme_auth: one in-band authentication message each (see fuzz_targets/nvme_auth.rs), as
# Linux's host and controller send them; the last also starts with an Authentication Send.
def auth_hdr(auth_type, auth_id, t_id):
    return bytes([auth_type, auth_id, 0, 0]) + struct.pack("<H", t_id)


def auth_negotiate(t_id, hashes, groups):
    d = bytes([1, 0, len(hashes), len(groups)]) + bytes(hashes).ljust(30, b"\0") + bytes(groups).ljust(30, b"\0")
    return auth_hdr(0, 0x00, t_id) + bytes([0, 1]) + d


def auth_challenge(t_id, hashid, hl, dhgid, dhv, seq):
    return (auth_hdr(1, 0x01, t_id) + bytes([hl, 0, hashid, dhgid]) + struct.pack("<HI", len(dhv), seq)
            + bytes(range(hl)) + dhv)


def auth_reply(t_id, hl, c2, dhv, seq):
    return (auth_hdr(1, 0x02, t_id) + bytes([hl, 0, 1 if c2 else 0, 0]) + struct.pack("<HI", len(dhv), seq)
            + b"\x11" * hl + (b"\x22" * hl if c2 else bytes(hl)) + dhv)


auth_send = bytes([0x7F, 0x40, 1, 0, 0x05]) + bytes(35) + bytes([0, 1, 1, 0xE9]) + struct.pack("<I", 72) + bytes(16)
assert len(auth_send) == 64
write("nvme_auth", {
    "seed-negotiate": auth_negotiate(1, [1, 2, 3], [0, 1, 2, 3, 4, 5]),
    "seed-challenge-null": auth_challenge(1, 1, 32, 0, b"", 0x12345678),
    "seed-challenge-2048": auth_challenge(2, 3, 64, 1, b"\x5a" * 256, 7),
    "seed-reply-bidirectional": auth_reply(2, 64, True, b"\x33" * 256, 9),
    "seed-reply-null": auth_reply(1, 32, False, b"", 0),
    "seed-success1": auth_hdr(1, 0x03, 2) + bytes([48, 0, 1]) + bytes(7) + b"\x44" * 48,
    "seed-success2": auth_hdr(1, 0x04, 2) + bytes(10),
    "seed-failure1": auth_hdr(0, 0xF1, 2) + bytes([1, 5]),
    "seed-failure2": auth_hdr(0, 0xF0, 2) + bytes([1, 1]),
    "seed-auth-send": auth_send + auth_negotiate(1, [1], [0]),
})

# nvme_ana_log: one Asymmetric Namespace Access log page each (see fuzz_targets/nvme_ana_log.rs),
# as flashpath's target and SPDK's send them: a header, then each group with its NSID list.
def ana_page(chgcnt, groups):
    b = struct.pack("<QH", chgcnt, len(groups)) + bytes(6)
    for grpid, state, nsids in groups:
        b += struct.pack("<IIQ", grpid, len(nsids), 0) + bytes([state]) + bytes(15)
        b += b"".join(struct.pack("<I", n) for n in nsids)
    return b


write("nvme_ana_log", {
    "seed-two-groups": ana_page(3, [(1, 1, [1]), (2, 3, [2, 5])]),
    "seed-groups-only": ana_page(1, [(1, 2, []), (7, 0xF, [])]),
    "seed-empty": ana_page(0, []),
})


# nvmf_auth: a setup byte, then host records (see fuzz_targets/nvmf_auth.rs): 2 negotiate
# (T_ID, hashes, groups, SC_C), 1 receive, 3 reply (flags, S2), 4 success2 (T_ID), 0 raw bytes.
def na_negotiate(t_id, hashes, groups):
    return bytes([2]) + struct.pack("<H", t_id) + bytes([hashes, groups, 0])


def na_reply(flags, s2=0):
    return bytes([3, flags, s2])


NA_RECEIVE = bytes([1])
write("nvmf_auth", {
    # Keys, SHA-256, null group: right key, unidirectional.
    "seed-unidirectional": bytes([0x05]) + na_negotiate(1, 1, 1) + NA_RECEIVE + na_reply(1) + NA_RECEIVE,
    # Both keys, ffdhe2048, bidirectional, Success2; then again (re-authentication).
    "seed-bidirectional-2048": bytes([0x27]) + (na_negotiate(7, 2, 2) + NA_RECEIVE + na_reply(3, 9) + NA_RECEIVE
                                                + bytes([4]) + struct.pack("<H", 7)) * 2,
    # A wrong key, then the right one; another T_ID; a flipped byte.
    "seed-refusals": bytes([0x07]) + na_negotiate(2, 7, 1) + NA_RECEIVE + na_reply(0) + NA_RECEIVE
                     + na_negotiate(3, 7, 1) + NA_RECEIVE + na_reply(5) + NA_RECEIVE
                     + na_negotiate(4, 7, 1) + NA_RECEIVE + na_reply(9) + NA_RECEIVE,
    # No keys; C2 without a controller key; raw bytes (a Negotiate message) and a Failure2.
    "seed-no-keys": bytes([0x00]) + na_negotiate(1, 1, 1) + NA_RECEIVE
                    + bytes([0, len(auth_negotiate(1, [1], [0]))]) + auth_negotiate(1, [1], [0]) + NA_RECEIVE,
    "seed-c2-no-ctrl-key": bytes([0x01]) + na_negotiate(1, 1, 1) + NA_RECEIVE + na_reply(3) + NA_RECEIVE
                           + bytes([0, 6]) + auth_hdr(0, 0xF0, 1) + bytes([1, 1]) + NA_RECEIVE,
})


# nvme_auth_host: the host's transaction (see fuzz_targets/nvme_auth_host.rs): a setup byte
# (bit 0: a controller key), the Challenge's length, the Challenge (T_ID 7), then Success1 or
# the controller's AUTH_Failure1.
def auth_host(setup, challenge, answer):
    return bytes([setup]) + struct.pack("<H", len(challenge)) + challenge + answer


auth_success1 = auth_hdr(1, 0x03, 7) + bytes([32, 0, 1]) + bytes(7) + b"\x44" * 32
write("nvme_auth_host", {
    "seed-null-unidirectional": auth_host(0, auth_challenge(7, 1, 32, 0, b"", 0x12345678),
                                          auth_hdr(1, 0x03, 7) + bytes([32, 0, 0]) + bytes(7 + 32)),
    "seed-null-bidirectional": auth_host(1, auth_challenge(7, 1, 32, 0, b"", 5), auth_success1),
    "seed-2048-bidirectional": auth_host(1, auth_challenge(7, 3, 64, 1, b"\x5a" * 256, 9),
                                         auth_hdr(1, 0x03, 7) + bytes([64, 0, 1]) + bytes(7) + b"\x44" * 64),
    "seed-failure1": auth_host(0, auth_challenge(7, 2, 48, 0, b"", 3), auth_hdr(0, 0xF1, 7) + bytes([1, 1])),
    "seed-other-transaction": auth_host(0, auth_challenge(8, 1, 32, 0, b"", 1), b""),
})


# dirty_bitmap_file: a persistent dirty bitmap file as the daemon writes it (layout at the top
# of crates/bdev/src/disk/bitmap_file.rs).
def bitmap_file(flags, granularity, size, words, bdev=b"m0", name=b"daily"):
    head = b"FPDBMAP\0" + struct.pack("<IIQQ", 1, flags, granularity, size) + bytes(range(16))
    head += struct.pack("<HHI", len(bdev), len(name), 0) + bdev + name
    return head + b"".join(struct.pack("<Q", w) for w in words)


write("dirty_bitmap_file", {
    "seed-clean": bitmap_file(2, 4096, 130 * 4096, [0xFFFF, 5, 0b10]),
    "seed-in-use-after-crash": bitmap_file(3, 65536, 8 << 20, [1 << 7, 0]),
    "seed-inconsistent": bitmap_file(4, 512, 64 * 512, [0]),
    "seed-odd-size": bitmap_file(2, 65536, 3 * 512, [1]),
    "seed-truncated": bitmap_file(2, 4096, 130 * 4096, [0xFFFF, 5, 0b10])[:70],
})


# backup_manifest and backup_chunk: their seeds are real objects (zstd, AES-GCM, HMAC), written
# by `cargo test -p fp-backup --lib -- --ignored write_fuzz_seeds` (crates/backup/src/tests.rs).
