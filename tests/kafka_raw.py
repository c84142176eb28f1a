"""A minimal Kafka protocol client over a plain socket, for tests that need exact
control of every byte (bad input, idempotence rules). Independent of the broker's
own codec: headers are packed here by hand, bodies with kio's writers/readers."""

from __future__ import annotations

import io
import socket
import struct

from kio.index import load_request_schema, load_response_schema
from kio.serial import entity_reader, entity_writer

from onceflow.protocol.codec import build_entity

API_VERSIONS = 18
RECV_TIMEOUT_S = 15.0


def request_header(api_key: int, version: int, correlation_id: int, client_id: str | None,
                   flexible: bool) -> bytes:
    client = b"\xff\xff" if client_id is None else struct.pack(">h", len(client_id)) + client_id.encode()
    header = struct.pack(">hhi", api_key, version, correlation_id) + client
    return header + (b"\x00" if flexible else b"")   # v2 header: empty tagged fields


class RawClient:
    def __init__(self, bootstrap: str, client_id: str | None = "raw-test") -> None:
        host, port = bootstrap.split(",")[0].rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=RECV_TIMEOUT_S)
        self.client_id = client_id
        self.correlation_id = 0

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> RawClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def send_frame(self, payload: bytes) -> None:
        self.sock.sendall(struct.pack(">i", len(payload)) + payload)

    def send_bytes(self, data: bytes) -> None:
        self.sock.sendall(data)

    def recv_exactly(self, size: int) -> bytes:
        chunks, remaining = [], size
        while remaining:
            chunk = self.sock.recv(remaining)
            if not chunk:
                raise ConnectionError("connection closed by the broker")
            chunks.append(chunk)
            remaining -= len(chunk)
        return b"".join(chunks)

    def recv_frame(self) -> bytes:
        (size,) = struct.unpack(">i", self.recv_exactly(4))
        return self.recv_exactly(size)

    def encode(self, api_key: int, version: int, body: dict) -> bytes:
        cls = load_request_schema(api_key, version)
        self.correlation_id += 1
        buffer = io.BytesIO()
        entity_writer(cls)(buffer, build_entity(cls, **body))
        header = request_header(api_key, version, self.correlation_id, self.client_id, cls.__flexible__)
        return header + buffer.getvalue()

    def request(self, api_key: int, version: int, body: dict):
        self.send_frame(self.encode(api_key, version, body))
        return self.decode_response(api_key, version, self.recv_frame())

    def decode_response(self, api_key: int, version: int, frame: bytes):
        cls = load_response_schema(api_key, version)
        (correlation_id,) = struct.unpack_from(">i", frame, 0)
        assert correlation_id == self.correlation_id, (correlation_id, self.correlation_id)
        offset = 4
        if cls.__flexible__ and api_key != API_VERSIONS:
            assert frame[4] == 0, "tests expect no tagged fields in the response header"
            offset = 5
        entity, size = entity_reader(cls)(frame, offset)
        assert offset + size == len(frame), "response has trailing bytes"
        return entity
