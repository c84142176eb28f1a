"""The source options Spark's Kafka source has: subscribePattern, assign, timestamps,
minPartitions / maxRecordsPerPartition, minOffsetsPerTrigger + maxTriggerDelay,
groupIdPrefix. Parsing and planning rules are checked as functions; each option is then
checked once end to end with real Spark against the broker, the expected rows coming from
what the test produced."""

from __future__ import annotations

import json
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from onceflow.spark.offsets import SourceOptionError
from onceflow.spark.source_options import (
    GROUP_ID_DEFAULT,
    Subscription,
    TriggerDelay,
    duration_ms,
    parse_options,
    split_ranges,
)
from tests.spark.support import create_topic, unique, wait_for
from tests.spark.test_source import QUERY_TIMEOUT_S, Collector, _produce, _run_available_now, _start

BASE = {"kafka.bootstrap.servers": "127.0.0.1:9"}


# --- parsing and planning rules ------------------------------------------------------------

@pytest.mark.parametrize("options, message", [
    ({}, "one of the options subscribe, subscribePattern, assign is required"),
    ({"subscribe": "a", "subscribePattern": "a.*"}, "only one of the options"),
    ({"subscribePattern": "("}, "not a regular expression"),
    ({"assign": "[0, 1]"}, "option assign: expected JSON like"),
    ({"assign": '{"a": [0, -1]}'}, "topic 'a' needs a non-empty list of partition numbers"),
    ({"subscribe": "a", "startingTimestamp": "yesterday"}, "startingTimestamp must be a timestamp"),
    ({"subscribe": "a", "startingOffsetsByTimestamp": '{"a": {"0": -2}}'}, "timestamp -2 of a-0 is negative"),
    ({"subscribe": "a", "startingOffsetsByTimestamp": "latest"}, "expected JSON like"),
    ({"subscribe": "a", "startingOffsetsByTimestampStrategy": "skip"}, "must be one of error, latest"),
    ({"subscribe": "a", "minOffsetsPerTrigger": "10", "maxOffsetsPerTrigger": "5"},
     r"minOffsetsPerTrigger \(10\) is higher than maxOffsetsPerTrigger \(5\)"),
    ({"subscribe": "a", "maxTriggerDelay": "soon"}, "maxTriggerDelay must be a duration"),
    ({"subscribe": "a", "minPartitions": "0"}, "minPartitions must be a positive integer"),
    ({"subscribe": "a", "groupIdPrefix": " "}, "groupIdPrefix is empty"),
    ({"subscribe": "a", "kafka.interceptor.classes": "x"}, "kafka.interceptor.classes is not allowed"),
    ({"subscribe": "a", "startingOffset": "earliest", "maxOffsetPerTrigger": "9",
      "failOnDataloss": "false"},
     (r"unknown options maxOffsetPerTrigger, startingOffset of onceflow-kafka "
      r"\(did you mean maxOffsetsPerTrigger, startingOffsets\?\)")),
])
def test_bad_options_are_refused_with_the_reason(options, message):
    with pytest.raises(SourceOptionError, match=message):
        parse_options({**BASE, **options}, streaming=True)


def test_option_names_are_case_insensitive_and_timestamps_win_over_offsets():
    options = parse_options({**BASE, "SUBSCRIBEPATTERN": "orders-.*", "startingoffsets": "earliest",
                             "STARTINGTIMESTAMP": "1700000000000", "maxtriggerdelay": "2m",
                             "minoffsetspertrigger": "7"}, streaming=True)
    assert options.subscription == Subscription("subscribePattern", pattern="orders-.*")
    assert options.starting.everywhere == 1_700_000_000_000
    assert (options.min_offsets_per_trigger, options.max_trigger_delay_ms) == (7, 120_000)


def test_group_id_from_kafka_group_id_prefix_or_default():
    assert parse_options({**BASE, "subscribe": "a"}).group_id == GROUP_ID_DEFAULT
    assert parse_options({**BASE, "subscribe": "a", "kafka.group.id": "mine"}).group_id == "mine"
    prefixed = parse_options({**BASE, "subscribe": "a", "groupIdPrefix": "etl"}).group_id
    assert prefixed.startswith("etl-") and prefixed.endswith("-executor")
    assert parse_options({**BASE, "subscribe": "a", "groupIdPrefix": "etl",
                          "kafka.group.id": "mine"}).group_id == "mine"


def test_pattern_and_assign_select_partitions():
    existing = {"orders-eu": [0, 1], "orders-us": [0], "refunds": [0], "__consumer_offsets": [0]}
    assert Subscription("subscribePattern", pattern="orders-.*").select(existing) == [
        ("orders-eu", 0), ("orders-eu", 1), ("orders-us", 0)]
    assert Subscription("subscribePattern", pattern="orders").select(existing) == []  # whole names
    assert Subscription("subscribePattern", pattern=".*").select(existing)[-1] == ("refunds", 0)
    assert Subscription("assign", assigned=(("orders-eu", 1),)).select(existing) == [("orders-eu", 1)]
    with pytest.raises(SourceOptionError, match="partitions orders-us-3 do not exist"):
        Subscription("assign", assigned=(("orders-us", 3),)).select(existing)


def test_durations_as_spark_reads_them():
    assert [duration_ms(t, "d") for t in ("250", "250ms", "10s", "15m", "2min", "1h", "1d")] == [
        250, 250, 10_000, 900_000, 120_000, 3_600_000, 86_400_000]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 1000), st.integers(0, 500)), min_size=1, max_size=8),
       st.one_of(st.none(), st.integers(1, 40)), st.one_of(st.none(), st.integers(1, 300)))
def test_split_ranges_covers_each_range_exactly(spans, min_partitions, max_records):
    ranges = [("t", p, start, start + size) for p, (start, size) in enumerate(spans)]
    pieces = split_ranges(ranges, min_partitions, max_records)
    for topic, partition, start, end in ranges:
        mine = sorted((s, e) for t, p, s, e in pieces if p == partition)
        covered = [offset for s, e in mine for offset in range(s, e)]
        assert covered == list(range(start, end))     # no gap, no overlap, nothing outside
    assert all(e > s for _, _, s, e in pieces)
    if max_records is not None:
        assert all(e - s <= max_records for _, _, s, e in pieces)
    non_empty = [r for r in ranges if r[3] > r[2]]
    if min_partitions is not None and max_records is None and non_empty:
        assert len(pieces) >= min(min_partitions, sum(r[3] - r[2] for r in non_empty)) // 2


def test_trigger_delay_holds_small_backlogs_until_the_delay():
    delay = TriggerDelay(min_offsets=10, max_delay_ms=1_000)
    assert not delay.hold(1, now_ms=50_000)           # the first batch never waits
    assert delay.hold(9, now_ms=50_500)
    assert not delay.hold(10, now_ms=50_600)          # enough waiting
    assert delay.hold(3, now_ms=51_000)
    assert not delay.hold(3, now_ms=51_600)           # the delay since the last batch passed


# --- end to end with Spark -----------------------------------------------------------------

def _read(spark, bootstrap: str, streaming: bool, **options: str):
    reader = (spark.readStream if streaming else spark.read).format("onceflow-kafka")
    reader = reader.option("kafka.bootstrap.servers", bootstrap)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def _values(rows) -> list[bytes]:
    return sorted(bytes(row["value"]) for row in rows)


def test_subscribe_pattern_reads_matching_topics_and_picks_up_new_ones(spark, bootstrap, tmp_path):
    stem = unique("pat")
    first, other = create_topic(bootstrap, f"{stem}-a", 2), create_topic(bootstrap, f"{stem}x-b", 1)
    _produce(bootstrap, first, [(i % 2, None, f"a{i}".encode(), None) for i in range(6)])
    _produce(bootstrap, other, [(0, None, b"not-matched", None)])
    batch = _read(spark, bootstrap, False, subscribePattern=f"{stem}-.*").collect()
    assert _values(batch) == sorted(f"a{i}".encode() for i in range(6))

    collector = Collector()
    query = _start(_read(spark, bootstrap, True, subscribePattern=f"{stem}-.*",
                         startingOffsets="earliest"), tmp_path / "ck", collector)
    try:
        wait_for(lambda: len(collector.rows) == 6, "the existing records", QUERY_TIMEOUT_S)
        later = create_topic(bootstrap, f"{stem}-c", 1)
        _produce(bootstrap, later, [(0, None, b"c0", None), (0, None, b"c1", None)])
        wait_for(lambda: len(collector.rows) == 8, "the new topic's records", QUERY_TIMEOUT_S)
    finally:
        query.stop()
    assert _values(collector.rows) == sorted([*(f"a{i}".encode() for i in range(6)), b"c0", b"c1"])


def test_assign_and_min_partitions(spark, bootstrap):
    topic = create_topic(bootstrap, unique("assign"), 3)
    _produce(bootstrap, topic, [(i % 3, None, f"v{i}".encode(), None) for i in range(30)])
    frame = _read(spark, bootstrap, False, assign=json.dumps({topic: [0, 2]}), minPartitions="6")
    assert frame.rdd.getNumPartitions() == 6
    assert _values(frame.collect()) == sorted(f"v{i}".encode() for i in range(30) if i % 3 != 1)


def test_starting_timestamps_and_their_strategy(spark, bootstrap, tmp_path):
    topic = create_topic(bootstrap, unique("stamp"), 2)
    _produce(bootstrap, topic, [(i % 2, None, f"old{i}".encode(), None) for i in range(4)])
    time.sleep(0.05)
    middle = int(time.time() * 1000)
    time.sleep(0.05)
    _produce(bootstrap, topic, [(i % 2, None, f"new{i}".encode(), None) for i in range(4)])
    newer = sorted(f"new{i}".encode() for i in range(4))
    assert _values(_read(spark, bootstrap, False, subscribe=topic,
                         startingTimestamp=str(middle)).collect()) == newer
    by_partition = json.dumps({topic: {"0": middle, "1": 0}})
    assert _values(_read(spark, bootstrap, False, subscribe=topic,
                         startingOffsetsByTimestamp=by_partition).collect()) == sorted(
        [b"new0", b"new2", b"old1", b"old3", b"new1", b"new3"])   # 0 from `middle`, 1 from 0
    ending = _read(spark, bootstrap, False, subscribe=topic, endingTimestamp=str(middle)).collect()
    assert _values(ending) == sorted(f"old{i}".encode() for i in range(4))

    future = str(int(time.time() * 1000) + 3_600_000)
    with pytest.raises(Exception, match="has a record at or after timestamp"):
        _read(spark, bootstrap, False, subscribe=topic, startingTimestamp=future).collect()
    collector = _run_available_now(_read(spark, bootstrap, True, subscribe=topic, startingTimestamp=future,
                                         startingOffsetsByTimestampStrategy="latest"), tmp_path / "ck")
    assert collector.rows == []


def test_min_offsets_per_trigger_waits_for_a_backlog(spark, bootstrap, tmp_path):
    topic = create_topic(bootstrap, unique("minoff"), 1)
    _produce(bootstrap, topic, [(0, None, f"a{i}".encode(), None) for i in range(3)])
    collector = Collector()
    query = _start(_read(spark, bootstrap, True, subscribe=topic, startingOffsets="earliest",
                         minOffsetsPerTrigger="5", maxTriggerDelay="1h"), tmp_path / "ck", collector)
    try:
        wait_for(lambda: len(collector.rows) == 3, "the first batch (never held)", QUERY_TIMEOUT_S)
        _produce(bootstrap, topic, [(0, None, f"b{i}".encode(), None) for i in range(4)])
        # Four waiting offsets are fewer than five: no batch while the query keeps triggering.
        wait_for(lambda: query.lastProgress is not None, "progress", QUERY_TIMEOUT_S)
        checks = 0
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            assert len(collector.rows) == 3, "a batch ran below minOffsetsPerTrigger"
            checks += 1
            time.sleep(0.2)
        _produce(bootstrap, topic, [(0, None, b"b4", None)])
        wait_for(lambda: len(collector.rows) == 8, "the batch once five wait", QUERY_TIMEOUT_S)
    finally:
        query.stop()
    assert checks > 0 and len(collector.batches) == 2
