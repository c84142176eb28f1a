"""Shared pieces of the transaction tests: a broker with fast transaction settings, one
transactional-producer interface over the three Python clients, read_committed /
read_uncommitted readers for each client, and raw-protocol helpers."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterator

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from tests.helpers import TIMEOUT_S
from tests.kafka_raw import RawClient
from tests import helpers

# Few internal partitions (each is a directory of files), groups that settle fast, and
# timed-out transactions looked for often, so timeouts show within a test.
FAST_TXNS = {"transaction_state_num_partitions": 4, "offsets_topic_num_partitions": 4,
             "group_initial_rebalance_delay_ms": 200, "group_min_session_timeout_ms": 1000,
             "transaction_abort_timed_out_cleanup_interval_ms": 200}
FAST_TXNS_ARGS = ("--transaction-state-partitions", "4", "--offsets-topic-partitions", "4",
                  "--transaction-abort-interval-ms", "200")
CLIENTS = ["confluent", "kafka-python", "aiokafka"]
WAIT_S = 30.0
POLL_S = 0.1
READ_IDLE_S = 1.5  # a reader that received nothing this long after reaching the end stops

FIND_COORDINATOR, INIT_PRODUCER_ID, ADD_PARTITIONS_TO_TXN, END_TXN = 10, 22, 24, 26
ADD_OFFSETS_TO_TXN, TXN_OFFSET_COMMIT = 25, 28
KEY_TYPE_TRANSACTION = 1


@pytest.fixture(scope="module")
def txn_broker() -> Iterator:
    from onceflow.broker.embedded import Broker

    with Broker(**FAST_TXNS) as broker:
        yield broker


def wait_for(condition: Callable[[], bool], what: str, timeout_s: float = WAIT_S) -> None:
    helpers.wait_for(condition, what, timeout_s, POLL_S)


# ---------------------------------------------------------------- transactional producers


class ConfluentTxn:
    def __init__(self, bootstrap: str, transactional_id: str, timeout_ms: int = 60_000,
                 config: dict | None = None) -> None:
        self.producer = Producer({"bootstrap.servers": bootstrap,
                                  "transactional.id": transactional_id,
                                  "transaction.timeout.ms": timeout_ms, "linger.ms": 5,
                                  **(config or {})})

    def init(self) -> None:
        self.producer.init_transactions(TIMEOUT_S)

    def begin(self) -> None:
        self.producer.begin_transaction()

    def send(self, topic: str, value: bytes, partition: int = 0) -> None:
        self.producer.produce(topic, value, partition=partition)

    def flush(self) -> None:
        assert self.producer.flush(TIMEOUT_S) == 0

    def send_offsets(self, offsets: dict[tuple[str, int], int], group_metadata) -> None:
        self.producer.send_offsets_to_transaction(
            [TopicPartition(t, p, o) for (t, p), o in offsets.items()], group_metadata, TIMEOUT_S)

    def commit(self) -> None:
        self.producer.commit_transaction(TIMEOUT_S)

    def abort(self) -> None:
        self.flush()  # librdkafka purges unsent records on abort: make them reach the log
        self.producer.abort_transaction(TIMEOUT_S)

    def close(self) -> None:
        self.producer.flush(0)


class KafkaPythonTxn:
    def __init__(self, bootstrap: str, transactional_id: str, timeout_ms: int = 60_000) -> None:
        from kafka import KafkaProducer

        self.producer = KafkaProducer(bootstrap_servers=bootstrap,
                                      transactional_id=transactional_id,
                                      transaction_timeout_ms=timeout_ms, linger_ms=5)

    def init(self) -> None:
        self.producer.init_transactions()

    def begin(self) -> None:
        self.producer.begin_transaction()

    def send(self, topic: str, value: bytes, partition: int = 0) -> None:
        self.producer.send(topic, value, partition=partition)

    def flush(self) -> None:
        self.producer.flush(TIMEOUT_S)

    def send_offsets(self, offsets: dict[tuple[str, int], int], group_metadata) -> None:
        from kafka import OffsetAndMetadata
        from kafka import TopicPartition as KafkaTopicPartition

        self.producer.send_offsets_to_transaction(
            {KafkaTopicPartition(t, p): OffsetAndMetadata(o, "", -1)
             for (t, p), o in offsets.items()}, group_metadata)

    def commit(self) -> None:
        self.producer.commit_transaction()

    def abort(self) -> None:
        self.flush()
        self.producer.abort_transaction()

    def close(self) -> None:
        self.producer.close(timeout=TIMEOUT_S)


class AiokafkaTxn:
    """aiokafka's producer on a private event loop, driven one call at a time."""

    def __init__(self, bootstrap: str, transactional_id: str, timeout_ms: int = 60_000) -> None:
        self.loop = asyncio.new_event_loop()
        self.bootstrap, self.transactional_id, self.timeout_ms = (
            bootstrap, transactional_id, timeout_ms)
        self.producer = None
        self.pending: list = []

    def _run(self, coroutine):
        return self.loop.run_until_complete(asyncio.wait_for(coroutine, TIMEOUT_S))

    def init(self) -> None:
        from aiokafka import AIOKafkaProducer

        async def start():
            self.producer = AIOKafkaProducer(
                bootstrap_servers=self.bootstrap, transactional_id=self.transactional_id,
                transaction_timeout_ms=self.timeout_ms, linger_ms=5)
            await self.producer.start()  # InitProducerId happens here

        self._run(start())

    def begin(self) -> None:
        self._run(self.producer.begin_transaction())

    def send(self, topic: str, value: bytes, partition: int = 0) -> None:
        self.pending.append(self._run(self.producer.send(topic, value, partition=partition)))

    def flush(self) -> None:
        async def wait_all():
            for future in self.pending:
                await future
        self._run(wait_all())
        self.pending.clear()

    def send_offsets(self, offsets: dict[tuple[str, int], int], group_id: str) -> None:
        from aiokafka import TopicPartition as AioTopicPartition

        self._run(self.producer.send_offsets_to_transaction(
            {AioTopicPartition(t, p): o for (t, p), o in offsets.items()}, group_id))

    def commit(self) -> None:
        self.flush()
        self._run(self.producer.commit_transaction())

    def abort(self) -> None:
        self.flush()
        self._run(self.producer.abort_transaction())

    def close(self) -> None:
        if self.producer is not None:
            self._run(self.producer.stop())
        self.loop.close()


def close_quietly(producer) -> None:
    """Close a producer that may be fenced or failed (its close may raise)."""
    with contextlib.suppress(Exception):  # a fenced producer's close may complain
        producer.close()


def txn_producer(client: str, bootstrap: str, transactional_id: str, **kwargs):
    kinds = {"confluent": ConfluentTxn, "kafka-python": KafkaPythonTxn,
             "aiokafka": AiokafkaTxn}
    return kinds[client](bootstrap, transactional_id, **kwargs)


# ---------------------------------------------------------------- readers


def read_all(client: str, bootstrap: str, topic: str, partitions: int,
             isolation: str = "read_committed") -> list[bytes]:
    """Every value a consumer of `isolation` reads from the start to the end of each
    partition (the LSO for read_committed), in partition order then offset order."""
    readers = {"confluent": _read_confluent, "kafka-python": _read_kafka_python,
               "aiokafka": _read_aiokafka}
    by_partition = readers[client](bootstrap, topic, partitions, isolation)
    return [value for p in range(partitions) for value in by_partition.get(p, [])]


def _read_confluent(bootstrap: str, topic: str, partitions: int,
                    isolation: str) -> dict[int, list[bytes]]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "txn-tests-reader",
                         "enable.auto.commit": False, "enable.partition.eof": True,
                         "isolation.level": isolation})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    found: dict[int, list[bytes]] = {}
    at_end: set[int] = set()
    deadline = time.monotonic() + WAIT_S
    try:
        while len(at_end) < partitions:
            assert time.monotonic() < deadline, f"read {isolation} never reached the end"
            message = consumer.poll(POLL_S)
            if message is None:
                continue
            if message.error():
                assert message.error().code() == KafkaError._PARTITION_EOF, message.error()
                at_end.add(message.partition())
                continue
            at_end.discard(message.partition())
            found.setdefault(message.partition(), []).append(message.value())
    finally:
        consumer.close()
    return found


def _read_kafka_python(bootstrap: str, topic: str, partitions: int,
                       isolation: str) -> dict[int, list[bytes]]:
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KafkaTopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, isolation_level=isolation,
                             enable_auto_commit=False, auto_offset_reset="earliest")
    tps = [KafkaTopicPartition(topic, p) for p in range(partitions)]
    consumer.assign(tps)
    consumer.seek_to_beginning(*tps)
    found: dict[int, list[bytes]] = {}
    try:
        ends = consumer.end_offsets(tps)
        deadline = time.monotonic() + WAIT_S
        while any(consumer.position(tp) < ends[tp] for tp in tps):
            assert time.monotonic() < deadline, f"read {isolation} never reached {ends}"
            for tp, records in consumer.poll(timeout_ms=100).items():
                found.setdefault(tp.partition, []).extend(r.value for r in records)
    finally:
        consumer.close()
    return found


def _read_aiokafka(bootstrap: str, topic: str, partitions: int,
                   isolation: str) -> dict[int, list[bytes]]:
    from aiokafka import AIOKafkaConsumer
    from aiokafka import TopicPartition as AioTopicPartition

    async def read() -> dict[int, list[bytes]]:
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, isolation_level=isolation,
                                    enable_auto_commit=False, auto_offset_reset="earliest")
        await consumer.start()
        tps = [AioTopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        found: dict[int, list[bytes]] = {}
        try:
            ends = await consumer.end_offsets(tps)
            deadline = time.monotonic() + WAIT_S
            while True:
                positions = [await consumer.position(tp) for tp in tps]
                if all(pos >= ends[tp] for pos, tp in zip(positions, tps)):
                    return found
                assert time.monotonic() < deadline, f"read {isolation} never reached {ends}"
                batches = await consumer.getmany(timeout_ms=100)
                for tp, records in batches.items():
                    found.setdefault(tp.partition, []).extend(r.value for r in records)
        finally:
            await consumer.stop()

    return asyncio.run(read())


def watermarks(bootstrap: str, topic: str, partition: int, isolation: str) -> tuple[int, int]:
    """(log start, end) where end is ListOffsets latest: the LSO under read_committed."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "txn-tests-watermarks",
                         "isolation.level": isolation})
    try:
        return consumer.get_watermark_offsets(TopicPartition(topic, partition),
                                              timeout=TIMEOUT_S, cached=False)
    finally:
        consumer.close()


# ---------------------------------------------------------------- raw protocol


def find_txn_coordinator(client: RawClient, transactional_id: str):
    return client.request(FIND_COORDINATOR, 1, {"key": transactional_id,
                                                "key_type": KEY_TYPE_TRANSACTION})


def init_txn_producer(client: RawClient, transactional_id: str, version: int = 4,
                      timeout_ms: int = 60_000):
    return client.request(INIT_PRODUCER_ID, version, {
        "transactional_id": transactional_id, "transaction_timeout": timeout_ms,
        "producer_id": -1, "producer_epoch": -1})


def add_partitions(client: RawClient, transactional_id: str, producer_id: int, epoch: int,
                   partitions: dict[str, list[int]], version: int = 3) -> dict:
    """AddPartitionsToTxn v0-3: {(topic, partition): error}."""
    response = client.request(ADD_PARTITIONS_TO_TXN, version, {
        "v3_and_below_transactional_id": transactional_id,
        "v3_and_below_producer_id": producer_id, "v3_and_below_producer_epoch": epoch,
        "v3_and_below_topics": [{"name": t, "partitions": ps} for t, ps in partitions.items()]})
    return {(t.name, p.partition_index): p.partition_error_code
            for t in response.results_by_topic_v3_and_below for p in t.results_by_partition}


def end_txn(client: RawClient, transactional_id: str, producer_id: int, epoch: int,
            commit: bool, version: int = 3):
    return client.request(END_TXN, version, {
        "transactional_id": transactional_id, "producer_id": producer_id,
        "producer_epoch": epoch, "committed": commit}).error_code
