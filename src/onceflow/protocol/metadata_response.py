"""A direct encoder of Metadata responses (v0-v13), for brokers with many partitions.

Theory of operation: a Metadata answer for every topic of a broker with 10,000 partitions
holds 10,000 partition dicts; the generic way (codec.build_response, then kio's entity
writer) turns each into a kio dataclass and walks it field by field, about three quarters of
the request's broker CPU (issue 19). `encode_metadata_response` writes the same bytes
straight from the handler's dict with `struct`, version by version from the "since" table
below, as protocol/fetch_response.py does for Fetch.

It takes the dict as build_response does: keys of fields that the version lacks are dropped,
absent fields take their schema defaults. A key no version has, a value of a type it does
not expect, a null where the version allows none, or a version outside its range: it returns
None and the caller uses the generic path (which raises where it must).
tests/protocol/test_metadata_response.py checks that both paths give the same bytes for every
version and a range of answers.
"""

from __future__ import annotations

import struct
from typing import Any

from onceflow.protocol.direct_writer import I16 as _I16
from onceflow.protocol.direct_writer import I32 as _I32
from onceflow.protocol.direct_writer import DirectWriter
from onceflow.protocol.direct_writer import Unsupported as _Unsupported
from onceflow.protocol.direct_writer import to_int as _int
from onceflow.protocol.framing import FRAME_SIZE

FIRST_VERSION, LAST_VERSION = 0, 13
# The version each field or encoding appears in (MetadataResponse.json).
_CONTROLLER_FROM = 1          # controller_id, broker rack, topic is_internal
_CLUSTER_ID_FROM = 2          # cluster_id
_THROTTLE_FROM = 3            # throttle_time
_OFFLINE_FROM = 5             # partition offline_replicas
_LEADER_EPOCH_FROM = 7        # partition leader_epoch
_AUTHORIZED_FROM = 8          # topic_authorized_operations; cluster's in 8-10
_CLUSTER_AUTHORIZED_UNTIL = 10
_FLEXIBLE_FROM = 9            # compact arrays and strings, tagged fields (none written)
_TOPIC_ID_FROM = 10           # topic_id
_NULLABLE_NAME_FROM = 12      # a topic asked by an unknown id has no name
_ERROR_CODE_FROM = 13         # top-level error_code

AUTHORIZED_OPERATIONS_OMITTED = -(2**31)

_BODY_KEYS = frozenset(("throttle_time", "brokers", "cluster_id", "controller_id", "topics",
                        "cluster_authorized_operations", "error_code"))
_BROKER_KEYS = frozenset(("node_id", "host", "port", "rack"))
_TOPIC_KEYS = frozenset(("error_code", "name", "topic_id", "is_internal", "partitions",
                         "topic_authorized_operations"))
_PARTITION_KEYS = frozenset(("error_code", "partition_index", "leader_id", "leader_epoch",
                             "replica_nodes", "isr_nodes", "offline_replicas"))

_PARTITION_V0 = struct.Struct(">hii")    # error_code, partition_index, leader_id
_PARTITION_V7 = struct.Struct(">hiii")   # ... leader_epoch
_ZERO_UUID = bytes(16)


def encode_metadata_response(correlation_id: int, api_version: int,
                             body: dict[str, Any]) -> list[bytes] | None:
    """The framed response as buffers for `writelines`, or None when `body` has a shape this
    encoder does not take."""
    if not FIRST_VERSION <= api_version <= LAST_VERSION or not body.keys() <= _BODY_KEYS:
        return None
    try:
        data = _Writer(api_version).response(correlation_id, body)
    except (_Unsupported, KeyError, AttributeError, TypeError, struct.error):
        return None   # a missing field, a value of another type: the generic path judges
    return [FRAME_SIZE.pack(len(data)), data]


class _Writer(DirectWriter):
    __slots__ = ()

    def __init__(self, api_version: int) -> None:
        super().__init__(api_version, api_version >= _FLEXIBLE_FROM)

    def response(self, correlation_id: int, body: dict[str, Any]) -> bytes:
        out, version = self._out, self._version
        out += _I32.pack(correlation_id)
        if self._flexible:
            out += b"\x00"   # response header v1: no tagged fields
        if version >= _THROTTLE_FROM:
            out += _I32.pack(_int(body["throttle_time"]))
        brokers = body["brokers"]
        self._array_length(len(brokers))
        for broker in brokers:
            self._broker(broker)
        if version >= _CLUSTER_ID_FROM:
            self._string(body.get("cluster_id"), nullable=True)
        if version >= _CONTROLLER_FROM:
            out += _I32.pack(_int(body.get("controller_id", -1)))
        topics = body["topics"]
        self._array_length(len(topics))
        for topic in topics:
            self._topic(topic)
        if _AUTHORIZED_FROM <= version <= _CLUSTER_AUTHORIZED_UNTIL:
            out += _I32.pack(_int(body.get("cluster_authorized_operations",
                                           AUTHORIZED_OPERATIONS_OMITTED)))
        if version >= _ERROR_CODE_FROM:
            out += _I16.pack(_int(body["error_code"]))
        if self._flexible:
            out += b"\x00"
        return bytes(out)

    def _broker(self, broker: dict[str, Any]) -> None:
        if type(broker) is not dict or not broker.keys() <= _BROKER_KEYS:
            raise _Unsupported
        out = self._out
        out += _I32.pack(_int(broker["node_id"]))
        self._string(broker["host"])
        out += _I32.pack(_int(broker["port"]))
        if self._version >= _CONTROLLER_FROM:
            self._string(broker.get("rack"), nullable=True)
        if self._flexible:
            out += b"\x00"

    def _topic(self, topic: dict[str, Any]) -> None:
        if type(topic) is not dict or not topic.keys() <= _TOPIC_KEYS:
            raise _Unsupported
        out, version = self._out, self._version
        out += _I16.pack(_int(topic["error_code"]))
        self._string(topic["name"], nullable=version >= _NULLABLE_NAME_FROM)
        if version >= _TOPIC_ID_FROM:
            topic_id = topic["topic_id"]
            out += _ZERO_UUID if topic_id is None else topic_id.bytes
        if version >= _CONTROLLER_FROM:
            is_internal = topic.get("is_internal", False)
            if type(is_internal) is not bool:
                raise _Unsupported
            out += b"\x01" if is_internal else b"\x00"
        partitions = topic["partitions"]
        self._array_length(len(partitions))
        for partition in partitions:
            self._partition(partition)
        if version >= _AUTHORIZED_FROM:
            out += _I32.pack(_int(topic.get("topic_authorized_operations",
                                            AUTHORIZED_OPERATIONS_OMITTED)))
        if self._flexible:
            out += b"\x00"

    def _partition(self, partition: dict[str, Any]) -> None:
        if type(partition) is not dict or not partition.keys() <= _PARTITION_KEYS:
            raise _Unsupported
        out, version = self._out, self._version
        if version >= _LEADER_EPOCH_FROM:
            out += _PARTITION_V7.pack(partition["error_code"], partition["partition_index"],
                                      partition["leader_id"], partition.get("leader_epoch", -1))
        else:
            out += _PARTITION_V0.pack(partition["error_code"], partition["partition_index"],
                                      partition["leader_id"])
        self._int32s(partition.get("replica_nodes", ()))
        self._int32s(partition.get("isr_nodes", ()))
        if version >= _OFFLINE_FROM:
            self._int32s(partition.get("offline_replicas", ()))
        if self._flexible:
            out += b"\x00"

    def _int32s(self, values: list[int] | tuple[int, ...]) -> None:
        if type(values) not in (list, tuple):
            raise _Unsupported
        self._array_length(len(values))
        self._out += struct.pack(f">{len(values)}i", *values)
