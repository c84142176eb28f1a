"""Size-prefixed frames out of a byte stream, sans I/O.

Theory of operation: every Kafka request and response is a frame, a 4-byte
big-endian signed size followed by that many bytes. The connection pump feeds
whatever the socket gave it to `FrameReader.receive_data` and then calls
`next_frame` until it returns None. The size at the head of the buffer is
validated as soon as its 4 bytes are there, before the body is waited for, so a
peer announcing a 2 GiB frame is refused after 4 bytes instead of after we have
buffered it. The buffer is therefore bounded by one frame (at most
`frame_bytes_max`) plus one socket read.

Consumed bytes are not cut off the front of the buffer one frame at a time
(that copies the tail every time and turns many small frames into quadratic
work); a read offset advances instead and the buffer is compacted only when the
consumed prefix is at least half of it, which makes compaction amortised O(1)
per byte.
"""

from __future__ import annotations

import struct

from onceflow.protocol.errors import ProtocolError

__all__ = ("FRAME_BYTES_MAX_DEFAULT", "FRAME_SIZE", "FrameReader", "encode_frame")

# Kafka's socket.request.max.bytes default (100 MiB): a request larger than this is
# refused by a real broker too.
FRAME_BYTES_MAX_DEFAULT = 100 * 1024 * 1024

# The size prefix: int32, big-endian, counting the bytes after itself.
FRAME_SIZE = struct.Struct(">i")

# Below this many consumed bytes compaction is not worth a memmove.
_COMPACT_BYTES_MIN = 64 * 1024


class FrameReader:
    """Split a byte stream into frames; refuse bad sizes before buffering bodies."""

    __slots__ = ("_buffer", "_frame_bytes_max", "_start")

    def __init__(self, frame_bytes_max: int) -> None:
        if frame_bytes_max <= 0:
            raise ValueError(f"frame_bytes_max must be positive, got {frame_bytes_max}")
        self._frame_bytes_max = frame_bytes_max
        self._buffer = bytearray()
        self._start = 0  # offset of the first unconsumed byte in _buffer

    @property
    def buffered_bytes(self) -> int:
        """Bytes received and not yet returned as frames."""
        return len(self._buffer) - self._start

    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        """Append bytes from the peer; raise ProtocolError at once for a bad size."""
        self._compact()
        self._buffer += data
        self._head_frame_size()

    def next_frame(self) -> bytes | None:
        """Return the next complete frame's payload, or None if it is not all here."""
        size = self._head_frame_size()
        if size is None:
            return None
        body_start = self._start + FRAME_SIZE.size
        body_end = body_start + size
        if body_end > len(self._buffer):
            return None
        with memoryview(self._buffer) as view:
            frame = bytes(view[body_start:body_end])
        self._start = body_end
        return frame

    def _head_frame_size(self) -> int | None:
        """The validated size of the frame at the head, None while its prefix is partial."""
        if len(self._buffer) - self._start < FRAME_SIZE.size:
            return None
        (size,) = FRAME_SIZE.unpack_from(self._buffer, self._start)
        if size <= 0:
            # Negative is never valid; zero cannot hold even a request header.
            raise ProtocolError(f"invalid frame size {size}")
        if size > self._frame_bytes_max:
            raise ProtocolError(f"frame size {size} exceeds the limit {self._frame_bytes_max}")
        return size

    def _compact(self) -> None:
        if self._start == 0:
            return
        if self._start == len(self._buffer):
            self._buffer.clear()
            self._start = 0
        elif self._start >= _COMPACT_BYTES_MIN and 2 * self._start >= len(self._buffer):
            del self._buffer[: self._start]
            self._start = 0


def encode_frame(payload: bytes | bytearray | memoryview) -> bytes:
    """Prefix `payload` with its 4-byte big-endian size."""
    return b"".join((FRAME_SIZE.pack(len(payload)), payload))
