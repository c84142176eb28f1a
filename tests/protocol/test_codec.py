"""Request decoding, response encoding, the ApiVersions rules and the builders."""

from __future__ import annotations

import datetime
import io
import struct
import subprocess
import sys
import textwrap

import pytest
from kio.index import load_request_schema, load_response_schema
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader, entity_writer

from onceflow.protocol import codec
from onceflow.protocol.apis import SUPPORTED, ApiKey, is_supported
from onceflow.protocol.codec import (
    RequestHeader,
    api_versions_fallback,
    build_entity,
    build_response,
    decode_request,
    encode_request,
    encode_response,
    request_type,
    to_ms,
)
from onceflow.protocol.errors import ProtocolError, UnsupportedVersion


def metadata_request(version: int, topics: list[str] | None, correlation_id: int = 7) -> bytes:
    """A Metadata request frame payload (no size prefix)."""
    header = RequestHeader(ApiKey.METADATA, version, correlation_id, "tester")
    topic_entries = None
    if topics is not None:
        topic_entries = [{"name": name, "topic_id": None} for name in topics]
    body = build_entity(
        request_type(ApiKey.METADATA, version),
        topics=topic_entries,
        allow_auto_topic_creation=False,
        include_cluster_authorized_operations=False,  # v8-10 only
        include_topic_authorized_operations=False,
    )
    return encode_request(header, body)[4:]


# ---------------------------------------------------------------- the table


def test_every_advertised_version_exists_in_kio() -> None:
    for api_key, (low, high) in SUPPORTED.items():
        assert 0 <= low <= high
        for version in range(low, high + 1):
            load_request_schema(api_key, version)
            load_response_schema(api_key, version)


def test_ranges_keep_librdkafka_features_on() -> None:
    # Message format v2 needs Produce 3 and Fetch 4 in range, zstd needs 7 and 10
    # (exact versions before librdkafka 2.11.1; overlap since).
    assert is_supported(ApiKey.PRODUCE, 3) and is_supported(ApiKey.PRODUCE, 7)
    assert is_supported(ApiKey.FETCH, 4) and is_supported(ApiKey.FETCH, 10)
    # aiokafka only speaks ApiVersions v0.
    assert is_supported(ApiKey.API_VERSIONS, 0)


# ---------------------------------------------------------------- decoding


def test_decode_header_and_body() -> None:
    request = decode_request(metadata_request(12, ["a", "b"], correlation_id=42))
    assert request.header == RequestHeader(3, 12, 42, "tester")
    assert [topic.name for topic in request.body.topics] == ["a", "b"]


def test_null_client_id() -> None:
    header = RequestHeader(ApiKey.METADATA, 4, 1, None)
    body = build_entity(request_type(3, 4), topics=None, allow_auto_topic_creation=True)
    assert decode_request(encode_request(header, body)[4:]).header.client_id is None


def test_bad_utf8_client_id_is_replaced_like_kafka() -> None:
    frame = struct.pack(">hhih", 3, 4, 1, 2) + b"\xff\xfe" + struct.pack(">i", -1) + b"\x01"
    assert decode_request(frame).header.client_id == "\ufffd\ufffd"


@pytest.mark.parametrize(
    "frame",
    [
        b"",
        b"\x00\x03\x00",
        struct.pack(">hhi", 3, 4, 1),  # no client_id length
        struct.pack(">hhih", 3, 4, 1, 50) + b"short",  # client_id past the end
        struct.pack(">hhih", 3, 4, 1, -2),  # negative client_id length
    ],
)
def test_malformed_header(frame: bytes) -> None:
    with pytest.raises(ProtocolError):
        decode_request(frame)


def test_trailing_bytes_ignored_as_kafka_does() -> None:
    # librdkafka 2.16 sends these 3 bytes after a Metadata v12 "all topics" body.
    frame = bytes.fromhex("0003000c00000003000772646b61666b610000000000010000")
    request = decode_request(frame)
    assert request.body.topics is None
    assert decode_request(metadata_request(12, ["a"]) + b"\x00").body == decode_request(metadata_request(12, ["a"])).body


def test_truncated_body_refused() -> None:
    frame = metadata_request(12, ["abc"])
    for cut in range(len(frame) - 1, 14, -1):
        with pytest.raises(ProtocolError):
            decode_request(frame[:cut])


def _header(api_key: int, version: int) -> bytes:
    return struct.pack(">hhih", api_key, version, 7, 1) + b"t"


@pytest.mark.parametrize("version", [1, 4, 9, 12])
def test_a_null_where_kafka_allows_one_is_read_as_none(version: int) -> None:
    # Metadata's topics is nullable from v1 ("all topics").
    assert decode_request(metadata_request(version, None)).body.topics is None


def test_a_null_where_kafka_allows_none_is_refused() -> None:
    # Kafka's generated readers: "non-nullable field ... was serialized as null".
    null32, null16 = b"\xff\xff\xff\xff", b"\xff\xff"
    refused = {
        "Metadata v0 topics (int32 count)": _header(3, 0) + null32,
        "Metadata v1 topic name (int16 length)": _header(3, 1) + b"\x00\x00\x00\x01" + null16,
        "Metadata v9 topic name (compact)": _header(3, 9) + b"\x00" + b"\x02" + b"\x00",
        "Fetch v4 topics": _header(1, 4) + struct.pack(">iiiib", -1, 500, 1, 1 << 20, 0) + null32,
        "Fetch v12 topics (compact)": _header(1, 12) + b"\x00" + struct.pack(
            ">iiiibii", -1, 500, 1, 1 << 20, 0, 0, -1) + b"\x00",
        "SaslAuthenticate v0 auth_bytes (int32 length)": _header(36, 0) + null32,
    }
    for name, frame in refused.items():
        with pytest.raises(ProtocolError, match="null in a non-nullable field"):
            decode_request(frame)
            pytest.fail(name)
    # The same frames with an empty value instead of the null are read.
    assert decode_request(_header(3, 0) + b"\x00\x00\x00\x00").body.topics == ()
    assert decode_request(_header(36, 0) + b"\x00\x00\x00\x00").body.auth_bytes == b""


def test_invalid_utf8_in_body_is_a_protocol_error() -> None:
    frame = metadata_request(9, ["ab"])  # flexible, topic name is compact string
    with pytest.raises(ProtocolError):
        decode_request(frame.replace(b"ab", b"\xff\xfe"))


@pytest.mark.parametrize(
    ("api_key", "api_version"),
    [(ApiKey.PRODUCE, 2), (ApiKey.FETCH, 18), (ApiKey.API_VERSIONS, 5), (999, 0), (-1, 0)],
)
def test_unsupported_version_carries_the_header(api_key: int, api_version: int) -> None:
    frame = struct.pack(">hhih", api_key, api_version, 1234, 3) + b"cli" + b"garbage"
    with pytest.raises(UnsupportedVersion) as raised:
        decode_request(frame)
    assert raised.value.header == RequestHeader(api_key, api_version, 1234, "cli")


def test_unknown_tagged_fields_are_skipped_like_kafka() -> None:
    plain = metadata_request(12, ["t"])
    # Header v2: tagged fields right after client_id ("tester", 6 bytes).
    header_end = 8 + 2 + 6
    tagged_header = plain[:header_end] + b"\x01\x05\x01z" + plain[header_end + 1 :]
    # Body: MetadataRequestTopic is topic_id(16) + name + tags; the request ends
    # with two bools and its own tags. Add an unknown tag to both.
    body = plain[header_end + 1 :]
    topic_tags_at = 1 + 16 + 2  # array count, uuid, compact "t"
    assert body[topic_tags_at] == 0 and body[-1] == 0
    tagged_body = (
        body[:topic_tags_at]
        + b"\x02\x09\x02hi\x0c\x00"  # tags 9 and 12
        + body[topic_tags_at + 1 : -1]
        + b"\x01\x63\x03abc"  # tag 99
    )
    expected = decode_request(plain)
    assert decode_request(tagged_header).body == expected.body
    frame = plain[: header_end + 1] + tagged_body
    assert decode_request(frame).body == expected.body


def test_unknown_tag_inside_a_known_tagged_struct() -> None:
    # No advertised request has a tagged struct, so drive the walker with a
    # FetchResponse v12, whose PartitionData carries diverging_epoch as tag 0.
    response_cls = load_response_schema(ApiKey.FETCH, 12)
    module = sys.modules[response_cls.__module__]
    body = build_entity(
        response_cls,
        throttle_time=0,
        error_code=0,
        responses=[
            {"topic": "t", "partitions": [{
                "partition_index": 0, "error_code": 0, "high_watermark": 5,
                "aborted_transactions": None, "records": b"xyz",
                "diverging_epoch": module.EpochEndOffset(epoch=3, end_offset=9),
            }]},
        ],
    )  # fmt: skip
    out = io.BytesIO()
    entity_writer(response_cls)(out, body)
    encoded = out.getvalue()
    # diverging_epoch value: epoch int32 3, end_offset int64 9, its own tags (0).
    inner = struct.pack(">iq", 3, 9) + b"\x00"
    assert encoded.count(inner) == 1
    grown = struct.pack(">iq", 3, 9) + b"\x01\x07\x01!"  # unknown tag 7 inside
    tag_header = b"\x00" + bytes([len(inner)])
    assert encoded.count(tag_header + inner) == 1
    mutated = encoded.replace(tag_header + inner, b"\x00" + bytes([len(grown)]) + grown)
    view = memoryview(mutated)
    edits: list[tuple[int, int, bytes]] = []
    end = codec._walk_entity(codec._shape(response_cls), view, 0, len(view), edits)
    assert end == len(view) and edits
    cleaned = codec._splice(view, 0, len(view), edits)
    assert cleaned == encoded
    assert entity_reader(response_cls)(cleaned, 0)[0] == body


HUGE_ARRAY_SCRIPT = textwrap.dedent(
    """
    import struct
    from onceflow.protocol.codec import decode_request
    from onceflow.protocol.errors import ProtocolError
    header = struct.pack(">hhih", {api_key}, {version}, 1, 0) + b"\\x00"
    for body in {bodies!r}:
        try:
            decode_request(header + body)
        except ProtocolError:
            pass
        else:
            raise SystemExit("decoded an impossible array")
    print("refused")
    """
)


@pytest.mark.parametrize(
    ("api_key", "version", "bodies"),
    [
        # Metadata v12 topics: compact array announcing 2^32 - 2 and 2^34 entries.
        (ApiKey.METADATA, 12, [b"\xff\xff\xff\xff\x0f" + bytes(10), b"\x81\x80\x80\x80\x40"]),
        # DescribeConfigs v4: a primitive (string) array inside a struct.
        (ApiKey.DESCRIBE_CONFIGS, 4, [b"\x02\x02\x02a\xff\xff\xff\xff\x0f" + bytes(8)]),
    ],
)
def test_huge_array_count_does_not_abort_the_process(
    api_key: int, version: int, bodies: list[bytes]
) -> None:
    """kio's native reader aborts the process on such counts; the walker refuses first."""
    script = HUGE_ARRAY_SCRIPT.format(api_key=int(api_key), version=version, bodies=bodies)
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "refused"


# ---------------------------------------------------------------- encoding


def test_response_header_v0_for_non_flexible() -> None:
    header = RequestHeader(ApiKey.METADATA, 8, 77, "c")
    frame = encode_response(header, build_response(header, throttle_time=0, brokers=[], topics=[]))
    size, correlation_id, throttle_ms = struct.unpack_from(">iii", frame)
    assert (size, correlation_id, throttle_ms) == (len(frame) - 4, 77, 0)


def test_response_header_v1_for_flexible() -> None:
    header = RequestHeader(ApiKey.METADATA, 12, 77, "c")
    frame = encode_response(header, build_response(header, throttle_time=5, brokers=[], topics=[]))
    assert frame[4:8] == struct.pack(">i", 77)
    assert frame[8] == 0  # empty tagged fields of response header v1
    assert frame[9:13] == struct.pack(">i", 5)


@pytest.mark.parametrize("version", [0, 1, 2, 3, 4])
def test_api_versions_response_always_uses_header_v0(version: int) -> None:
    header = RequestHeader(ApiKey.API_VERSIONS, version, 9, "c")
    body = build_response(
        header, error_code=0, throttle_time=0,
        api_keys=[{"api_key": 18, "min_version": 0, "max_version": 4}],
    )  # fmt: skip
    frame = encode_response(header, body)
    assert frame[4:8] == struct.pack(">i", 9)
    assert frame[8:10] == b"\x00\x00"  # error_code follows the correlation id directly
    decoded, size = entity_reader(type(body))(frame, 8)
    assert decoded == body and 8 + size == len(frame)


def test_api_versions_fallback_bytes() -> None:
    low, high = SUPPORTED[ApiKey.API_VERSIONS]
    frame = api_versions_fallback(RequestHeader(ApiKey.API_VERSIONS, 99, 7, "new-client"))
    expected_body = struct.pack(">hi", 35, 1) + struct.pack(">hhh", 18, low, high)
    assert frame == struct.pack(">ii", 4 + len(expected_body), 7) + expected_body


def test_encode_response_refuses_a_body_of_another_version() -> None:
    header = RequestHeader(ApiKey.METADATA, 12, 1, None)
    body = build_response(RequestHeader(ApiKey.METADATA, 11, 1, None), throttle_time=0,
                          brokers=[], topics=[])  # fmt: skip
    with pytest.raises(TypeError):
        encode_response(header, body)


# ---------------------------------------------------------------- builders


def test_build_response_converts_plain_values() -> None:
    header = RequestHeader(ApiKey.PRODUCE, 9, 1, None)
    body = build_response(
        header,
        throttle_time=25,
        responses=[{"name": "t", "partition_responses": [
            {"index": 0, "error_code": 6, "base_offset": 10, "log_append_time": -1,
             "record_errors": []},
            {"index": 1, "error_code": 0, "base_offset": 11,
             "log_append_time": 1_700_000_000_123, "record_errors": []},
        ]}],
    )  # fmt: skip
    first, second = body.responses[0].partition_responses
    assert first.error_code is ErrorCode.not_leader_or_follower
    assert first.log_append_time is None
    assert body.throttle_time == datetime.timedelta(milliseconds=25)
    assert round(second.log_append_time.timestamp() * 1000) == 1_700_000_000_123
    frame = encode_response(header, body)
    decoded, _ = entity_reader(type(body))(frame, 9)
    assert decoded.responses[0].partition_responses[1].log_append_time == second.log_append_time


def test_build_response_drops_fields_of_other_versions() -> None:
    # log_start_offset exists from Fetch v5 on; v4 silently drops it.
    header = RequestHeader(ApiKey.FETCH, 4, 1, None)
    partition = {"partition_index": 0, "error_code": 0, "high_watermark": 3,
                 "last_stable_offset": 3, "log_start_offset": 0,
                 "aborted_transactions": None, "records": b""}  # fmt: skip
    body = build_response(header, throttle_time=0, error_code=0, session_id=0,
                          responses=[{"topic": "t", "partitions": [partition]}])  # fmt: skip
    assert not hasattr(body.responses[0].partitions[0], "log_start_offset")
    assert not hasattr(body, "session_id")


def test_build_response_refuses_unknown_names() -> None:
    header = RequestHeader(ApiKey.METADATA, 12, 1, None)
    with pytest.raises(TypeError, match="brokerz"):
        build_response(header, throttle_time=0, brokerz=[], topics=[])


def test_to_ms() -> None:
    assert to_ms(datetime.timedelta(seconds=1.5)) == 1500
