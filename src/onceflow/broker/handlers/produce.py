"""Produce: validate each partition's record batch, check producer state, append, answer.

Per partition (Kafka's rules for Produce v3+): exactly one magic-2 batch, CRC-32C
valid, no control batch from a client, at most the topic's max.message.bytes, and on a
compacted topic (cleanup.policy contains compact) a key on every record - else
INVALID_RECORD with each keyless record's index in `record_errors` (the records are
decompressed for this check only). A failing partition gets its error code; the other
partitions of the request are still appended.

Then the partition's producer state judges batches that carry a producer id
(`PartitionState.append`: prepare, append, commit in one synchronous step, in
request order, so a pipelined request is checked against the previous one):

- a retry of one of the producer's last 5 batches (same epoch, same first and last
  sequence) is a duplicate: nothing is appended and the answer is a success with
  the batch's original base offset (and, as Kafka, its timestamp as log append time);
- a gap, or a retry older than those 5 batches: OUT_OF_ORDER_SEQUENCE_NUMBER;
- an epoch older than the producer's: INVALID_PRODUCER_EPOCH (Kafka 2.7+, every
  Produce version; PRODUCER_FENCED belongs to the coordinator APIs); a newer epoch
  must start at sequence 0 (else OUT_OF_ORDER_SEQUENCE_NUMBER);
- a non-transactional batch while the producer has a transaction open:
  INVALID_TXN_STATE.

A transactional batch for a partition where its producer has no open transaction yet
is first checked with the transaction coordinator (KIP-890 part 1, as Kafka 3.6+): was
the partition added to the producer's transaction? If not, Produce v11+ answers
TRANSACTION_ABORTABLE and older versions INVALID_TXN_STATE; a fenced producer gets
INVALID_PRODUCER_EPOCH; a coordinator that cannot answer now (busy, loading) gets
NOT_ENOUGH_REPLICAS, which every client retries without a metadata refresh.

Transactions V2 (KIP-890 part 2): from Produce v12 the producer no longer sends
AddPartitionsToTxn; the broker adds the partitions of its transactional batches to its
transaction itself (`_add_implicitly`, Kafka's ADD_PARTITION operation), so a batch of an
ended transaction - whose epoch the end bumped - is refused INVALID_PRODUCER_EPOCH there
instead of opening a transaction nobody will end. While such an add is in flight, later
requests of the same transactional id wait for it, so appends keep the requests' order.

Batches without a producer id (plain producers; aiokafka also sends base sequence 0
with producer id -1) are appended without any sequence check. Answers:

- acks=0: no response at all (Kafka sends none);
- acks=1: answered once the bytes are written (page cache: survives a crash of
  the broker process);
- acks=-1: answered once the group committer has fsync'd them (with fsync on). A
  duplicate waits too, until the offsets it names are on disk: its original append
  may still be in the page cache.

Authorization (issue 13), as Kafka's KafkaApis: a transactional id without Write on it
fails every partition with TRANSACTIONAL_ID_AUTHORIZATION_FAILED; a topic without Write
fails its partitions with TOPIC_AUTHORIZATION_FAILED, the others are appended.
"""

from __future__ import annotations

import asyncio
import dataclasses

from kio.schema.errors import ErrorCode

from onceflow.broker.handlers import ApiKey, RequestContext, handles
from onceflow.broker.state import INTERNAL_TOPICS, PartitionState
from onceflow.protocol.compression import batch_records
from onceflow.protocol.errors import RecordError
from onceflow.protocol.records import (
    ATTR_TRANSACTIONAL,
    ATTRIBUTES_AT,
    BatchHeader,
    check_produce_records,
)
from onceflow.security.acl import Operation, ResourceType
from onceflow.storage.layout import LogFailedError
from onceflow.storage.producer_state import Duplicate, Rejected
from onceflow.txn import TopicPartition

ACKS_NONE, ACKS_LEADER, ACKS_ALL = 0, 1, -1
ABORTABLE_MIN_VERSION = 11  # Produce v11+ clients know TRANSACTION_ABORTABLE (KIP-890)
ADD_PARTITION_MIN_VERSION = 12  # Produce v12+: the broker adds partitions (KIP-890 part 2)
# Coordinator answers that mean "ask again" (ReplicaManager maps them so old clients retry).
_VERIFY_RETRIABLE = frozenset({ErrorCode.concurrent_transactions,
                               ErrorCode.coordinator_load_in_progress,
                               ErrorCode.coordinator_not_available, ErrorCode.not_coordinator})
NOT_ADDED_MESSAGE = "Partition was not added to the transaction"


class ProduceError(Exception):
    def __init__(self, code: ErrorCode, message: str | None = None,
                 record_errors: list[dict] | None = None) -> None:
        super().__init__(message or code.name)
        self.code = code
        self.message = message
        self.record_errors = record_errors or []


@dataclasses.dataclass(slots=True)
class _Outcome:
    index: int
    error_code: ErrorCode = ErrorCode.none
    error_message: str | None = None
    base_offset: int = -1
    log_append_time_ms: int = -1
    log_start_offset: int = -1
    record_errors: list[dict] = dataclasses.field(default_factory=list)  # Produce v8+
    partition: PartitionState | None = None  # set when offsets were named: flush for acks=all
    durable_end: int = 0  # offsets below this (exclusive) must be on disk before answering

    def response(self) -> dict:
        return {
            "index": self.index, "error_code": self.error_code, "base_offset": self.base_offset,
            "log_append_time": self.log_append_time_ms, "log_start_offset": self.log_start_offset,
            "record_errors": self.record_errors, "error_message": self.error_message,
        }


def single_batch(records, api_version: int, max_message_bytes: int) -> tuple[BatchHeader, memoryview]:
    """The one valid batch of a partition's records, or ProduceError."""
    try:
        header, batch = check_produce_records(records, api_version)
    except RecordError as exc:
        raise ProduceError(ErrorCode(exc.error_code), str(exc)) from None
    if len(batch) > max_message_bytes:
        raise ProduceError(ErrorCode.message_too_large,
                           f"batch of {len(batch)} bytes exceeds max.message.bytes {max_message_bytes}")
    return header, batch


def check_keys(topic: str, index: int, batch: memoryview) -> None:
    """A compacted topic's records must all have a key (Kafka's LogValidator): else the
    batch fails INVALID_RECORD, every keyless record named in `record_errors`."""
    try:
        records = batch_records(batch)
    except RecordError as exc:
        raise ProduceError(ErrorCode(exc.error_code), str(exc)) from None
    message = ("Compacted topic cannot accept message without key in topic partition "
               f"{topic}-{index}")
    keyless = [i for i, record in enumerate(records) if record.key is None]
    if not keyless:
        return
    shown = ", ".join(f"RecordError(batchIndex={i}, message='{message}')" for i in keyless[:3])
    raise ProduceError(
        ErrorCode.invalid_record,
        f"One or more records have been rejected due to {len(keyless)} record errors in "
        f"total, and only showing the first three errors at most: [{shown}]",
        [{"batch_index": i, "batch_index_error_message": message} for i in keyless])


def _verify_transaction(ctx: RequestContext, partition: PartitionState,
                        transactional_id: str | None, header: BatchHeader) -> ErrorCode | None:
    """KIP-890 part 1 (see the module docstring); None when the batch may go in."""
    if (not header.is_transactional or header.producer_id < 0 or transactional_id is None
            or partition.producers.has_ongoing_transaction(header.producer_id,
                                                           header.producer_epoch)):
        return None
    error = ctx.txns.verify(
        transactional_id, header.producer_id, header.producer_epoch,
        TopicPartition(partition.topic, partition.index),
        abortable_ok=ctx.api_version >= ABORTABLE_MIN_VERSION)
    if error is ErrorCode.none:
        return None
    return ErrorCode.not_enough_replicas if error in _VERIFY_RETRIABLE else error


def _append(ctx: RequestContext, topic: str, data, transactional_id: str | None,
            refused: dict[TopicPartition, ErrorCode]) -> _Outcome:
    outcome = _Outcome(data.index)
    state = ctx.broker
    info = state.topic(topic)
    if info is not None and not state.ready(topic, data.index):  # still recovering
        outcome.error_code = ErrorCode.not_leader_or_follower
        return outcome
    partition = state.partition(topic, data.index) if info else None
    if partition is None:
        outcome.error_code = ErrorCode.unknown_topic_or_partition
        return outcome
    if state.leader(info, data.index) != ctx.node_id:
        outcome.error_code = ErrorCode.not_leader_or_follower
        return outcome
    if topic in INTERNAL_TOPICS:   # only coordinators write there (Kafka: same error)
        outcome.error_code = ErrorCode.invalid_topic_exception
        outcome.error_message = f"Cannot append to internal topic {topic}"
        return outcome
    log = partition.log
    try:
        header, batch = single_batch(data.records, ctx.api_version, log.config.max_message_bytes)
        if log.config.compacts:
            check_keys(topic, data.index, batch)
        error = refused.get(TopicPartition(topic, data.index)) if refused else None
        if error is None:
            error = _verify_transaction(ctx, partition, transactional_id, header)
        if error is not None:
            raise ProduceError(error, NOT_ADDED_MESSAGE if error in (
                ErrorCode.invalid_txn_state, ErrorCode.transaction_abortable) else None)
        result = partition.append([header], [batch], ctx.now_ms())
    except ProduceError as exc:
        outcome.error_code, outcome.error_message = exc.code, exc.message
        outcome.record_errors = exc.record_errors
        return outcome
    except LogFailedError as exc:
        outcome.error_code, outcome.error_message = ErrorCode.kafka_storage_error, str(exc)
        ctx.broker.metrics.storage_error(topic)
        return outcome
    if isinstance(result, Rejected):
        # As Kafka: a refused append still reports the log start offset, which the Java
        # client needs to decide how to handle UNKNOWN_PRODUCER_ID (-1 makes it retry).
        outcome.error_code, outcome.error_message = result.error_code, result.message
        outcome.log_start_offset = log.log_start_offset
        return outcome
    if isinstance(result, Duplicate):
        ctx.broker.metrics.duplicate(topic)
        outcome.log_append_time_ms = result.timestamp_ms  # as Kafka: the cached batch's
    else:
        outcome.log_append_time_ms = result.log_append_time_ms
    outcome.base_offset = result.first_offset
    outcome.durable_end = result.last_offset + 1
    outcome.log_start_offset = log.log_start_offset
    outcome.partition = partition
    return outcome


async def _flush(ctx: RequestContext, outcomes: list[_Outcome]) -> None:
    """Wait until every offset the outcomes name is on disk (one flush per log). A log whose
    flush failed (ENOSPC, EIO: the log is now failed) turns its outcomes into
    KAFKA_STORAGE_ERROR: what did not reach the disk is never acknowledged."""
    logs = {id(o.partition): o.partition.log for o in outcomes
            if o.partition is not None and o.partition.log.recovery_point_offset < o.durable_end}
    if not logs:
        return
    committer = ctx.broker.committer
    failed: dict[int, BaseException] = {}
    if len(logs) == 1:   # the common small request: no gather, one future less (issue 19)
        [(key, log)] = logs.items()
        try:
            await committer.flush_waiter(log)
        except LogFailedError as error:
            failed[key] = error
    else:
        futures = [committer.flush_waiter(log) for log in logs.values()]
        results = await asyncio.gather(*futures, return_exceptions=True)
        failed = {key: result for key, result in zip(logs, results, strict=True)
                  if isinstance(result, BaseException)}
    for outcome in outcomes:
        error = failed.get(id(outcome.partition))
        if error is not None:
            if not isinstance(error, LogFailedError):
                raise error  # not a disk fault: a bug, loudly
            _storage_error(ctx, outcome, error)


def _storage_error(ctx: RequestContext, outcome: _Outcome, error: LogFailedError) -> None:
    """The partition's log failed (Kafka's offline log dir): KAFKA_STORAGE_ERROR at once."""
    outcome.error_code, outcome.error_message = ErrorCode.kafka_storage_error, str(error)
    outcome.base_offset = outcome.log_append_time_ms = -1
    if outcome.partition is not None:
        ctx.broker.metrics.storage_error(outcome.partition.topic)


def _has_transactional_batch(body) -> bool:
    """Whether any partition carries a transactional batch (header bit only)."""
    for topic in body.topic_data:
        for data in topic.partition_data:
            records = data.records
            if records and len(records) > ATTRIBUTES_AT + 1 and records[ATTRIBUTES_AT + 1] & ATTR_TRANSACTIONAL:
                return True
    return False


def _request_error(body) -> ErrorCode | None:
    """An error for every partition of the request, as Kafka's KafkaApis answers:
    transactional batches without a transactional id could open a transaction that
    no coordinator would ever end."""
    if body.transactional_id is None and _has_transactional_batch(body):
        return ErrorCode.transactional_id_authorization_failed
    return None


def _authorization_error(ctx: RequestContext, body) -> ErrorCode | None:
    if body.transactional_id is not None and not ctx.authorized(
            Operation.WRITE, ResourceType.TRANSACTIONAL_ID, body.transactional_id):
        return ErrorCode.transactional_id_authorization_failed
    return None


def _topic_name(ctx: RequestContext, topic) -> str | None:
    """The topic's name: v13+ names topics by id (None when the id is unknown)."""
    if hasattr(topic, "name"):
        return topic.name
    info = ctx.broker.topic_by_id(topic.topic_id)
    return None if info is None else info.name


def _to_add(ctx: RequestContext, body) -> tuple[list[TopicPartition], int, int]:
    """Transactions V2: the partitions of transactional batches that the producer's
    transaction does not hold yet (the broker adds them), and the producer id and epoch."""
    wanted, producer = [], (-1, -1)
    for topic in body.topic_data:
        name = _topic_name(ctx, topic)
        for data in topic.partition_data:
            partition = None if name is None else ctx.broker.partition(name, data.index)
            if partition is None or not data.records:
                continue
            try:
                header, _ = check_produce_records(data.records, ctx.api_version)
            except RecordError:
                continue  # refused by _append with its own error
            if not header.is_transactional or header.producer_id < 0 \
                    or partition.producers.has_ongoing_transaction(header.producer_id,
                                                                   header.producer_epoch):
                continue
            producer = (header.producer_id, header.producer_epoch)
            wanted.append(TopicPartition(name, data.index))
    return wanted, *producer


async def _add_implicitly(ctx: RequestContext, body) -> tuple[dict, asyncio.Future | None]:
    """KIP-890 part 2 for Produce v12+: wait for an implicit add of the same producer that
    is still appending, then add this request's new partitions; the partitions the
    coordinator refused, with the error to answer, and the gate to close after appending."""
    txns, transactional_id = ctx.txns, body.transactional_id
    while (gate := txns.gate(transactional_id)) is not None:
        await gate
    wanted, producer_id, producer_epoch = _to_add(ctx, body)
    if not wanted:
        return {}, None
    gate = txns.open_gate(transactional_id)
    try:
        error = await txns.add_implicitly(transactional_id, producer_id, producer_epoch, wanted)
    except BaseException:
        txns.close_gate(transactional_id, gate)
        raise
    if error is ErrorCode.none:
        return {}, gate
    error = ErrorCode.not_enough_replicas if error in _VERIFY_RETRIABLE else error
    return {tp: error for tp in wanted}, gate


@handles(ApiKey.PRODUCE)
async def produce(ctx: RequestContext, body) -> dict | None:
    acks = body.acks
    per_topic: list[tuple[object, list[_Outcome]]] = []   # (request topic, outcomes)
    all_outcomes: list[_Outcome] = []
    whole_request_error = _request_error(body) or _authorization_error(ctx, body)
    refused: dict[TopicPartition, ErrorCode] = {}
    gate = None
    if (whole_request_error is None and body.transactional_id is not None
            and ctx.api_version >= ADD_PARTITION_MIN_VERSION and _has_transactional_batch(body)):
        refused, gate = await _add_implicitly(ctx, body)
    try:
        for topic in body.topic_data:
            name = _topic_name(ctx, topic)
            if whole_request_error is not None:
                outcomes = [_Outcome(p.index, whole_request_error) for p in topic.partition_data]
            elif acks not in (ACKS_NONE, ACKS_LEADER, ACKS_ALL):
                outcomes = [_Outcome(p.index, ErrorCode.invalid_required_acks)
                            for p in topic.partition_data]
            elif name is None:   # v13+: an id no topic has
                outcomes = [_Outcome(p.index, ErrorCode.unknown_topic_id)
                            for p in topic.partition_data]
            elif not ctx.authorized(Operation.WRITE, ResourceType.TOPIC, name):
                outcomes = [_Outcome(p.index, ErrorCode.topic_authorization_failed)
                            for p in topic.partition_data]
            else:
                outcomes = [_append(ctx, name, p, body.transactional_id, refused)
                            for p in topic.partition_data]
            all_outcomes += outcomes
            per_topic.append((topic, outcomes))
    finally:
        if gate is not None:  # appended: the producer's next request may go
            ctx.txns.close_gate(body.transactional_id, gate)
    if acks == ACKS_NONE:
        return None
    if acks == ACKS_ALL:
        await _flush(ctx, all_outcomes)
    results = [{"name": getattr(topic, "name", None), "topic_id": getattr(topic, "topic_id", None),
                "partition_responses": [o.response() for o in outcomes]}
               for topic, outcomes in per_topic]
    return {"responses": results, "throttle_time": 0}
