"""GroupCommitter: coalescing, ordering, failures, disabled fsync, draining on close."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from conftest import NOW_MS
from storage_batches import make_batch

from onceflow.storage import GroupCommitter, LogFailedError


class SlowLog:
    """Stands in for a PartitionLog: each flush takes `delay_s` and is counted."""

    def __init__(self, delay_s: float = 0.005, error: BaseException | None = None) -> None:
        self.delay_s, self.error, self.flushes = delay_s, error, 0

    def flush(self) -> None:
        self.flushes += 1
        time.sleep(self.delay_s)
        if self.error is not None:
            raise self.error


def test_many_requesters_few_flushes():
    committer = GroupCommitter(fsync_enabled=True)
    log = SlowLog()
    per_thread, threads_n = 20, 8

    def requester():
        for _ in range(per_thread):
            committer.request_flush(log).result(timeout=10)

    threads = [threading.Thread(target=requester) for _ in range(threads_n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    committer.close()
    stats = committer.statistics()
    assert stats.requests == per_thread * threads_n and stats.failures == 0
    assert log.flushes == stats.flushes < stats.requests / 2


class GateLog:
    """A flush that signals it started and then waits to be released."""

    def __init__(self) -> None:
        self.started, self.release = threading.Event(), threading.Event()

    def flush(self) -> None:
        self.started.set()
        assert self.release.wait(10)


def test_each_log_flushed_once_per_round():
    committer = GroupCommitter(fsync_enabled=True)
    blocker, a, b = GateLog(), SlowLog(0), SlowLog(0)
    first = committer.request_flush(blocker)
    assert blocker.started.wait(10)  # the thread is busy: the next requests queue up
    futures = [committer.request_flush(log) for log in (a, b, a, a, b)]
    blocker.release.set()
    for f in [first, *futures]:
        assert f.result(timeout=5) is None
    assert (a.flushes, b.flushes) == (1, 1)
    committer.close()


def test_logs_of_a_round_are_flushed_in_parallel():
    committer = GroupCommitter(fsync_enabled=True)
    blocker = GateLog()
    committer.request_flush(blocker)
    assert blocker.started.wait(10)  # the next requests all land in one round
    delay_s, logs = 0.3, [SlowLog(0.3) for _ in range(4)]
    futures = [committer.request_flush(log) for log in logs]
    start = time.monotonic()
    blocker.release.set()
    for future in futures:
        assert future.result(timeout=10) is None
    elapsed_s = time.monotonic() - start
    committer.close()
    assert [log.flushes for log in logs] == [1, 1, 1, 1]
    # One after the other they would take 4 x 0.3 s.
    assert elapsed_s < 2.5 * delay_s, elapsed_s


def test_failed_flush_sets_exception_on_its_futures_only(caplog):
    committer = GroupCommitter(fsync_enabled=True)
    bad, good = SlowLog(0.02, OSError(5, "EIO")), SlowLog(0)
    futures = [
        committer.request_flush(bad),
        committer.request_flush(bad),
        committer.request_flush(good),
    ]
    with pytest.raises(OSError):
        futures[0].result(timeout=5)
    with pytest.raises(OSError):
        futures[1].result(timeout=5)
    assert futures[2].result(timeout=5) is None
    committer.close()
    assert committer.statistics().failures >= 1
    assert any(r.levelname == "CRITICAL" for r in caplog.records)


def test_disabled_resolves_immediately():
    committer = GroupCommitter(fsync_enabled=False)
    log = SlowLog()
    assert committer.request_flush(log).done() and log.flushes == 0
    committer.close()


def test_close_drains_pending_then_refuses():
    committer = GroupCommitter(fsync_enabled=True)
    log = SlowLog(0.01)
    futures = [committer.request_flush(log) for _ in range(5)]
    committer.close()
    assert all(f.done() and f.exception() is None for f in futures)
    with pytest.raises(RuntimeError):
        committer.request_flush(log)


def test_futures_cannot_be_cancelled_out_of_resolution():
    committer = GroupCommitter(fsync_enabled=True)
    future = committer.request_flush(SlowLog(0.01))
    assert not future.cancel()
    assert future.result(timeout=5) is None
    committer.close()


def test_real_log_durable_after_future(open_log):
    log = open_log()
    committer = GroupCommitter(fsync_enabled=True)
    info = log.append([make_batch(3)], NOW_MS)
    committer.request_flush(log).result(timeout=10)
    assert log.recovery_point_offset >= info.end_position
    committer.close()


def test_fsync_failure_fails_the_log(open_log, monkeypatch):
    log = open_log()
    log.append([make_batch(1)], NOW_MS)

    def broken_fsync(fd):
        raise OSError(5, "EIO")

    monkeypatch.setattr("onceflow.storage.log.os.fsync", broken_fsync)
    committer = GroupCommitter(fsync_enabled=True)
    with pytest.raises(LogFailedError):
        committer.request_flush(log).result(timeout=10)
    committer.close()
    monkeypatch.undo()
    with pytest.raises(LogFailedError):
        log.append([make_batch(1)], NOW_MS)
    with pytest.raises(LogFailedError):
        log.flush()


def test_loop_waiters_are_resolved_together_and_hear_of_failures():
    """flush_waiter: asyncio futures of the caller's loop, resolved after the flush that
    follows the request, failures raised into them, a cancelled waiter left alone."""
    committer = GroupCommitter(fsync_enabled=True)
    good, bad = SlowLog(delay_s=0.02), SlowLog(error=OSError(28, "No space left on device"))

    async def main():
        waiters = [committer.flush_waiter(good) for _ in range(50)]
        cancelled = committer.flush_waiter(good)
        cancelled.cancel()
        failing = committer.flush_waiter(bad)
        await asyncio.wait_for(asyncio.gather(*waiters), timeout=10)
        with pytest.raises(OSError):
            await asyncio.wait_for(failing, timeout=10)
        assert cancelled.cancelled()
        assert all(w.result() is None for w in waiters)

    try:
        asyncio.run(main())
        assert 1 <= good.flushes <= 2   # 51 requests, one or two rounds
    finally:
        committer.close()


def test_loop_waiters_resolve_at_once_without_fsync():
    committer = GroupCommitter(fsync_enabled=False)

    async def main():
        waiter = committer.flush_waiter(SlowLog())
        assert waiter.done() and waiter.result() is None

    asyncio.run(main())
