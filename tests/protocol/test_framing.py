"""FrameReader: sizes checked before bodies are buffered, any chunking works."""

from __future__ import annotations

import itertools
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from onceflow.protocol.errors import ProtocolError
from onceflow.protocol.framing import FRAME_BYTES_MAX_DEFAULT, FrameReader, encode_frame

CAP_BYTES = 1024


def drain(reader: FrameReader) -> list[bytes]:
    frames = []
    while (frame := reader.next_frame()) is not None:
        frames.append(frame)
    return frames


def test_encode_frame_prefixes_big_endian_size() -> None:
    assert encode_frame(b"abc") == b"\x00\x00\x00\x03abc"


def test_byte_at_a_time() -> None:
    payloads = [b"x", b"hello", bytes(range(256)) * 3]
    stream = b"".join(encode_frame(payload) for payload in payloads)
    reader = FrameReader(CAP_BYTES)
    received = []
    for index in range(len(stream)):
        reader.receive_data(stream[index : index + 1])
        received += drain(reader)
    assert received == payloads
    assert reader.buffered_bytes == 0


def test_many_frames_in_one_chunk() -> None:
    payloads = [bytes([n]) * n for n in range(1, 200)]
    reader = FrameReader(CAP_BYTES)
    reader.receive_data(b"".join(encode_frame(payload) for payload in payloads))
    assert drain(reader) == payloads


def test_partial_frame_waits() -> None:
    reader = FrameReader(CAP_BYTES)
    frame = encode_frame(b"0123456789")
    reader.receive_data(frame[:7])
    assert reader.next_frame() is None
    reader.receive_data(frame[7:])
    assert reader.next_frame() == b"0123456789"
    assert reader.next_frame() is None


@pytest.mark.parametrize("size", [-1, -(2**31), 0, CAP_BYTES + 1, 2**31 - 1])
def test_bad_size_refused_from_the_prefix_alone(size: int) -> None:
    reader = FrameReader(CAP_BYTES)
    with pytest.raises(ProtocolError):
        reader.receive_data(struct.pack(">i", size))  # no body byte sent yet
    with pytest.raises(ProtocolError):
        reader.next_frame()


def test_bad_size_after_a_good_frame() -> None:
    reader = FrameReader(CAP_BYTES)
    reader.receive_data(encode_frame(b"ok"))
    reader.receive_data(struct.pack(">i", CAP_BYTES + 1))
    assert reader.next_frame() == b"ok"
    with pytest.raises(ProtocolError):
        reader.next_frame()


def test_frame_at_the_cap_is_accepted() -> None:
    reader = FrameReader(CAP_BYTES)
    reader.receive_data(encode_frame(bytes(CAP_BYTES)))
    assert reader.next_frame() == bytes(CAP_BYTES)


def test_large_stream_in_small_chunks_stays_bounded() -> None:
    payload = bytes(range(256)) * 256  # 64 KiB
    stream = encode_frame(payload) * 40
    reader = FrameReader(FRAME_BYTES_MAX_DEFAULT)
    received = 0
    largest_buffer = 0
    for start in range(0, len(stream), 4096):
        reader.receive_data(stream[start : start + 4096])
        largest_buffer = max(largest_buffer, len(reader._buffer))
        for frame in drain(reader):
            assert frame == payload
            received += 1
    assert received == 40
    # Compaction keeps the buffer within about two frames plus a chunk.
    assert largest_buffer <= 2 * len(payload) + 3 * 4096


@settings(max_examples=200, deadline=None)
@given(
    payloads=st.lists(st.binary(min_size=1, max_size=300), max_size=8),
    cuts=st.lists(st.integers(min_value=0, max_value=3000), max_size=12),
)
def test_any_chunking_yields_the_same_frames(payloads: list[bytes], cuts: list[int]) -> None:
    stream = b"".join(encode_frame(payload) for payload in payloads)
    bounds = sorted({0, len(stream), *(cut % (len(stream) + 1) for cut in cuts)})
    reader = FrameReader(CAP_BYTES)
    received = []
    for start, end in itertools.pairwise(bounds):
        reader.receive_data(stream[start:end])
        received += drain(reader)
    assert received == payloads
