"""Fetch: read whole batches per partition, long-polling until min_bytes arrive.

Limits (KIP-74): `partition_max_bytes` per partition and `max_bytes` for the whole
response, except that the first partition with data returns at least one whole
batch even if it is larger, so a big batch never blocks a consumer. The upper
bound of what is readable is the high watermark (read_uncommitted) or the last
stable offset (read_committed).

read_committed responses also carry `aborted_transactions`: (producer id, first
offset) of every aborted transaction overlapping the returned records, from the
segments' aborted-transaction indexes (storage/txn_index.py). The client drops a
producer's records from that first offset until it meets that producer's ABORT
marker. The index is asked about [fetch offset, LSO) first - almost always empty -
and only when it answers is the exact end of the returned batches computed, so
read_committed costs no more than read_uncommitted without aborts.

Long poll: when fewer than `min_bytes` are available and the client allows a
wait, the handler registers a waiter on each requested partition and sleeps until
an append wakes it or `max_wait_ms` passes, then reads again.

Fetch sessions (KIP-227) are not created: the response carries session id 0,
which tells clients to keep sending full fetch requests.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time

from kio.schema.errors import ErrorCode

from onceflow.broker.config import FETCH_WAIT_MS_MAX
from onceflow.broker.handlers import ApiKey, RequestContext, handles
from onceflow.security.acl import Operation, ResourceType
from onceflow.broker.state import PartitionState
from onceflow.protocol.records import iter_batches
from onceflow.storage import LogClosedError, OffsetOutOfRange

READ_UNCOMMITTED, READ_COMMITTED = 0, 1
# Fetch session epochs: -1 = full request without a session, 0 = ask for a new one.
SESSIONLESS_EPOCHS = (-1, 0)


@dataclasses.dataclass(slots=True)
class _Wanted:
    topic_key: object               # name (v<13) or topic id (v13+), echoed back
    index: int
    fetch_offset: int
    partition_max_bytes: int
    partition: PartitionState | None
    error_code: ErrorCode = ErrorCode.none
    topic_id: object = None          # the id the partition was resolved under
    by_id: bool = False

    def lose(self) -> None:
        """The topic went (deleted, or the broker is stopping) while the fetch waited:
        answer as Kafka does for a topic it does not know."""
        self.partition = None
        self.error_code = ErrorCode.unknown_topic_id if self.by_id else ErrorCode.unknown_topic_or_partition


def last_stable_offset(partition: PartitionState) -> int:
    """First offset of the earliest open transaction, or the high watermark."""
    return partition.last_stable_offset


def aborted_transactions(partition: PartitionState, fetch_offset: int, upper_offset: int,
                         records: bytes) -> list[dict]:
    """The AbortedTransactions of a read_committed answer holding `records`."""
    if not records:
        return []
    aborted = partition.aborted_transactions(fetch_offset, upper_offset)
    if not aborted:
        return []
    end_offset = upper_offset  # exclusive end of the returned batches
    for header, _ in iter_batches(records):
        end_offset = header.last_offset + 1
    return [{"producer_id": txn.producer_id, "first_offset": txn.first_offset}
            for txn in aborted if txn.first_offset < end_offset]


def _resolve(ctx: RequestContext, body) -> list[_Wanted]:
    state = ctx.broker
    wanted = []
    for topic in body.topics:
        by_id = hasattr(topic, "topic_id")
        info = state.topic_by_id(topic.topic_id) if by_id else state.topic(topic.topic)
        key = topic.topic_id if by_id else topic.topic
        for p in topic.partitions:
            item = _Wanted(key, p.partition, p.fetch_offset, p.partition_max_bytes, None,
                           by_id=by_id)
            name = info.name if info is not None else (None if by_id else topic.topic)
            if name is not None and not ctx.authorized(Operation.READ, ResourceType.TOPIC, name):
                item.error_code = ErrorCode.topic_authorization_failed  # Kafka: before existence
            elif info is None:
                item.error_code = ErrorCode.unknown_topic_id if by_id else ErrorCode.unknown_topic_or_partition
            elif (partition := state.partition(info.name, p.partition)) is None:
                item.error_code = ErrorCode.unknown_topic_or_partition
            elif state.leader(info, p.partition) != ctx.node_id:
                item.error_code = ErrorCode.not_leader_or_follower
            else:
                item.partition = partition
                item.topic_id = info.topic_id
            wanted.append(item)
    return wanted


def _read_all(wanted: list[_Wanted], isolation: int, max_bytes: int) -> tuple[list[dict], int, bool]:
    """(partition responses, bytes read, whether any partition has an error)."""
    responses, total, errors = [], 0, False
    for item in wanted:
        response = {"partition_index": item.index, "error_code": item.error_code,
                    "high_watermark": -1, "last_stable_offset": -1, "log_start_offset": -1,
                    "aborted_transactions": None if isolation == READ_UNCOMMITTED else [],
                    "preferred_read_replica": -1, "records": b""}
        partition = item.partition
        if partition is None:
            errors = True
            responses.append(response)
            continue
        log = partition.log
        lso = last_stable_offset(partition)
        upper = lso if isolation == READ_COMMITTED else partition.high_watermark
        response.update(high_watermark=partition.high_watermark, last_stable_offset=lso,
                        log_start_offset=log.log_start_offset)
        budget = min(item.partition_max_bytes, max_bytes - total)
        try:
            # The first partition with data gets at least one whole batch (KIP-74):
            # log.read returns one even when it is larger than the budget.
            records = log.read(item.fetch_offset, max(budget, 1), upper) if total == 0 or budget > 0 else b""
        except OffsetOutOfRange:
            response["error_code"] = ErrorCode.offset_out_of_range
            errors = True
            records = b""
        except LogClosedError:   # deleted between the check and the read
            item.lose()
            response.update(error_code=item.error_code, high_watermark=-1,
                            last_stable_offset=-1, log_start_offset=-1)
            errors = True
            records = b""
        response["records"] = records
        if isolation == READ_COMMITTED:
            response["aborted_transactions"] = aborted_transactions(
                partition, item.fetch_offset, upper, records)
        total += len(records)
        responses.append(response)
    return responses, total, errors


async def _wait_for_data(wanted: list[_Wanted], timeout_s: float) -> None:
    loop = asyncio.get_running_loop()
    waiter: asyncio.Future[None] = loop.create_future()
    partitions = [w.partition for w in wanted if w.partition is not None]
    for partition in partitions:
        partition.waiters.add(waiter)
    try:
        await asyncio.wait_for(waiter, timeout_s)
    except asyncio.TimeoutError:
        pass
    finally:
        for partition in partitions:
            partition.waiters.discard(waiter)


def _drop_gone(ctx: RequestContext, wanted: list[_Wanted]) -> None:
    """After a wait: partitions whose topic was deleted (or deleted and created again
    under a new id) are answered with an error instead of read from a closed log."""
    for item in wanted:
        if item.partition is None:
            continue
        info = ctx.broker.topic(item.partition.topic)
        if info is None or info.topic_id != item.topic_id:
            item.lose()


def _group(wanted: list[_Wanted], responses: list[dict], by_id: bool) -> list[dict]:
    topics: dict[object, list[dict]] = {}
    for item, response in zip(wanted, responses):
        topics.setdefault(item.topic_key, []).append(response)
    key = "topic_id" if by_id else "topic"
    return [{key: k, "partitions": parts} for k, parts in topics.items()]


@handles(ApiKey.FETCH)
async def fetch(ctx: RequestContext, body) -> dict:
    session_epoch = getattr(body, "session_epoch", -1)
    if getattr(body, "session_id", 0) != 0 or session_epoch not in SESSIONLESS_EPOCHS:
        return {"throttle_time": 0, "error_code": ErrorCode.fetch_session_id_not_found,
                "session_id": 0, "responses": []}
    isolation = getattr(body, "isolation_level", READ_UNCOMMITTED)
    max_bytes = getattr(body, "max_bytes", 2**31 - 1)
    wait_ms = min(int(body.max_wait.total_seconds() * 1000), FETCH_WAIT_MS_MAX)
    deadline = time.monotonic() + wait_ms / 1000
    wanted = _resolve(ctx, body)
    while True:
        responses, total, errors = _read_all(wanted, isolation, max_bytes)
        remaining_s = deadline - time.monotonic()
        if total >= body.min_bytes or errors or remaining_s <= 0 or not wanted:
            break
        await _wait_for_data(wanted, remaining_s)
        _drop_gone(ctx, wanted)
    by_id = bool(body.topics) and hasattr(body.topics[0], "topic_id")
    return {"throttle_time": 0, "error_code": ErrorCode.none, "session_id": 0,
            "responses": _group(wanted, responses, by_id)}
