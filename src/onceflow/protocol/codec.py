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
4. walks the body with a bounds checker compiled from the kio schema (see
   "Why a walker" below), and
5. hands the body to kio's native reader, requiring that it consume exactly the
   rest of the frame.

Any failure in steps 1-5 is a `ProtocolError`; nothing else escapes for any
input (tests/protocol fuzz this).

Why a walker before kio. kio 0.6.5's native reader trusts compact array lengths:
it reserves memory for the announced count before reading elements, so a
6-byte frame announcing 2^32 elements aborts the whole process (Rust's
allocation failure handler, not a Python exception). It also rejects unknown
tagged fields with KeyError, where Kafka skips them (KIP-482 lets newer clients
add tags to existing versions). The walker follows the same schema as kio, checks
every length and count against the bytes left (Kafka's generated code makes the
same check), and cuts unknown tagged fields out of the copy handed to kio. It
does no per-byte work on opaque fields: a 1 MiB records blob is one length
check. Record data stays opaque kio `Records` bytes in both directions.

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
import types
import typing
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
_INT8 = struct.Struct(">b")
_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")
# An empty tagged-field section: a zero count.
_NO_TAGGED_FIELDS = b"\x00"
# Kafka encodes unsigned varints of int32 values in at most 5 bytes.
_UVARINT_BYTES_MAX = 5


@dataclasses.dataclass(frozen=True, slots=True)
class RequestHeader:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None


@dataclasses.dataclass(frozen=True, slots=True)
class Request:
    header: RequestHeader
    body: Any  # the kio request dataclass for (api_key, api_version)


# ---------------------------------------------------------------- kio schemas


class _FieldInfo(NamedTuple):
    """What the walker and the builder need to know about one kio field."""

    name: str
    kafka_type: str | None  # None for nested entities
    entity: type | None  # nested entity class (alone or as array element)
    is_array: bool
    nullable: bool  # the Python type admits None
    tag: int | None  # tagged-field tag, None for a regular field


def _classify(field: dataclasses.Field[Any]) -> _FieldInfo:
    field_type: Any = field.type
    nullable = False
    if typing.get_origin(field_type) in (types.UnionType, typing.Union):
        members = [arg for arg in typing.get_args(field_type) if arg is not types.NoneType]
        nullable = len(members) < len(typing.get_args(field_type))
        (field_type,) = members
    is_array = typing.get_origin(field_type) is tuple
    if is_array:
        field_type = typing.get_args(field_type)[0]
    entity = field_type if dataclasses.is_dataclass(field_type) else None
    return _FieldInfo(
        name=field.name,
        kafka_type=field.metadata.get("kafka_type"),
        entity=entity,  # type: ignore[arg-type]
        is_array=is_array,
        nullable=nullable,
        tag=field.metadata.get("tag"),
    )


@functools.cache
def _field_infos(entity_type: type) -> tuple[_FieldInfo, ...]:
    return tuple(_classify(field) for field in dataclasses.fields(entity_type))


# ---------------------------------------------------------------- the walker

# Step kinds. A step is (kind, argument, flag).
_FIXED = 0  # argument: byte count
_STRING16 = 1  # int16 length, -1 = null
_BYTES32 = 2  # int32 length, -1 = null
_COMPACT = 3  # unsigned varint length + 1, 0 = null
_ENTITY = 4  # argument: _Shape; flag: preceded by an int8 null marker
_ARRAY = 5  # argument: element step; flag: compact (varint count + 1) or int32 count

_Step = tuple[int, Any, bool]

_FIXED_BYTES = {
    "bool": 1, "int8": 1, "uint8": 1,
    "int16": 2, "uint16": 2, "error_code": 2,
    "int32": 4, "uint32": 4, "timedelta_i32": 4,
    "int64": 8, "uint64": 8, "float64": 8, "timedelta_i64": 8, "datetime_i64": 8,
    "uuid": 16,
}  # fmt: skip


class _Shape(NamedTuple):
    fields: tuple[_Step, ...]
    tags: dict[int, _Step]
    flexible: bool


def _primitive_step(kafka_type: str | None, flexible: bool) -> _Step:
    if kafka_type in _FIXED_BYTES:
        return (_FIXED, _FIXED_BYTES[kafka_type], False)
    if kafka_type == "string":
        return (_COMPACT, None, False) if flexible else (_STRING16, None, False)
    if kafka_type in ("bytes", "records"):
        return (_COMPACT, None, False) if flexible else (_BYTES32, None, False)
    raise RuntimeError(f"kio kafka_type {kafka_type!r} is unknown to the bounds walker")


@functools.cache
def _shape(entity_type: type) -> _Shape:
    flexible: bool = entity_type.__flexible__  # type: ignore[attr-defined]
    fields: list[_Step] = []
    tags: dict[int, _Step] = {}
    for info in _field_infos(entity_type):
        if info.entity is not None:
            # kio writes a null marker only for a nullable, untagged, single struct.
            marker = info.nullable and not info.is_array and info.tag is None
            step: _Step = (_ENTITY, _shape(info.entity), marker)
        else:
            step = _primitive_step(info.kafka_type, flexible)
        if info.is_array:
            step = (_ARRAY, step, flexible)
        if info.tag is None:
            fields.append(step)
        else:
            tags[info.tag] = step
    return _Shape(_merge_fixed(fields), tags, flexible)


def _merge_fixed(steps: list[_Step]) -> tuple[_Step, ...]:
    """Fuse runs of fixed-size fields into one step: the walker's hot loop shrinks."""
    merged: list[_Step] = []
    for step in steps:
        if step[0] == _FIXED and merged and merged[-1][0] == _FIXED:
            merged[-1] = (_FIXED, merged[-1][1] + step[1], False)
        else:
            merged.append(step)
    return tuple(merged)


_NO_TAGS = _Shape((), {}, True)

# An edit replaces buf[start:end] with new bytes: (start, end, replacement).
_Edit = tuple[int, int, bytes]


def _truncated(pos: int) -> ProtocolError:
    return ProtocolError(f"request truncated at byte {pos}")


def _read_uvarint(buf: memoryview, pos: int, end: int) -> tuple[int, int]:
    value = 0
    for shift in range(0, 7 * _UVARINT_BYTES_MAX, 7):
        if pos >= end:
            raise _truncated(pos)
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
    raise ProtocolError(f"unsigned varint longer than {_UVARINT_BYTES_MAX} bytes at byte {pos}")


def _read_fixed(codec: struct.Struct, buf: memoryview, pos: int, end: int) -> tuple[int, int]:
    if pos + codec.size > end:
        raise _truncated(pos)
    return codec.unpack_from(buf, pos)[0], pos + codec.size


def _skip(length: int, pos: int, end: int) -> int:
    if length < -1:
        raise ProtocolError(f"negative length {length} at byte {pos}")
    pos += max(length, 0)
    if pos > end:
        raise _truncated(end)
    return pos


def _walk(step: _Step, buf: memoryview, pos: int, end: int, edits: list[_Edit]) -> int:
    kind, argument, flag = step
    if kind == _FIXED:
        if pos + argument > end:
            raise _truncated(pos)
        return pos + argument
    if kind == _STRING16:
        length, pos = _read_fixed(_INT16, buf, pos, end)
        return _skip(length, pos, end)
    if kind == _BYTES32:
        length, pos = _read_fixed(_INT32, buf, pos, end)
        return _skip(length, pos, end)
    if kind == _COMPACT:
        length, pos = _read_uvarint(buf, pos, end)
        return _skip(length - 1, pos, end)
    if kind == _ENTITY:
        if flag:
            marker, pos = _read_fixed(_INT8, buf, pos, end)
            if marker < 0:
                return pos
        return _walk_entity(argument, buf, pos, end, edits)
    return _walk_array(argument, flag, buf, pos, end, edits)


def _walk_array(
    element: _Step, compact: bool, buf: memoryview, pos: int, end: int, edits: list[_Edit]
) -> int:
    if compact:
        count, pos = _read_uvarint(buf, pos, end)
        count -= 1
    else:
        count, pos = _read_fixed(_INT32, buf, pos, end)
    if count < -1 or count > end - pos:
        # Kafka's rule too: a count above the bytes left cannot be honest, and
        # kio would reserve memory for it before noticing.
        raise ProtocolError(f"array count {count} with {end - pos} bytes left at byte {pos}")
    if count <= 0:  # -1 is a null array
        return pos
    if element[0] == _FIXED:
        return _skip(count * element[1], pos, end)
    if element[0] == _ENTITY:  # array elements never carry a null marker
        for _ in range(count):
            pos = _walk_entity(element[1], buf, pos, end, edits)
        return pos
    for _ in range(count):
        pos = _walk(element, buf, pos, end, edits)
    return pos


def _walk_entity(shape: _Shape, buf: memoryview, pos: int, end: int, edits: list[_Edit]) -> int:
    for step in shape.fields:
        if step[0] == _FIXED:  # inlined: most fields are fixed-size
            pos += step[1]
            if pos > end:
                raise _truncated(end)
        else:
            pos = _walk(step, buf, pos, end, edits)
    if not shape.flexible:
        return pos
    if pos < end and buf[pos] == 0:  # no tagged fields, the usual case
        return pos + 1
    return _walk_tagged_fields(shape, buf, pos, end, edits)


def _walk_tagged_fields(
    shape: _Shape, buf: memoryview, pos: int, end: int, edits: list[_Edit]
) -> int:
    """Check a tagged-field section; schedule an edit dropping unknown tags."""
    section_start = pos
    count, pos = _read_uvarint(buf, pos, end)
    kept: list[bytes] = []
    rewrite = False
    for _ in range(count):
        field_start = pos
        tag, pos = _read_uvarint(buf, pos, end)
        size, pos = _read_uvarint(buf, pos, end)
        value_end = _skip(size, pos, end)
        step = shape.tags.get(tag)
        if step is None:
            rewrite = True  # unknown tag: Kafka ignores it, kio would refuse it
        else:
            inner: list[_Edit] = []
            if _walk(step, buf, pos, value_end, inner) != value_end:
                raise ProtocolError(f"tagged field {tag} size mismatch at byte {pos}")
            if inner:
                value = _splice(buf, pos, value_end, inner)
                kept.append(_encode_uvarint(tag) + _encode_uvarint(len(value)) + value)
                rewrite = True
            else:
                kept.append(bytes(buf[field_start:value_end]))
        pos = value_end
    if rewrite:
        edits.append((section_start, pos, _encode_uvarint(len(kept)) + b"".join(kept)))
    return pos


def _splice(buf: memoryview, start: int, end: int, edits: list[_Edit]) -> bytes:
    parts: list[bytes | memoryview] = []
    cursor = start
    for edit_start, edit_end, replacement in edits:
        parts += (buf[cursor:edit_start], replacement)
        cursor = edit_end
    parts.append(buf[cursor:end])
    return b"".join(parts)


def _encode_uvarint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


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
    )


def request_type(api_key: int, api_version: int) -> type:
    """The kio request class of (api_key, api_version)."""
    return _api_codec(api_key, api_version).request_type


def response_type(api_key: int, api_version: int) -> type:
    """The kio response class of (api_key, api_version)."""
    return _api_codec(api_key, api_version).response_type


# ---------------------------------------------------------------- decoding


def decode_request(frame: bytes | bytearray | memoryview) -> Request:
    """Decode one request frame (without its size prefix).

    Raises UnsupportedVersion(header) for a key/version outside apis.SUPPORTED and
    ProtocolError for anything malformed; nothing else.
    """
    view = memoryview(frame).cast("B")
    header, pos = _decode_header(view)
    if not is_supported(header.api_key, header.api_version):
        raise UnsupportedVersion(header)
    codec = _api_codec(header.api_key, header.api_version)
    end = len(view)
    if codec.flexible:
        pos = _walk_tagged_fields(_NO_TAGS, view, pos, end, [])
    edits: list[_Edit] = []
    # Bytes after the body are ignored, as Kafka's generated readers do:
    # librdkafka 2.x sends 3 extra bytes after a Metadata v12 "all topics" body.
    end = _walk_entity(codec.request_shape, view, pos, end, edits)
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

    __slots__ = ("_chunks", "_small", "_size")

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
