"""Kafka 4's transactional producer with transactions V2, replayed request by request.

No client reachable here speaks transactions V2 (librdkafka sends EndTxn v0-1; the Java
client on PyPI is 3.9.1), so this replays the requests of Kafka 4.0's
`TransactionManager` once `transaction.version` >= 2 is finalized, over the raw protocol:

    initTransactions       FindCoordinator(TRANSACTION), InitProducerId v5 (-1/-1)
    send()                 Produce v12 with transactional batches; no AddPartitionsToTxn:
                           the broker adds the partition (maybeAddPartition only marks the
                           transaction started)
    sendOffsetsToTxn()     FindCoordinator(GROUP), TxnOffsetCommit v5; no AddOffsetsToTxn
    commit/abort           EndTxn v5 once every batch is acknowledged; skipped when nothing
                           was sent (transactionStarted false); the answer's producer id and
                           epoch replace the client's and every sequence restarts at 0
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from kio.schema.errors import ErrorCode

from onceflow.protocol.records import SimpleRecord, build_batch
from tests.integration.transactions_support import KEY_TYPE_TRANSACTION
from tests.kafka_raw import RawClient

PRODUCE, FIND_COORDINATOR, INIT_PRODUCER_ID, END_TXN, TXN_OFFSET_COMMIT = 0, 10, 22, 26, 28
API_VERSIONS = 18
PRODUCE_V2, END_TXN_V2, TXN_OFFSET_COMMIT_V2, INIT_PRODUCER_ID_V2 = 12, 5, 5, 5
KEY_TYPE_GROUP = 0
RETRIABLE = frozenset({ErrorCode.not_enough_replicas, ErrorCode.concurrent_transactions})
RETRIES_MAX = 50
RETRY_BACKOFF_S = 0.1  # the Java producer's retry.backoff.ms


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def finalized_features(bootstrap: str) -> dict[str, int]:
    with RawClient(bootstrap) as client:
        response = client.request(API_VERSIONS, 3, {"client_software_name": "raw",
                                                    "client_software_version": "1"})
    return {f.name: f.max_version_level for f in response.finalized_features}


@dataclass
class V2Producer:
    bootstrap: str
    transactional_id: str
    timeout_ms: int = 60_000
    producer_id: int = -1
    epoch: int = -1
    sequences: dict[tuple[str, int], int] = field(default_factory=dict)
    started: bool = False
    client: RawClient | None = None

    def connect(self) -> RawClient:
        if self.client is None:
            self.client = RawClient(self.bootstrap)
        return self.client

    def reconnect(self) -> None:
        if self.client is not None:
            self.client.close()
        self.client = None

    def close(self) -> None:
        self.reconnect()

    def init(self) -> None:
        client = self.connect()
        found = client.request(FIND_COORDINATOR, 1, {"key": self.transactional_id,
                                                     "key_type": KEY_TYPE_TRANSACTION})
        assert found.error_code == ErrorCode.none, found
        response = client.request(INIT_PRODUCER_ID, INIT_PRODUCER_ID_V2, {
            "transactional_id": self.transactional_id, "transaction_timeout": self.timeout_ms,
            "producer_id": -1, "producer_epoch": -1})
        assert response.error_code == ErrorCode.none, response
        self.producer_id, self.epoch = response.producer_id, response.producer_epoch
        self.sequences.clear()

    def batch(self, topic: str, partition: int, values: list[bytes]) -> bytes:
        """The next transactional batch for a partition (its sequence moves on)."""
        sequence = self.sequences.get((topic, partition), 0)
        self.sequences[(topic, partition)] = sequence + len(values)
        self.started = True  # maybeAddPartition (V2): the transaction has begun
        return build_batch([SimpleRecord(key=None, value=v) for v in values],
                           producer_id=self.producer_id, producer_epoch=self.epoch,
                           base_sequence=sequence, transactional=True,
                           base_timestamp_ms=now_ms())

    def produce_request(self, topic: str, partition: int, records: bytes) -> dict:
        return {"transactional_id": self.transactional_id, "acks": -1, "timeout": 10_000,
                "topic_data": [{"name": topic, "partition_data": [
                    {"index": partition, "records": records}]}]}

    def produce(self, topic: str, partition: int, records: bytes) -> tuple[ErrorCode, int]:
        """One Produce v12, retried on a retriable error as the Java Sender does."""
        for _ in range(RETRIES_MAX):
            response = self.connect().request(PRODUCE, PRODUCE_V2,
                                              self.produce_request(topic, partition, records))
            answer = response.responses[0].partition_responses[0]
            if answer.error_code not in RETRIABLE:
                break
            time.sleep(RETRY_BACKOFF_S)
        return answer.error_code, answer.base_offset

    def send(self, topic: str, partition: int, values: list[bytes]) -> tuple[ErrorCode, int]:
        return self.produce(topic, partition, self.batch(topic, partition, values))

    def send_offsets(self, group_id: str, offsets: dict[tuple[str, int], int],
                     generation_id: int = -1, member_id: str = "",
                     instance_id: str | None = None) -> dict[tuple[str, int], ErrorCode]:
        client = self.connect()
        found = client.request(FIND_COORDINATOR, 1, {"key": group_id,
                                                     "key_type": KEY_TYPE_GROUP})
        assert found.error_code == ErrorCode.none, found
        topics: dict[str, list] = {}
        for (topic, partition), offset in offsets.items():
            topics.setdefault(topic, []).append({
                "partition_index": partition, "committed_offset": offset,
                "committed_leader_epoch": -1, "committed_metadata": ""})
        self.started = True
        response = client.request(TXN_OFFSET_COMMIT, TXN_OFFSET_COMMIT_V2, {
            "transactional_id": self.transactional_id, "group_id": group_id,
            "producer_id": self.producer_id, "producer_epoch": self.epoch,
            "generation_id": generation_id, "member_id": member_id,
            "group_instance_id": instance_id,
            "topics": [{"name": t, "partitions": ps} for t, ps in topics.items()]})
        return {(t.name, p.partition_index): p.error_code
                for t in response.topics for p in t.partitions}

    def end_txn(self, commit: bool, producer_id: int | None = None,
                epoch: int | None = None):
        """One EndTxn v5 (no client bookkeeping): the raw answer."""
        return self.connect().request(END_TXN, END_TXN_V2, {
            "transactional_id": self.transactional_id,
            "producer_id": self.producer_id if producer_id is None else producer_id,
            "producer_epoch": self.epoch if epoch is None else epoch, "committed": commit})

    def end(self, commit: bool) -> ErrorCode:
        """commitTransaction/abortTransaction: EndTxn v5 unless nothing was sent; the
        answer's producer id and epoch are the client's from now on."""
        if not self.started:
            return ErrorCode.none
        response = self.end_txn(commit)
        if response.error_code == ErrorCode.none:
            self.producer_id, self.epoch = response.producer_id, response.producer_epoch
            self.sequences.clear()
            self.started = False
        return response.error_code
