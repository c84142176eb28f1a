"""The request pipeline's stages, each alone and then together, without a socket.

Real parts throughout: the ApiVersions handler, a BrokerState on a temporary directory,
an unattached FaultInjector; the frames are what a client would send.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Iterator

import pytest
from kio.schema.api_versions.v3.request import ApiVersionsRequest
from kio.schema.errors import ErrorCode

from onceflow.broker.cluster import Cluster, Node
from onceflow.broker.config import BrokerConfig
from onceflow.broker.faults import LOST_ANSWER, FaultInjector
from onceflow.broker.handlers import HANDLERS, load_all
from onceflow.broker.pipeline import Peer, RequestPipeline, decode, encode
from onceflow.broker.state import BrokerState
from onceflow.protocol.apis import ApiKey
from onceflow.protocol.codec import (
    Request,
    RequestHeader,
    api_versions_fallback,
    encode_request,
)
from onceflow.protocol.errors import ProtocolError, UnsupportedVersion

UNSPOKEN_VERSION = 999


def api_versions_frame(correlation_id: int = 7) -> bytes:
    header = RequestHeader(ApiKey.API_VERSIONS, 3, correlation_id, "test")
    body = ApiVersionsRequest(client_software_name="onceflow-test",
                              client_software_version="1.0")
    return encode_request(header, body)[4:]  # the pipeline gets frames without the size


def unspoken_frame(api_key: int) -> bytes:
    """A header of a version no broker speaks (the body is never read)."""
    return struct.pack(">hhih", api_key, UNSPOKEN_VERSION, 9, -1)


def test_decode_gives_the_request() -> None:
    request = decode(api_versions_frame(correlation_id=41))
    assert isinstance(request, Request)
    assert (request.header.api_key, request.header.correlation_id) == (ApiKey.API_VERSIONS, 41)


def test_decode_answers_an_unspoken_api_versions_version_itself() -> None:
    answer = decode(unspoken_frame(ApiKey.API_VERSIONS))
    assert answer == api_versions_fallback(
        RequestHeader(ApiKey.API_VERSIONS, UNSPOKEN_VERSION, 9, None))


def test_decode_refuses_other_unspoken_apis_and_garbage() -> None:
    with pytest.raises(UnsupportedVersion):
        decode(unspoken_frame(ApiKey.PRODUCE))
    with pytest.raises(ProtocolError):
        decode(api_versions_frame()[:-3])


def test_encode_sends_nothing_for_no_answer() -> None:
    assert encode(RequestHeader(ApiKey.PRODUCE, 9, 1, None), None) is None


@pytest.fixture
def pipeline(tmp_path) -> Iterator[tuple[RequestPipeline, FaultInjector]]:
    load_all()
    state = BrokerState(BrokerConfig(data_dir=tmp_path), Cluster([Node(0, "127.0.0.1", 9092)]))
    faults = FaultInjector()
    # ApiVersions needs no coordinator runtime.
    yield RequestPipeline(state, None, None, faults, HANDLERS), faults  # type: ignore[arg-type]
    state.close()


def test_start_runs_the_handler_and_encodes_its_answer(pipeline) -> None:
    pipe, _faults = pipeline
    work = pipe.start(api_versions_frame(correlation_id=5), Peer(0), lambda reason: None)
    chunks = asyncio.run(work)
    frame = b"".join(chunks)
    size, correlation_id = struct.unpack_from(">ii", frame)
    assert (size, correlation_id) == (len(frame) - 4, 5)
    # ApiVersions answers with header v0: the error code follows the correlation id.
    assert struct.unpack_from(">h", frame, 8)[0] == ErrorCode.none.value


def test_start_lets_fault_injection_take_the_answer(pipeline) -> None:
    pipe, faults = pipeline
    faults.drop_responses("api_versions", count=1)
    dropped = asyncio.run(pipe.start(api_versions_frame(), Peer(0), lambda reason: None))
    answered = asyncio.run(pipe.start(api_versions_frame(), Peer(0), lambda reason: None))
    assert dropped is LOST_ANSWER and answered
