"""`onceflow txn ...` and `onceflow producers describe` against a real broker, with real
transactional producers (confluent-kafka)."""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, Producer, TopicPartition

from onceflow.protocol.apis import ApiKey, is_supported
from onceflow.protocol.records import SimpleRecord, build_batch, iter_batches
from tests.cli.helpers import assert_one_line_error, table_rows

TIMEOUT_S = 15.0
WIDE = {"COLUMNS": "250"}  # rich tables unwrapped, one line per row
# A producer id far above any the broker hands out: no coordinator knows it.
UNKNOWN_PRODUCER_ID = 10**15
HOUR_MS = 3_600_000


@pytest.fixture
def transactional() -> Iterator:
    """`transactional(bootstrap)`: a confluent-kafka producer with a fresh transactional id,
    initialised. Aborted at the end if a transaction is still open."""
    producers: list[Producer] = []

    def make(bootstrap: str) -> tuple[Producer, str]:
        transactional_id = f"cli-txn-{uuid.uuid4().hex[:8]}"
        producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": transactional_id})
        producer.init_transactions(TIMEOUT_S)
        producers.append(producer)
        return producer, transactional_id

    yield make
    for producer in producers:
        with contextlib.suppress(KafkaException):  # nothing open, which is fine
            producer.abort_transaction(TIMEOUT_S)
    producers.clear()  # destroyed now, while the broker still runs


def open_transaction(producer: Producer, topic: str, partition: int, records: int = 3) -> None:
    producer.begin_transaction()
    for i in range(records):
        producer.produce(topic, value=f"v{i}".encode(), partition=partition)
    assert producer.flush(TIMEOUT_S) == 0


def rows_by_first_cell(output: str) -> dict[str, list[str]]:
    return {row[0]: row for row in table_rows(output) if row}


def field_values(output: str) -> dict[str, str]:
    """`txn describe`'s field/value table as a dict."""
    return {row[0]: row[1] for row in table_rows(output) if len(row) == 2}


def append_hanging_batch(broker, topic: str, partition: int) -> int:
    """A transactional batch from a producer id no coordinator knows, last written an hour
    ago: a hanging transaction. Clients cannot make one (the broker checks with the
    coordinator that the partition is in the producer's transaction), so it is appended
    on the broker's loop the way Produce appends. Returns its offset."""
    written_ms = int(time.time() * 1000) - HOUR_MS
    batch = build_batch([SimpleRecord(key=None, value=b"hanging")], base_timestamp_ms=written_ms,
                        producer_id=UNKNOWN_PRODUCER_ID, producer_epoch=0, base_sequence=0,
                        transactional=True)
    header, view = next(iter_batches(batch))

    def append() -> int:
        state = broker.server.state.partition(topic, partition)
        return state.append([header], [view], int(time.time() * 1000)).first_offset

    return broker.call(append)


# ---------------------------------------------------------------- list, describe


def test_list_and_describe_show_open_and_committed_transactions(onceflow, bootstrap, make_topic,
                                                                 transactional):
    topic = make_topic(partitions=2)
    open_producer, open_id = transactional(bootstrap)
    done_producer, done_id = transactional(bootstrap)
    open_transaction(open_producer, topic, 0)
    open_transaction(done_producer, topic, 1)
    done_producer.commit_transaction(TIMEOUT_S)

    listed = onceflow("txn", "list", "-b", bootstrap, env=WIDE)
    assert listed.exit_code == 0, listed.output
    rows = rows_by_first_cell(listed.stdout)
    assert rows[open_id][3] == "Ongoing" and rows[done_id][3] == "CompleteCommit"
    ongoing = onceflow("txn", "list", "--state", "Ongoing", "-b", bootstrap, env=WIDE)
    assert open_id in rows_by_first_cell(ongoing.stdout)
    assert done_id not in rows_by_first_cell(ongoing.stdout)

    described = onceflow("txn", "describe", open_id, "-b", bootstrap, env=WIDE)
    assert described.exit_code == 0, described.output
    fields = field_values(described.stdout)
    assert fields["state"] == "Ongoing" and fields["partitions"] == f"{topic}:0"
    assert fields["producer id"] == rows[open_id][2]
    assert int(fields["open for ms"]) >= 0

    open_producer.commit_transaction(TIMEOUT_S)
    fields = field_values(onceflow("txn", "describe", open_id, "-b", bootstrap, env=WIDE).stdout)
    assert fields["state"] == "CompleteCommit" and fields["open for ms"] == "-"


def test_describe_a_transactional_id_without_a_transaction_yet(onceflow, bootstrap, transactional):
    _producer, transactional_id = transactional(bootstrap)  # initialised, nothing begun
    result = onceflow("txn", "describe", transactional_id, "-b", bootstrap, env=WIDE)
    assert result.exit_code == 0, result.output
    fields = field_values(result.stdout)
    assert fields["state"] == "Empty" and fields["producer epoch"] == "0"
    assert fields["started at ms"] == "-" and fields["partitions"] == "-"  # the broker sent -1


def test_describe_unknown_transactional_id_is_one_line(onceflow, bootstrap):
    result = onceflow("txn", "describe", "no-such-transactional-id", "-b", bootstrap)
    assert_one_line_error(result, "unknown transactional id 'no-such-transactional-id'")


def test_list_with_producer_id_filter(onceflow, bootstrap, make_topic, transactional):
    topic = make_topic()
    producer, transactional_id = transactional(bootstrap)
    open_transaction(producer, topic, 0)
    producer.commit_transaction(TIMEOUT_S)
    producer_id = rows_by_first_cell(
        onceflow("txn", "list", "-b", bootstrap, env=WIDE).stdout)[transactional_id][2]
    only = onceflow("txn", "list", "--producer-id", producer_id, "-b", bootstrap, env=WIDE)
    assert list(rows_by_first_cell(only.stdout)) == [transactional_id]


def test_list_older_than_filters_by_how_long_the_transaction_is_open(onceflow, bootstrap,
                                                                    make_topic, transactional):
    topic = make_topic()
    producer, transactional_id = transactional(bootstrap)
    open_transaction(producer, topic, 0)
    time.sleep(0.05)
    old = onceflow("txn", "list", "--older-than-ms", "10", "-b", bootstrap, env=WIDE)
    assert transactional_id in rows_by_first_cell(old.stdout), old.output
    young = onceflow("txn", "list", "--older-than-ms", str(HOUR_MS), "-b", bootstrap, env=WIDE)
    assert transactional_id not in rows_by_first_cell(young.stdout)


# ---------------------------------------------------------------- producers describe


def test_producers_describe_shows_the_open_transaction_holding_the_lso(onceflow, bootstrap,
                                                                      make_topic, transactional):
    topic = make_topic()
    plain = Producer({"bootstrap.servers": bootstrap})
    for _ in range(4):
        plain.produce(topic, value=b"before", partition=0)
    assert plain.flush(TIMEOUT_S) == 0
    producer, _ = transactional(bootstrap)
    open_transaction(producer, topic, 0, records=3)

    result = onceflow("producers", "describe", topic, "0", "-b", bootstrap, env=WIDE)
    assert result.exit_code == 0, result.output
    (row,) = table_rows(result.stdout)
    assert row[5] == "4"  # the open transaction starts after the 4 plain records
    assert row[3] == "2"  # last sequence: 3 records from sequence 0
    assert "log end 7, last stable offset 4" in result.stdout

    producer.commit_transaction(TIMEOUT_S)
    after = onceflow("producers", "describe", topic, "0", "-b", bootstrap, env=WIDE)
    (row,) = table_rows(after.stdout)
    assert row[5] == "-"
    assert "log end 8, last stable offset 8" in after.stdout  # the COMMIT marker: offset 7


def test_producers_describe_unknown_topic_or_partition_is_one_line(onceflow, bootstrap,
                                                                   make_topic):
    assert_one_line_error(onceflow("producers", "describe", "no-such-topic", "0", "-b", bootstrap),
                          "unknown topic 'no-such-topic'")
    topic = make_topic()
    assert_one_line_error(onceflow("producers", "describe", topic, "3", "-b", bootstrap),
                          f"topic '{topic}' has no partition 3")


# ---------------------------------------------------------------- hanging transactions


def test_find_hanging_reports_only_transactions_no_coordinator_will_end(
        onceflow, bootstrap, onceflow_broker, make_topic, transactional):
    topic = make_topic(partitions=2)
    live, _ = transactional(bootstrap)
    open_transaction(live, topic, 1)  # open, but its coordinator will end it
    offset = append_hanging_batch(onceflow_broker, topic, 0)

    result = onceflow("txn", "find-hanging", "--topic", topic, "--older-than-ms", "0",
                      "-b", bootstrap, env=WIDE)
    assert result.exit_code == 0, result.output
    (row,) = table_rows(result.stdout)
    assert row[:3] == [topic, "0", str(UNKNOWN_PRODUCER_ID)]
    assert row[5] == str(offset) and row[6] == str(offset)  # it holds the LSO at its start
    assert row[8] == "-" and "no coordinator knows" in row[9]
    assert f"--topic {topic} --partition 0 --start-offset {offset}" in result.stdout

    recent = onceflow("txn", "find-hanging", "--topic", topic, "--older-than-ms",
                      str(2 * HOUR_MS), "-b", bootstrap, env=WIDE)
    assert table_rows(recent.stdout) == [] and "0 hanging transactions" in recent.stdout


def test_find_hanging_default_age_is_the_max_transaction_timeout(onceflow, bootstrap,
                                                                 onceflow_broker, make_topic):
    topic = make_topic()
    append_hanging_batch(onceflow_broker, topic, 0)  # an hour old: older than 15 minutes
    result = onceflow("txn", "find-hanging", "--topic", topic, "--partition", "0",
                      "-b", bootstrap, env=WIDE)
    assert len(table_rows(result.stdout)) == 1, result.output


def test_find_hanging_partition_needs_topic(onceflow, bootstrap):
    assert_one_line_error(onceflow("txn", "find-hanging", "--partition", "0", "-b", bootstrap),
                          "--partition needs --topic")


# ---------------------------------------------------------------- abort


@pytest.mark.skipif(not is_supported(ApiKey.WRITE_TXN_MARKERS, 1),
                    reason="the broker does not accept WriteTxnMarkers from clients yet")
def test_abort_ends_a_hanging_transaction(onceflow, bootstrap, onceflow_broker, make_topic):
    topic = make_topic()
    offset = append_hanging_batch(onceflow_broker, topic, 0)
    result = onceflow("txn", "abort", "--topic", topic, "--partition", "0",
                      "--start-offset", str(offset), "-b", bootstrap)
    assert result.exit_code == 0, result.output
    assert f"producer {UNKNOWN_PRODUCER_ID}" in result.stdout

    described = onceflow("producers", "describe", topic, "0", "-b", bootstrap, env=WIDE)
    (row,) = table_rows(described.stdout)
    assert row[5] == "-"
    assert f"log end {offset + 2}, last stable offset {offset + 2}" in described.stdout
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "cli-abort-check",
                         "isolation.level": "read_committed"})
    consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
    assert [m for m in consumer.consume(10, 2.0) if m.error() is None] == []
    consumer.close()


def test_abort_needs_the_transaction_named(onceflow, bootstrap, make_topic):
    topic = make_topic()
    assert_one_line_error(
        onceflow("txn", "abort", "--topic", topic, "--partition", "0", "-b", bootstrap),
        "--start-offset")
    assert_one_line_error(
        onceflow("txn", "abort", "--topic", topic, "--partition", "0", "--start-offset", "5",
                 "-b", bootstrap),
        "no open transaction starts at offset 5")


def test_commands_report_an_unreachable_broker_in_one_line(onceflow):
    for args in (("txn", "list"), ("producers", "describe", "t", "0")):
        assert_one_line_error(onceflow(*args, "-b", "127.0.0.1:1"), "cannot reach a broker")
