"""Kafka request decoding and response encoding over kio, sans I/O.

Theory of operation. A request frame is a request header followed by the body
of one (api_key, api_version). `decode_request`:

1. parses the header itself: int16 api_key, int16 api_version, int32
   correlation_id, then client_id as a nullable int16-length string (Kafka keeps
   that legacy encoding even in flexible headers). These four fields sit at the
   same place in header v1 and v2, so they are known before the version is
   judged, and `UnsupportedVersion` can carry the correlation id;
2. refuses a key/version outside `apis.SUPPORTED` (UnsupportedVersion); the body
   of such a request is never parsed, as in Kafka;
3. skips the header's tagged fields when the version is flexible (header v2;
   Kafka defines none in the request header, so all are skipped);
4. walks the body with a bounds checker compiled from the kio schema
   (walker.py: why a walker is needed, and how it cuts records fields out so
   that a Produce body holds views of the frame instead of copies), and
5. hands the body to kio's native reader, requiring that it consume exactly the
   rest of the frame.

Steps 4-5 are the generic path. An API in `DIRECT_DECODERS` (Produce:
produce_request.py) skips them: its body is read in one pass straight from the
frame into light classes with kio's field names, the same values and refusals
(its tests compare both paths; `direct=False` takes the generic one).

Any failure in steps 1-5 is a `ProtocolError`; nothing else escapes for any
input (tests/protocol fuzz this).

Responses. `encode_response` writes the frame size, the response header and the
kio-encoded body into one buffer. Header v1 (correlation id plus tagged fields)
goes with flexible versions and v0 (correlation id only) with the others, except
that ApiVersions always uses v0, so a client can read it before it knows which
versions the broker speaks. `api_versions_fallback` is Kafka's answer to an
ApiVersions version it does not know: a v0 body with UNSUPPORTED_VERSION and,
as the only entry (KIP-511), the ApiVersions range, so the client retries lower.

Building responses. kio's entity classes use rich types (ErrorCode, timedelta
for *_ms fields, datetime for timestamps, tuples of nested classes that differ
per version). `build_response(header, **fields)` builds the body of the
request's version from plain values: ints for error codes, durations and
timestamps, lists for arrays and dicts for nested entities. A field that exists
only in other versions of the same entity is dropped (handlers write one dict
for all versions); a name that no version has is a TypeError.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import importlib
import io
import struct
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from kio.index import load_request_schema, load_response_schema
from kio.schema.api_versions.v0.response import ApiVersion as ApiVersionV0
from kio.schema.api_versions.v0.response import ApiVersionsResponse as ApiVersionsResponseV0
from kio.schema.errors import ErrorCode
from kio.schema.index import schema_name_map
from kio.serial import entity_reader, entity_writer
from kio.serial.readers import tz_aware_from_i64

from onceflow.protocol.apis import SUPPORTED, ApiKey, is_supported
from onceflow.protocol.errors import ProtocolError, UnsupportedVersion
from onceflow.protocol.framing import FRAME_SIZE
from onceflow.protocol.header import RequestHeader
from onceflow.protocol.produce_request import decode_produce_request
from onceflow.protocol.walker import (
    _NO_TAGS,
    _Edit,
    _field_infos,
    _FieldInfo,
    _put_records,
    _read_fixed,
    _records_plan,
    _Shape,
    _shape,
    _skip,
    _splice,
    _walk_entity,
    _walk_tagged_fields,
)

__all__ = (
    "Request",
    "RequestHeader",
    "api_versions_fallback",
    "build_entity",
    "build_response",
    "decode_request",
    "encode_request",
    "encode_response",
    "request_type",
    "response_type",
    "to_ms",
)

# api_key int16, api_version int16, correlation_id int32: the start of every header.
_HEADER_FIXED = struct.Struct(">hhi")
_CORRELATION_ID = struct.Struct(">i")
_INT16 = struct.Struct(">h")
# An empty tagged-field section: a zero count.
_NO_TAGGED_FIELDS = b"\x00"


@dataclasses.dataclass(frozen=True, slots=True)
class Request:
    header: RequestHeader
    body: Any  # the kio request dataclass for (api_key, api_version), or a direct
    # decoder's equivalent with the same field names (Produce: produce_request.py)


# ---------------------------------------------------------------- per-API codecs


class _ApiCodec(NamedTuple):
    request_type: type
    response_type: type
    request_shape: _Shape
    read_request: Callable[[Any, int], tuple[Any, int]]
    write_request: Callable[[Any, Any], None]
    write_response: Callable[[Any, Any], None]
    flexible: bool  # request header v2; response header v1 unless ApiVersions
    response_header_flexible: bool
    has_records: bool  # the request carries records fields (Produce): cut them out


@functools.cache
def _api_codec(api_key: int, api_version: int) -> _ApiCodec:
    request_cls = load_request_schema(api_key, api_version)
    response_cls = load_response_schema(api_key, api_version)
    flexible: bool = request_cls.__flexible__
    return _ApiCodec(
        request_type=request_cls,
        response_type=response_cls,
        request_shape=_shape(request_cls),
        read_request=entity_reader(request_cls),
        write_request=entity_writer(request_cls),
        write_response=entity_writer(response_cls),
        flexible=flexible,
        response_header_flexible=flexible and api_key != ApiKey.API_VERSIONS,
        has_records=bool(_records_plan(request_cls)),
    )


def request_type(api_key: int, api_version: int) -> type:
    """The kio request class of (api_key, api_version)."""
    return _api_codec(api_key, api_version).request_type


def response_type(api_key: int, api_version: int) -> type:
    """The kio response class of (api_key, api_version)."""
    return _api_codec(api_key, api_version).response_type


# ---------------------------------------------------------------- decoding


# Direct decoders of hot-path request bodies (issue 19), by API key: (frame, body start,
# api_version) -> body, the same values and refusals as the generic path (their tests
# compare both).
DIRECT_DECODERS: dict[int, Callable[[memoryview, int, int], Any]] = {
    ApiKey.PRODUCE: decode_produce_request,
}


def decode_request(frame: bytes | bytearray | memoryview, *, direct: bool = True) -> Request:
    """Decode one request frame (without its size prefix).

    Raises UnsupportedVersion(header) for a key/version outside apis.SUPPORTED and
    ProtocolError for anything malformed; nothing else. `direct=False` decodes with the
    generic path even where `DIRECT_DECODERS` has a decoder (tests, benchmarks).
    """
    # Read-only: kio's reader refuses writable buffers (a large frame is a pooled
    # bytearray), and records handed out as views of it must not be writable either.
    view = memoryview(frame).cast("B").toreadonly()
    header, pos = _decode_header(view)
    if not is_supported(header.api_key, header.api_version):
        raise UnsupportedVersion(header)
    codec = _api_codec(header.api_key, header.api_version)
    end = len(view)
    if codec.flexible:
        if pos < end and view[pos] == 0:  # no tagged fields: the usual case
            pos += 1
        else:
            pos = _walk_tagged_fields(_NO_TAGS, view, pos, end, [])
    if direct and (decode_body := DIRECT_DECODERS.get(header.api_key)) is not None:
        return Request(header, decode_body(view, pos, header.api_version))
    edits: list[_Edit] = []
    cuts: list[memoryview | None] | None = [] if codec.has_records else None
    # Bytes after the body are ignored, as Kafka's generated readers do:
    # librdkafka 2.x sends 3 extra bytes after a Metadata v12 "all topics" body.
    end = _walk_entity(codec.request_shape, view, pos, end, edits, cuts)
    view = view[:end]
    body_buffer: bytes | memoryview = view
    if edits:
        body_buffer, pos = _splice(view, pos, end, edits), 0
    try:
        body, size = codec.read_request(body_buffer, pos)
    except Exception as error:  # foreign decoder: any failure is the peer's input
        raise ProtocolError(f"undecodable request body ({header}): {error!r}") from error
    if pos + size != len(body_buffer):
        raise ProtocolError(f"request body size mismatch ({header})")
    if cuts:
        remaining = iter(cuts)
        body = _put_records(body, remaining)
        if next(remaining, None) is not None:
            raise AssertionError(f"records cut from {header} outnumber its records fields")
    return Request(header, body)


def _decode_header(view: memoryview) -> tuple[RequestHeader, int]:
    end = len(view)
    if end < _HEADER_FIXED.size:
        raise ProtocolError(f"frame of {end} bytes is shorter than a request header")
    api_key, api_version, correlation_id = _HEADER_FIXED.unpack_from(view, 0)
    length, pos = _read_fixed(_INT16, view, _HEADER_FIXED.size, end)
    client_id = None
    if length >= 0:
        pos = _skip(length, pos, end)
        # Kafka decodes like Java's String(bytes, UTF_8): bad bytes become U+FFFD.
        client_id = str(view[pos - length : pos], "utf-8", "replace")
    elif length != -1:
        raise ProtocolError(f"negative client_id length {length}")
    return RequestHeader(api_key, api_version, correlation_id, client_id), pos


# ---------------------------------------------------------------- encoding


def encode_response(header: RequestHeader, body: Any) -> bytes:
    """Frame, header and body of the response to `header`, ready to send."""
    return b"".join(encode_response_chunks(header, body))


def encode_response_chunks(header: RequestHeader, body: Any) -> list[bytes | memoryview]:
    """The same frame as `encode_response`, as buffers for `writelines`: large
    record blobs (Fetch) are referenced, not copied."""
    codec = _api_codec(header.api_key, header.api_version)
    if type(body) is not codec.response_type:
        raise TypeError(
            f"response body {type(body).__module__}.{type(body).__qualname__} does not "
            f"match api_key={header.api_key} api_version={header.api_version}"
        )
    prefix = _CORRELATION_ID.pack(header.correlation_id)
    if codec.response_header_flexible:
        prefix += _NO_TAGGED_FIELDS
    out = _ChunkWriter()
    out.write(prefix)
    codec.write_response(out, body)
    return out.framed()


def api_versions_fallback(header: RequestHeader) -> bytes:
    """Kafka's answer to an unsupported ApiVersions version: v0, UNSUPPORTED_VERSION."""
    min_version, max_version = SUPPORTED[ApiKey.API_VERSIONS]
    body = ApiVersionsResponseV0(
        error_code=ErrorCode.unsupported_version,
        api_keys=(
            ApiVersionV0(
                api_key=ApiKey.API_VERSIONS, min_version=min_version, max_version=max_version
            ),
        ),
    )
    prefix = _CORRELATION_ID.pack(header.correlation_id)
    return _encode_frame(prefix, entity_writer(ApiVersionsResponseV0), body)


def encode_request(header: RequestHeader, body: Any) -> bytes:
    """Frame a request as a client would (tests, internal clients)."""
    codec = _api_codec(header.api_key, header.api_version)
    if type(body) is not codec.request_type:
        raise TypeError(f"request body {type(body).__qualname__} does not match {header}")
    prefix = _HEADER_FIXED.pack(header.api_key, header.api_version, header.correlation_id)
    if header.client_id is None:
        prefix += _INT16.pack(-1)
    else:
        client_id = header.client_id.encode()
        prefix += _INT16.pack(len(client_id)) + client_id
    if codec.flexible:
        prefix += _NO_TAGGED_FIELDS
    return _encode_frame(prefix, codec.write_request, body)


class _ChunkWriter:
    """A write-only buffer that keeps large writes as references (scatter-gather).

    kio's writers call `write` for every field; small ones are gathered into one
    bytearray, and anything of at least `_CHUNK_BY_REFERENCE_BYTES` (record blobs)
    is kept as its own chunk, so a Fetch response never copies its records.
    """

    __slots__ = ("_chunks", "_size", "_small")

    def __init__(self) -> None:
        self._chunks: list[bytes | memoryview] = []
        self._small = bytearray()
        self._size = 0

    def write(self, data: bytes | bytearray | memoryview) -> int:
        length = len(data)
        self._size += length
        if length < _CHUNK_BY_REFERENCE_BYTES:
            self._small += data
            return length
        if self._small:
            self._chunks.append(bytes(self._small))
            self._small = bytearray()
        self._chunks.append(data if isinstance(data, (bytes, memoryview)) else bytes(data))
        return length

    def framed(self) -> list[bytes | memoryview]:
        """The chunks behind a 4-byte size prefix."""
        if self._small:
            self._chunks.append(bytes(self._small))
            self._small = bytearray()
        return [FRAME_SIZE.pack(self._size), *self._chunks]


# Below this a write is cheaper to copy than to keep as a separate buffer.
_CHUNK_BY_REFERENCE_BYTES = 16 * 1024


def _encode_frame(prefix: bytes, write_body: Callable[[Any, Any], None], body: Any) -> bytes:
    out = io.BytesIO()
    out.write(bytes(FRAME_SIZE.size))  # patched below once the size is known
    out.write(prefix)
    write_body(out, body)
    size = out.tell() - FRAME_SIZE.size
    with out.getbuffer() as frame:
        FRAME_SIZE.pack_into(frame, 0, size)
    return out.getvalue()


# ---------------------------------------------------------------- building


def to_ms(value: datetime.timedelta) -> int:
    """A kio duration field (timeout, max_wait, ...) as whole milliseconds."""
    return value // datetime.timedelta(milliseconds=1)


def build_response(header: RequestHeader, /, **fields: Any) -> Any:
    """The response body of `header`'s API and version, built from plain values."""
    return build_entity(response_type(header.api_key, header.api_version), **fields)


def build_entity(entity_type: type, /, **fields: Any) -> Any:
    """Build a kio entity, converting plain values (see the module docstring)."""
    converters = _converters(entity_type)
    kwargs = {}
    for name, value in fields.items():
        convert = converters.get(name)
        if convert is not None:
            kwargs[name] = convert(value)
        elif name not in _names_in_any_version(entity_type):
            raise TypeError(f"{entity_type.__qualname__} has no field {name!r} in any version")
    return entity_type(**kwargs)


def _identity(value: Any) -> Any:
    return value


def _to_error_code(value: int) -> ErrorCode:
    return value if isinstance(value, ErrorCode) else ErrorCode(value)


def _to_timedelta(value: int | datetime.timedelta) -> datetime.timedelta:
    if isinstance(value, datetime.timedelta):
        return value
    return datetime.timedelta(milliseconds=value)


def _to_datetime(value: int | datetime.datetime | None) -> datetime.datetime | None:
    if value is None or isinstance(value, datetime.datetime):
        return value
    return None if value < 0 else tz_aware_from_i64(value)  # Kafka: -1 = no timestamp


_PRIMITIVE_CONVERTERS: dict[str | None, Callable[[Any], Any]] = {
    "error_code": _to_error_code,
    "timedelta_i32": _to_timedelta,
    "timedelta_i64": _to_timedelta,
    "datetime_i64": _to_datetime,
}


def _build_nested(entity_type: type, value: Any) -> Any:
    if isinstance(value, entity_type):
        return value
    if isinstance(value, Mapping):
        return build_entity(entity_type, **value)
    raise TypeError(f"expected a dict or {entity_type.__qualname__}, got {value!r}")


def _converter(info: _FieldInfo) -> Callable[[Any], Any]:
    if info.entity is not None:
        element = functools.partial(_build_nested, info.entity)
    else:
        element = _PRIMITIVE_CONVERTERS.get(info.kafka_type, _identity)
    if info.is_array:
        return lambda value: None if value is None else tuple(map(element, value))
    if info.nullable and element is not _identity:
        return lambda value: None if value is None else element(value)
    return element


@functools.cache
def _converters(entity_type: type) -> dict[str, Callable[[Any], Any]]:
    return {info.name: _converter(info) for info in _field_infos(entity_type)}


@functools.cache
def _names_in_any_version(entity_type: type) -> frozenset[str]:
    """Field names of the same-named entity across every kio version of its API."""
    module_parts = entity_type.__module__.split(".")  # kio.schema.<api>.v<N>.<kind>
    if len(module_parts) != 5 or module_parts[2] not in schema_name_map:
        return frozenset(field.name for field in dataclasses.fields(entity_type))
    names: set[str] = set()
    for version in schema_name_map[module_parts[2]]:
        module_parts[3] = f"v{version}"
        module = importlib.import_module(".".join(module_parts))
        same_entity = getattr(module, entity_type.__qualname__, None)
        if same_entity is not None:
            names.update(field.name for field in dataclasses.fields(same_entity))
    return frozenset(names)
