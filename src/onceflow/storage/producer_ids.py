"""Durable producer id allocation: a PID is never handed out twice, also across crashes.

Theory of operation
-------------------
Ids are reserved in blocks, as Kafka's controller hands out blocks of PRODUCER_ID_BLOCK_SIZE.
One small file holds the start of the next block not yet reserved. To reserve a block the
allocator first writes the block's end as the new "next block start" (temp file, fsync,
rename, fsync of the directory) and only then hands out ids from the block. After a crash the
allocator starts at the recorded value, so it skips the unused rest of at most one block and
never reuses an id. A missing file means a fresh data directory (ids start at 0); a file that
fails its checks is an error, never guessed around, since guessing could reuse ids.

File layout (big-endian, 18 bytes):

    magic "OFPI" | version u16 | crc32c u32 of the next field | next_block_start i64
"""

from __future__ import annotations

import struct
import threading
from pathlib import Path

import crc32c

from onceflow.storage.layout import replace_file

PRODUCER_ID_BLOCK_SIZE = 1000  # Kafka's block size: one fsync per 1000 InitProducerId calls
PRODUCER_ID_MAX = 2**63 - 1  # producer ids are int64
FILE_MAGIC = b"OFPI"
FILE_VERSION = 1

_PREFIX = struct.Struct(">4sHI")  # magic, version, crc32c of the body
_BODY = struct.Struct(">q")  # next_block_start


class ProducerIdFileCorrupt(Exception):
    """The allocator file failed its checks; refusing to guess which ids were handed out."""


class ProducerIdsExhausted(Exception):
    """Every int64 producer id has been handed out."""


def encode_next_block_start(next_block_start: int) -> bytes:
    body = _BODY.pack(next_block_start)
    return _PREFIX.pack(FILE_MAGIC, FILE_VERSION, crc32c.crc32c(body)) + body


def decode_next_block_start(data: bytes) -> int:
    if len(data) != _PREFIX.size + _BODY.size:
        raise ProducerIdFileCorrupt(f"expected {_PREFIX.size + _BODY.size} bytes, got {len(data)}")
    magic, version, crc = _PREFIX.unpack_from(data)
    if magic != FILE_MAGIC or version != FILE_VERSION:
        raise ProducerIdFileCorrupt(f"unknown format {magic!r} v{version}")
    body = data[_PREFIX.size:]
    if crc32c.crc32c(body) != crc:
        raise ProducerIdFileCorrupt("CRC mismatch")
    (next_block_start,) = _BODY.unpack(body)
    if next_block_start < 0:
        raise ProducerIdFileCorrupt(f"negative next block start {next_block_start}")
    return next_block_start


class ProducerIdAllocator:
    """Hands out increasing, never-reused producer ids; thread-safe."""

    def __init__(self, path: Path, *, block_size: int = PRODUCER_ID_BLOCK_SIZE,
                 fsync: bool = True) -> None:
        assert block_size > 0
        self._path = path
        self._block_size = block_size
        self._fsync = fsync
        self._lock = threading.Lock()
        start = decode_next_block_start(path.read_bytes()) if path.exists() else 0
        self._next_id = start  # the block [start, start) is empty: the first call reserves
        self._block_end = start  # exclusive end of the reserved block

    @property
    def path(self) -> Path:
        return self._path

    def next_id(self) -> int:
        with self._lock:
            if self._next_id == self._block_end:
                self._reserve_block()
            producer_id = self._next_id
            self._next_id += 1
            return producer_id

    def _reserve_block(self) -> None:
        if self._block_end > PRODUCER_ID_MAX - self._block_size:
            raise ProducerIdsExhausted(f"no block of {self._block_size} after {self._block_end}")
        new_end = self._block_end + self._block_size
        self._write(new_end)
        # read back: the block is ours only if the file says so
        assert decode_next_block_start(self._path.read_bytes()) == new_end
        self._block_end = new_end

    def _write(self, next_block_start: int) -> None:
        data = encode_next_block_start(next_block_start)
        assert decode_next_block_start(data) == next_block_start
        replace_file(self._path, data, self._fsync, self._path.with_name(self._path.name + ".tmp"))
