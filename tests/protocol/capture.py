"""A one-node answering machine that records what real clients send.

It speaks just enough Kafka for a producer to get from connect to its first
Produce: ApiVersions, Metadata (one topic, one partition, led by itself) and
Produce (success). Every request frame is kept, so tests can check that the
codec decodes real clients' bytes and can print them as golden constants:

    .venv/bin/python -m tests.protocol.capture

It runs on a plain socket and a thread, so it depends on nothing but the
protocol package it tests.
"""

from __future__ import annotations

import socket
import threading
import uuid

from onceflow.protocol.apis import SUPPORTED, ApiKey
from onceflow.protocol.codec import (
    Request,
    api_versions_fallback,
    build_response,
    decode_request,
    encode_response,
)
from onceflow.protocol.errors import UnsupportedVersion
from onceflow.protocol.framing import FRAME_BYTES_MAX_DEFAULT, FrameReader

NODE_ID = 1
TOPIC_ID = uuid.UUID("6f6e6365-666c-6f77-2d67-6f6c64656e21")
RECV_BYTES = 65536


class CaptureBroker:
    def __init__(self, topic: str) -> None:
        self.topic = topic
        self.frames: list[bytes] = []
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._thread = threading.Thread(target=self._accept_loop, daemon=True)
        self._thread.start()

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def close(self) -> None:
        self._listener.close()

    def requests(self) -> list[Request]:
        with self._lock:
            frames = list(self.frames)
        return [decode_request(frame) for frame in frames]

    def _accept_loop(self) -> None:
        while True:
            try:
                connection, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(connection,), daemon=True).start()

    def _serve(self, connection: socket.socket) -> None:
        reader = FrameReader(FRAME_BYTES_MAX_DEFAULT)
        with connection:
            while data := _recv(connection):
                reader.receive_data(data)
                while (frame := reader.next_frame()) is not None:
                    with self._lock:
                        self.frames.append(frame)
                    answer = self._answer(frame)
                    if answer is None:
                        continue
                    connection.sendall(answer)

    def _answer(self, frame: bytes) -> bytes | None:
        try:
            request = decode_request(frame)
        except UnsupportedVersion as error:
            return api_versions_fallback(error.header)
        header, body = request.header, request.body
        if header.api_key == ApiKey.API_VERSIONS:
            keys = [
                {"api_key": key, "min_version": low, "max_version": high}
                for key, (low, high) in SUPPORTED.items()
            ]
            fields = {"error_code": 0, "api_keys": keys, "throttle_time": 0}
            return encode_response(header, build_response(header, **fields))
        if header.api_key == ApiKey.METADATA:
            return encode_response(header, build_response(header, **self._metadata()))
        if header.api_key == ApiKey.PRODUCE:
            if body.acks == 0:
                return None
            return encode_response(header, build_response(header, **_produce_ok(body)))
        raise AssertionError(f"capture broker cannot answer {header}")

    def _metadata(self) -> dict[str, object]:
        partition = {
            "error_code": 0, "partition_index": 0, "leader_id": NODE_ID, "leader_epoch": 0,
            "replica_nodes": [NODE_ID], "isr_nodes": [NODE_ID], "offline_replicas": [],
        }  # fmt: skip
        topic = {
            "error_code": 0, "name": self.topic, "topic_id": TOPIC_ID, "is_internal": False,
            "partitions": [partition],
        }  # fmt: skip
        return {
            "throttle_time": 0,
            "error_code": 0,   # v13+
            "brokers": [{"node_id": NODE_ID, "host": "127.0.0.1", "port": self.port}],
            "cluster_id": "capture",
            "controller_id": NODE_ID,
            "topics": [topic],
        }


def _produce_ok(body: object) -> dict[str, object]:
    responses = [
        {
            "name": topic.name,
            "partition_responses": [
                {
                    "index": data.index,
                    "error_code": 0,
                    "base_offset": 0,
                    "log_append_time": -1,
                    "log_start_offset": 0,
                    "record_errors": [],
                }
                for data in topic.partition_data
            ],
        }  # fmt: skip
        for topic in body.topic_data  # type: ignore[attr-defined]
    ]
    return {"responses": responses, "throttle_time": 0}


def _recv(connection: socket.socket) -> bytes:
    try:
        return connection.recv(RECV_BYTES)
    except OSError:
        return b""


# ---------------------------------------------------------------- real clients


def produce_with_confluent(bootstrap: str, topic: str, compression: str) -> None:
    import confluent_kafka

    producer = confluent_kafka.Producer(
        {"bootstrap.servers": bootstrap, "compression.type": compression,
         "client.id": "golden-rdkafka", "linger.ms": 0, "message.timeout.ms": 10000}
    )  # fmt: skip
    producer.produce(topic, key=b"key", value=b"value " * 20, partition=0)
    remaining = producer.flush(10)
    assert remaining == 0, "librdkafka did not get its produce acknowledged"


def produce_with_kafka_python(bootstrap: str, topic: str, compression: str) -> None:
    import kafka

    producer = kafka.KafkaProducer(
        bootstrap_servers=bootstrap, client_id="golden-kafka-python",
        compression_type=compression, enable_idempotence=False, request_timeout_ms=10000,
    )  # fmt: skip
    try:
        producer.send(topic, key=b"key", value=b"value " * 20, partition=0).get(timeout=10)
    finally:
        producer.close(timeout=5)


def produce_with_aiokafka(bootstrap: str, topic: str, compression: str) -> None:
    import asyncio

    import aiokafka

    async def run() -> None:
        producer = aiokafka.AIOKafkaProducer(
            bootstrap_servers=bootstrap, client_id="golden-aiokafka",
            compression_type=compression, request_timeout_ms=10000,
        )  # fmt: skip
        await producer.start()
        try:
            await producer.send_and_wait(topic, key=b"key", value=b"value " * 20, partition=0)
        finally:
            await producer.stop()

    asyncio.run(run())


PRODUCERS = {
    "confluent": produce_with_confluent,
    "kafka-python": produce_with_kafka_python,
    "aiokafka": produce_with_aiokafka,
}


def capture(client: str, compression: str, topic: str = "golden") -> list[bytes]:
    broker = CaptureBroker(topic)
    try:
        PRODUCERS[client](broker.bootstrap, topic, compression)
    finally:
        broker.close()
    with broker._lock:
        return list(broker.frames)


if __name__ == "__main__":
    for client_name in PRODUCERS:
        for frame_bytes in capture(client_name, "gzip"):
            request = decode_request(frame_bytes)
            print(client_name, request.header)
            print(frame_bytes.hex())
