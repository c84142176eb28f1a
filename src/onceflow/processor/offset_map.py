"""The completed-offsets map carried in the commit metadata.

Theory of operation
-------------------
Decaton commits only the watermark, so after a restart or a rebalance every record
that had completed *above* the watermark runs again. We also store those completed
offsets, compactly, in the metadata string of the same offset commit (for the
exactly-once mode, inside the same transaction as the outputs), so the next owner
of the partition registers them as already done instead of processing them again.

Format (version 1), a str because Kafka's commit metadata is a string:

    "o1:" + base64url_nopad(
        varint(watermark)          # the committed offset this map belongs to
        varint(range_count)
        range_count x (varint(gap), varint(length))
    )

Ranges are half-open, sorted and disjoint; `gap` is the distance from the end of the
previous range (the watermark for the first range) to the range start, so the
numbers stay small. Varints are unsigned LEB128.

The string is capped (`bytes_max`, well under Kafka's `offset.metadata.max.bytes`
default of 4096). When the ranges do not fit, the highest ones are dropped: a dropped
range only costs reprocessing, never a lost record. `required` ranges — ones that an
earlier committed map already promised — are never dropped, because in exactly-once
mode their outputs are already committed; they are re-encodings of a map that fitted,
so they can exceed the cap only by the few bytes the watermark varint can grow.

Decoding accepts only a map whose watermark equals the committed offset (anything
else means someone moved the offset since) and any malformed input yields None:
the map is an optimisation, so a bad one is ignored, never trusted.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Sequence

PREFIX = "o1:"
# Kafka's default offset.metadata.max.bytes is 4096; stay well below it.
BYTES_MAX_DEFAULT = 1024
# A decoder bound: each range takes at least two bytes, so no real map has more.
RANGES_MAX = 4096
VARINT_BYTES_MAX = 10

Range = tuple[int, int]


def _varint(value: int) -> bytes:
    if value < 0:
        raise ValueError(f"varint of negative {value}")
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    value = 0
    for index in range(VARINT_BYTES_MAX):
        byte = buf[pos + index]  # IndexError on truncation: handled by decode()
        value |= (byte & 0x7F) << (7 * index)
        if not byte & 0x80:
            return value, pos + index + 1
    raise ValueError("varint too long")


def _normalise(ranges: Sequence[Range], watermark: int) -> list[Range]:
    """Sort, clip below the watermark, and merge overlapping or adjacent ranges."""
    merged: list[Range] = []
    for start, end in sorted(ranges):
        start = max(start, watermark + 1)
        if end <= start:
            continue
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def _encoded_length(raw_bytes: int) -> int:
    return len(PREFIX) + (4 * raw_bytes + 2) // 3  # base64 without padding


def encode(
    watermark: int,
    ranges: Sequence[Range],
    bytes_max: int = BYTES_MAX_DEFAULT,
    required: Sequence[Range] = (),
) -> tuple[str, list[Range]]:
    """Encode the completed ranges above `watermark`.

    Returns the metadata string and the ranges it actually covers (a prefix of the
    optional ranges, plus every required range). The empty string means "no map".
    """
    optional = _normalise(ranges, watermark)
    must = _normalise(required, watermark)
    if not optional and not must:
        return "", []
    head = _varint(watermark)

    def fits(count: int) -> list[Range] | None:
        kept = _normalise([*optional[:count], *must], watermark)
        body = _encode_ranges(watermark, kept)
        size = _encoded_length(len(head) + len(_varint(len(kept))) + len(body))
        return kept if size <= bytes_max else None

    # Optional ranges (completed in the window) lie below the required ones (carried
    # over from the previous map), so keeping a prefix of them keeps the order. The
    # size grows with the prefix length, so search for the longest prefix that fits.
    low, high = 0, len(optional)
    while low < high:
        middle = (low + high + 1) // 2
        if fits(middle) is not None:
            low = middle
        else:
            high = middle - 1
    kept = fits(low)
    if kept is None:  # only required ranges left: keep them even over the cap
        kept = _normalise(must, watermark)
    if not kept:
        return "", []
    raw = head + _varint(len(kept)) + _encode_ranges(watermark, kept)
    text = PREFIX + base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")
    return text, kept


def _encode_ranges(watermark: int, ranges: Sequence[Range]) -> bytes:
    out = bytearray()
    previous_end = watermark
    for start, end in ranges:
        out += _varint(start - previous_end)
        out += _varint(end - start)
        previous_end = end
    return bytes(out)


def decode(metadata: str | None, committed_offset: int) -> list[Range] | None:
    """The ranges in `metadata` if it is a valid map for `committed_offset`, else None."""
    if not metadata or not metadata.startswith(PREFIX):
        return None
    try:
        text = metadata[len(PREFIX) :]
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
        watermark, pos = _read_varint(raw, 0)
        count, pos = _read_varint(raw, pos)
        if watermark != committed_offset or count > RANGES_MAX:
            return None
        ranges: list[Range] = []
        previous_end = watermark
        for _ in range(count):
            gap, pos = _read_varint(raw, pos)
            length, pos = _read_varint(raw, pos)
            if (gap < 1 and ranges) or length < 1:
                return None  # not the canonical form: adjacent or empty ranges
            start = previous_end + gap
            if start <= watermark:
                return None
            ranges.append((start, start + length))
            previous_end = start + length
        if pos != len(raw):
            return None
        return ranges
    except (ValueError, IndexError, binascii.Error):
        return None
