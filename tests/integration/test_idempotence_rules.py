"""Each idempotent-producer rule of the broker, byte-exact, with a raw protocol client.

No client library: batches are built by hand (`protocol.records.build_batch`) with the
producer id, epoch and sequence under test, sent as Produce v9 and judged by the error
code, the base offset and the log end offset, so every rule is seen exactly as a client
sees it:

- a retry of any of the last 5 batches answers its original offset, appends nothing;
- a retry older than those 5 batches: OUT_OF_ORDER_SEQUENCE_NUMBER;
- a gap: OUT_OF_ORDER_SEQUENCE_NUMBER, nothing appended, and the state is unchanged;
- an older epoch: INVALID_PRODUCER_EPOCH; a newer epoch must start at sequence 0;
- sequences wrap from 2^31-1 to 0;
- a plain batch while the producer has a transaction open: INVALID_TXN_STATE;
- InitProducerId: new PIDs, KIP-360 bumps; transactional ids go to the transaction
  coordinator (tests/integration/test_transactions_protocol.py has its rules).
"""

from __future__ import annotations

import dataclasses
import time

import pytest
from kio.schema.errors import ErrorCode

from onceflow.protocol.records import SEQUENCE_MAX, SimpleRecord, build_batch
from tests.helpers import create_topic, unique
from tests.kafka_raw import RawClient

PRODUCE, LIST_OFFSETS, INIT_PRODUCER_ID = 0, 2, 22
PRODUCE_VERSION = 9
INIT_PRODUCER_ID_VERSION = 4  # v3+ carries the current PID/epoch (KIP-360)
RECORDS_PER_BATCH = 2
WINDOW = 5  # the broker keeps the last 5 batches per producer and partition
LATEST = -1


@dataclasses.dataclass
class Sent:
    error: ErrorCode
    base_offset: int


class RawProducer:
    """Produces hand-built batches of one producer id to partition 0 of a topic."""

    def __init__(self, client: RawClient, topic: str, producer_id: int, epoch: int = 0) -> None:
        self.client, self.topic = client, topic
        self.producer_id, self.epoch = producer_id, epoch

    def batch(self, sequence: int, count: int = RECORDS_PER_BATCH, *, epoch: int | None = None,
              transactional: bool = False) -> bytes:
        records = [SimpleRecord(key=None, value=f"{sequence}+{i}".encode()) for i in range(count)]
        # A real timestamp: idle producers expire by their batches' timestamps (Kafka's
        # rule), and one from 1970 would be forgotten at the first expiry check.
        return build_batch(records, producer_id=self.producer_id,
                           producer_epoch=self.epoch if epoch is None else epoch,
                           base_sequence=sequence, transactional=transactional,
                           base_timestamp_ms=now_ms())

    def send(self, records: bytes, acks: int = -1) -> Sent:
        body = {"transactional_id": None, "acks": acks, "timeout": 10_000, "topic_data": [
            {"name": self.topic, "partition_data": [{"index": 0, "records": records}]}]}
        response = self.client.request(PRODUCE, PRODUCE_VERSION, body)
        partition = response.responses[0].partition_responses[0]
        return Sent(partition.error_code, partition.base_offset)

    def produce(self, sequence: int, count: int = RECORDS_PER_BATCH, **batch_args) -> Sent:
        return self.send(self.batch(sequence, count, **batch_args))


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def log_end_offset(client: RawClient, topic: str) -> int:
    response = client.request(LIST_OFFSETS, 7, {"replica_id": -1, "isolation_level": 0, "topics": [
        {"name": topic, "partitions": [{"partition_index": 0, "timestamp": LATEST}]}]})
    partition = response.topics[0].partitions[0]
    assert partition.error_code == ErrorCode.none
    return partition.offset


def init_producer_id(client: RawClient, producer_id: int = -1, epoch: int = -1,
                     transactional_id: str | None = None,
                     version: int = INIT_PRODUCER_ID_VERSION):
    body = {"transactional_id": transactional_id, "transaction_timeout": 60_000,
            "producer_id": producer_id, "producer_epoch": epoch}
    return client.request(INIT_PRODUCER_ID, version, body)


def new_producer(client: RawClient, topic: str) -> RawProducer:
    answer = init_producer_id(client)
    assert answer.error_code == ErrorCode.none and answer.producer_epoch == 0
    return RawProducer(client, topic, answer.producer_id)


@pytest.fixture
def client(onceflow_broker):
    with RawClient(onceflow_broker.bootstrap_servers) as raw:
        yield raw


@pytest.fixture
def topic(onceflow_broker) -> str:
    return create_topic(onceflow_broker.bootstrap_servers, unique("idem"))


def send_window(producer: RawProducer, batches: int = WINDOW) -> list[int]:
    """Sends `batches` in-order batches from sequence 0; returns their base offsets."""
    offsets = []
    for i in range(batches):
        sent = producer.produce(i * RECORDS_PER_BATCH)
        assert sent.error == ErrorCode.none
        offsets.append(sent.base_offset)
    return offsets


# --- duplicates ------------------------------------------------------------------------------


def test_duplicate_of_each_cached_batch_returns_its_original_offset(onceflow_broker, client, topic):
    metrics = onceflow_broker.server.state.metrics.registry
    producer = new_producer(client, topic)
    offsets = send_window(producer)
    assert offsets == [i * RECORDS_PER_BATCH for i in range(WINDOW)]
    end = log_end_offset(client, topic)
    for i in reversed(range(WINDOW)):  # any order: each is found among the 5
        retry = producer.produce(i * RECORDS_PER_BATCH)
        assert retry == Sent(ErrorCode.none, offsets[i])
    assert log_end_offset(client, topic) == end, "a duplicate was appended"
    duplicates = metrics.get_sample_value("onceflow_producer_duplicates_total", {"topic": topic})
    assert duplicates == WINDOW
    # The producer carries on after its retries as if nothing happened.
    assert producer.produce(WINDOW * RECORDS_PER_BATCH) == Sent(ErrorCode.none, end)


def test_duplicate_with_acks_1_also_answers_the_original_offset(client, topic):
    producer = new_producer(client, topic)
    first = producer.send(producer.batch(0), acks=1)
    assert first == Sent(ErrorCode.none, 0)
    assert producer.send(producer.batch(0), acks=1) == first
    assert log_end_offset(client, topic) == RECORDS_PER_BATCH


def test_retry_older_than_the_window_is_out_of_order(client, topic):
    producer = new_producer(client, topic)
    send_window(producer, WINDOW + 1)
    end = log_end_offset(client, topic)
    oldest = producer.produce(0)  # the 6th-newest batch: no longer cached
    assert oldest.error == ErrorCode.out_of_order_sequence_number
    assert oldest.base_offset == -1
    assert log_end_offset(client, topic) == end
    # The 5 newest are still recognised.
    assert producer.produce(RECORDS_PER_BATCH).error == ErrorCode.none
    assert log_end_offset(client, topic) == end


def test_partial_overlap_with_a_cached_batch_is_not_a_duplicate(client, topic):
    producer = new_producer(client, topic)
    send_window(producer, 2)  # sequences 0-1 and 2-3
    end = log_end_offset(client, topic)
    # Same first sequence, different record count: neither a duplicate nor in sequence.
    assert producer.produce(2, count=1).error == ErrorCode.out_of_order_sequence_number
    assert log_end_offset(client, topic) == end


# --- gaps and epochs -------------------------------------------------------------------------


def test_gap_is_out_of_order_and_appends_nothing(client, topic):
    producer = new_producer(client, topic)
    send_window(producer, 1)  # sequences 0-1: the next is 2
    end = log_end_offset(client, topic)
    gap = producer.produce(2 + RECORDS_PER_BATCH)  # batch 2-3 is missing
    assert gap == Sent(ErrorCode.out_of_order_sequence_number, -1)
    assert log_end_offset(client, topic) == end
    # The rejection changed nothing: the missing batch, then the one after, go in.
    assert producer.produce(2) == Sent(ErrorCode.none, end)
    assert producer.produce(4) == Sent(ErrorCode.none, end + RECORDS_PER_BATCH)


def test_older_epoch_is_rejected(client, topic):
    producer = new_producer(client, topic)
    send_window(producer, 1)
    bumped = init_producer_id(client, producer.producer_id, 0)
    assert (bumped.producer_id, bumped.producer_epoch) == (producer.producer_id, 1)
    assert producer.produce(0, epoch=1) == Sent(ErrorCode.none, RECORDS_PER_BATCH)
    end = log_end_offset(client, topic)
    zombie = producer.produce(2, epoch=0)  # in sequence for epoch 0, but epoch 0 is over
    assert zombie.error == ErrorCode.invalid_producer_epoch
    # Even an exact retry of an epoch-0 batch: the cache holds epoch 1 only.
    assert producer.produce(0, epoch=0).error == ErrorCode.invalid_producer_epoch
    assert log_end_offset(client, topic) == end


def test_new_epoch_must_start_at_sequence_zero(client, topic):
    producer = new_producer(client, topic)
    send_window(producer, 2)
    end = log_end_offset(client, topic)
    jumped = producer.produce(4, epoch=1)  # would continue epoch 0's sequence
    assert jumped.error == ErrorCode.out_of_order_sequence_number
    assert log_end_offset(client, topic) == end
    assert producer.produce(0, epoch=1) == Sent(ErrorCode.none, end)


def test_sequence_wraps_around_after_int32_max(client, topic):
    producer = new_producer(client, topic)
    # A PID new to the partition may start anywhere: start 3 short of the end.
    last_before_wrap = producer.produce(SEQUENCE_MAX - 2, count=3)  # SEQUENCE_MAX-2 .. MAX
    assert last_before_wrap == Sent(ErrorCode.none, 0)
    assert producer.produce(0) == Sent(ErrorCode.none, 3)  # 0 follows 2^31-1
    spanning = producer.produce(2, count=3)
    assert spanning == Sent(ErrorCode.none, 5)
    # A batch that itself crosses the wrap: 2^31-2, 2^31-1, 0, 1 (a fresh producer).
    other = new_producer(client, topic)
    assert other.produce(SEQUENCE_MAX - 1, count=4) == Sent(ErrorCode.none, 8)
    assert other.produce(2) == Sent(ErrorCode.none, 12)
    assert other.produce(SEQUENCE_MAX - 1, count=4) == Sent(ErrorCode.none, 8)  # duplicate
    assert other.produce(0).error == ErrorCode.out_of_order_sequence_number


# A plain batch while the producer's transaction is open (INVALID_TXN_STATE) is tested
# through a real transaction in test_transactions_protocol.py: a transactional batch
# without a transactional id is refused outright, as Kafka does.


def test_batches_without_producer_id_are_not_checked(client, topic):
    # aiokafka sends base sequence 0 with producer id -1: every one of them is appended.
    plain = RawProducer(client, topic, producer_id=-1, epoch=-1)
    for expected in (0, 2, 4):
        assert plain.produce(0) == Sent(ErrorCode.none, expected)


def test_sequence_without_producer_id_is_invalid_record(client, topic):
    producer = new_producer(client, topic)
    assert producer.produce(-1).error == ErrorCode.invalid_record


# --- InitProducerId --------------------------------------------------------------------------


@pytest.mark.parametrize("version", [0, 2, 4, 5])
def test_init_producer_id_hands_out_increasing_new_ids(client, version):
    first = init_producer_id(client, version=version)
    second = init_producer_id(client, version=version)
    assert first.error_code == second.error_code == ErrorCode.none
    assert first.producer_epoch == second.producer_epoch == 0
    assert 0 <= first.producer_id < second.producer_id


def test_kip_360_bump_keeps_the_pid_and_is_idempotent(client, topic):
    producer = new_producer(client, topic)
    pid = producer.producer_id
    bumped = init_producer_id(client, pid, 0)
    assert bumped.error_code == ErrorCode.none
    assert (bumped.producer_id, bumped.producer_epoch) == (pid, 1)
    # The answer was lost and the client asks again: nothing used epoch 1 yet, same answer.
    again = init_producer_id(client, pid, 0)
    assert (again.producer_id, again.producer_epoch) == (pid, 1)
    assert producer.produce(0, epoch=1).error == ErrorCode.none
    # Presenting an epoch older than one the partitions have seen: a new PID instead.
    stale = init_producer_id(client, pid, 0)
    assert stale.producer_id != pid and stale.producer_epoch == 0


def test_kip_360_with_a_pid_never_handed_out_gets_a_new_pid(client):
    future_pid = init_producer_id(client).producer_id + 1_000_000
    answer = init_producer_id(client, future_pid, 3)
    assert answer.error_code == ErrorCode.none
    assert answer.producer_id < future_pid and answer.producer_epoch == 0


def test_transactional_and_idempotent_producers_share_one_id_allocator(client):
    client.request(10, 1, {"key": "tx", "key_type": 1})  # FindCoordinator creates the topic
    idempotent = init_producer_id(client).producer_id
    transactional = init_producer_id(client, transactional_id=unique("tx"))
    assert transactional.error_code == ErrorCode.none and transactional.producer_epoch == 0
    assert transactional.producer_id > idempotent  # one durable allocator for the broker
    assert init_producer_id(client, transactional_id="").error_code == ErrorCode.invalid_request


# --- expiry ----------------------------------------------------------------------------------


def test_idle_producers_expire_after_producer_id_expiration_ms():
    from onceflow import Broker

    expiration_ms = 300
    with Broker(producer_id_expiration_ms=expiration_ms,
                producer_id_expiration_check_interval_ms=50) as broker, \
            RawClient(broker.bootstrap_servers) as client:
        topic = create_topic(broker.bootstrap_servers, unique("expiry"))
        producer = new_producer(client, topic)
        batch = producer.batch(0)
        assert producer.send(batch) == Sent(ErrorCode.none, 0)
        assert producer.send(batch) == Sent(ErrorCode.none, 0)  # still known: a duplicate
        deadline = time.monotonic() + 10
        while broker.call(lambda: broker.server.state.partition(topic, 0).producers.entries()):
            assert time.monotonic() < deadline, "the producer never expired"
            time.sleep(0.05)
        # Forgotten: the same batch is now new to the partition, and appended again.
        assert producer.send(batch) == Sent(ErrorCode.none, RECORDS_PER_BATCH)
