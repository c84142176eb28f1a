"""Pure parts of the processor without a broker: routing, rate limit, retry headers,
partition contexts (dispatch, blocked keys, resize, offset-map carry-over), lanes."""

from __future__ import annotations

import threading
import time
import zlib

import pytest

from onceflow.processor import Output, ProcessorConfig, Properties, RetryPolicy
from onceflow.processor import retry as retry_mod
from onceflow.processor.lanes import Mailbox, ThreadEngine
from onceflow.processor.metrics import LatencyHistogram, PartitionCounters
from onceflow.processor.partition import PartitionContext
from onceflow.processor.ratelimit import TokenBucket
from onceflow.processor.record import Record, as_outputs
from onceflow.processor.routing import RoundRobin, lane_for_key


def make_ctx(capacity: int = 100, concurrency: int = 4, start: int | None = 0, done=None):
    return PartitionContext(
        "t",
        0,
        max_pending_records=capacity,
        start_offset=start,
        done_ranges=done,
        concurrency=concurrency,
        mailbox=Mailbox(),
        counters=PartitionCounters(),
        latency=LatencyHistogram(),
    )


def records(offsets, key=lambda o: f"k{o % 3}".encode()):
    return [Record("t", 0, o, key(o), value=b"v") for o in offsets]


def test_routing_is_stable_and_keyless_round_robin() -> None:
    # CRC-32 of b"order-42" is 0x57F706DE in every process, unlike the salted hash().
    expected = ((0x57F706DE * 0x9E3779B1) & 0xFFFFFFFF) * 64 >> 32
    assert lane_for_key(b"order-42", 64) == lane_for_key("order-42", 64) == expected
    assert {lane_for_key(str(i).encode(), 8) for i in range(200)} == set(range(8))
    robin = RoundRobin()
    assert [robin.lane(3) for _ in range(7)] == [0, 1, 2, 0, 1, 2, 0]


@pytest.mark.parametrize("partitions, lanes", [(4, 16), (3, 64), (8, 8), (1, 5)])
def test_lanes_are_independent_of_a_crc32_partitioner(partitions: int, lanes: int) -> None:
    # librdkafka's default partitioner is CRC-32 % partitions: every partition must
    # still spread its keys over all of its lanes, evenly.
    per_partition: dict[int, list[int]] = {p: [0] * lanes for p in range(partitions)}
    for i in range(lanes * partitions * 200):
        key = f"key-{i}".encode()
        per_partition[zlib.crc32(key) % partitions][lane_for_key(key, lanes)] += 1
    for counts in per_partition.values():
        mean = sum(counts) / lanes
        assert min(counts) > 0.7 * mean and max(counts) < 1.3 * mean, counts


def test_token_bucket_with_fake_clock() -> None:
    bucket = TokenBucket(rate_per_s=10, now_ms=0, burst=2)
    assert bucket.try_take(0) and bucket.try_take(0)
    assert not bucket.try_take(0)
    assert bucket.wait_ms(0) == 100
    assert not bucket.try_take(99)
    assert bucket.try_take(100)
    # Idle for a long time: no more than `burst` at once.
    assert [bucket.try_take(10_000) for _ in range(3)] == [True, True, False]


def test_dispatch_keeps_key_order_and_spreads_keys() -> None:
    ctx = make_ctx(concurrency=4)
    for record in records(range(30)):
        assert ctx.accept(record)
    batches: list = []
    assert ctx.dispatch(0, frozenset(), batches) is None
    assert sum(len(r) for _, r in batches) == 30
    for lane, lane_records in batches:
        keys = {r.key for r in lane_records}
        for key in keys:
            offsets = [r.offset for r in lane_records if r.key == key]
            assert offsets == sorted(offsets)
        assert all(lane is ctx.lanes[lane_for_key(k, 4)] for k in keys)


def test_blocked_keys_complete_without_running() -> None:
    ctx = make_ctx()
    for record in records(range(9)):
        ctx.accept(record)
    batches: list = []
    ctx.dispatch(0, frozenset({b"k0"}), batches)
    dispatched = [r.offset for _, rs in batches for r in rs]
    assert sorted(dispatched) == [1, 2, 4, 5, 7, 8]
    assert ctx.counters.skipped == 3
    assert ctx.window.incomplete_count == 6


def test_rate_limit_and_retry_backoff_hold_the_queue() -> None:
    ctx = make_ctx()
    ctx.set_rate_limit(10, now_ms=0)  # burst 1
    for record in records(range(3)):
        ctx.accept(record)
    batches: list = []
    assert ctx.dispatch(0, frozenset(), batches) == 100
    assert sum(len(r) for _, r in batches) == 1
    ctx.set_rate_limit(None, now_ms=0)
    held = records([3])[0]
    held._not_before_ms = 500
    ctx.accept(held)
    batches = []
    assert ctx.dispatch(10, frozenset(), batches) == 500
    assert sum(len(r) for _, r in batches) == 2


def test_window_full_refuses_and_counts_pending_max() -> None:
    ctx = make_ctx(capacity=5)
    accepted = [ctx.accept(r) for r in records(range(7))]
    assert accepted == [True] * 5 + [False] * 2
    assert ctx.counters.pending_max == 5


def test_offset_map_ranges_are_skipped_and_carried_into_next_commit() -> None:
    ctx = make_ctx(start=10, done=[(12, 14), (20, 25)])
    for record in records(range(10, 16)):
        ctx.accept(record)
    assert [r.offset for r in ctx.ready] == [10, 11, 14, 15]
    assert ctx.counters.skipped == 2
    position = ctx.commit_position(1024)
    # Watermark 10 (nothing ran yet); 12-13 done in the window; 20-25 carried over.
    assert position.offset == 10
    assert position.covered == [(12, 14), (20, 25)]
    assert position.covers(21) and not position.covers(15)


def test_resize_waits_for_idle_lanes() -> None:
    ctx = make_ctx(concurrency=2)
    ctx.accept(records([0])[0])
    ctx.lanes[0].scheduled = True  # a job is running on lane 0
    ctx.set_concurrency(5)
    batches: list = []
    assert ctx.dispatch(0, frozenset(), batches) is not None
    assert batches == [] and len(ctx.lanes) == 2
    ctx.lanes[0].scheduled = False
    ctx.dispatch(1, frozenset(), batches)
    assert len(ctx.lanes) == 5 and len(batches) == 1


def test_retry_output_then_dead_letter() -> None:
    policy = RetryPolicy(max_attempts=2, backoff_ms=100)
    record = Record("in", 3, 42, b"k", value=b"v", headers=[("user", b"h")])
    output, is_retry = retry_mod.failure_output(record, ValueError("boom"), policy, "g", 1000)
    assert is_retry and output.topic == "g-retry" and output.key == b"k"
    info = retry_mod.parse_retry_headers(output.headers)
    assert (info.topic, info.partition, info.offset, info.attempt) == ("in", 3, 42, 1)
    assert info.not_before_ms == 1100
    assert ("user", b"h") in output.headers
    record.attempt = 2
    output, is_retry = retry_mod.failure_output(record, ValueError("boom"), policy, "g", 1000)
    headers = dict(output.headers)
    assert not is_retry and output.topic == "g-dlq"
    assert headers["onceflow.error-type"] == b"builtins.ValueError"
    assert headers["onceflow.error"] == b"boom"
    assert retry_mod.parse_retry_headers([("onceflow.attempt", b"9" * 100)]) is None


def test_backoff_grows_and_is_capped() -> None:
    policy = RetryPolicy(max_attempts=9, backoff_ms=100, backoff_multiplier=3, backoff_max_ms=1000)
    assert [policy.backoff_for(a) for a in (1, 2, 3, 4)] == [100, 300, 900, 1000]


def test_config_validation() -> None:
    with pytest.raises(ValueError):
        ProcessorConfig(exactly_once=True)
    with pytest.raises(ValueError):
        ProcessorConfig(max_pending_records=0)
    with pytest.raises(ValueError):
        Properties(concurrency=0)
    assert Properties(blocked_keys=frozenset({"a"})).blocked_keys == {b"a"}
    assert ProcessorConfig(max_pending_records=100).resume_pending_records == 75


def test_as_outputs() -> None:
    out = Output("t", b"v")
    assert as_outputs(None) is None
    assert as_outputs(out) == [out]
    assert as_outputs([out, out]) == [out, out]
    assert as_outputs(iter([])) is None
    with pytest.raises(TypeError):
        as_outputs(b"bytes")
    with pytest.raises(TypeError):
        as_outputs([1])


def test_thread_engine_runs_one_record_per_lane_at_a_time_and_defers() -> None:
    mailbox = Mailbox()
    running: dict[int, int] = {}
    overlaps = []
    lock = threading.Lock()

    def handler(record: Record) -> None:
        lane = record.offset % 2
        with lock:
            running[lane] = running.get(lane, 0) + 1
            if running[lane] > 1:
                overlaps.append(record.offset)
        time.sleep(0.001)
        with lock:
            running[lane] -= 1
        if record.offset == 7:
            completion = record.defer()
            threading.Timer(0.01, completion.complete, args=(Output("o", b"x"),)).start()

    engine = ThreadEngine(handler, mailbox, "test")
    engine.set_threads(4)
    ctx = make_ctx(concurrency=2)
    ctx.mailbox = mailbox
    batch = records(range(20))
    for record in batch:
        record._ctx = ctx
    engine.dispatch([(ctx.lanes[0], batch[0::2]), (ctx.lanes[1], batch[1::2])])
    deadline = time.monotonic() + 5
    finished: list[Record] = []
    while len(finished) < 20 and time.monotonic() < deadline:
        while mailbox.finished:
            finished.extend(mailbox.finished.popleft())
        time.sleep(0.005)
    engine.close()
    assert overlaps == []
    assert sorted(r.offset for r in finished) == list(range(20))
    assert [c.record.offset for c in mailbox.deferred] == [7]
    deferred = next(r for r in finished if r.offset == 7)
    assert deferred._outputs == [Output("o", b"x")]
    assert ctx.lanes[0].started + ctx.lanes[1].started == 20
