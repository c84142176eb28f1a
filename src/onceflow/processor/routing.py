"""Which lane (worker queue) of a partition processes a record.

Records with the same key must always land on the same lane, in every process and
after every restart, so the hash must be stable: CRC-32 of the key bytes, never
Python's `hash()`, which is salted per process.

CRC-32 alone is not enough. librdkafka's default partitioner (`consistent_random`)
is itself CRC-32 of the key modulo the partition count, so `crc32(key) % lanes`
would correlate with the partition: with 4 partitions and 16 lanes, the keys of a
partition would all share `crc32 % 4` and only 4 of its 16 lanes would ever run (a
CRC with a salt prefix keeps that flaw: CRC is affine). Decaton hashes a prefixed key
with murmur2 for the same reason. We multiply the CRC by the 32-bit golden ratio and
take the high bits of the product (Fibonacci hashing), which depend on every bit of the
CRC, then map onto the lanes with a multiply-shift instead of a modulo.

Keyless records carry no order to keep, so they are spread round-robin.
"""

from __future__ import annotations

from zlib import crc32

GOLDEN_RATIO_32 = 0x9E3779B1  # 2^32 / phi, odd
MASK_32 = 0xFFFFFFFF


def lane_for_key(key: bytes | str, lanes: int) -> int:
    if isinstance(key, str):
        key = key.encode("utf-8")
    mixed = (crc32(key) * GOLDEN_RATIO_32) & MASK_32
    return (mixed * lanes) >> 32


class RoundRobin:
    """Lane choice for keyless records."""

    __slots__ = ("_next",)

    def __init__(self) -> None:
        self._next = 0

    def lane(self, lanes: int) -> int:
        lane = self._next % lanes
        self._next = lane + 1
        return lane
