"""The issue's "done when" for atomicity=batch: a streaming Kafka -> Kafka query whose output
and write partitioning (repartition(3, uuid)) depend on uuid(), its driver SIGKILLed three
times mid-batch: every input id exactly once in the output, and a read_committed reader
polling all along never sees part of a batch, except while the driver commits it (the
batch's transactions commit one after another) or across a kill that landed inside that
commit. And the same query with atomicity=partition shows the documented limitation.

What is expected comes from the ids the test produced and Spark's own checkpoint (which
input offsets each batch read), never from the sink."""

from __future__ import annotations

import bisect
import contextlib
import random
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, TopicPartition
from pyspark.errors import StreamingQueryException

from onceflow.client import transactions as txns
from onceflow.client.cluster import Cluster
from onceflow.spark import checkpoint as spark_checkpoint
from onceflow.spark.progress import BatchDecision, ProgressLog, decision_key
from tests.spark.support import (
    DriverProcess,
    batches_committed,
    create_topic,
    produce,
    read_committed,
    unique,
    wait_for,
)

DRIVER = Path(__file__).parent / "drivers" / "uuid_to_kafka.py"
INPUT_PARTITIONS, OUTPUT_PARTITIONS = 2, 3
RECORDS_PER_PARTITION = 1_200  # 2,400 records, 400 per micro-batch: room for 3 kills
# A batch seen partly for longer than this, with no kill inside its commit, is not atomic.
# The commit itself takes milliseconds (three EndTxn); the margin is for a loaded machine.
COMMIT_SPAN_MAX_S = 10.0
PREFIX = "onceflow-spark"
INJECTED_ROWS = 600  # two batches of 300; batch 1 fails once  # the sink's default transactionalIdPrefix


class CommittedReader(threading.Thread):
    """A read_committed consumer polling the output during the whole run. After each pass
    it has read everything below the LSOs it asked for at the pass's start: `snapshots`
    holds (time, number of ids seen) at those points; `seen` the ids in arrival order."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        super().__init__(daemon=True)
        self.topic = topic
        self.consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("r"),
                                  "isolation.level": "read_committed",
                                  "enable.auto.commit": False, "enable.partition.eof": True})
        self.consumer.assign([TopicPartition(topic, p, 0) for p in range(OUTPUT_PARTITIONS)])
        self.seen: list[str] = []
        self.snapshots: list[tuple[float, int]] = []  # (monotonic s, ids seen by then)
        self.wall_ms: list[int] = []  # the same snapshots' wall-clock times
        self.halt = threading.Event()
        self.error: Exception | None = None

    def run(self) -> None:
        try:
            while not self.halt.is_set():
                self._pass()
                self.snapshots.append((time.monotonic(), len(self.seen)))
                self.wall_ms.append(int(time.time() * 1000))
                time.sleep(0.02)
        except Exception as error:  # noqa: BLE001 - reported by stop()
            self.error = error
        finally:
            self.consumer.close()

    def _pass(self) -> None:
        ends = {p: self.consumer.get_watermark_offsets(TopicPartition(self.topic, p),
                                                       timeout=10, cached=False)[1]
                for p in range(OUTPUT_PARTITIONS)}
        positions = {tp.partition: tp.offset for tp in self.consumer.position(
            [TopicPartition(self.topic, p) for p in range(OUTPUT_PARTITIONS)])}
        behind = {p for p, end in ends.items() if max(positions[p], 0) < end}
        deadline = time.monotonic() + 60
        while behind:
            assert time.monotonic() < deadline, f"committed reads stuck below {ends}"
            message = self.consumer.poll(0.1)
            if message is None:
                continue
            if message.error():
                assert message.error().code() == KafkaError._PARTITION_EOF, message.error()
            else:
                self.seen.append(message.value().decode().split("|")[0])
            p = message.partition()
            position = self.consumer.position([TopicPartition(self.topic, p)])[0].offset
            if position >= ends[p]:
                behind.discard(p)

    def stop(self) -> None:
        self.halt.set()
        self.join(30)
        assert self.error is None, self.error


def input_ids() -> list[str]:
    return [f"{p}:{i:05d}" for p in range(INPUT_PARTITIONS) for i in range(RECORDS_PER_PARTITION)]


def batches_of(checkpoint: Path, topic: str) -> dict[str, int]:
    """Input id -> the micro-batch that read it, from the offsets Spark checkpointed."""
    batch_of: dict[str, int] = {}
    start = {p: 0 for p in range(INPUT_PARTITIONS)}
    for batch in sorted(batches_committed(checkpoint)):
        ends = spark_checkpoint.read_offsets(checkpoint, batch).source_offsets[0][topic]
        for p in range(INPUT_PARTITIONS):
            end = int(ends[str(p)])
            for offset in range(start[p], end):
                batch_of[f"{p}:{offset:05d}"] = batch
            start[p] = end
    return batch_of


def partial_spans(reader: CommittedReader, batch_of: dict[str, int]) -> dict[int, float]:
    """Batch -> seconds between the first pass that saw part of it and the first that saw
    all of it (only batches ever seen partly)."""
    arrivals: dict[int, list[int]] = defaultdict(list)
    for index, record_id in enumerate(reader.seen):
        arrivals[batch_of[record_id]].append(index)
    sizes = Counter(batch_of.values())
    spans = {}
    for batch, indices in arrivals.items():
        partial_since = None
        for at, count in reader.snapshots:
            seen = bisect.bisect_left(indices, count)
            if 0 < seen < sizes[batch] and partial_since is None:
                partial_since = at
            if seen == sizes[batch]:
                if partial_since is not None:
                    spans[batch] = at - partial_since
                break
    return spans


def seen_before_decided(reader: CommittedReader, batch_of: dict[str, int],
                        decided_ms: dict[int, int]) -> dict[int, int]:
    """Batch -> ms by which a reader saw a row of it before the driver recorded its decision
    (the decision's time is taken before it is written, and nothing commits before)."""
    first_seen: dict[int, int] = {}
    snapshot = 0
    for index, record_id in enumerate(reader.seen):
        while reader.snapshots[snapshot][1] <= index:
            snapshot += 1
        first_seen.setdefault(batch_of[record_id], reader.wall_ms[snapshot])
    return {b: decided_ms[b] - at for b, at in first_seen.items() if at < decided_ms[b]}


def decisions(bootstrap: str, progress_topic: str, query: str) -> dict[int, int]:
    """Batch -> time_ms of the query's recorded decisions (the progress topic is compacted,
    but a test's topic never rolls a segment, so every record is still there)."""
    found = {}
    for record in read_committed(bootstrap, progress_topic):
        if record.key() == decision_key(query):
            decision = BatchDecision.decode(record.value())
            assert decision.batch not in found, f"batch {decision.batch} decided twice"
            found[decision.batch] = decision.time_ms
    return found


def open_transactions(cluster: Cluster, query: str) -> list[str]:
    return [t.transactional_id for t in txns.list_transactions(cluster, states=["Ongoing"])
            if t.transactional_id.startswith(f"{PREFIX}-{query}-")]


@pytest.mark.slow
def test_batch_atomicity_survives_three_driver_kills_with_uuid_partitioning(bootstrap,
                                                                           tmp_path):
    source = create_topic(bootstrap, unique("uuid-in"), partitions=INPUT_PARTITIONS)
    output = create_topic(bootstrap, unique("uuid-out"), partitions=OUTPUT_PARTITIONS)
    ids = input_ids()
    for p in range(INPUT_PARTITIONS):
        produce(bootstrap, source, [(None, i.encode()) for i in ids if i.startswith(f"{p}:")],
                partition=p)
    checkpoint, progress_topic = tmp_path / "ck", unique("progress")
    command = DriverProcess.python(DRIVER, bootstrap, source, output, str(checkpoint), "batch",
                                   progress_topic)
    reader = CommittedReader(bootstrap, output)
    reader.start()
    log = ProgressLog(bootstrap, progress_topic, partitions=4)
    cluster = Cluster.connect(bootstrap)  # kept: the polls below must be quick
    killed: list[int] = []
    try:
        with DriverProcess(command, tmp_path / "driver.log") as driver:
            for round_index in range(3):
                driver.start()
                batch = driver.wait_mid_batch(checkpoint, killed[-1] if killed else -1, 180)
                query = spark_checkpoint.query_id(checkpoint)
                if round_index == 0:  # some tasks prepared, nothing decided
                    wait_for(lambda q=query: open_transactions(cluster, q),
                             f"a prepared transaction of batch {batch}", 120, 0.02)
                elif round_index == 1:  # anywhere in the batch
                    time.sleep(random.uniform(0.0, 1.0))
                else:  # the decision recorded: the commit is under way or done
                    def decided(b=batch, q=query) -> bool:
                        latest = log.latest_decision(q, 30_000)
                        return latest is not None and latest.batch >= b
                    wait_for(decided, f"the decision of batch {batch}", 120, 0.02)
                driver.kill()
                killed.append(batch)
            driver.start()
            assert driver.wait(timeout_s=240) == 0, driver.tail()
        assert open_transactions(cluster, spark_checkpoint.query_id(checkpoint)) == []
    finally:
        log.close()
        cluster.close()
        reader.stop()
    final = Counter(r.value().decode().split("|")[0] for r in read_committed(bootstrap, output))
    assert set(final) == set(ids), f"missing {len(set(ids) - set(final))}; kills {killed}"
    assert not [i for i, n in final.items() if n > 1], f"ids written twice; kills {killed}"
    batch_of = batches_of(checkpoint, source)
    assert set(batch_of) == set(ids) and len(set(batch_of.values())) >= 6
    decided_ms = decisions(bootstrap, progress_topic, spark_checkpoint.query_id(checkpoint))
    assert set(decided_ms) >= set(batch_of.values()), (sorted(decided_ms), killed)
    early = seen_before_decided(reader, batch_of, decided_ms)
    assert not early, f"rows seen before their batch was decided (ms early): {early}"
    spans = partial_spans(reader, batch_of)
    too_long = {b: s for b, s in spans.items() if s > COMMIT_SPAN_MAX_S and b not in killed}
    assert not too_long, f"batches seen partly (seconds): {too_long}; kills {killed}"
    assert reader.snapshots and Counter(reader.seen) == final  # the reader saw it all


def _failing_until(released: str, fail_batch: int):
    """A UDF passing values through, that fails every attempt of write partition 2 of
    `fail_batch` until the file `released` exists - its first attempt only after its
    siblings had the time to finish (local[2] runs partitions 0 and 1 first) - so the
    query fails (the session retries a task as a cluster would) with those committed."""
    from pyspark.sql.functions import udf

    def check(value):
        import os
        import time as time_

        from pyspark import TaskContext

        context = TaskContext.get()
        batch = int(context.getLocalProperty("streaming.sql.batchId"))
        if context.partitionId() == 2 and batch == fail_batch and not os.path.exists(released):
            if context.attemptNumber() == 0:
                time_.sleep(3)
            raise RuntimeError("injected failure of write partition 2")
        return value

    return udf(check, "string")


def _run_with_a_failed_task(spark, bootstrap: str, tmp_path: Path, atomicity: str) -> Counter:
    """The uuid pipeline, its batch 1 failing in one of three write partitions after the
    other two finished, then restarted from the checkpoint (Spark replays batch 1)."""
    source = create_topic(bootstrap, unique("uuid-in"), partitions=1)
    output = create_topic(bootstrap, unique("uuid-out"), partitions=OUTPUT_PARTITIONS)
    ids = [f"0:{i:05d}" for i in range(INJECTED_ROWS)]
    produce(bootstrap, source, [(None, i.encode()) for i in ids], partition=0)
    released = tmp_path / "released"
    check = _failing_until(str(released), fail_batch=1)
    progress_topic = unique("progress")

    def run():
        frame = (spark.readStream.format("onceflow-kafka")
                 .option("kafka.bootstrap.servers", bootstrap).option("subscribe", source)
                 .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", "300")
                 .load()
                 .selectExpr("CAST(value AS STRING) AS id", "uuid() AS u")
                 .repartition(3, "u")
                 .select(check("id").alias("id"), "u")
                 .selectExpr("concat(id, '|', u) AS value"))
        query = (frame.writeStream.format("onceflow-kafka")
                 .option("kafka.bootstrap.servers", bootstrap).option("topic", output)
                 .option("atomicity", atomicity).option("progressTopic", progress_topic)
                 .option("checkpointLocation", str(tmp_path / "ck"))
                 .trigger(availableNow=True).start())
        with contextlib.suppress(StreamingQueryException):  # the injected failure
            query.awaitTermination(120)
        return query

    failed = run()
    assert failed.exception() is not None and "injected failure" in str(failed.exception())
    released.touch()
    again = run()
    assert again.exception() is None, again.exception()
    return Counter(r.value().decode().split("|")[0] for r in read_committed(bootstrap, output))


def test_partition_atomicity_loses_and_doubles_rows_of_a_replayed_uuid_batch(
        spark, bootstrap, tmp_path):
    """The documented limitation (docs/spark-kafka-sink.md): a replay skips the partitions
    that committed, but uuid() gave them other rows this time."""
    seen = _run_with_a_failed_task(spark, bootstrap, tmp_path, "partition")
    expected = {f"0:{i:05d}" for i in range(INJECTED_ROWS)}
    missing = expected - set(seen)
    doubled = {i for i, n in seen.items() if n > 1}
    assert missing and doubled, (len(missing), len(doubled))
    assert set(seen) <= expected


def test_batch_atomicity_writes_a_replayed_uuid_batch_exactly_once(spark, bootstrap, tmp_path):
    seen = _run_with_a_failed_task(spark, bootstrap, tmp_path, "batch")
    assert seen == Counter({f"0:{i:05d}": 1 for i in range(INJECTED_ROWS)})
