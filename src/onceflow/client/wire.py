"""A small blocking Kafka client for the admin APIs confluent-kafka does not expose.

confluent-kafka 2.16's AdminClient has no DescribeProducers, DescribeTransactions,
ListTransactions, WriteTxnMarkers or FindCoordinator for transactional ids, so the
`txn` and `producers` commands speak them here, one request at a time.

Theory of operation: a `Connection` is one socket to one broker. Its first request is
ApiVersions v0 (every broker answers it), which tells the version range of every API;
each later call picks the highest version in both the broker's range and the caller's.
Bodies are built from plain values with `codec.build_entity` (fields of other versions
are ignored, so one call site serves every version) and framed by
`codec.encode_request`; answers are read with their size checked before buffering and
decoded by kio's reader for the chosen version. Every failure - nothing listening, a
timeout, a broker without the API, a malformed answer - is a `WireError`.
"""

from __future__ import annotations

import dataclasses
import functools
import socket
import struct
import typing
from collections.abc import Mapping
from typing import Any, Self

from kio.serial import entity_reader

from onceflow.client.security import SecurityError, authenticate, tls_context
from onceflow.protocol.apis import ApiKey
from onceflow.protocol.codec import (
    RequestHeader,
    build_entity,
    encode_request,
    request_type,
    response_type,
)

# The largest answer we accept: admin answers for thousands of partitions are a few MB.
RESPONSE_BYTES_MAX = 64 * 1024 * 1024
SOCKET_TIMEOUT_S = 30.0
CLIENT_ID = "onceflow-cli"
API_VERSIONS_V0 = 0
_SIZE = struct.Struct(">i")
_UVARINT_BYTES_MAX = 5


class WireError(Exception):
    """A broker could not be asked, or its answer could not be read."""


class Connection:
    """One socket to one broker (see the module docstring)."""

    def __init__(self, host: str, port: int, timeout_s: float = SOCKET_TIMEOUT_S,
                 properties: Mapping[str, str] | None = None) -> None:
        """`properties`: librdkafka's security settings (client.security), if any."""
        self.address = f"{host}:{port}"
        properties = properties or {}
        try:
            context = tls_context(properties)
        except SecurityError as exc:
            raise WireError(str(exc)) from None
        try:
            sock = socket.create_connection((host, port), timeout=timeout_s)
        except OSError as exc:
            raise WireError(f"cannot connect to {self.address}: {exc.strerror or exc}") from None
        self._sock = sock
        self._correlation_id = 0
        self._versions: dict[int, tuple[int, int]] | None = None
        try:
            if context is not None:
                self._sock = context.wrap_socket(sock, server_hostname=host)
            authenticate(properties, self.call)
        except (OSError, SecurityError) as exc:  # ssl.SSLError is an OSError
            self._sock.close()
            raise WireError(f"cannot connect to {self.address}: {exc}") from None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._sock.close()

    def versions(self) -> dict[int, tuple[int, int]]:
        """api_key -> (min, max) as the broker advertises them."""
        if self._versions is None:
            answer = self._exchange(ApiKey.API_VERSIONS, API_VERSIONS_V0, {})
            self._versions = {k.api_key: (k.min_version, k.max_version) for k in answer.api_keys}
        return self._versions

    def call(self, api_key: ApiKey, versions: tuple[int, int], **fields: Any) -> Any:
        """Send one request of `api_key` at the highest version both sides speak."""
        return self._exchange(api_key, self.pick_version(api_key, versions), fields)

    def pick_version(self, api_key: ApiKey, versions: tuple[int, int]) -> int:
        broker = self.versions().get(api_key)
        if broker is None or broker[1] < versions[0] or versions[1] < broker[0]:
            raise WireError(f"the broker at {self.address} does not answer {api_key.name} "
                            f"v{versions[0]}-{versions[1]}")
        return min(broker[1], versions[1])

    def _exchange(self, api_key: int, version: int, fields: dict[str, Any]) -> Any:
        self._correlation_id += 1
        header = RequestHeader(api_key, version, self._correlation_id, CLIENT_ID)
        body = build_entity(request_type(api_key, version), **fields)
        try:
            self._sock.sendall(encode_request(header, body))
            frame = self._receive_frame()
        except OSError as exc:  # socket.timeout included
            raise WireError(f"no answer from {self.address}: {exc}") from None
        return decode_response(api_key, version, self._correlation_id, frame)

    def _receive_frame(self) -> bytes:
        (size,) = _SIZE.unpack(self._receive_exactly(_SIZE.size))
        if not 0 < size <= RESPONSE_BYTES_MAX:
            raise WireError(f"{self.address} sent a frame of {size} bytes")
        return self._receive_exactly(size)

    def _receive_exactly(self, size: int) -> bytes:
        chunks, remaining = [], size
        while remaining:
            chunk = self._sock.recv(min(remaining, 1 << 20))
            if not chunk:
                raise WireError(f"{self.address} closed the connection")
            chunks.append(chunk)
            remaining -= len(chunk)
        return b"".join(chunks)


def decode_response(api_key: int, version: int, correlation_id: int, frame: bytes) -> Any:
    """The body of one response frame (size prefix removed)."""
    entity_type = response_type(api_key, version)
    if len(frame) < _SIZE.size or _SIZE.unpack_from(frame)[0] != correlation_id:
        raise WireError("answer to another request (correlation id mismatch)")
    pos = _SIZE.size
    if entity_type.__flexible__ and api_key != ApiKey.API_VERSIONS:
        pos = _skip_tagged_fields(frame, pos)  # response header v1
    try:
        body, size = entity_reader(_nullable_timestamps(entity_type))(frame, pos)
    except Exception as exc:  # noqa: BLE001 - a foreign decoder: any failure is the answer's
        raise WireError(f"malformed {ApiKey(api_key).name} v{version} answer: {exc}") from None
    if pos + size != len(frame):
        raise WireError(f"{ApiKey(api_key).name} v{version} answer has trailing bytes")
    return body


def _read_uvarint(buf: bytes, pos: int) -> tuple[int, int]:
    value = 0
    for index in range(_UVARINT_BYTES_MAX):
        if pos >= len(buf):
            break
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << (7 * index)
        if not byte & 0x80:
            return value, pos
    raise WireError("malformed varint in a response header")


def _skip_tagged_fields(buf: bytes, pos: int) -> int:
    count, pos = _read_uvarint(buf, pos)
    for _ in range(count):
        _tag, pos = _read_uvarint(buf, pos)
        size, pos = _read_uvarint(buf, pos)
        pos += size
    if pos > len(buf):
        raise WireError("truncated tagged fields in a response header")
    return pos


@functools.cache
def _nullable_timestamps(entity_type: type) -> type:
    """`entity_type` with its timestamp fields nullable.

    kio reads a `datetime_i64` field as a non-negative time, but Kafka sends -1 for "no
    timestamp" (DescribeTransactions' start time of a transaction that is not open), so
    this copy of the schema declares those fields optional: kio then reads -1 as None.
    Nested entities are copied the same way; everything else is unchanged.
    """
    hints = typing.get_type_hints(entity_type)
    fields = []
    for field in dataclasses.fields(entity_type):
        kind = hints[field.name]
        args = typing.get_args(kind)
        if field.metadata.get("kafka_type") == "datetime_i64" and not args:
            kind = kind | None
        elif args and dataclasses.is_dataclass(args[0]):
            kind = tuple[_nullable_timestamps(args[0]), ...]  # type: ignore[misc]
        elif dataclasses.is_dataclass(kind):
            kind = _nullable_timestamps(kind)
        fields.append((field.name, kind, dataclasses.field(metadata=field.metadata)))
    class_vars = {name: getattr(entity_type, name) for name in
                  ("__type__", "__version__", "__flexible__", "__api_key__", "__header_schema__")
                  if hasattr(entity_type, name)}
    return dataclasses.make_dataclass(entity_type.__name__, fields, namespace=class_vars,
                                      frozen=True, slots=True, kw_only=True)
