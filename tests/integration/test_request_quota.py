"""The request_percentage quota enforced (issue 15): the loop time of a request's handler
counted as Kafka's ClientRequestQuotaManager counts request-thread time, then a real
confluent-kafka producer that sends many requests throttled under a low quota and never
throttled without one; and a consumer's fetch capped to what its consumer_byte_rate
allows in one quota window, as KafkaApis caps it."""

from __future__ import annotations

import asyncio
import time

from confluent_kafka import Producer

from onceflow import Broker
from onceflow.broker.quotas import ClientQuotas, LoopTimer
from onceflow.protocol.records import SimpleRecord, build_batch
from tests.helpers import create_topic, unique
from tests.integration.test_client_quotas import SMALL, alter
from tests.integration.test_fetch_sessions import _answered, _fetch
from tests.integration.test_fetch_topic_ids import topic_id
from tests.kafka_raw import RawClient

BUSY_S = 0.02
WAIT_S = 1.0
# A quota so low that a few dozen Produce requests exceed it: 0.001 % of one thread over
# the 10 s window is 100 us of handler time in all.
TINY_PERCENTAGE = 0.001
REQUESTS_MAX = 2_000
DEADLINE_S = 30.0


def test_loop_timer_counts_the_steps_and_not_the_waits():
    async def handler() -> str:
        started = time.perf_counter()
        while time.perf_counter() - started < BUSY_S:
            pass
        await asyncio.sleep(WAIT_S)
        return "answer"

    async def run() -> tuple[str, int]:
        timer = LoopTimer(handler())
        return await timer, timer.busy_ns

    answer, busy_ns = asyncio.run(run())
    assert answer == "answer"
    assert BUSY_S * 1e9 <= busy_ns < WAIT_S * 1e9 / 2


def test_loop_timer_passes_exceptions_and_cancellation_through():
    async def failing() -> None:
        await asyncio.sleep(0)
        raise ValueError("handler bug")

    async def waiting() -> None:
        await asyncio.sleep(60)

    async def run() -> tuple[bool, bool]:
        try:
            await LoopTimer(failing())
        except ValueError:
            failed = True
        task = asyncio.ensure_future(LoopTimer(waiting()))
        await asyncio.sleep(0)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            return failed, True
        return failed, False

    assert asyncio.run(run()) == (True, True)


def test_request_time_throttle_is_bounded_by_one_window_sample(tmp_path):
    quotas = ClientQuotas(tmp_path / "q", {(("client-id", "app"),): {"request_percentage": 1.0}})
    assert quotas.record_request_time("u", "app", 50_000_000, now_s=100.0) == 0  # 0.5 % of 10 s
    # 5 s of loop time in one request: far over, but Kafka throttles at most 1 s at a time.
    assert quotas.record_request_time("u", "app", 5_000_000_000, now_s=100.5) == 1000
    assert quotas.record_request_time("u", "other", 5_000_000_000, now_s=100.5) == 0


def _produce_one_at_a_time(bootstrap: str, topic: str, client_id: str, requests: int,
                           stop_when_throttled: bool) -> tuple[int, list[int]]:
    """Produce `requests` records, each in its own request; the requests sent and the
    throttle times librdkafka reported (throttle_cb)."""
    throttles: list[int] = []
    producer = Producer({"bootstrap.servers": bootstrap, "client.id": client_id,
                         "linger.ms": 0, "acks": "all",
                         "throttle_cb": lambda event: throttles.append(
                             round(event.throttle_time * 1000))})
    deadline = time.monotonic() + DEADLINE_S
    sent = 0
    while sent < requests and time.monotonic() < deadline:
        producer.produce(topic, b"v")
        assert producer.flush(DEADLINE_S) == 0
        producer.poll(0)
        sent += 1
        if stop_when_throttled and any(throttles):
            break
    producer.flush(DEADLINE_S)
    producer.poll(0)
    return sent, throttles


def test_a_low_request_percentage_throttles_a_busy_client_and_only_it(tmp_path):
    with Broker(tmp_path / "data", **SMALL) as broker:
        topic = create_topic(broker.bootstrap_servers, unique("reqquota"))
        limited, free = unique("limited"), unique("free")
        with RawClient(broker.bootstrap_servers) as raw:
            assert alter(raw, {"client-id": limited},
                         {"request_percentage": TINY_PERCENTAGE})[0] == 0
        sent, throttles = _produce_one_at_a_time(broker.bootstrap_servers, topic, limited,
                                                 REQUESTS_MAX, stop_when_throttled=True)
        assert any(throttles), f"no throttle time after {sent} requests"
        assert max(throttles) <= 1000   # one window sample at most, as Kafka bounds it
        # The same load from a client without a quota is never throttled.
        _sent, free_throttles = _produce_one_at_a_time(
            broker.bootstrap_servers, topic, free, max(2 * sent, 50), stop_when_throttled=False)
        assert not any(free_throttles), free_throttles


FETCH_QUOTA_BYTES_S = 1_000
# Kafka's getMaxValueInQuotaWindow: the quota times (quota.window.num - 1) window samples.
FETCH_WINDOW_BYTES = FETCH_QUOTA_BYTES_S * 10
BATCH_VALUE_BYTES = 3_000
BATCHES = 10


def test_a_consumer_fetch_is_capped_to_its_quota_window(tmp_path):
    with Broker(tmp_path / "data", **SMALL) as broker:
        bootstrap = broker.bootstrap_servers
        topic = create_topic(bootstrap, unique("fetchcap"))
        tid = topic_id(bootstrap, topic)
        capped = unique("capped")
        with RawClient(bootstrap) as raw:
            for _ in range(BATCHES):
                response = raw.request(0, 9, {
                    "transactional_id": None, "acks": -1, "timeout": 5000, "topic_data": [{
                        "name": topic, "partition_data": [{"index": 0, "records": build_batch(
                            [SimpleRecord(key=None, value=b"v" * BATCH_VALUE_BYTES)])}]}]})
                assert response.responses[0].partition_responses[0].error_code == 0
            assert alter(raw, {"client-id": capped},
                         {"consumer_byte_rate": float(FETCH_QUOTA_BYTES_S)})[0] == 0
        with RawClient(bootstrap, client_id=capped) as client:
            capped_bytes = _answered(_fetch(client, tid, 0, -1, {0: 0}))[0]
            # Over the quota now: Kafka answers the next fetch (here one that would create
            # a session) with its throttle time and no records, creates no session, and
            # takes back the bytes it did not send (so one later fetch is not punished
            # for them).
            throttled = _fetch(client, tid, 0, 0, {0: 0})
            assert throttled.throttle_time.total_seconds() > 0
            assert throttled.responses == () and throttled.session_id == 0
            quotas = broker.server.state.quotas
            window = next(w for (key, *_), w in quotas._windows.items()
                          if key == "consumer_byte_rate")
            recorded = sum(total for _start, total in window._buckets)
            assert recorded == capped_bytes, (recorded, capped_bytes)
        with RawClient(bootstrap, client_id=unique("free")) as client:
            free_bytes = _answered(_fetch(client, tid, 0, -1, {0: 0}))[0]
    # Whole batches up to the window's bytes (the first batch always, KIP-74).
    assert BATCH_VALUE_BYTES <= capped_bytes <= FETCH_WINDOW_BYTES, capped_bytes
    assert free_bytes > BATCHES * BATCH_VALUE_BYTES, free_bytes
