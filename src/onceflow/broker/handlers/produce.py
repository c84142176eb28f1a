"""Produce: validate each partition's record batch, append, answer per acks.

Per partition (Kafka's rules for Produce v3+): exactly one magic-2 batch, CRC-32C
valid, no control batch from a client, at most the topic's max.message.bytes. A
failing partition gets its error code; the other partitions of the request are
still appended. The append happens synchronously in request order; then:

- acks=0: no response at all (Kafka sends none);
- acks=1: answered once the bytes are written (page cache: survives a crash of
  the broker process);
- acks=-1: answered once the group committer has fsync'd them (with fsync on).
"""

from __future__ import annotations

import asyncio
import dataclasses

from kio.schema.errors import ErrorCode

from onceflow.broker.handlers import ApiKey, RequestContext, handles
from onceflow.broker.state import PartitionState
from onceflow.protocol.errors import RecordError
from onceflow.protocol.records import BatchHeader, check_produce_records

ACKS_NONE, ACKS_LEADER, ACKS_ALL = 0, 1, -1


class ProduceError(Exception):
    def __init__(self, code: ErrorCode, message: str | None = None) -> None:
        super().__init__(message or code.name)
        self.code = code
        self.message = message


@dataclasses.dataclass(slots=True)
class _Outcome:
    index: int
    error_code: ErrorCode = ErrorCode.none
    error_message: str | None = None
    base_offset: int = -1
    log_append_time_ms: int = -1
    log_start_offset: int = -1
    partition: PartitionState | None = None

    def response(self) -> dict:
        return {
            "index": self.index, "error_code": self.error_code, "base_offset": self.base_offset,
            "log_append_time": self.log_append_time_ms, "log_start_offset": self.log_start_offset,
            "record_errors": [], "error_message": self.error_message,
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


def _append(ctx: RequestContext, topic: str, data) -> _Outcome:
    outcome = _Outcome(data.index)
    state = ctx.broker
    info = state.topic(topic)
    partition = state.partition(topic, data.index) if info else None
    if partition is None:
        outcome.error_code = ErrorCode.unknown_topic_or_partition
        return outcome
    if state.leader(info, data.index) != ctx.node_id:
        outcome.error_code = ErrorCode.not_leader_or_follower
        return outcome
    log = partition.log
    try:
        header, batch = single_batch(data.records, ctx.api_version, log.config.max_message_bytes)
    except ProduceError as exc:
        outcome.error_code, outcome.error_message = exc.code, exc.message
        return outcome
    appended = log.append([batch], ctx.now_ms())
    partition.notify()
    outcome.base_offset = appended.first_offset
    outcome.log_append_time_ms = appended.log_append_time_ms
    outcome.log_start_offset = log.log_start_offset
    outcome.partition = partition
    return outcome


async def _flush(ctx: RequestContext, outcomes: list[_Outcome]) -> None:
    logs = {id(o.partition): o.partition.log for o in outcomes if o.partition is not None}
    futures = [asyncio.wrap_future(ctx.broker.committer.request_flush(log)) for log in logs.values()]
    if futures:
        await asyncio.gather(*futures)


@handles(ApiKey.PRODUCE)
async def produce(ctx: RequestContext, body) -> dict | None:
    acks = body.acks
    results = []
    all_outcomes: list[_Outcome] = []
    for topic in body.topic_data:
        if acks not in (ACKS_NONE, ACKS_LEADER, ACKS_ALL):
            outcomes = [_Outcome(p.index, ErrorCode.invalid_required_acks) for p in topic.partition_data]
        else:
            outcomes = [_append(ctx, topic.name, p) for p in topic.partition_data]
        all_outcomes += outcomes
        results.append({"name": topic.name, "partition_responses": [o.response() for o in outcomes]})
    if acks == ACKS_NONE:
        return None
    if acks == ACKS_ALL:
        await _flush(ctx, all_outcomes)
    # Responses were built before the flush; offsets do not change while waiting.
    return {"responses": results, "throttle_time": 0}
