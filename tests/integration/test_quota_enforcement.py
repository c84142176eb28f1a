"""Client byte-rate quotas enforced (issue 15): the rate window and the eight levels of
Kafka's quota resolution as functions, then a real confluent-kafka producer held to its
producer_byte_rate, with the throttle times reported to the client."""

from __future__ import annotations

import json
import time

import pytest
from confluent_kafka import Producer

from onceflow import Broker
from onceflow.broker.quotas import ClientQuotas, RateWindow
from tests.helpers import create_topic, unique
from tests.integration.test_client_quotas import SMALL, alter
from tests.kafka_raw import RawClient

QUOTA_BYTES_S = 1_000_000
# Kafka's window (quota.window.num 11 x 1 s): a new client may send (11 - 1) s worth of
# quota at once, is then throttled until that burst leaves the window 11 s later, sends
# again, and so on: the rate holds over whole windows, not within one. Measured over one
# whole window from half a second before the second burst (11 s after the first).
SETTLE_S = 10.5
MEASURE_S = 11.0
VALUE_BYTES = 10_000    # large records: the request's framing is about 1 % of its size


def test_rate_window_counts_at_least_the_full_windows():
    window = RateWindow(samples=11, window_s=1.0)
    window.record(5_000, now_s=100.0)
    assert window.window_size_s(100.0) == 10.0          # a first burst is spread over 10 s
    assert window.rate(100.0) == 500.0
    window.record(5_000, now_s=112.5)                    # the first bucket has left the window
    assert window.rate(112.5) == 500.0
    for second in range(20):
        window.record(1_000, now_s=200.0 + second)
    assert window.rate(219.0) == pytest.approx(1_000, rel=0.1)


def test_the_most_specific_quota_applies_with_kafka_metric_tags(tmp_path):
    def quotas(*entries):
        return ClientQuotas(tmp_path / "q", {tuple(sorted(e.items())): {"producer_byte_rate": v}
                                             for e, v in entries})

    everything = quotas(({"user": "alice", "client-id": "app"}, 1), ({"user": "alice"}, 3),
                        ({"user": None}, 6), ({"client-id": "app"}, 7), ({"client-id": None}, 8))
    assert everything.bound("producer_byte_rate", "alice", "app") == (1, ("alice", "app"))
    assert everything.bound("producer_byte_rate", "alice", "other") == (3, ("alice", ""))
    assert everything.bound("producer_byte_rate", "bob", "app") == (6, ("bob", ""))
    client_level = quotas(({"client-id": "app"}, 7), ({"client-id": None}, 8))
    assert client_level.bound("producer_byte_rate", "bob", "app") == (7, ("", "app"))
    assert client_level.bound("producer_byte_rate", "bob", "x") == (8, ("", "x"))
    assert client_level.bound("consumer_byte_rate", "bob", "x") is None


def test_produce_quota_holds_a_fast_producer_to_its_rate(tmp_path):
    with Broker(tmp_path / "data", **SMALL) as broker:
        topic = create_topic(broker.bootstrap_servers, unique("quota"))
        client_id = unique("fast")
        with RawClient(broker.bootstrap_servers) as raw:
            assert alter(raw, {"client-id": client_id},
                         {"producer_byte_rate": float(QUOTA_BYTES_S)})[0] == 0
        throttles: list[int] = []

        def stats(text: str) -> None:
            for node in json.loads(text)["brokers"].values():
                if node.get("nodeid", -1) >= 0 and node["throttle"]["cnt"]:
                    throttles.append(node["throttle"]["max"])

        acked: list[tuple[float, int]] = []
        # One request of about 100 kB at a time: each is throttled on its own, so the
        # delivered rate is smooth enough to measure over a few seconds (Kafka reads one
        # request per connection at a time; onceflow reads ahead, so a pipelined burst
        # would be throttled as a whole, in one long pause).
        producer = Producer({"bootstrap.servers": broker.bootstrap_servers, "client.id": client_id,
                             "linger.ms": 5, "acks": "all", "batch.size": 100_000,
                             "max.in.flight.requests.per.connection": 1,
                             "statistics.interval.ms": 500, "stats_cb": stats,
                             "queue.buffering.max.kbytes": 2048})
        value = b"v" * VALUE_BYTES
        started = time.monotonic()

        def delivered(error, message) -> None:
            assert error is None, error
            acked.append((time.monotonic() - started, len(message.value())))

        while time.monotonic() - started < SETTLE_S + MEASURE_S + 1:
            try:
                producer.produce(topic, value, on_delivery=delivered)
            except BufferError:   # the client's queue is full: it is being held back
                producer.poll(0.05)
            producer.poll(0)
        producer.flush(30)
    first = acked[0][0] + SETTLE_S
    window = [size for at, size in acked if first <= at < first + MEASURE_S]
    rate = sum(window) / MEASURE_S
    assert rate == pytest.approx(QUOTA_BYTES_S, rel=0.10), f"{rate:,.0f} B/s, quota {QUOTA_BYTES_S:,}"
    assert throttles and max(throttles) > 0, "librdkafka saw no throttle time"
