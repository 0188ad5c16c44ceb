"""dm-crypt's aes-xts-plain64 with Python's `cryptography`: the independent AES-XTS the crypto
bdev's tests check flashpath against.

usage: xts_plain64.py enc|dec KEY_HEX UNIT_BYTES FIRST_SECTOR IN OUT
Each UNIT_BYTES of IN is one XTS data unit; its tweak is the number of its first 512-byte
sector (FIRST_SECTOR for the first unit), 64-bit little-endian zero-padded to 16 bytes.
"""
import sys

from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

mode, key, unit, first = sys.argv[1], bytes.fromhex(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
with open(sys.argv[5], "rb") as f:
    data = f.read()
out = bytearray()
for i in range(0, len(data), unit):
    c = Cipher(algorithms.AES(key), modes.XTS((first + i // 512).to_bytes(16, "little")))
    op = c.encryptor() if mode == "enc" else c.decryptor()
    out += op.update(data[i : i + unit]) + op.finalize()
with open(sys.argv[6], "wb") as f:
    f.write(bytes(out))
