"""Answers a fail_requests fault gives in place of the handler's, for every Produce
version: v13 names topics by id (its topics have no name)."""

import uuid

import pytest
from kio.schema.errors import ErrorCode

from onceflow.broker.faults import _produce_error
from onceflow.broker.pipeline import encode
from onceflow.protocol.apis import SUPPORTED, ApiKey
from onceflow.protocol.codec import decode_request, encode_request
from onceflow.protocol.header import RequestHeader
from tests.protocol.test_produce_request import batch, kio_body


@pytest.mark.parametrize("version", range(SUPPORTED[ApiKey.PRODUCE][0],
                                          SUPPORTED[ApiKey.PRODUCE][1] + 1))
def test_injected_produce_error_is_encoded_for_every_version(version):
    header = RequestHeader(ApiKey.PRODUCE, version, 7, "c")
    frame = encode_request(header, kio_body(version, None, [("t", [(0, batch(b"v"))])]))[4:]
    request = decode_request(frame)
    answer = _produce_error(request.body, ErrorCode.not_leader_or_follower)
    chunks = encode(request.header, answer)
    assert b"".join(bytes(c) for c in chunks)  # encodable: names or ids as the version has
    topic = answer["responses"][0]
    if version >= 13:
        assert topic["topic_id"] == uuid.uuid5(uuid.NAMESPACE_DNS, "t")
    else:
        assert topic["name"] == "t"
