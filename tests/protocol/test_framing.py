"""FrameReader: sizes checked before bodies are buffered, any chunking works."""

from __future__ import annotations

import itertools
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from onceflow.protocol.errors import ProtocolError
from onceflow.protocol.framing import (
    DIRECT_FRAME_BYTES_MIN,
    FRAME_BYTES_MAX_DEFAULT,
    HEAD_BYTES,
    HEAD_SMALL_BYTES,
    BufferPool,
    FrameReader,
    encode_frame,
)

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
        largest_buffer = max(largest_buffer, reader.held_bytes)
        for frame in drain(reader):
            assert frame == payload
            received += 1
    assert received == 40
    # The fixed head plus the one frame under way (its buffer rounded up to a power
    # of two), however many frames went through.
    assert largest_buffer <= HEAD_BYTES + 2 * len(payload)


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


# ------------------------------------------------- zero-copy reads (BufferedProtocol)


def feed_reads(reader: FrameReader, stream: bytes, read_sizes: list[int]) -> list[bytes]:
    """Feed `stream` as a socket would: each read fills at most what get_buffer offers."""
    received: list[bytes] = []
    position, turn = 0, 0
    while position < len(stream):
        target = reader.get_buffer()
        assert len(target) > 0
        wanted = read_sizes[turn % len(read_sizes)] if read_sizes else len(target)
        count = min(len(target), max(wanted, 1), len(stream) - position)
        target[:count] = stream[position : position + count]
        reader.buffer_updated(count)
        position, turn = position + count, turn + 1
        received += [bytes(frame) for frame in drain(reader)]
    return received


@settings(max_examples=200, deadline=None)
@given(
    payloads=st.lists(
        st.binary(min_size=1, max_size=64)
        | st.integers(DIRECT_FRAME_BYTES_MIN - 8, 3 * DIRECT_FRAME_BYTES_MIN).map(
            lambda n: bytes([n % 251]) * n
        ),
        max_size=8,
    ),
    read_sizes=st.lists(st.integers(min_value=1, max_value=2 * HEAD_BYTES), max_size=6),
)
def test_buffered_reads_yield_the_same_frames(payloads: list[bytes], read_sizes: list[int]) -> None:
    stream = b"".join(encode_frame(payload) for payload in payloads)
    reader = FrameReader(FRAME_BYTES_MAX_DEFAULT, BufferPool())
    assert feed_reads(reader, stream, read_sizes) == payloads
    assert reader.buffered_bytes == 0


def test_large_frame_body_is_read_in_place_and_never_past_its_end() -> None:
    payload = bytes(range(256)) * 1024  # 256 KiB: larger than the head
    stream = encode_frame(payload) + encode_frame(b"next")
    reader = FrameReader(FRAME_BYTES_MAX_DEFAULT)
    first = reader.get_buffer()
    first[:1000] = stream[:1000]
    reader.buffer_updated(1000)
    rest = reader.get_buffer()
    # The rest of the frame exactly: the socket writes it to its final place.
    assert len(rest) == len(payload) + 4 - 1000
    rest[:] = stream[1000 : len(payload) + 4]
    reader.buffer_updated(len(rest))
    frame = reader.next_frame()
    assert isinstance(frame, memoryview) and frame == payload
    tail = reader.get_buffer()
    tail[:8] = stream[len(payload) + 4 :]
    reader.buffer_updated(8)
    assert reader.next_frame() == b"next"


def test_pool_reuses_a_buffer_only_once_no_view_of_it_is_left() -> None:
    pool = BufferPool()
    payload = b"p" * (DIRECT_FRAME_BYTES_MIN * 2)
    reader = FrameReader(FRAME_BYTES_MAX_DEFAULT, pool)

    def large_frame() -> memoryview:
        stream = encode_frame(payload)
        feed_reads(reader, stream[:10], [])  # incomplete: a pooled buffer is taken
        target = reader.get_buffer()
        target[:] = stream[10:]
        reader.buffer_updated(len(target))
        frame = reader.next_frame()
        assert isinstance(frame, memoryview)
        return frame

    first = large_frame()
    kept = first[100:200]  # e.g. a decoded records field still referenced
    first_buffer = first.obj
    pool.give(first)
    assert pool.idle_bytes == 0  # not reusable: `kept` views it
    second = large_frame()
    assert second.obj is not first_buffer
    assert kept == payload[100:200]
    second_buffer = second.obj
    pool.give(second)
    assert pool.idle_bytes == len(second_buffer)
    third = large_frame()
    assert third.obj is second_buffer  # recycled
    assert third == payload


def test_pool_keeps_at_most_its_byte_budget() -> None:
    pool = BufferPool(pool_bytes_max=100_000)
    buffers = [pool.take(40_000) for _ in range(3)]  # 64 KiB each
    for buffer in buffers:
        pool.give(memoryview(buffer))
    assert pool.idle_bytes == 65_536


def test_pool_ignores_bytes_and_foreign_buffers() -> None:
    pool = BufferPool()
    pool.give(b"small frame")
    pool.give(memoryview(bytearray(1000)))  # not a power-of-two class
    assert pool.idle_bytes == 0


def test_bytes_after_a_bad_size_are_dropped_not_buffered() -> None:
    reader = FrameReader(CAP_BYTES)
    reader.receive_data(encode_frame(b"ok") + struct.pack(">i", -5))
    reader.receive_data(bytes(3 * HEAD_BYTES))  # more than the head holds
    assert reader.next_frame() == b"ok"
    with pytest.raises(ProtocolError):
        reader.next_frame()
    with pytest.raises(ProtocolError):
        reader.receive_data(b"more")


def test_an_idle_reader_holds_only_the_small_head() -> None:
    """A quiet connection's memory (issue 19): after a burst that needed the large head,
    the first short read sends the large head back to the pool for the next burst."""
    pool = BufferPool()
    reader = FrameReader(FRAME_BYTES_MAX_DEFAULT, pool)
    assert reader.held_bytes == HEAD_SMALL_BYTES
    burst = [bytes([n]) * 1000 for n in range(100)]  # many small frames, one large read
    reader.receive_data(b"".join(encode_frame(payload) for payload in burst))
    assert drain(reader) == burst
    reader.receive_data(encode_frame(b"quiet"))
    assert drain(reader) == [b"quiet"]
    reader.get_buffer()  # the socket's next read: the small head is enough
    assert reader.held_bytes == HEAD_SMALL_BYTES
    assert pool.idle_bytes == HEAD_BYTES
    reader.receive_data(b"".join(encode_frame(payload) for payload in burst))
    assert drain(reader) == burst
    assert pool.idle_bytes == 0  # the same large head, reused


def test_a_small_frame_larger_than_the_small_head_is_read_whole() -> None:
    payload = bytes(range(256)) * ((DIRECT_FRAME_BYTES_MIN - 100) // 256)
    assert HEAD_SMALL_BYTES < len(payload) < DIRECT_FRAME_BYTES_MIN
    reader = FrameReader(FRAME_BYTES_MAX_DEFAULT)
    frame = encode_frame(payload)
    for start in range(0, len(frame), 1500):  # reads shorter than the small head
        reader.receive_data(frame[start : start + 1500])
    assert drain(reader) == [payload]
