"""A direct encoder of Fetch responses (v4-v17), for the small-request hot path.

Theory of operation: a consumer reading along a producer of one-record requests fetches
about once per record, so a Fetch answer is built as often as a Produce answer; the generic
way (codec.build_response, then kio's entity writer) turns the handler's plain dict into kio
dataclasses and walks them field by field, which cost about as much as the rest of the
Fetch (issue 19). `encode_fetch_response` writes the same bytes straight from the dict with
`struct`, version by version from the schema's "since" table below, and keeps record blobs
of at least `_CHUNK_BY_REFERENCE_BYTES` as their own buffers (not copied), as
codec.encode_response_chunks does.

It takes the dict as build_response does: keys of fields that the version lacks are dropped,
tagged fields (v12+) are written only when they differ from their defaults, in tag order.
A key no version has, a value of a type it does not expect, or a version outside its range:
it returns None and the caller uses the generic path (which raises where it must).
tests/protocol/test_fetch_response.py checks that both paths give the same bytes for every
version and a range of answers.
"""

from __future__ import annotations

import struct
from typing import Any

from onceflow.protocol.direct_writer import I32 as _I32
from onceflow.protocol.direct_writer import DirectWriter
from onceflow.protocol.direct_writer import Unsupported as _Unsupported
from onceflow.protocol.direct_writer import to_int as _int
from onceflow.protocol.direct_writer import uvarint as _uvarint
from onceflow.protocol.framing import FRAME_SIZE

FIRST_VERSION, LAST_VERSION = 4, 17
# The version each field or encoding appears in (FetchResponse.json).
_LOG_START_FROM = 5           # partition log_start_offset
_SESSION_FROM = 7             # top-level error_code and session_id
_PREFERRED_REPLICA_FROM = 11  # partition preferred_read_replica
_FLEXIBLE_FROM = 12           # compact arrays and strings, tagged fields; the partition
                              # tags diverging_epoch (0), current_leader (1), snapshot_id (2)
_TOPIC_ID_FROM = 13           # topics named by id
_NODE_ENDPOINTS_FROM = 16     # top-level tag 0: node_endpoints (KIP-951)

_BODY_KEYS = frozenset(("throttle_time", "error_code", "session_id", "responses",
                        "node_endpoints"))
_TOPIC_KEYS = frozenset(("topic", "topic_id", "partitions"))
_PARTITION_KEYS = frozenset(("partition_index", "error_code", "high_watermark",
                             "last_stable_offset", "log_start_offset", "diverging_epoch",
                             "current_leader", "snapshot_id", "aborted_transactions",
                             "preferred_read_replica", "records"))
_ABORTED_KEYS = frozenset(("producer_id", "first_offset"))
_NODE_KEYS = frozenset(("node_id", "host", "port", "rack"))

_TOP_V7 = struct.Struct(">ihi")         # throttle_time, error_code, session_id
_PARTITION_V4 = struct.Struct(">ihqq")  # index, error_code, high watermark, LSO
_PARTITION_V5 = struct.Struct(">ihqqq")  # ... log_start_offset
_ABORTED = struct.Struct(">qq")         # producer_id, first_offset
# v12+ read_uncommitted: index, error_code, high watermark, LSO, log start, the compact null
# aborted_transactions (one byte, 0), preferred_read_replica
_PARTITION_FLEXIBLE_UNCOMMITTED = struct.Struct(">ihqqqBi")
_ZERO_UUID = bytes(16)

# The partition's tagged structs: (tag, key, (field, default) in wire order, struct).
_PARTITION_TAGS = (
    (0, "diverging_epoch", (("epoch", -1), ("end_offset", -1)), struct.Struct(">iq")),
    (1, "current_leader", (("leader_id", -1), ("leader_epoch", -1)), struct.Struct(">ii")),
    (2, "snapshot_id", (("end_offset", -1), ("epoch", -1)), struct.Struct(">qi")),
)

_TAG_KEYS = frozenset(key for _, key, _, _ in _PARTITION_TAGS)

# Below this a record blob is cheaper to copy than to keep as a separate buffer (the same
# bound as codec._CHUNK_BY_REFERENCE_BYTES).
_CHUNK_BY_REFERENCE_BYTES = 16 * 1024


def encode_fetch_response(correlation_id: int, api_version: int,
                          body: dict[str, Any]) -> list[bytes | memoryview] | None:
    """The framed response as buffers for `writelines` (records referenced, not copied),
    or None when `body` has a shape this encoder does not take."""
    if not FIRST_VERSION <= api_version <= LAST_VERSION or not body.keys() <= _BODY_KEYS:
        return None
    try:
        return _Writer(api_version).response(correlation_id, body)
    except (_Unsupported, KeyError, AttributeError, struct.error):
        return None   # a missing field, a value of another type: the generic path judges


class _Writer(DirectWriter):
    """One response's bytes: small fields gathered in a bytearray, large records kept."""

    __slots__ = ("_chunks", "_size")

    def __init__(self, api_version: int) -> None:
        super().__init__(api_version, api_version >= _FLEXIBLE_FROM)
        self._chunks: list[bytes | memoryview] = []
        self._size = 0

    def response(self, correlation_id: int, body: dict[str, Any]) -> list[bytes | memoryview]:
        out, version, flexible = self._out, self._version, self._flexible
        out += _I32.pack(correlation_id)
        if flexible:
            out += b"\x00"   # response header v1: no tagged fields
        throttle = _int(body["throttle_time"])
        if version >= _SESSION_FROM:
            out += _TOP_V7.pack(throttle, _int(body["error_code"]), _int(body.get("session_id", 0)))
        else:
            out += _I32.pack(throttle)
        topics = body["responses"]
        self._array_length(len(topics))
        for topic in topics:
            self._topic(topic)
        if flexible:
            endpoints = body.get("node_endpoints") or ()
            if version >= _NODE_ENDPOINTS_FROM and endpoints:
                value = _Writer(version)
                value._node_endpoints(endpoints)
                out += b"\x01\x00"   # one tagged field, tag 0
                _uvarint(out, len(value._out))
                out += value._out
            else:
                out += b"\x00"
        if out:
            self._chunks.append(bytes(out))
            self._size += len(out)
        return [FRAME_SIZE.pack(self._size), *self._chunks]

    def _topic(self, topic: dict[str, Any]) -> None:
        if type(topic) is not dict or not topic.keys() <= _TOPIC_KEYS:
            raise _Unsupported
        out = self._out
        if self._version >= _TOPIC_ID_FROM:
            topic_id = topic["topic_id"]
            out += _ZERO_UUID if topic_id is None else topic_id.bytes
        else:
            self._string(topic["topic"])
        partitions = topic["partitions"]
        self._array_length(len(partitions))
        for partition in partitions:
            self._partition(partition)
        if self._flexible:
            out += b"\x00"

    def _partition(self, partition: dict[str, Any]) -> None:
        if type(partition) is not dict or not partition.keys() <= _PARTITION_KEYS:
            raise _Unsupported
        out, version = self._out, self._version
        aborted = partition["aborted_transactions"]
        if aborted is None and version >= _FLEXIBLE_FROM:
            # The usual answer (read_uncommitted, v12+) in one pack: the null aborted array
            # is the compact length 0.
            out += _PARTITION_FLEXIBLE_UNCOMMITTED.pack(
                partition["partition_index"], _int(partition["error_code"]),
                partition["high_watermark"], partition.get("last_stable_offset", -1),
                partition.get("log_start_offset", -1), 0,
                partition.get("preferred_read_replica", -1))
            self._records(partition["records"])
            self._partition_tags(partition)
            return
        fields = (partition["partition_index"], _int(partition["error_code"]),
                  partition["high_watermark"], partition.get("last_stable_offset", -1))
        if version >= _LOG_START_FROM:
            out += _PARTITION_V5.pack(*fields, partition.get("log_start_offset", -1))
        else:
            out += _PARTITION_V4.pack(*fields)
        if aborted is None:
            self._array_length(-1)
        else:
            self._array_length(len(aborted))
            for txn in aborted:
                if type(txn) is not dict or not txn.keys() <= _ABORTED_KEYS:
                    raise _Unsupported
                out += _ABORTED.pack(txn["producer_id"], txn["first_offset"])
                if self._flexible:
                    out += b"\x00"
        if version >= _PREFERRED_REPLICA_FROM:
            out += _I32.pack(partition.get("preferred_read_replica", -1))
        self._records(partition["records"])
        if self._flexible:
            self._partition_tags(partition)

    def _partition_tags(self, partition: dict[str, Any]) -> None:
        if _TAG_KEYS.isdisjoint(partition):   # the usual answer: no tagged field
            self._out += b"\x00"
            return
        tagged = []
        for tag, key, defaults, codec in _PARTITION_TAGS:
            value = partition.get(key)
            if value is None:
                continue
            if type(value) is not dict or not value.keys() <= {name for name, _ in defaults}:
                raise _Unsupported
            values = tuple(value.get(name, default) for name, default in defaults)
            if values != tuple(default for _, default in defaults):
                tagged.append((tag, codec.pack(*values) + b"\x00"))
        out = self._out
        _uvarint(out, len(tagged))
        for tag, value in tagged:
            _uvarint(out, tag)
            _uvarint(out, len(value))
            out += value

    def _records(self, records: bytes | memoryview | None) -> None:
        out = self._out
        if records is None:
            self._array_length(-1)   # a null records field: the same length encoding
            return
        if not isinstance(records, (bytes, memoryview)):
            raise _Unsupported
        length = len(records)
        if self._flexible:
            _uvarint(out, length + 1)
        else:
            out += _I32.pack(length)
        if length < _CHUNK_BY_REFERENCE_BYTES:
            out += records
            return
        self._chunks += (bytes(out), records)   # the blob by reference
        self._size += len(out) + length
        out.clear()

    def _node_endpoints(self, endpoints: list[dict[str, Any]]) -> None:
        out = self._out
        self._array_length(len(endpoints))
        for node in endpoints:
            if type(node) is not dict or not node.keys() <= _NODE_KEYS:
                raise _Unsupported
            out += _I32.pack(node["node_id"])
            self._string(node["host"])
            out += _I32.pack(node["port"])
            rack = node.get("rack")
            if rack is None:
                out += b"\x00"
            else:
                self._string(rack)
            out += b"\x00"
