"""Kafka's *flexible* record encoding (KIP-482), for the coordinator records that use it.

The classic `__consumer_offsets` records are non-flexible (int16 string lengths, int32
array counts: records.py). The newer ones - the consumer group records of KIP-848 and
TransactionLogValue v1 - are flexible:

    compact string   unsigned varint (length + 1; 0 = null) + UTF-8
    compact array    unsigned varint (count + 1; 0 = null) + elements
    uuid             16 bytes
    tagged fields    unsigned varint count, then per field: varint tag, varint size, bytes

One writer per shape and one reader (`FlexibleReader`, the bounded `Reader` plus the
varint shapes) serve every flexible record, so each record module only lists its fields.
Unknown tagged fields are skipped on read, which is what they are for (a newer Kafka
may add some).
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Iterable

from onceflow.groups.records import Reader, RecordFormatError

# Kafka caps strings at Short.MAX_VALUE bytes, compact ones too (readString).
STRING_BYTES_MAX = 0x7FFF
VARINT_BYTES_MAX = 5  # an unsigned varint of an int32 takes at most 5 bytes
UUID_BYTES = 16

I8 = struct.Struct(">b")
I16 = struct.Struct(">h")
I32 = struct.Struct(">i")
I64 = struct.Struct(">q")


# ---------------------------------------------------------------- writing


def uvarint(n: int) -> bytes:
    assert n >= 0
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def utf8(s: str) -> bytes:
    data = s.encode()
    if len(data) > STRING_BYTES_MAX:
        raise RecordFormatError(f"string of {len(data)} bytes exceeds {STRING_BYTES_MAX}")
    return data


def compact_string(s: str | None) -> bytes:
    if s is None:
        return uvarint(0)
    data = utf8(s)
    return uvarint(len(data) + 1) + data


def compact_array_head(count: int | None) -> bytes:
    return uvarint(0 if count is None else count + 1)


def compact_strings(items: Iterable[str]) -> bytes:
    items = list(items)
    return compact_array_head(len(items)) + b"".join(compact_string(s) for s in items)


def compact_int32s(items: Iterable[int]) -> bytes:
    items = list(items)
    return compact_array_head(len(items)) + b"".join(I32.pack(i) for i in items)


def tagged(fields: Iterable[tuple[int, bytes]] = ()) -> bytes:
    fields = list(fields)
    return uvarint(len(fields)) + b"".join(
        uvarint(tag) + uvarint(len(data)) + data for tag, data in fields)


NO_TAGS = tagged()


# ---------------------------------------------------------------- reading


class FlexibleReader(Reader):
    """The bounded reader plus the flexible shapes; every count is checked against the
    bytes that remain before anything is allocated."""

    def uvarint(self) -> int:
        result = shift = 0
        for _ in range(VARINT_BYTES_MAX):
            byte = self.take(1)[0]
            result |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return result
            shift += 7
        raise RecordFormatError("unsigned varint longer than 5 bytes")

    def compact_nullable_string(self) -> str | None:
        n = self.uvarint() - 1
        if n == -1:
            return None
        if n > STRING_BYTES_MAX:
            raise RecordFormatError(f"bad string length {n}")
        try:
            return bytes(self.take(n)).decode()
        except UnicodeDecodeError as exc:
            raise RecordFormatError(f"string is not UTF-8: {exc}") from None

    def compact_string(self) -> str:
        s = self.compact_nullable_string()
        if s is None:
            raise RecordFormatError("null where a string is required")
        return s

    def compact_count(self, entry_bytes_min: int) -> int | None:
        """Element count of a compact array (None = null), checked against what remains."""
        n = self.uvarint() - 1
        if n == -1:
            return None
        if n * entry_bytes_min > self.remaining():
            raise RecordFormatError(f"array count {n} does not fit {self.remaining()} bytes")
        return n

    def compact_strings(self) -> tuple[str, ...]:
        return tuple(self.compact_string() for _ in range(self.compact_count(1) or 0))

    def compact_int32s(self) -> tuple[int, ...]:
        return tuple(self.int32() for _ in range(self.compact_count(4) or 0))

    def uuid(self) -> uuid.UUID:
        return uuid.UUID(bytes=bytes(self.take(UUID_BYTES)))

    def tags(self) -> dict[int, bytes]:
        """A tagged-field section: {tag: raw bytes} (callers pick the tags they know)."""
        fields: dict[int, bytes] = {}
        count = self.uvarint()
        if count > self.remaining():
            raise RecordFormatError(f"{count} tagged fields cannot fit {self.remaining()} bytes")
        for _ in range(count):
            tag = self.uvarint()
            fields[tag] = bytes(self.take(self.uvarint()))
        return fields


def tag_int(fields: dict[int, bytes], tag: int, fmt: struct.Struct, default: int) -> int:
    """A fixed-size integer tagged field, or its default when absent."""
    raw = fields.get(tag)
    if raw is None:
        return default
    if len(raw) != fmt.size:
        raise RecordFormatError(f"tagged field {tag} has {len(raw)} bytes, expected {fmt.size}")
    return fmt.unpack(raw)[0]
