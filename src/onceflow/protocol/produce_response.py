"""A direct encoder of Produce responses (v3-v13), for the small-request hot path.

Theory of operation: the generic way to answer (codec.build_response, then kio's
entity writer) turns the handler's plain dict into kio dataclasses and walks them field by
field; for a one-record Produce that was about a fifth of the broker's CPU at 5,000
requests a second (py-spy, bench/latency.py, issue 19). A Produce answer has a fixed
shape, so `encode_produce_response` writes the same bytes straight from the dict with
`struct`. It takes only the shape the Produce handler builds (the keys below, no tagged
fields); for anything else it returns None and the caller uses the generic path.
tests/protocol/test_produce_response.py checks that both paths give the same bytes for
every version.
"""

from __future__ import annotations

import struct
from typing import Any

from onceflow.protocol.framing import FRAME_SIZE

FIRST_VERSION, LAST_VERSION = 3, 13
_FLEXIBLE_FROM = 9       # compact arrays and strings, tagged fields
_LOG_START_FROM = 5      # log_start_offset
_RECORD_ERRORS_FROM = 8  # record_errors and error_message
_TOPIC_ID_FROM = 13      # topics named by id

_PARTITION_KEYS = frozenset(("index", "error_code", "base_offset", "log_append_time",
                             "log_start_offset", "record_errors", "error_message"))
_BODY_KEYS = frozenset(("responses", "throttle_time"))

_I32 = struct.Struct(">i")
_I16 = struct.Struct(">h")
_PARTITION_V3 = struct.Struct(">ihqq")    # index, error_code, base_offset, log_append_time
_PARTITION_V5 = struct.Struct(">ihqqq")   # ... log_start_offset


def encode_produce_response(correlation_id: int, api_version: int,
                            body: dict[str, Any]) -> list[bytes] | None:
    """The framed response (one buffer behind the size prefix), or None when `body` has
    a shape this encoder does not take (the generic encoder then answers)."""
    if not FIRST_VERSION <= api_version <= LAST_VERSION or not body.keys() <= _BODY_KEYS:
        return None
    flexible = api_version >= _FLEXIBLE_FROM
    out = bytearray(_I32.pack(correlation_id))
    if flexible:
        out += b"\x00"   # response header v1: no tagged fields
    topics = body["responses"]
    _array_length(out, len(topics), flexible)
    for topic in topics:
        if api_version >= _TOPIC_ID_FROM:
            topic_id = topic.get("topic_id")
            if topic_id is None:
                return None
            out += topic_id.bytes
        elif not _string(out, topic.get("name"), flexible, nullable=False):
            return None
        partitions = topic["partition_responses"]
        _array_length(out, len(partitions), flexible)
        for partition in partitions:
            if not partition.keys() <= _PARTITION_KEYS:
                return None
            if not _partition(out, partition, api_version, flexible):
                return None
        if flexible:
            out += b"\x00"
    throttle = body.get("throttle_time", 0)
    if not isinstance(throttle, int):
        return None
    out += _I32.pack(throttle)
    if flexible:
        out += b"\x00"
    return [FRAME_SIZE.pack(len(out)), bytes(out)]


def _partition(out: bytearray, partition: dict[str, Any], api_version: int,
               flexible: bool) -> bool:
    append_time = partition.get("log_append_time", -1)
    if not isinstance(append_time, int):
        return False
    append_time = -1 if append_time < 0 else append_time
    fields = (partition["index"], int(partition["error_code"]), partition["base_offset"],
              append_time)
    if api_version >= _LOG_START_FROM:
        out += _PARTITION_V5.pack(*fields, partition.get("log_start_offset", -1))
    else:
        out += _PARTITION_V3.pack(*fields)
    if api_version >= _RECORD_ERRORS_FROM:
        errors = partition.get("record_errors") or ()
        _array_length(out, len(errors), flexible)
        for error in errors:
            if not error.keys() <= {"batch_index", "batch_index_error_message"}:
                return False
            out += _I32.pack(error["batch_index"])
            _string(out, error.get("batch_index_error_message"), flexible, nullable=True)
            if flexible:
                out += b"\x00"
        _string(out, partition.get("error_message"), flexible, nullable=True)
    if flexible:
        out += b"\x00"
    return True


def _array_length(out: bytearray, length: int, flexible: bool) -> None:
    if flexible:
        _uvarint(out, length + 1)
    else:
        out += _I32.pack(length)


def _string(out: bytearray, value: str | None, flexible: bool, nullable: bool) -> bool:
    if value is None:
        if not nullable:
            return False
        out += b"\x00" if flexible else _I16.pack(-1)
        return True
    data = value.encode()
    if flexible:
        _uvarint(out, len(data) + 1)
    else:
        out += _I16.pack(len(data))
    out += data
    return True


def _uvarint(out: bytearray, value: int) -> None:
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
