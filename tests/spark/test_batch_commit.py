"""atomicity=batch (onceflow.spark.batch_commit): prepared task transactions, the driver's
recorded decision, recovery of a decision made by a run that died, and the abort of
transactions no decision names - on a real broker, with and without KIP-939.

The task code runs in this process (as test_kafka_sink's zombie test does); what the tests
expect comes from the values they wrote and a plain read_committed consumer."""

from __future__ import annotations

import time

import pyarrow as pa
import pytest
from pyspark.sql.types import StringType, StructType

from onceflow.client import transactions as txns
from onceflow.client.cluster import Cluster
from onceflow.spark import batch_commit
from onceflow.spark.kafka_sink import (
    KafkaBatchWriter,
    KafkaCommitMessage,
    TransactionalWriter,
    close_cached_clients,
    progress_log,
)
from onceflow.spark.kafka_sink_options import SinkOptionError, parse_options, row_layout
from onceflow.spark.progress import BatchDecision
from tests.spark.support import create_topic, read_committed, unique, wait_for

PATHS = {"kip939": batch_commit.PATH_KIP_939, "epoch": batch_commit.PATH_EPOCH}


@pytest.fixture(scope="module")
def two_pc_bootstrap():
    from onceflow.broker.embedded import Broker

    with Broker(transaction_two_phase_commit_enable=True,
                transaction_state_num_partitions=4) as broker:
        yield broker.bootstrap_servers


@pytest.fixture(params=sorted(PATHS))
def setup(request, bootstrap, two_pc_bootstrap):
    """(bootstrap, options, layout, expected path): KIP-939 on a broker that allows it, the
    by-epoch path on one that does not (the session broker: 2PC off, as Kafka's default)."""
    servers = two_pc_bootstrap if request.param == "kip939" else bootstrap
    output = create_topic(servers, unique("batch-out"), partitions=3)
    options = parse_options({"kafka.bootstrap.servers": servers, "topic": output,
                             "atomicity": "batch", "progressTopic": unique("progress"),
                             "progressTopicPartitions": "2"})
    layout = row_layout(StructType().add("value", StringType()), options.topic)
    yield servers, options, layout, PATHS[request.param]
    close_cached_clients()


def prepare(options, layout, query: str, batch: int, partition: int,
            values: list[str]) -> KafkaCommitMessage:
    rows = pa.record_batch([pa.array(values, pa.string())], names=["value"])
    return batch_commit.write_prepared(options, layout, query, partition, batch, iter([rows]),
                                       TransactionalWriter, KafkaCommitMessage)


def values_of(servers: str, topic: str) -> list[str]:
    return sorted(r.value().decode() for r in read_committed(servers, topic))


def open_transactions(servers: str, options, query: str) -> list[str]:
    prefix = batch_commit.query_prefix(options, query)
    with Cluster.connect(servers) as cluster:
        return [t.transactional_id for t in txns.list_transactions(cluster, states=["Ongoing"])
                if t.transactional_id.startswith(prefix)]


def batch_values(batch: int, tag: str, partitions: int = 3, rows: int = 20) -> list[list[str]]:
    return [[f"b{batch}-{tag}-p{p}-{i}" for i in range(rows)] for p in range(partitions)]


def test_a_batch_becomes_visible_only_when_the_driver_commits_it(setup):
    servers, options, layout, path = setup
    query = unique("q")
    written = batch_values(0, "run1")
    messages = [prepare(options, layout, query, 0, p, v) for p, v in enumerate(written)]
    assert {(m.outcome, m.path, m.query) for m in messages} == {("prepared", path, query)}
    time.sleep(0.5)  # the rows are on the partitions: still nothing visible
    assert values_of(servers, options.topic) == []
    outcome = batch_commit.BatchCommitter(options).commit(messages, 0, progress_log(options))
    assert "committed 3 transactions" in outcome
    expected = sorted(v for vs in written for v in vs)
    wait_for(lambda: values_of(servers, options.topic) == expected, "the batch's rows", 30)
    decision = progress_log(options).latest_decision(query, 30_000)
    assert (decision.batch, {t for t, _, _ in decision.transactions}) == (
        0, {m.transactional_id for m in messages})
    assert open_transactions(servers, options, query) == []
    # Spark may call commit again for the same batch: nothing changes
    again = batch_commit.BatchCommitter(options).commit(messages, 0, progress_log(options))
    assert "completed its 3 transactions, aborted 0 of this run" in again
    assert values_of(servers, options.topic) == expected


def test_a_decided_batch_is_completed_by_the_next_run_and_its_replay_aborted(setup):
    servers, options, layout, _ = setup
    query, log = unique("q"), None
    log = progress_log(options)
    first = [prepare(options, layout, query, 1, p, v)
             for p, v in enumerate(batch_values(1, "run1"))]
    # The first driver recorded its decision and died before committing anything.
    log.record_decision(BatchDecision(query, 1, tuple(batch_commit._txn(m) for m in first),
                                      int(time.time() * 1000)))
    assert values_of(servers, options.topic) == []
    # Restarted, Spark replays batch 1; a non-deterministic transformation gives other rows.
    replay = [prepare(options, layout, query, 1, p, v)
              for p, v in enumerate(batch_values(1, "run2"))]
    outcome = batch_commit.BatchCommitter(options).commit(replay, 1, log)
    assert "decided by an earlier run" in outcome
    expected = sorted(v for vs in batch_values(1, "run1") for v in vs)
    wait_for(lambda: values_of(servers, options.topic) == expected, "the decided rows", 30)
    wait_for(lambda: open_transactions(servers, options, query) == [], "no open transaction", 30)
    assert values_of(servers, options.topic) == expected  # the replay's rows never show


def test_failed_attempts_are_aborted_and_spark_abort_aborts_the_batch(setup):
    servers, options, layout, _ = setup
    query = unique("q")
    committer = batch_commit.BatchCommitter(options)
    prepare(options, layout, query, 2, 0, ["failed-attempt"])  # its task then died
    good = [prepare(options, layout, query, 2, p, v)
            for p, v in enumerate(batch_values(2, "ok"))]
    assert "aborted 1 left open" in committer.commit(good, 2, progress_log(options))
    expected = sorted(v for vs in batch_values(2, "ok") for v in vs)
    wait_for(lambda: values_of(servers, options.topic) == expected, "the batch's rows", 30)
    given_up = [prepare(options, layout, query, 3, p, v)
                for p, v in enumerate(batch_values(3, "given-up"))]
    committer.abort(given_up)
    wait_for(lambda: open_transactions(servers, options, query) == [], "no open transaction", 30)
    assert values_of(servers, options.topic) == expected


def test_batch_options_are_checked():
    base = {"kafka.bootstrap.servers": "x:1", "topic": "t"}
    assert parse_options(base).atomicity == "partition"
    batch = parse_options({**base, "Atomicity": "batch"})
    assert (batch.atomicity, batch.two_phase_commit) == ("batch", "auto")
    assert batch.transaction_timeout_ms == 900_000
    with pytest.raises(SinkOptionError, match="atomicity='task' is not one of partition, batch"):
        parse_options({**base, "atomicity": "task"})
    with pytest.raises(SinkOptionError, match="twoPhaseCommit"):
        parse_options({**base, "twoPhaseCommit": "maybe"})
    with pytest.raises(SinkOptionError, match="atomicity=batch needs exactlyOnce=true"):
        parse_options({**base, "atomicity": "batch", "exactlyOnce": "false"})
    with pytest.raises(SinkOptionError, match="atomicity=batch is for streaming writes"):
        KafkaBatchWriter({**base, "atomicity": "batch"}, StructType().add("value", StringType()))

