"""Lanes and the engines that run them: worker threads or an asyncio event loop.

Theory of operation
-------------------
Each partition has `concurrency` lanes. A lane is a FIFO of records with one rule: at
most one of its records runs at a time. All records of one key go to one lane
(routing.py), so per-key order holds while different keys of the same partition run
concurrently.

`ThreadEngine` runs plain-function handlers. A lane is a *strand* on a shared,
resizable pool of worker threads: when records arrive at an idle lane, one job is
submitted for it; that job runs the lane's records one after another and ends when the
lane is empty (or after `LANE_TURN_RECORDS`, re-submitting itself so that busy lanes
share the threads fairly). So there is never more than one job per lane, and the
number of threads is set independently of the number of lanes.

`AsyncEngine` runs `async def` handlers on one event loop in its own thread: a lane
is a task that awaits its records one after another. The subscription thread hands
a whole poll batch over with a single `call_soon_threadsafe`.

Both report back through the `Mailbox`: lists of finished records (outputs or error
set on them) and completions of deferred records, in deques the subscription thread
drains. Finished results are batched, except that a result slower than
`POST_AFTER_S` is posted at once so slow handlers do not hold back commits.

A lane stops taking records as soon as its partition is `stopping` (revoked, lost,
rewound); records still queued are simply never started. `lane.started` counts the
records started on the lane; it is written only by the lane's single active job.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from onceflow.processor.record import Completion, Output, Record, as_outputs

log = logging.getLogger(__name__)

LANE_CHUNK_RECORDS = 16  # records taken from a lane per lock acquisition
LANE_TURN_RECORDS = 256  # records one job runs before yielding its thread to other lanes
POST_AFTER_S = 0.001  # results slower than this are posted at once, faster ones batched
JOIN_TIMEOUT_S = 5.0  # closing waits this long for threads to exit (they are daemons)

# What running a handler left to do (see _settle).
FINISHED, DEFERRED, ALREADY_POSTED = 0, 1, 2


class Mailbox:
    """Results from workers to the subscription thread. deque appends and pops are
    atomic, so no lock is needed."""

    __slots__ = ("deferred", "finished")

    def __init__(self) -> None:
        self.finished: deque[list[Record]] = deque()
        self.deferred: deque[Completion] = deque()

    def post_finished(self, records: list[Record]) -> None:
        self.finished.append(records)

    def post_deferred(self, completion: Completion) -> None:
        self.deferred.append(completion)


class LaneOwner(Protocol):
    """What a lane needs of its partition (partition.PartitionContext, which imports
    this module): whether to stop taking records."""

    stopping: bool


class Lane:
    __slots__ = ("ctx", "lock", "queue", "scheduled", "started")

    def __init__(self, ctx: LaneOwner) -> None:
        self.ctx = ctx
        self.queue: deque[Record] = deque()
        self.lock = threading.Lock()
        self.scheduled = False  # a job (or task) owns this lane right now
        self.started = 0

    @property
    def idle(self) -> bool:
        return not self.scheduled


def _settle(
    record: Record, outputs: list[Output] | None, error: BaseException | None, elapsed_s: float
) -> int:
    """After the handler returned or raised: is the record finished, deferred, or was
    it already completed through its Completion?

    A deferred record may be completed by another thread before its handler even
    returns, so the result fields are written only when the record is not deferred.
    """
    completion = record._completion
    if completion is None:
        record._outputs, record._error, record._elapsed_s = outputs, error, elapsed_s
        return FINISHED
    if error is None:
        return DEFERRED  # outputs come from Completion.complete()
    if completion._claim():  # raising after defer() fails the record...
        record._outputs, record._error, record._elapsed_s = None, error, elapsed_s
        return FINISHED
    return ALREADY_POSTED  # ...unless complete() already won


class WorkerPool:
    """A resizable set of daemon threads taking jobs from one queue."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._jobs: queue.SimpleQueue[tuple[Callable[[Any], None], Any] | None] = (
            queue.SimpleQueue()
        )
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._size = 0
        self.failure: BaseException | None = None

    @property
    def size(self) -> int:
        return self._size

    def resize(self, size: int) -> None:
        with self._lock:
            self._threads = [t for t in self._threads if t.is_alive()]
            while self._size < size:
                thread = threading.Thread(
                    target=self._work, name=f"{self._name}-{len(self._threads)}", daemon=True
                )
                thread.start()
                self._threads.append(thread)
                self._size += 1
            while self._size > size:
                self._jobs.put(None)  # one thread exits per sentinel
                self._size -= 1

    def submit(self, job: Callable[[Any], None], argument: Any) -> None:
        self._jobs.put((job, argument))

    def _work(self) -> None:
        while (job := self._jobs.get()) is not None:
            function, argument = job
            try:
                function(argument)
            except BaseException as exc:  # our bug, not a handler's: stop the processor
                log.critical("worker crashed", exc_info=exc)
                self.failure = exc

    def close(self, timeout_s: float = JOIN_TIMEOUT_S) -> None:
        self.resize(0)
        deadline = time.monotonic() + timeout_s
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))


class ThreadEngine:
    """Runs plain-function handlers on a `WorkerPool`, one strand per lane."""

    def __init__(self, handler: Callable[[Record], object], mailbox: Mailbox, name: str) -> None:
        self._handler = handler
        self._mailbox = mailbox
        self._pool = WorkerPool(name)

    @property
    def failure(self) -> BaseException | None:
        return self._pool.failure

    def set_threads(self, threads: int) -> None:
        self._pool.resize(threads)

    def dispatch(self, batches: list[tuple[Lane, list[Record]]]) -> None:
        for lane, records in batches:
            with lane.lock:
                lane.queue.extend(records)
                if lane.scheduled:
                    continue
                lane.scheduled = True
            self._pool.submit(self._run_lane, lane)

    def _take_chunk(self, lane: Lane) -> list[Record] | None:
        with lane.lock:
            if lane.ctx.stopping or not lane.queue:
                lane.scheduled = False
                return None
            count = min(len(lane.queue), LANE_CHUNK_RECORDS)
            return [lane.queue.popleft() for _ in range(count)]

    def _run_lane(self, lane: Lane) -> None:
        ctx, mailbox, handler = lane.ctx, self._mailbox, self._handler
        finished: list[Record] = []
        ran = 0
        while True:
            if ran >= LANE_TURN_RECORDS:
                self._pool.submit(self._run_lane, lane)  # still scheduled: requeue
                break
            chunk = self._take_chunk(lane)
            if chunk is None:
                break
            for record in chunk:
                if ctx.stopping:
                    break  # the rest of the chunk is abandoned with the partition
                lane.started += 1
                record._started_s = started = time.perf_counter()
                try:
                    outputs, error = as_outputs(handler(record)), None
                except Exception as exc:  # noqa: BLE001 - a handler failure is data for the retry policy
                    outputs, error = None, exc
                elapsed = time.perf_counter() - started
                state = _settle(record, outputs, error, elapsed)
                if state == FINISHED:
                    finished.append(record)
                    if elapsed >= POST_AFTER_S:
                        mailbox.post_finished(finished)
                        finished = []
                elif state == DEFERRED:
                    mailbox.post_deferred(record._completion)  # type: ignore[arg-type]
            ran += len(chunk)
        if finished:
            mailbox.post_finished(finished)

    def close(self) -> None:
        self._pool.close()


class AsyncEngine:
    """Runs `async def` handlers on an event loop in a dedicated thread."""

    def __init__(
        self, handler: Callable[[Record], Awaitable[object]], mailbox: Mailbox, name: str
    ) -> None:
        self._handler = handler
        self._mailbox = mailbox
        self._loop = asyncio.new_event_loop()
        self._tasks: set[asyncio.Task[None]] = set()
        self._finished: list[Record] = []
        self._flush_scheduled = False
        self.failure: BaseException | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def set_threads(self, threads: int) -> None:
        """One event loop thread, whatever the concurrency."""

    def dispatch(self, batches: list[tuple[Lane, list[Record]]]) -> None:
        self._loop.call_soon_threadsafe(self._accept, batches)

    def _accept(self, batches: list[tuple[Lane, list[Record]]]) -> None:
        for lane, records in batches:
            lane.queue.extend(records)
            if not lane.scheduled:
                lane.scheduled = True
                task = self._loop.create_task(self._run_lane(lane))
                self._tasks.add(task)
                task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.critical("lane task crashed", exc_info=task.exception())
            self.failure = task.exception()

    async def _run_lane(self, lane: Lane) -> None:
        ctx, lane_queue, handler = lane.ctx, lane.queue, self._handler
        try:
            ran = 0
            while lane_queue and not ctx.stopping:
                record = lane_queue.popleft()
                lane.started += 1
                record._started_s = started = time.perf_counter()
                try:
                    outputs, error = as_outputs(await handler(record)), None
                except Exception as exc:  # noqa: BLE001 - a handler failure is data for the retry policy
                    outputs, error = None, exc
                state = _settle(record, outputs, error, time.perf_counter() - started)
                self._settled(record, state)
                ran += 1
                if ran % LANE_TURN_RECORDS == 0:
                    await asyncio.sleep(0)  # let other lanes run
        finally:
            lane.scheduled = False

    def _settled(self, record: Record, state: int) -> None:
        if state == DEFERRED:
            self._mailbox.post_deferred(record._completion)  # type: ignore[arg-type]
        elif state == FINISHED:
            self._finished.append(record)
            if not self._flush_scheduled:
                self._flush_scheduled = True
                self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        finished, self._finished = self._finished, []
        if finished:
            self._mailbox.post_finished(finished)

    async def _cancel_all(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def close(self) -> None:
        if not self._loop.is_running():
            return
        future = asyncio.run_coroutine_threadsafe(self._cancel_all(), self._loop)
        try:
            future.result(JOIN_TIMEOUT_S)
        except Exception:  # noqa: BLE001 - best effort on the way out
            log.warning("lane tasks did not stop in time")
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(JOIN_TIMEOUT_S)
        if not self._thread.is_alive():
            self._loop.close()
