"""Fuzz harness: request frames, as the broker's connection turns bytes into requests.

What runs. The connection (broker/connection.py) pumps socket bytes into a `FrameReader`
(`get_buffer` / `buffer_updated` / `next_frame`) and hands each frame to `pipeline.decode`,
which is `codec.decode_request` (header, supported-version check, the bounds walker of
walker.py, then kio's reader) plus the ApiVersions fallback answer. The first input byte picks
the mode:

- even: the rest is one frame, decoded with `pipeline.decode`;
- odd: the rest is a byte stream, cut into reads of `1 + data[1] % 64` bytes and pumped
  through a `FrameReader` exactly as the connection does; every frame it hands out is decoded.

Protocol errors (the broker closes the connection, or answers the ApiVersions fallback):
`ProtocolError` and `UnsupportedVersion`. Everything else escaping is a crash. Checks beyond
"no crash":

- stream mode: the frames the reader hands out are exactly those of a plain reference
  splitter over the same bytes, and it raises ProtocolError only where the reference finds a
  bad size (after handing out every complete frame before it);
- a decoded request re-encodes (`encode_request`) and decodes again to an equal request
  (or, with a NaN float64, to one that encodes to the same bytes): the walker and kio agree
  on every accepted byte;
- a request of an API with a direct decoder (`codec.DIRECT_DECODERS`: Produce) that the
  direct decoder accepts, the generic path accepts too, with an equal body; the generic
  body is the one re-encoded (encode_request takes kio's classes only).
"""

from __future__ import annotations

import dataclasses
import struct
import typing
import uuid
from collections.abc import Iterator

from onceflow.broker.pipeline import decode
from onceflow.protocol.apis import SUPPORTED, ApiKey
from onceflow.protocol.codec import (
    DIRECT_DECODERS,
    Request,
    RequestHeader,
    build_entity,
    decode_request,
    encode_request,
    request_type,
)
from onceflow.protocol.errors import ProtocolError, UnsupportedVersion
from onceflow.protocol.framing import BufferPool, FrameReader, encode_frame
from onceflow.protocol.records import SimpleRecord, build_batch
from onceflow.protocol.walker import (
    _ARRAY,
    _ARRAY_COMPACT,
    _BYTES32,
    _COMPACT,
    _ENTITY,
    _FIXED,
    _STRING16,
    _Shape,
    _shape,
)

PROTOCOL_ERRORS = (ProtocolError, UnsupportedVersion)
MAX_LEN = 4096
# Small enough that fuzzed sizes cross it; the broker's default is Kafka's 100 MiB.
FRAME_BYTES_MAX = 32 * 1024
_SIZE = struct.Struct(">i")


def test_one_input(data: bytes) -> None:
    if not data:
        return
    if data[0] & 1:
        _stream(data[2:], 1 + (data[1] % 64 if len(data) > 1 else 0))
    else:
        _decode(data[1:])


def _decode(frame: bytes | memoryview) -> None:
    try:
        request = decode(frame)
    except PROTOCOL_ERRORS:
        return
    if isinstance(request, Request):
        if request.header.api_key in DIRECT_DECODERS:
            generic = decode_request(frame, direct=False)
            assert generic.body == request.body, f"direct and generic differ: {request.header}"
            request = generic
        _check_round_trip(request)
    else:
        assert isinstance(request, bytes) and request, "the ApiVersions fallback is a frame"


def _check_round_trip(request: Request) -> None:
    encoded = encode_request(request.header, request.body)
    (size,) = _SIZE.unpack_from(encoded)
    assert size == len(encoded) - _SIZE.size, "encode_request framed a wrong size"
    again = decode_request(encoded[_SIZE.size:], direct=False)
    # Equal bodies; or, where a float64 is NaN (never equal to itself), the same bytes again.
    assert again.body == request.body or encode_request(again.header, again.body) == encoded, (
        f"re-decoded body differs: {request.header}")
    assert again.header == request.header, f"re-decoded header differs: {request.header}"


def _stream(data: bytes, read_bytes: int) -> None:
    reader = FrameReader(FRAME_BYTES_MAX, BufferPool(4 * FRAME_BYTES_MAX))
    expected, error_at_end = _reference_frames(data)
    got: list[bytes] = []
    view = memoryview(data)
    try:
        while view:
            target = reader.get_buffer()
            assert len(target) > 0, "get_buffer handed out an empty buffer"
            count = min(len(target), len(view), read_bytes)
            target[:count] = view[:count]
            target.release()
            view = view[count:]
            reader.buffer_updated(count)
            while (frame := reader.next_frame()) is not None:
                got.append(bytes(frame))
                _decode(frame)
                reader._pool.give(frame)  # as the connection does once a request is done
    except ProtocolError:
        assert error_at_end, "FrameReader refused a stream whose sizes are all valid"
        assert got == expected, "FrameReader lost or changed frames before a bad size"
        return
    assert got == expected, "FrameReader frames differ from the reference split"
    assert not error_at_end, "a bad frame size went unreported"


def _reference_frames(data: bytes) -> tuple[list[bytes], bool]:
    """Complete frames in `data` up to the first bad size; whether a bad size was found."""
    frames, pos = [], 0
    while pos + _SIZE.size <= len(data):
        (size,) = _SIZE.unpack_from(data, pos)
        if size <= 0 or size > FRAME_BYTES_MAX:
            return frames, True
        if pos + _SIZE.size + size > len(data):
            break
        frames.append(data[pos + _SIZE.size: pos + _SIZE.size + size])
        pos += _SIZE.size + size
    return frames, False


# ------------------------------------------------------------------------------ seeds


def seeds() -> list[bytes]:
    """Mode 0: one frame per advertised (api, version), a few Produce frames with real record
    batches and the frames captured from real clients; mode 1: streams of several of them."""
    frames = [*_minimal_frames(), *_produce_frames(), *_golden_frames()]
    found = [b"\x00" + frame for frame in frames]
    for start in range(0, len(frames), 7):
        stream = b"".join(encode_frame(frame) for frame in frames[start:start + 3])
        found.append(b"\x01" + bytes([start % 64]) + stream)
    return [seed for seed in found if len(seed) <= MAX_LEN]


def _minimal_frames() -> Iterator[bytes]:
    for api_key, (low, high) in sorted(SUPPORTED.items()):
        for version in range(low, high + 1):
            prefix = struct.pack(">hhih", api_key, version, 7, 4) + b"fuzz"
            shape = _shape(request_type(api_key, version))
            frame = prefix + (b"\x00" if shape.flexible else b"") + _minimal_body(shape)
            try:
                decode_request(frame)
            except PROTOCOL_ERRORS:
                continue  # e.g. a field kio refuses at its zero value: no seed for it
            yield frame


def _minimal_body(shape: _Shape) -> bytes:
    """Bytes the schema accepts: zeros, empty strings, one element per array."""
    return b"".join(_minimal_step(step) for step in shape.fields) + (
        b"\x00" if shape.flexible else b"")


def _minimal_step(step: tuple) -> bytes:
    kind, argument, flag = step
    if kind == _FIXED:
        return bytes(argument)
    if kind == _STRING16:
        return b"\x00\x00"
    if kind == _BYTES32:
        return b"\x00\x00\x00\x00"
    if kind == _COMPACT:
        return b"\x01"
    if kind == _ENTITY:
        return (b"\x01" if flag else b"") + _minimal_body(argument)
    assert kind == _ARRAY
    element = _minimal_body(argument[1]) if argument[0] == _ENTITY else _minimal_step(argument)
    return (b"\x02" if flag & _ARRAY_COMPACT else b"\x00\x00\x00\x01") + element


def _produce_frames() -> Iterator[bytes]:
    batch = build_batch([SimpleRecord(b"key", b"value"), SimpleRecord(None, b"v2")],
                        producer_id=1000, producer_epoch=0, base_sequence=0)
    low, high = SUPPORTED[ApiKey.PRODUCE]
    for version in range(low, high + 1):
        body_type = request_type(ApiKey.PRODUCE, version)
        header = RequestHeader(ApiKey.PRODUCE, version, 3, "fuzz")
        body = _produce_body(body_type, batch)
        yield encode_request(header, body)[_SIZE.size:]


# A topic id for the Produce versions (v13+) that name topics by id instead of by name.
SEED_TOPIC_ID = uuid.UUID(int=0x0F0E0D0C0B0A09080706050403020100)


def _produce_body(body_type: type, batch: bytes) -> object:
    topic_type = _element_type(body_type, "topic_data")
    names = {f.name for f in dataclasses.fields(topic_type)}
    topic = {"topic_id": SEED_TOPIC_ID} if "topic_id" in names else {"name": "t"}
    return build_entity(body_type, transactional_id=None, acks=-1, timeout=30_000,
                        topic_data=[{**topic, "partition_data": [
                            {"index": 0, "records": batch}]}])


def _element_type(entity_type: type, field: str) -> type:
    """The element class of a tuple-typed field of a kio entity (`tuple[X, ...]` -> X)."""
    hints = typing.get_type_hints(entity_type)
    return typing.get_args(hints[field])[0]


def _golden_frames() -> list[bytes]:
    try:
        from tests.protocol.golden import GOLDEN_FRAMES
    except ImportError:  # run from outside the repository: the generated seeds suffice
        return []
    return list(GOLDEN_FRAMES.values())
