"""Real clients' bytes: stored captures decode to what the clients meant, and
fresh captures from the installed clients decode too."""

from __future__ import annotations

import gzip
import struct

import pytest

from onceflow.protocol.apis import SUPPORTED, ApiKey
from onceflow.protocol.codec import RequestHeader, decode_request
from onceflow.protocol.records import (
    ATTR_COMPRESSION_MASK,
    ATTRIBUTES_AT,
    BATCH_HEADER_BYTES,
    Compression,
    check_produce_records,
    decode_records,
)
from tests.protocol import golden
from tests.protocol.capture import capture

RECORD_VALUE = b"value " * 20
# kafka-python loads its schemas with a deprecated importlib.resources call.
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def decompressed_batch(batch: memoryview) -> bytes:
    """The same batch with its gzip payload inflated, so decode_records can read it."""
    records = gzip.decompress(bytes(batch[BATCH_HEADER_BYTES:]))
    header = bytearray(batch[:BATCH_HEADER_BYTES])
    struct.pack_into(">i", header, 8, len(header) - 12 + len(records))
    (attributes,) = struct.unpack_from(">h", header, ATTRIBUTES_AT)
    struct.pack_into(">h", header, ATTRIBUTES_AT, attributes & ~ATTR_COMPRESSION_MASK)
    return bytes(header) + records


def test_rdkafka_api_versions_v3() -> None:
    request = decode_request(golden.RDKAFKA_API_VERSIONS_V3)
    assert request.header == RequestHeader(18, 3, 1, "golden-rdkafka")
    assert request.body.client_software_name == "confluent-kafka-python"
    assert request.body.client_software_version == "2.16.1-rdkafka-2.16.0"


def test_kafka_python_api_versions_v4() -> None:
    request = decode_request(golden.KAFKA_PYTHON_API_VERSIONS_V4)
    assert request.header == RequestHeader(18, 4, 1, "golden-kafka-python")
    assert request.body.client_software_name == "kafka-python"
    assert request.body.client_software_version == "3.0.12"


def test_aiokafka_api_versions_v0_has_an_empty_body() -> None:
    request = decode_request(golden.AIOKAFKA_API_VERSIONS_V0)
    assert request.header == RequestHeader(18, 0, 1, "golden-aiokafka")


def test_metadata_requests() -> None:
    rdkafka = decode_request(golden.RDKAFKA_METADATA_V12)
    assert rdkafka.header == RequestHeader(3, 12, 2, "golden-rdkafka")
    assert [(topic.name, topic.topic_id) for topic in rdkafka.body.topics] == [("golden", None)]
    assert rdkafka.body.allow_auto_topic_creation is True
    kafka_python = decode_request(golden.KAFKA_PYTHON_METADATA_V12)
    assert kafka_python.body.topics == ()  # an empty list: no topics (null would be all)
    aiokafka = decode_request(golden.AIOKAFKA_METADATA_V5)
    assert aiokafka.header.api_version == 5 and aiokafka.body.topics == ()


@pytest.mark.parametrize(
    ("frame", "version", "acks", "timeout_ms", "producer_epoch", "base_sequence"),
    [
        (golden.RDKAFKA_PRODUCE_V10_GZIP, 10, -1, 30000, -1, -1),
        (golden.KAFKA_PYTHON_PRODUCE_V9_GZIP, 9, -1, 10000, -1, -1),
        # aiokafka writes base_sequence 0 without a producer id: only meaningful
        # when producer_id >= 0.
        (golden.AIOKAFKA_PRODUCE_V7_GZIP, 7, 1, 10000, -1, 0),
    ],
)
def test_produce_requests_with_gzip(
    frame: bytes, version: int, acks: int, timeout_ms: int, producer_epoch: int,
    base_sequence: int,
) -> None:  # fmt: skip
    request = decode_request(frame)
    assert request.header.api_key == ApiKey.PRODUCE and request.header.api_version == version
    body = request.body
    assert (body.acks, body.timeout.total_seconds() * 1000) == (acks, timeout_ms)
    (topic,) = body.topic_data
    (partition,) = topic.partition_data
    assert (topic.name, partition.index) == ("golden", 0)
    header, batch = check_produce_records(partition.records, version)
    assert header.compression == Compression.GZIP
    assert (header.records_count, header.last_offset_delta) == (1, 0)
    assert (header.producer_id, header.producer_epoch) == (-1, producer_epoch)
    assert header.base_sequence == base_sequence
    (record,) = decode_records(decompressed_batch(batch))
    assert (record.key, record.value, record.headers) == (b"key", RECORD_VALUE, ())
    assert record.timestamp_ms == header.base_timestamp


# ---------------------------------------------------------------- live captures


def produce_batches(frames: list[bytes]) -> list[tuple[int, int]]:
    """(produce version, compression codec) of every produce request captured."""
    found = []
    for frame in frames:
        request = decode_request(frame)
        if request.header.api_key != ApiKey.PRODUCE:
            continue
        records = request.body.topic_data[0].partition_data[0].records
        header, _ = check_produce_records(records, request.header.api_version)
        found.append((request.header.api_version, header.compression))
    return found


@pytest.mark.parametrize(
    ("client", "produce_version"), [("confluent", 10), ("kafka-python", 9), ("aiokafka", 7)]
)
def test_live_clients_decode(client: str, produce_version: int) -> None:
    frames = capture(client, "gzip")
    keys = [decode_request(frame).header.api_key for frame in frames]
    assert keys[0] == ApiKey.API_VERSIONS
    assert ApiKey.METADATA in keys
    assert produce_batches(frames) == [(produce_version, Compression.GZIP)]


def test_librdkafka_uses_zstd_with_these_ranges() -> None:
    assert produce_batches(capture("confluent", "zstd")) == [(10, Compression.ZSTD)]


def test_librdkafka_lz4_follows_find_coordinator() -> None:
    """librdkafka enables lz4 only when FindCoordinator is advertised."""
    expected = Compression.LZ4 if ApiKey.FIND_COORDINATOR in SUPPORTED else Compression.NONE
    assert produce_batches(capture("confluent", "lz4")) == [(10, expected)]
