#!/usr/bin/env python3
"""Writes the committed seed corpus (corpus/<target>/seed-*). See fuzz_targets/chain_parser.rs for the layout."""
import struct, json, os

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
for name, data in seeds.items():
    open(f"corpus/chain_parser/{name}", "wb").write(data)

rpc = {
    "seed-create": b'\x00{"name": "Malloc0", "block_size": 512, "num_blocks": 1024, "read_only": false, "md_size": 0}',
    "seed-null": b"\x80null",
    "seed-bad-types": b'\x13{"name": 5, "num_blocks": -1, "ctrlr": [1, 2], "bdev_name": {"a": null}}',
}
for name, data in rpc.items():
    open(f"corpus/rpc_params/{name}", "wb").write(data)

srv = {
    "seed-one": b'{"jsonrpc": "2.0", "id": 1, "method": "echo", "params": {"name": "x", "size": 4096, "md_size": 0}}\n',
    "seed-back-to-back": b'{"jsonrpc":"2.0","id":1,"method":"none"}{"jsonrpc":"2.0","id":"a","method":"fail"}{"jsonrpc":"2.0","method":"echo"}',
    "seed-batch": b'[{"jsonrpc":"2.0","id":1,"method":"echo","params":{"name":"y","read_only":true}},{"jsonrpc":"2.0","method":"none"},1,{"id":2}]',
    "seed-garbage": b'{"jsonrpc":"2.0","id":1,"method":"nope","params":[1]}\n{"jsonrpc": "2.0", "id": null, "method": "echo", ',
}
for name, data in srv.items():
    open(f"corpus/rpc_server/{name}", "wb").write(data)
