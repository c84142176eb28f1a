"""The direct Fetch response encoder (protocol/fetch_response.py) writes the same bytes as
the generic path (build_response + kio's writer), for every version and a range of answers."""

from __future__ import annotations

import datetime
import uuid

import pytest
from kio.schema.errors import ErrorCode

from onceflow.protocol.apis import SUPPORTED, ApiKey
from onceflow.protocol.codec import RequestHeader, build_response, encode_response_chunks
from onceflow.protocol.fetch_response import (
    FIRST_VERSION,
    LAST_VERSION,
    encode_fetch_response,
)

TOPIC_ID = uuid.UUID("8d3e5b4c-1f2a-4b6c-9d8e-7f6a5b4c3d2e")
LARGE_RECORDS = bytes(range(256)) * 100   # 25,600 bytes: kept by reference


def _partition(index: int, **changes) -> dict:
    partition = {"partition_index": index, "error_code": ErrorCode.none,
                 "high_watermark": 1234567890123, "last_stable_offset": 1234567890000,
                 "log_start_offset": 7, "aborted_transactions": None,
                 "preferred_read_replica": -1, "records": b"\x00" * 70}
    partition.update(changes)
    return partition


def _topic(partitions: list[dict], name: str = "t", topic_id: uuid.UUID = TOPIC_ID) -> dict:
    # Both keys: the generic path drops the one the version lacks, and so must the encoder.
    return {"topic": name, "topic_id": topic_id, "partitions": partitions}


def _body(topics: list[dict], **changes) -> dict:
    body = {"throttle_time": 0, "error_code": ErrorCode.none, "session_id": 0,
            "responses": topics, "node_endpoints": []}
    body.update(changes)
    return body


BODIES = {
    "one record": _body([_topic([_partition(0)])]),
    "empty and null records": _body([_topic([_partition(0, records=b""),
                                             _partition(1, records=None)])]),
    "no topics, a session": _body([], session_id=123456789),
    "top-level error": _body([], error_code=ErrorCode.fetch_session_id_not_found,
                             throttle_time=2500),
    "partition errors": _body([_topic([
        _partition(0, error_code=ErrorCode.offset_out_of_range, records=b""),
        _partition(1, error_code=ErrorCode.unknown_topic_or_partition, high_watermark=-1,
                   last_stable_offset=-1, log_start_offset=-1, records=b""),
    ], name="topic-é")]),
    "read_committed with aborts": _body([_topic([
        _partition(0, aborted_transactions=[{"producer_id": 4000, "first_offset": 12},
                                            {"producer_id": 2**40, "first_offset": 2**33}]),
        _partition(1, aborted_transactions=[]),
    ])]),
    "preferred read replica": _body([_topic([_partition(2, preferred_read_replica=3)])]),
    "not the leader, endpoints": _body(
        [_topic([_partition(0, error_code=ErrorCode.not_leader_or_follower, records=b"",
                            current_leader={"leader_id": 2, "leader_epoch": 5})])],
        node_endpoints=[{"node_id": 2, "host": "broker-2.example", "port": 9093, "rack": None},
                        {"node_id": 3, "host": "b3", "port": 19092, "rack": "rack-a"}]),
    "default-valued tags": _body([_topic([_partition(
        0, current_leader={"leader_id": -1, "leader_epoch": -1}, diverging_epoch={},
        snapshot_id={"end_offset": -1})])]),
    "every partition tag": _body([_topic([_partition(
        0, diverging_epoch={"epoch": 4, "end_offset": 990},
        current_leader={"leader_id": 1},
        snapshot_id={"end_offset": 2**35, "epoch": 9})])]),
    "large records by reference": _body([
        _topic([_partition(0, records=LARGE_RECORDS), _partition(1),
                _partition(2, records=memoryview(LARGE_RECORDS)[:20000])]),
        _topic([_partition(0, records=b"\x01" * 300)], name="second",
               topic_id=uuid.UUID(int=5)),
    ]),
    "many partitions, long name": _body([_topic(
        [_partition(i, high_watermark=i * 1000, records=b"") for i in range(200)],
        name="x" * 249, topic_id=None)]),
}


def _generic(version: int, body: dict) -> bytes:
    header = RequestHeader(ApiKey.FETCH, version, 987654, "client")
    return b"".join(encode_response_chunks(header, build_response(header, **body)))


def test_the_range_is_every_supported_version() -> None:
    assert SUPPORTED[ApiKey.FETCH] == (FIRST_VERSION, LAST_VERSION)


@pytest.mark.parametrize("version", range(FIRST_VERSION, LAST_VERSION + 1))
@pytest.mark.parametrize("name", sorted(BODIES))
def test_same_bytes_as_the_generic_encoder(version: int, name: str) -> None:
    body = BODIES[name]
    direct = encode_fetch_response(987654, version, body)
    assert direct is not None
    assert b"".join(direct) == _generic(version, body)


@pytest.mark.parametrize("version", [4, 12, 17])
def test_large_records_are_referenced_not_copied(version: int) -> None:
    view = memoryview(LARGE_RECORDS)[:20000]
    body = _body([_topic([_partition(0, records=LARGE_RECORDS), _partition(1, records=view)])])
    direct = encode_fetch_response(1, version, body)
    assert direct is not None
    assert any(chunk is LARGE_RECORDS for chunk in direct)
    assert any(chunk is view for chunk in direct)
    assert int.from_bytes(direct[0], "big") == sum(len(chunk) for chunk in direct[1:])


@pytest.mark.parametrize("body", [
    _body([], unknown_field=1),                                         # no version has it
    _body([_topic([{**_partition(0), "records_count": 1}])]),
    _body([], throttle_time=datetime.timedelta(milliseconds=5)),        # not a plain int
    _body([_topic([_partition(0, current_leader={"leader_id": 1, "epoch": 2})])]),
    _body([_topic([{k: v for k, v in _partition(0).items() if k != "records"}])]),
])
def test_other_shapes_are_left_to_the_generic_encoder(body: dict) -> None:
    assert encode_fetch_response(1, 12, body) is None


@pytest.mark.parametrize("version", [FIRST_VERSION - 1, LAST_VERSION + 1])
def test_versions_outside_the_range_are_left_to_the_generic_encoder(version: int) -> None:
    assert encode_fetch_response(1, version, BODIES["one record"]) is None
