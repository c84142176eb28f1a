"""Size-prefixed frames out of a byte stream, sans I/O.

Theory of operation: every Kafka request and response is a frame, a 4-byte
big-endian signed size followed by that many bytes. `FrameReader` takes bytes in
one of two ways and hands out complete frames with `next_frame`:

- zero-copy, for `asyncio.BufferedProtocol`: the pump asks `get_buffer()` where
  the socket should read into, reads there, then reports the byte count with
  `buffer_updated(nbytes)`;
- `receive_data(data)`, for anyone holding bytes already (tests, clients); it
  copies `data` through the same two calls.

Sizes are validated as soon as their 4 bytes are there, before any body is
waited for, so a peer announcing a 2 GiB frame is refused after 4 bytes instead
of after we have buffered it. A bad size behind complete frames is reported once
those frames have been taken, so every good request before it is still served.

Where the bytes land. Reads go into a `head` buffer while no large frame is
under way. An idle connection holds only a small head (`HEAD_SMALL_BYTES`,
room for the small requests a quiet client sends); a read that fills it means
the peer is streaming, and the head is swapped for a large one (`HEAD_BYTES`,
from the pool) that takes many small requests per read. Once the large head is
empty again after a read that would have fitted the small one (or after a
large frame), it goes back to the pool, so ten thousand idle connections do
not each keep 128 KiB. Complete frames of the head are cut out at once (a copy, cheap at
their size). A frame of at least `DIRECT_FRAME_BYTES_MIN` that is not complete
yet gets a buffer of its own from a `BufferPool`: the bytes of it already in the
head are copied there once (right after a large frame only a short read goes to
the head, so that is little), and from then on `get_buffer` hands out exactly the
rest of that frame, so the socket writes the body (Produce's records: nearly
every byte) straight to its final place, and `next_frame` returns a memoryview
of it. Produce is decoded without copying its records (codec.py), so a record
batch is copied by the kernel from the socket into that buffer and by the kernel
from there into the log, and by nobody in between. After a large frame the
next read goes to the small head: a peer that sent one large frame usually
sends another, and all but that short prefix of it then lands in its own buffer
instead of being copied out of a head.

Recycling. Allocating a fresh multi-megabyte buffer per request costs page faults
and zeroing for every byte, about what a copy costs; `BufferPool.give(frame)`
takes a large frame's buffer back once its request is done, and reuses it only if
no view of it is alive any more (see `BufferPool.give`), so a view kept by
mistake can never see its bytes overwritten. The pool keeps at most
`pool_bytes_max` idle bytes. Memory held by a reader is bounded by the two heads
plus one frame under way (at most `frame_bytes_max`) plus the frames not yet taken.
"""

from __future__ import annotations

import collections
import struct

from onceflow.protocol.errors import ProtocolError

__all__ = (
    "DIRECT_FRAME_BYTES_MIN",
    "FRAME_BYTES_MAX_DEFAULT",
    "FRAME_SIZE",
    "BufferPool",
    "FrameReader",
    "encode_frame",
)

# Kafka's socket.request.max.bytes default (100 MiB): a request larger than this is
# refused by a real broker too.
FRAME_BYTES_MAX_DEFAULT = 100 * 1024 * 1024

# The size prefix: int32, big-endian, counting the bytes after itself.
FRAME_SIZE = struct.Struct(">i")

# Reads land in a head while no large frame is under way. The large head has room
# for many small requests per read, and is small enough that cutting frames out of
# it stays cache-friendly; a power of two, so that the pool recycles it.
HEAD_BYTES = 128 * 1024
# The head of a quiet connection (every connection holds one for its lifetime): an
# ApiVersions, Metadata or Fetch request fits; a read that fills it brings in the
# large head. Also the first read after a large frame (see the module docstring).
HEAD_SMALL_BYTES = 2 * 1024
# From this size an incomplete frame is read into its own buffer (no copy after the
# read); below it, copying the frame out of the head costs less than a pooled buffer.
# Must leave room for a size prefix in the head, so that every smaller frame fits.
DIRECT_FRAME_BYTES_MIN = 16 * 1024
# Idle pooled buffers kept for reuse, all sizes together; more are freed.
POOL_BYTES_MAX_DEFAULT = 64 * 1024 * 1024

assert DIRECT_FRAME_BYTES_MIN + FRAME_SIZE.size <= HEAD_BYTES
assert HEAD_SMALL_BYTES < HEAD_BYTES and HEAD_BYTES & (HEAD_BYTES - 1) == 0


class BufferPool:
    """Reusable bytearrays for large frames, in power-of-two size classes."""

    __slots__ = ("_free", "_idle_bytes", "_pool_bytes_max")

    def __init__(self, pool_bytes_max: int = POOL_BYTES_MAX_DEFAULT) -> None:
        if pool_bytes_max < 0:
            raise ValueError(f"pool_bytes_max must not be negative, got {pool_bytes_max}")
        self._pool_bytes_max = pool_bytes_max
        self._free: dict[int, list[bytearray]] = {}
        self._idle_bytes = 0

    @property
    def idle_bytes(self) -> int:
        """Bytes held in buffers waiting for reuse."""
        return self._idle_bytes

    def take(self, size: int) -> bytearray:
        """A buffer of at least `size` bytes (its contents are garbage)."""
        capacity = 1 << (size - 1).bit_length()
        free = self._free.get(capacity)
        if free:
            self._idle_bytes -= capacity
            return free.pop()
        return bytearray(capacity)

    def give(self, frame: bytes | memoryview) -> None:
        """Take a large frame's buffer back once its request is done (bytes: ignored).

        Releases `frame` itself. The buffer is reused only when nothing else views it:
        growing a bytearray raises BufferError while any memoryview of it is alive
        (slices of `frame` included), which is exactly the check wanted; anything
        else still holding a view just keeps the buffer to itself, and the garbage
        collector frees it later.
        """
        if not isinstance(frame, memoryview):
            return
        buffer = frame.obj
        try:
            frame.release()
        except BufferError:  # someone is reading through `frame` itself right now
            return
        capacity = len(buffer) if isinstance(buffer, bytearray) else 0
        if capacity == 0 or capacity & (capacity - 1):
            return  # not one of ours
        if self._idle_bytes + capacity > self._pool_bytes_max:
            return
        try:
            buffer.append(0)  # raises BufferError while a view is alive
        except BufferError:
            return
        del buffer[-1]
        self._free.setdefault(capacity, []).append(buffer)
        self._idle_bytes += capacity


class FrameReader:
    """Split a byte stream into frames; refuse bad sizes before buffering bodies."""

    __slots__ = (
        "_end",
        "_error",
        "_frame_bytes_max",
        "_frames",
        "_head",
        "_head_view",
        "_large",
        "_large_filled",
        "_large_size",
        "_pool",
        "_shrink",
        "_small",
        "_small_view",
        "_start",
    )

    def __init__(self, frame_bytes_max: int, pool: BufferPool | None = None) -> None:
        if frame_bytes_max <= 0:
            raise ValueError(f"frame_bytes_max must be positive, got {frame_bytes_max}")
        self._frame_bytes_max = frame_bytes_max
        self._pool = pool if pool is not None else BufferPool(0)
        self._small = bytearray(HEAD_SMALL_BYTES)
        self._small_view = memoryview(self._small)
        # The head in use: the small one or a large one from the pool. Frames are cut
        # out through its view (one copy; slicing the bytearray would copy twice). A
        # head is never resized, so the view may live as long as it.
        self._head, self._head_view = self._small, self._small_view
        self._start = self._end = 0  # unparsed bytes of the head: [_start, _end)
        # The large frame under way, if any: a view of exactly its bytes in a pooled buffer.
        self._large: memoryview | None = None
        self._large_size = self._large_filled = 0
        # Go back to the small head once the large one is empty: the last read was
        # short, or a large frame came (set while the head is in use by the socket).
        self._shrink = False
        # Complete frames not yet taken; None while there are none (an empty deque
        # costs 600-odd bytes, times every idle connection).
        self._frames: collections.deque[bytes | memoryview] | None = None
        self._error: ProtocolError | None = None  # a bad size behind queued frames

    @property
    def buffered_bytes(self) -> int:
        """Bytes received and not yet returned as frames (size prefixes included)."""
        queued = sum(FRAME_SIZE.size + len(frame) for frame in self._frames or ())
        large = FRAME_SIZE.size + self._large_filled if self._large is not None else 0
        return queued + large + self._end - self._start

    @property
    def held_bytes(self) -> int:
        """Memory this reader holds: the head, a large frame under way, queued frames."""
        large = len(self._large.obj) if self._large is not None else 0
        head = len(self._head) if self._head is not self._small else 0
        return (len(self._small) + head + large
                + sum(len(frame) for frame in self._frames or ()))

    # -- zero-copy input ------------------------------------------------------------

    def get_buffer(self) -> memoryview:
        """Where the next bytes from the peer go: never empty, never past a large frame."""
        if self._shrink and self._end == 0:
            self._use_small_head()
        if self._large is not None:
            return self._large[self._large_filled :]
        if self._error is not None:
            self._start = self._end = 0  # nothing after a bad size is ever parsed
        elif self._end == len(self._head):
            if self._head is self._small:
                self._use_large_head()
            else:
                self._compact()
        return self._head_view[self._end :]

    def buffer_updated(self, nbytes: int) -> None:
        """`nbytes` were written at the start of the last `get_buffer()`; raise
        ProtocolError at once for a bad size with no complete frame before it."""
        if self._large is not None:
            # The hot path of a large request: several reads each, nothing to parse.
            self._large_filled += nbytes
            if self._large_filled == self._large_size:  # the head is empty meanwhile
                self._queue(self._large)
                self._large, self._shrink = None, True
            return
        self._end += nbytes
        self._shrink = nbytes < HEAD_SMALL_BYTES and self._head is not self._small
        self._parse_head()

    # -- copying input ------------------------------------------------------------

    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        """Append bytes from the peer; raise ProtocolError at once for a bad size."""
        with memoryview(data) as view:
            view = view.cast("B")
            while view:
                target = self.get_buffer()
                count = min(len(target), len(view))
                target[:count] = view[:count]
                del target  # no view of the head left, so it can go back to the pool
                self.buffer_updated(count)
                view = view[count:]
        self._raise_if_no_frames()

    # -- output ---------------------------------------------------------------------

    def next_frame(self) -> bytes | memoryview | None:
        """The next complete frame's payload (bytes, or a memoryview of a pooled buffer
        for a large one: give it back with `BufferPool.give` when done), or None."""
        if self._frames:
            return self._frames.popleft()
        self._frames = None
        self._raise_if_no_frames()
        return None

    # -- internals ------------------------------------------------------------------

    def _parse_head(self) -> None:
        """Cut complete frames out of the head; start a large frame if one begins."""
        head = self._head
        while self._error is None and self._large is None:
            available = self._end - self._start
            if available < FRAME_SIZE.size:
                break
            size = self._checked_size(FRAME_SIZE.unpack_from(head, self._start)[0])
            if size is None:
                break
            body_start = self._start + FRAME_SIZE.size
            if size <= available - FRAME_SIZE.size:
                self._queue(bytes(self._head_view[body_start : body_start + size]))
                self._start = body_start + size
            elif size >= DIRECT_FRAME_BYTES_MIN:
                self._start_large(size, body_start)
            else:
                break  # a small frame still arriving: it fits the head once compacted
        if self._start == self._end:
            self._start = self._end = 0
        self._raise_if_no_frames()

    def _queue(self, frame: bytes | memoryview) -> None:
        if self._frames is None:
            self._frames = collections.deque()
        self._frames.append(frame)

    def _start_large(self, size: int, body_start: int) -> None:
        large = memoryview(self._pool.take(size))[:size]
        present = self._end - body_start
        large[:present] = self._head_view[body_start : self._end]
        self._large, self._large_size, self._large_filled = large, size, present
        self._start = self._end = 0
        self._shrink = self._head is not self._small

    def _use_large_head(self) -> None:
        """The small head is full: move its unparsed bytes to a large head."""
        head = self._pool.take(HEAD_BYTES)
        count = self._end - self._start
        head[:count] = self._small_view[self._start : self._end]
        self._head, self._head_view = head, memoryview(head)
        self._start, self._end = 0, count

    def _use_small_head(self) -> None:
        """The large head is empty: give it back (the pool reuses it only if no view
        of it is left, see `BufferPool.give`)."""
        self._shrink = False
        if self._head is not self._small:
            large_view = self._head_view
            self._head, self._head_view = self._small, self._small_view
            self._pool.give(large_view)

    def _checked_size(self, size: int) -> int | None:
        if size <= 0:
            # Negative is never valid; zero cannot hold even a request header.
            self._error = ProtocolError(f"invalid frame size {size}")
        elif size > self._frame_bytes_max:
            self._error = ProtocolError(
                f"frame size {size} exceeds the limit {self._frame_bytes_max}"
            )
        else:
            return size
        return None

    def _raise_if_no_frames(self) -> None:
        if self._error is not None and not self._frames:
            raise self._error

    def _compact(self) -> None:
        """Move the partial frame at the head's end to its start. The copy goes through
        a temporary (source and target may overlap) and keeps the head's size: the
        socket layer may hold a view of it, which forbids resizing."""
        count = self._end - self._start
        self._head[:count] = self._head[self._start : self._end]
        self._start, self._end = 0, count


def encode_frame(payload: bytes | bytearray | memoryview) -> bytes:
    """Prefix `payload` with its 4-byte big-endian size."""
    return b"".join((FRAME_SIZE.pack(len(payload)), payload))
