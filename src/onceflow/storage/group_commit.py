"""`GroupCommitter`: one background thread that turns many flush requests into few fsyncs.

Theory of operation
-------------------
An acks=all produce appends (no fsync) and then asks `request_flush(log)` for a future that
resolves once everything appended to that log *before the request* is on disk. Requests queue
in a dict keyed by log. The thread loops in *rounds*: it takes every request queued since the
previous round, calls `log.flush()` once per distinct log, then resolves all the futures of
that log. While a round's fsyncs run, new requests pile up for the next round, so under load
one fsync covers every append that arrived during the previous fsync: the number of fsyncs
per second is bounded by the disk's fsync latency, not by the request rate.

The logs of one round are flushed in parallel, by up to `FLUSH_THREADS_MAX` threads, each
log's futures resolved as soon as its own fsync returns: fsyncs of different files queue at
the device together, so a round with many dirty partitions takes about one fsync latency
instead of their sum (measured here: the one committer thread spent ~85% of a produce
benchmark in fsyncs of 8 partitions one after the other, and the answers waited on it).

A request made after an append is always served by a flush that starts after the request was
queued, hence after the append: the future never resolves early.

A caller on an event loop asks `flush_waiter(log)` instead: an asyncio future of its loop.
The thread resolves every such future of a round with one `call_soon_threadsafe` per loop,
not one per request as `asyncio.wrap_future` over `request_flush` would (each is a wake-up
of the loop and a turn of the interpreter lock between the two threads: issue 19).

A failing flush is loud: it is logged at CRITICAL, the log marks itself failed (appends raise
from then on), and every future of that log in the round gets the exception. Futures are
marked running at creation, so cancelling the awaiting side cannot make them unresolvable.
With fsync disabled, futures are returned already resolved.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import NamedTuple, Protocol

logger = logging.getLogger(__name__)

# Most logs flushed in one round. Bounded so a round (and the latency of requests queued after
# it) stays short even with thousands of partitions; the rest waits for the next round.
ROUND_LOGS_MAX = 1024
# Logs fsynced at once in a round. The device queues them; beyond a few, more threads only
# cost memory (and a round rarely has more dirty logs than partitions being written).
FLUSH_THREADS_MAX = 8


class Flushable(Protocol):
    def flush(self) -> None: ...


class GroupCommitStats(NamedTuple):
    rounds: int  # rounds that flushed at least one log
    flushes: int  # log.flush() calls (each one fsync of each dirty file of that log)
    requests: int  # request_flush() calls served
    failures: int  # flushes that raised
    pending: int  # requests queued now


class GroupCommitter:
    """Coalesces fsyncs of many appends (see the module docstring)."""

    def __init__(self, fsync_enabled: bool, *, name: str = "onceflow-group-commit") -> None:
        self.fsync_enabled = fsync_enabled
        self._cond = threading.Condition(threading.Lock())
        self._pending: dict[int, tuple[Flushable, list[Future | asyncio.Future[None]]]] = {}
        self._closing = False
        self._rounds = self._flushes = self._requests = self._failures = 0
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._flushers: ThreadPoolExecutor | None = None
        if fsync_enabled:
            self._flushers = ThreadPoolExecutor(FLUSH_THREADS_MAX, thread_name_prefix=name)
            self._thread.start()

    def request_flush(self, log: Flushable) -> Future:
        """A future resolved (None) once `log` is durable up to its state at this call."""
        future: Future = Future()
        future.set_running_or_notify_cancel()
        if not self.fsync_enabled:
            future.set_result(None)
            return future
        self._queue(log, future)
        return future

    def flush_waiter(self, log: Flushable) -> asyncio.Future[None]:
        """The same as `request_flush`, as a future of the running event loop (see the
        module docstring); cancelling it only stops the waiting."""
        waiter = asyncio.get_running_loop().create_future()
        if not self.fsync_enabled:
            waiter.set_result(None)
            return waiter
        self._queue(log, waiter)
        return waiter

    def _queue(self, log: Flushable, future: Future | asyncio.Future[None]) -> None:
        with self._cond:
            if self._closing:
                raise RuntimeError("GroupCommitter is closed")
            entry = self._pending.get(id(log))
            if entry is None:
                self._pending[id(log)] = (log, [future])
            else:
                entry[1].append(future)
            self._cond.notify()

    def statistics(self) -> GroupCommitStats:
        with self._cond:
            pending = sum(len(futures) for _, futures in self._pending.values())
            return GroupCommitStats(
                self._rounds, self._flushes, self._requests, self._failures, pending
            )

    def close(self) -> None:
        """Serves every queued request, then stops the thread."""
        with self._cond:
            self._closing = True
            self._cond.notify()
        if self._thread.is_alive():
            self._thread.join()
        if self._flushers is not None:
            self._flushers.shutdown()

    def _next_round(self) -> list[tuple[Flushable, list[Future | asyncio.Future[None]]]] | None:
        with self._cond:
            while not self._pending and not self._closing:
                self._cond.wait()
            if not self._pending:
                return None  # closing and drained
            keys = list(self._pending)[:ROUND_LOGS_MAX]
            return [self._pending.pop(key) for key in keys]

    def _run(self) -> None:
        while (batch := self._next_round()) is not None:
            if len(batch) == 1 or self._flushers is None:
                failed = [self._flush(log, futures) for log, futures in batch]
            else:
                failed = list(self._flushers.map(lambda entry: self._flush(*entry), batch))
            with self._cond:
                self._rounds += 1
                self._flushes += len(batch)
                self._requests += sum(len(futures) for _, futures in batch)
                self._failures += sum(failed)

    @staticmethod
    def _flush(log: Flushable, futures: list[Future | asyncio.Future[None]]) -> bool:
        """Flush one log and resolve its futures; True if the flush failed."""
        error: BaseException | None = None
        try:
            log.flush()
        except BaseException as exc:  # noqa: BLE001 - every waiter must hear of it
            logger.critical("group commit: flush of %r failed: %r", log, exc)
            error = exc
        by_loop: dict[asyncio.AbstractEventLoop, list[asyncio.Future[None]]] = {}
        for future in futures:
            if isinstance(future, Future):
                if error is None:
                    future.set_result(None)
                else:
                    future.set_exception(error)
            else:
                by_loop.setdefault(future.get_loop(), []).append(future)
        for loop, waiters in by_loop.items():
            try:
                loop.call_soon_threadsafe(_resolve, waiters, error)
            except RuntimeError:   # the loop is closed: nobody waits any more
                pass
        return error is not None


def _resolve(waiters: list[asyncio.Future[None]], error: BaseException | None) -> None:
    """On the waiters' loop: every waiter still waiting learns the flush's outcome."""
    for waiter in waiters:
        if waiter.done():
            continue   # cancelled by its side
        if error is None:
            waiter.set_result(None)
        else:
            waiter.set_exception(error)
