"""The direct Produce response encoder (protocol/produce_response.py) writes the same
bytes as the generic path (build_response + kio's writer), for every version it takes."""

from __future__ import annotations

import uuid

import pytest

from onceflow.protocol.apis import ApiKey
from onceflow.protocol.codec import RequestHeader, build_response, encode_response_chunks
from onceflow.protocol.produce_response import (
    FIRST_VERSION,
    LAST_VERSION,
    encode_produce_response,
)


def _partition(index: int, **changes) -> dict:
    partition = {"index": index, "error_code": 0, "base_offset": 1234567890123,
                 "log_append_time": -1, "log_start_offset": 7, "record_errors": [],
                 "error_message": None}
    partition.update(changes)
    return partition


BODIES = {
    "one partition": {"responses": [{"name": "t", "partition_responses": [_partition(0)]}],
                      "throttle_time": 0},
    "errors and times": {
        "responses": [
            {"name": "topic-é", "partition_responses": [
                _partition(3, log_append_time=1_700_000_000_123),
                _partition(1, error_code=87, base_offset=-1, log_start_offset=-1,
                           record_errors=[{"batch_index": 0,
                                           "batch_index_error_message": "no key"},
                                          {"batch_index": 5,
                                           "batch_index_error_message": None}],
                           error_message="keyless records in a compacted topic")]},
            {"name": "other", "partition_responses": []},
        ],
        "throttle_time": 1500,
    },
    "many partitions": {"responses": [{"name": "x" * 200, "partition_responses": [
        _partition(i, base_offset=i * 1000) for i in range(150)]}], "throttle_time": 0},
    "no topics": {"responses": [], "throttle_time": 0},
}
TOPIC_ID = uuid.UUID("8d3e5b4c-1f2a-4b6c-9d8e-7f6a5b4c3d2e")


def _for_version(body: dict, version: int) -> dict:
    """The body as the handler builds it for `version` (v13 names topics by id)."""
    if version < 13:
        return body
    return {**body, "responses": [{**topic, "name": None, "topic_id": TOPIC_ID}
                                  for topic in body["responses"]]}


@pytest.mark.parametrize("version", range(FIRST_VERSION, LAST_VERSION + 1))
@pytest.mark.parametrize("name", sorted(BODIES))
def test_same_bytes_as_the_generic_encoder(version: int, name: str) -> None:
    body = _for_version(BODIES[name], version)
    header = RequestHeader(ApiKey.PRODUCE, version, 987654, "client")
    direct = encode_produce_response(header.correlation_id, version, body)
    generic = encode_response_chunks(header, build_response(header, **body))
    assert direct is not None
    assert b"".join(direct) == b"".join(generic)


@pytest.mark.parametrize("body", [
    {"responses": [], "throttle_time": 0, "node_endpoints": []},         # a tagged field
    {"responses": [{"name": "t", "partition_responses": [
        {**_partition(0), "current_leader": {"leader_id": 1}}]}], "throttle_time": 0},
])
def test_other_shapes_are_left_to_the_generic_encoder(body: dict) -> None:
    assert encode_produce_response(1, 12, body) is None


def test_versions_outside_the_range_are_left_to_the_generic_encoder() -> None:
    body = BODIES["one partition"]
    assert encode_produce_response(1, FIRST_VERSION - 1, body) is None
    assert encode_produce_response(1, LAST_VERSION + 1, body) is None
