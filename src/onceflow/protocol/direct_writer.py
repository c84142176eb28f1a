"""What the direct response encoders (fetch_response.py, metadata_response.py) share: the
writer's state, arrays' lengths and strings in both the classic and the flexible (compact)
encoding, int checks and unsigned varints.

A direct encoder writes a handler's dict straight to bytes; any value of a shape it does not
take raises `Unsupported`, and the caller hands the dict to the generic (kio) path instead.
"""

from __future__ import annotations

import struct
from typing import Any

I16 = struct.Struct(">h")
I32 = struct.Struct(">i")


class Unsupported(Exception):
    """The dict has a shape this encoder leaves to the generic path."""


class DirectWriter:
    """One response's small fields, gathered in a bytearray."""

    __slots__ = ("_flexible", "_out", "_version")

    def __init__(self, api_version: int, flexible: bool) -> None:
        self._version = api_version
        self._flexible = flexible
        self._out = bytearray()

    def _array_length(self, length: int) -> None:
        if self._flexible:
            uvarint(self._out, length + 1)
        else:
            self._out += I32.pack(length)

    def _string(self, value: str | None, nullable: bool = False) -> None:
        if value is None:
            if not nullable:
                raise Unsupported
            self._out += b"\x00" if self._flexible else I16.pack(-1)
            return
        if type(value) is not str:
            raise Unsupported
        data = value.encode()
        if self._flexible:
            uvarint(self._out, len(data) + 1)
        else:
            self._out += I16.pack(len(data))
        self._out += data


def to_int(value: Any) -> int:
    """An int field (error codes are ErrorCode enums, an int subclass; not a bool)."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise Unsupported
    return int(value)


def uvarint(out: bytearray, value: int) -> None:
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
