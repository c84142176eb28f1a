"""The direct Metadata response encoder (protocol/metadata_response.py) writes the same bytes
as the generic path (build_response + kio's writer), for every version and a range of
answers, including the handler's own answers."""

from __future__ import annotations

import datetime
import uuid

import pytest
from kio.schema.errors import ErrorCode

from onceflow.protocol.apis import SUPPORTED, ApiKey
from onceflow.protocol.codec import RequestHeader, build_response, encode_response_chunks
from onceflow.protocol.metadata_response import (
    FIRST_VERSION,
    LAST_VERSION,
    encode_metadata_response,
)

TOPIC_ID = uuid.UUID("8d3e5b4c-1f2a-4b6c-9d8e-7f6a5b4c3d2e")
OMITTED = -(2**31)


def _partition(index: int, **changes) -> dict:
    partition = {"error_code": ErrorCode.none, "partition_index": index, "leader_id": 1,
                 "leader_epoch": 7, "replica_nodes": [1, 2, 3], "isr_nodes": [1, 3],
                 "offline_replicas": [2]}
    partition.update(changes)
    return partition


def _topic(partitions: list[dict], name: str | None = "t", **changes) -> dict:
    topic = {"error_code": ErrorCode.none, "name": name, "topic_id": TOPIC_ID,
             "is_internal": False, "partitions": partitions,
             "topic_authorized_operations": OMITTED}
    topic.update(changes)
    return topic


def _body(topics: list[dict], **changes) -> dict:
    body = {"throttle_time": 0, "error_code": ErrorCode.none,
            "brokers": [{"node_id": 1, "host": "localhost", "port": 9092, "rack": None},
                        {"node_id": 2, "host": "broker-é.example", "port": 19092,
                         "rack": "rack-a"}],
            "cluster_id": "onceflow-cluster", "controller_id": 1, "topics": topics,
            "cluster_authorized_operations": OMITTED}
    body.update(changes)
    return body


BODIES = {
    "one partition": _body([_topic([_partition(0)])]),
    "no topics, no cluster id": _body([], cluster_id=None, controller_id=-1),
    "a topic error, as the handler answers one": _body([
        {"error_code": ErrorCode.unknown_topic_or_partition, "name": "missing",
         "topic_id": None, "partitions": []}]),
    "internal topic, authorized operations": _body(
        [_topic([_partition(0, replica_nodes=[], isr_nodes=[], offline_replicas=[])],
                name="__consumer_offsets", is_internal=True, topic_authorized_operations=3576)],
        cluster_authorized_operations=4088, throttle_time=1500),
    "partition errors and defaults": _body([_topic([
        _partition(0, error_code=ErrorCode.leader_not_available, leader_id=-1),
        {"error_code": ErrorCode.none, "partition_index": 1, "leader_id": 2},
    ])]),
    "many partitions, long name": _body([_topic(
        [_partition(i, replica_nodes=[i % 3], isr_nodes=[i % 3], offline_replicas=[])
         for i in range(300)], name="x" * 249)]),
}


def _generic(version: int, body: dict) -> bytes:
    header = RequestHeader(ApiKey.METADATA, version, 987654, "client")
    return b"".join(encode_response_chunks(header, build_response(header, **body)))


def test_the_range_is_every_supported_version() -> None:
    assert SUPPORTED[ApiKey.METADATA] == (FIRST_VERSION, LAST_VERSION)


@pytest.mark.parametrize("version", range(FIRST_VERSION, LAST_VERSION + 1))
@pytest.mark.parametrize("name", sorted(BODIES))
def test_same_bytes_as_the_generic_encoder(version: int, name: str) -> None:
    body = BODIES[name]
    direct = encode_metadata_response(987654, version, body)
    assert direct is not None
    assert b"".join(direct) == _generic(version, body)
    assert int.from_bytes(direct[0], "big") == len(direct[1])


@pytest.mark.parametrize("version", range(12, LAST_VERSION + 1))
def test_a_topic_asked_by_an_unknown_id_has_no_name(version: int) -> None:
    body = _body([{"error_code": ErrorCode.unknown_topic_id, "name": None,
                   "topic_id": TOPIC_ID, "partitions": []}])
    direct = encode_metadata_response(1, version, body)
    assert direct is not None
    assert b"".join(direct) == _generic(version, body).replace(
        (987654).to_bytes(4, "big"), (1).to_bytes(4, "big"), 1)


@pytest.mark.parametrize("body", [
    _body([], unknown_field=1),                                           # no version has it
    _body([_topic([{**_partition(0), "records": b""}])]),
    _body([], throttle_time=datetime.timedelta(milliseconds=5)),          # not a plain int
    _body([_topic([_partition(0, replica_nodes="1,2")])]),
    _body([_topic([_partition(0)], is_internal=1)]),
    _body([_topic([_partition(0)], name=None)]),                          # v11: not nullable
])
def test_other_shapes_are_left_to_the_generic_encoder(body: dict) -> None:
    assert encode_metadata_response(1, 11, body) is None


@pytest.mark.parametrize("version", [FIRST_VERSION - 1, LAST_VERSION + 1])
def test_versions_outside_the_range_are_left_to_the_generic_encoder(version: int) -> None:
    assert encode_metadata_response(1, version, BODIES["one partition"]) is None
