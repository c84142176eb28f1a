"""What a handler sees (`Record`), what it may return (`Output`), and deferred completion.

A handler is `def handle(record) -> None | Output | Iterable[Output]` (run on a worker
thread) or the same as `async def` (run on the processor's event loop). When it returns,
the record is complete, and its outputs are produced (in exactly-once mode: inside the
next transaction). A handler that finishes its work later calls `record.defer()` and
completes the returned `Completion` from any thread; its lane moves on to the next
record at once. A deferred record that is not completed within its timeout is
force-completed and reported (metric `deferred_timeouts`, a warning in the log).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple, Protocol

Headers = list[tuple[str, bytes]]


class FinishedRecords(Protocol):
    def post_finished(self, records: list[Record]) -> None: ...


class RecordOwner(Protocol):
    """What a record needs of the partition it was fetched for (its
    partition.PartitionContext, which imports this module): where a deferred record is
    posted once completed."""

    @property
    def mailbox(self) -> FinishedRecords: ...


class Output(NamedTuple):
    """A record to produce once the input record completes."""

    topic: str
    value: bytes | str | None
    key: bytes | str | None = None
    headers: Headers | None = None
    partition: int | None = None


class Record:
    """One input record. For a retried record, `topic`/`partition`/`offset` name the
    original record and `attempt` counts the deliveries (1 for the first)."""

    __slots__ = (  # noqa: RUF023 - public fields first, then bookkeeping
        "topic",
        "partition",
        "offset",
        "key",
        "attempt",
        "_message",
        "_value",
        "_headers",
        "_timestamp_ms",
        # Bookkeeping of the subscription loop, not part of the public surface:
        "_ctx",  # the PartitionContext the record was fetched for
        "_position",  # its offset in the partition it was consumed from
        "_not_before_ms",  # monotonic time before which it must not start (retries)
        "_completion",  # set by defer()
        "_outputs",
        "_error",
        "_started_s",
        "_elapsed_s",
    )

    def __init__(
        self,
        topic: str,
        partition: int,
        offset: int,
        key: bytes | None,
        value: bytes | None = None,
        headers: Headers | None = None,
        timestamp_ms: int | None = None,
        attempt: int = 1,
        message: Any = None,
    ) -> None:
        self.topic = topic
        self.partition = partition
        self.offset = offset
        self.key = key
        self.attempt = attempt
        self._message = message  # a confluent_kafka.Message; fields read lazily
        self._value = value
        self._headers = headers
        self._timestamp_ms = timestamp_ms
        self._ctx: RecordOwner | None = None  # the partition.PartitionContext
        self._position = offset
        self._not_before_ms = 0
        self._completion: Completion | None = None
        self._outputs: list[Output] | None = None
        self._error: BaseException | None = None
        self._started_s = 0.0
        self._elapsed_s = 0.0

    @property
    def value(self) -> bytes | None:
        if self._message is not None:
            return self._message.value()
        return self._value

    @property
    def headers(self) -> Headers | None:
        if self._message is not None:
            return self._message.headers()
        return self._headers

    @property
    def timestamp_ms(self) -> int | None:
        if self._message is not None:
            kind, timestamp = self._message.timestamp()
            return timestamp if kind else None
        return self._timestamp_ms

    def defer(self, timeout_ms: int | None = None) -> Completion:
        """Finish this record later: the handler may return, the record stays pending
        until `complete()`/`fail()` on the returned object. `timeout_ms=None` uses
        `ProcessorConfig.deferred_timeout_ms`."""
        if self._completion is not None:
            raise RuntimeError("record already deferred")
        if self._ctx is None:
            raise RuntimeError("only a record being processed can be deferred")
        self._completion = Completion(self, timeout_ms, self._ctx.mailbox.post_finished)
        return self._completion

    def __repr__(self) -> str:
        return (
            f"Record(topic={self.topic!r}, partition={self.partition}, offset={self.offset}, "
            f"key={self.key!r}, attempt={self.attempt})"
        )


class Completion:
    """Completes a deferred record, once, from any thread."""

    __slots__ = ("_done", "_lock", "_sink", "record", "timeout_ms")

    def __init__(
        self, record: Record, timeout_ms: int | None, sink: Callable[[list[Record]], None]
    ) -> None:
        self.record = record
        self.timeout_ms = timeout_ms
        self._lock = threading.Lock()
        self._done = False
        self._sink = sink

    @property
    def done(self) -> bool:
        return self._done

    def complete(self, outputs: Output | Iterable[Output] | None = None) -> bool:
        """Mark the record done; False if it was already completed (or timed out)."""
        try:
            normalised = as_outputs(outputs)
        except TypeError as exc:
            return self.fail(exc)
        return self._finish(normalised, None)

    def fail(self, error: BaseException) -> bool:
        """Report the record failed: it goes through the retry policy."""
        return self._finish(None, error)

    def _claim(self) -> bool:
        with self._lock:
            if self._done:
                return False
            self._done = True
            return True

    def _finish(self, outputs: list[Output] | None, error: BaseException | None) -> bool:
        if not self._claim():
            return False
        record = self.record
        record._outputs = outputs
        record._error = error
        record._elapsed_s = time.perf_counter() - record._started_s
        self._sink([record])
        return True


def as_outputs(result: object) -> list[Output] | None:
    """Normalise a handler's return value; TypeError for anything but outputs."""
    if result is None:
        return None
    if isinstance(result, Output):
        return [result]
    if isinstance(result, (str, bytes, dict)) or not isinstance(result, Iterable):
        raise TypeError(f"a handler returns None, an Output or Outputs, not {type(result)!r}")
    outputs = list(result)
    for output in outputs:
        if not isinstance(output, Output):
            raise TypeError(f"a handler returns Outputs, not {type(output)!r}")
    return outputs or None
