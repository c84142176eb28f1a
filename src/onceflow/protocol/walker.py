"""kio schemas compiled into bounds-checking walks over request bytes, sans I/O.

Used by codec.py before it hands a request body to kio's native reader (the generic
path; Produce bodies are read by produce_request.py instead, see codec.py).

Why a walker before kio. kio 0.6.5's native reader trusts compact array lengths:
it reserves memory for the announced count before reading elements, so a
6-byte frame announcing 2^32 elements aborts the whole process (Rust's
allocation failure handler, not a Python exception). It also rejects unknown
tagged fields with KeyError, where Kafka skips them (KIP-482 lets newer clients
add tags to existing versions). The walker follows the same schema as kio, checks
every length and count against the bytes left (Kafka's generated code makes the
same check), and cuts unknown tagged fields out of the copy handed to kio. It
does no per-byte work on opaque fields: a 1 MiB records blob is one length
check. Record data stays opaque in both directions.

Records are not copied. A Produce request is nearly all records, and kio would
copy each records field into a new bytes object. The walker knows from the
schema which fields are records (nullable, untagged: every request records field
Kafka defines), so for requests that have any (`_records_plan`) it replaces each
one with a null in the copy handed to kio (a copy of the small rest of the body)
and collects memoryviews of the originals, in wire order; `_put_records` then
sets them into the decoded entity, walking the same schema in the same order. A
decoded Produce body therefore holds memoryviews of the frame (compare equal to
the bytes kio would give); the frame must outlive the request.
"""

from __future__ import annotations

import dataclasses
import functools
import struct
import types
import typing
from collections.abc import Iterator
from typing import Any, NamedTuple

from onceflow.protocol.errors import ProtocolError

_INT8 = struct.Struct(">b")
_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")
# Kafka encodes unsigned varints of int32 values in at most 5 bytes.
_UVARINT_BYTES_MAX = 5


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


def _is_cuttable_records(info: _FieldInfo) -> bool:
    """A records field that the walker may cut out: nullable (kio then reads the null
    left in its place), single, not tagged (tagged sections are walked apart)."""
    return (info.kafka_type == "records" and info.nullable and not info.is_array
            and info.tag is None)


# How to put cut records back into a decoded entity: per field, in wire order, None
# for a records field, else the nested entity type (a field holding records inside).
_RecordsPlan = tuple[tuple[str, type | None, bool], ...]


@functools.cache
def _records_plan(entity_type: type) -> _RecordsPlan:
    plan = []
    for info in _field_infos(entity_type):
        if _is_cuttable_records(info):
            plan.append((info.name, None, False))
        elif info.entity is not None and info.tag is None and _records_plan(info.entity):
            plan.append((info.name, info.entity, info.is_array))
    return tuple(plan)


def _put_records(entity: Any, cuts: Iterator[memoryview | None]) -> Any:
    """`entity` with its records fields set from `cuts`, in the walker's (wire) order."""
    changes = {}
    for name, nested, is_array in _records_plan(type(entity)):
        value = getattr(entity, name)
        if nested is None:
            changes[name] = next(cuts)
        elif value is None:
            continue  # a null struct or array: the walker found no records in it
        elif is_array:
            changes[name] = tuple([_put_records(element, cuts) for element in value])
        else:
            changes[name] = _put_records(value, cuts)
    return dataclasses.replace(entity, **changes)


# ---------------------------------------------------------------- the walker

# Step kinds. A step is (kind, argument, flag).
_FIXED = 0  # argument: byte count
_STRING16 = 1  # int16 length, -1 = null
_BYTES32 = 2  # int32 length, -1 = null
_COMPACT = 3  # unsigned varint length + 1, 0 = null
_ENTITY = 4  # argument: _Shape; flag: preceded by an int8 null marker
_ARRAY = 5  # argument: element step; flag: _ARRAY_COMPACT | _ARRAY_NULLABLE bits
# A _STRING16, _BYTES32 or _COMPACT step's flag: whether null is allowed (the field's
# nullableVersions hold this version). Kafka's generated readers refuse a null in a field
# that is not ("non-nullable field ... was serialized as null"), and so does the walker:
# kio would read None into a field its handler takes for a value.
_ARRAY_COMPACT = 1  # varint count + 1, else int32 count
_ARRAY_NULLABLE = 2  # a count of -1 (null) is allowed
# The argument of a _BYTES32 or _COMPACT step that is a nullable records field: the
# walker may cut it out of the body (see "Records are not copied" above).
_CUTTABLE_RECORDS = True

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


def _primitive_step(info: _FieldInfo, flexible: bool) -> _Step:
    kafka_type = info.kafka_type
    if kafka_type in _FIXED_BYTES:
        return (_FIXED, _FIXED_BYTES[kafka_type], False)
    nullable = info.nullable and not info.is_array  # an array's own nullability is its step's
    if kafka_type == "string":
        return (_COMPACT, None, nullable) if flexible else (_STRING16, None, nullable)
    if kafka_type in ("bytes", "records"):
        cuttable = _CUTTABLE_RECORDS if _is_cuttable_records(info) else None
        return (_COMPACT, cuttable, nullable) if flexible else (_BYTES32, cuttable, nullable)
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
            step = _primitive_step(info, flexible)
        if info.is_array:
            step = (_ARRAY, step, (_ARRAY_COMPACT if flexible else 0)
                    | (_ARRAY_NULLABLE if info.nullable else 0))
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
# A null records field, as kio reads it: int32 length -1, or compact length 0.
_NULL_BYTES32 = b"\xff\xff\xff\xff"
_NULL_COMPACT = b"\x00"


def _truncated(pos: int) -> ProtocolError:
    return ProtocolError(f"request truncated at byte {pos}")


def _null_refused(pos: int) -> ProtocolError:
    return ProtocolError(f"null in a non-nullable field ending at byte {pos}")


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


def _walk(
    step: _Step, buf: memoryview, pos: int, end: int, edits: list[_Edit],
    cuts: list[memoryview | None] | None = None,
) -> int:
    kind, argument, flag = step
    if kind == _FIXED:
        if pos + argument > end:
            raise _truncated(pos)
        return pos + argument
    if kind == _STRING16:
        length, pos = _read_fixed(_INT16, buf, pos, end)
        if length == -1 and not flag:
            raise _null_refused(pos)
        return _skip(length, pos, end)
    if kind == _BYTES32:
        field_start = pos
        length, pos = _read_fixed(_INT32, buf, pos, end)
        if length == -1 and not flag:
            raise _null_refused(pos)
        field_end = _skip(length, pos, end)
        if argument is _CUTTABLE_RECORDS and cuts is not None:
            _cut_records(buf, field_start, pos, field_end, length >= 0, _NULL_BYTES32, edits, cuts)
        return field_end
    if kind == _COMPACT:
        field_start = pos
        length, pos = _read_uvarint(buf, pos, end)
        if length == 0 and not flag:
            raise _null_refused(pos)
        field_end = _skip(length - 1, pos, end)
        if argument is _CUTTABLE_RECORDS and cuts is not None:
            _cut_records(buf, field_start, pos, field_end, length > 0, _NULL_COMPACT, edits, cuts)
        return field_end
    if kind == _ENTITY:
        if flag:
            marker, pos = _read_fixed(_INT8, buf, pos, end)
            if marker < 0:
                return pos
        return _walk_entity(argument, buf, pos, end, edits, cuts)
    return _walk_array(argument, flag, buf, pos, end, edits, cuts)


def _cut_records(
    buf: memoryview, field_start: int, data_start: int, field_end: int, present: bool,
    null: bytes, edits: list[_Edit], cuts: list[memoryview | None],
) -> None:
    """Hand a records field to the caller as a view and replace it with null for kio."""
    if not present:
        cuts.append(None)
        return
    cuts.append(buf[data_start:field_end])
    edits.append((field_start, field_end, null))


def _walk_array(
    element: _Step, flags: int, buf: memoryview, pos: int, end: int, edits: list[_Edit],
    cuts: list[memoryview | None] | None = None,
) -> int:
    if flags & _ARRAY_COMPACT:
        count, pos = _read_uvarint(buf, pos, end)
        count -= 1
    else:
        count, pos = _read_fixed(_INT32, buf, pos, end)
    if count == -1 and not flags & _ARRAY_NULLABLE:
        raise _null_refused(pos)
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
            pos = _walk_entity(element[1], buf, pos, end, edits, cuts)
        return pos
    for _ in range(count):
        pos = _walk(element, buf, pos, end, edits, cuts)
    return pos


def _walk_entity(
    shape: _Shape, buf: memoryview, pos: int, end: int, edits: list[_Edit],
    cuts: list[memoryview | None] | None = None,
) -> int:
    """Check one entity's bytes; returns where it ends. With `cuts`, records fields
    are cut out (see `_cut_records`) in wire order; tagged fields never are."""
    for step in shape.fields:
        if step[0] == _FIXED:  # inlined: most fields are fixed-size
            pos += step[1]
            if pos > end:
                raise _truncated(end)
        else:
            pos = _walk(step, buf, pos, end, edits, cuts)
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
