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
an append wakes it or `max_wait_ms` passes, then reads again. A fetch whose every
partition is asked from its upper bound (a consumer reading along) waits without reading
first: that read could only find nothing.

Topics are named by id from v13 on: an id the broker does not know (zero included)
answers UNKNOWN_TOPIC_ID. A topic deleted while a fetch waits on it (or deleted and
created again under a new id) answers UNKNOWN_TOPIC_OR_PARTITION by name and
UNKNOWN_TOPIC_ID by id; so does a log closed under the read by a stopping broker.
INCONSISTENT_TOPIC_ID is answered where Kafka's ReplicaManager.read answers it: the
request's id resolves to a topic name whose log now has another id. That happens to an
incremental fetch of a by-id session (which remembers the name each id resolved to)
after the topic was deleted and created again under the same name, and to a by-id fetch
whose topic is deleted and created again while it waits; once no topic has the name,
the session's partition answers UNKNOWN_TOPIC_OR_PARTITION. NOT_LEADER_OR_FOLLOWER
answers carry the leader (v12+, tagged) and its endpoint (v16+, KIP-951).

Quotas: a consumer's fetch asks for at most what its `consumer_byte_rate` allows in one
quota window (max_bytes and min_bytes capped there, as KafkaApis.handleFetchRequest does),
so one answer never holds more than the quota would let through; a follower is not capped.

Fetch sessions (KIP-227, broker/runtime/fetch_sessions.py): a full fetch with epoch 0
creates a session when the cache has room; an incremental fetch reads every partition
of its session and answers only those with something new (docs/protocol.md).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
import weakref

from kio.schema.errors import ErrorCode

from onceflow.broker.access import ANONYMOUS
from onceflow.broker.config import FETCH_WAIT_MS_MAX
from onceflow.broker.handlers import ApiKey, RequestContext, handles
from onceflow.broker.handlers.metadata import brokers
from onceflow.broker.quotas import CONSUMER_BYTE_RATE, quota_user
from onceflow.broker.runtime.fetch_sessions import (
    FINAL_EPOCH,
    INITIAL_EPOCH,
    FetchSession,
    FetchSessionCache,
    next_epoch,
)
from onceflow.broker.state import PartitionState
from onceflow.protocol.records import iter_batches
from onceflow.security.acl import Operation, ResourceType
from onceflow.storage import LogClosedError, OffsetOutOfRange
from onceflow.storage.store import TopicInfo

READ_UNCOMMITTED, READ_COMMITTED = 0, 1
TOPIC_ID_VERSION = 13   # Fetch v13+ names topics by id
INT32_MAX = 2**31 - 1


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
    topic_name: str | None = None    # the name the request's key resolved to
    leader: int = -1                 # NOT_LEADER_OR_FOLLOWER: who leads (v16+ tells)
    leader_epoch: int = -1

    def lose(self) -> None:
        """The topic went (deleted, or the broker is stopping) while the fetch waited:
        answer as Kafka does for a topic it does not know."""
        self.partition = None
        self.error_code = ErrorCode.unknown_topic_id if self.by_id else ErrorCode.unknown_topic_or_partition


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


def _requested(body, by_id: bool) -> list[tuple[tuple, int, int]]:
    """((topic key, partition), fetch offset, partition max bytes) of the request."""
    return [((topic.topic_id if by_id else topic.topic, p.partition), p.fetch_offset,
             p.partition_max_bytes)
            for topic in body.topics for p in topic.partitions]


def _forgotten(body, by_id: bool) -> list[tuple]:
    return [(topic.topic_id if by_id else topic.topic, index)
            for topic in getattr(body, "forgotten_topics_data", None) or ()
            for index in topic.partitions]


def _resolve(ctx: RequestContext, requested: list[tuple[tuple, int, int]],
             by_id: bool, session: FetchSession | None = None) -> list[_Wanted]:
    state = ctx.broker
    node_id = ctx.node_id
    wanted = []
    topics: dict[object, tuple] = {}   # key -> (info, name, error for every partition or None)
    infos: dict[object, TopicInfo] | None = None   # key -> topic, read once per request
    for (key, index), fetch_offset, max_bytes in requested:
        topic = topics.get(key)
        if topic is None:
            if infos is None:
                infos = state.topics()   # a copy: one per request, not one per topic
                if by_id:
                    infos = {info.topic_id: info for info in infos.values()}
            topic = topics[key] = _resolve_topic(ctx, key, infos.get(key), by_id)
        info, name, error = topic
        item = _Wanted(key, index, fetch_offset, max_bytes, None, ErrorCode.none, None, by_id)
        if name is None and session is not None:   # an id the session resolved before
            name = session.topic_name((key, index))
            if name is not None:
                error = _session_name_error(ctx, name, index)
        item.topic_name = name
        if error is not None:
            item.error_code = error
        elif not state.ready(name, index):  # still recovering
            item.error_code = ErrorCode.not_leader_or_follower
        elif (partition := state.partition(name, index)) is None:
            item.error_code = ErrorCode.unknown_topic_or_partition
        elif (leader := state.leader(info, index)) != node_id:
            item.error_code = ErrorCode.not_leader_or_follower
            item.leader, item.leader_epoch = leader, state.cluster.leader_epoch
        else:
            item.partition = partition
            item.topic_id = info.topic_id
        wanted.append(item)
    return wanted


def _resolve_topic(ctx: RequestContext, key, info: TopicInfo | None, by_id: bool) -> tuple:
    """(info, name, the error of each of its partitions or None), once per topic of a
    request: authorization is checked before existence, as Kafka does."""
    name = info.name if info is not None else (None if by_id else key)
    if name is not None and not ctx.authorized(Operation.READ, ResourceType.TOPIC, name):
        return info, name, ErrorCode.topic_authorization_failed
    if info is None:
        return info, name, (ErrorCode.unknown_topic_id if by_id
                            else ErrorCode.unknown_topic_or_partition)
    return info, name, None


def _session_name_error(ctx: RequestContext, name: str, index: int) -> ErrorCode:
    """The error of a by-id session's partition whose id is gone but whose name the session
    remembers (the topic was deleted, perhaps created again under a new id)."""
    if not ctx.authorized(Operation.READ, ResourceType.TOPIC, name):
        return ErrorCode.topic_authorization_failed
    return _stale_id_error(ctx.broker, name, index)


def _stale_id_error(state, name: str, index: int) -> ErrorCode:
    """A by-id request's old id whose name the session remembers: the log by that name has
    another id now (Kafka's read: INCONSISTENT_TOPIC_ID), or there is none."""
    current = state.topic(name)
    if current is None or state.partition(name, index) is None:
        return ErrorCode.unknown_topic_or_partition
    return ErrorCode.inconsistent_topic_id


def _read_all(wanted: list[_Wanted], isolation: int, max_bytes: int) -> tuple[list[dict], int, bool]:
    """(partition responses, bytes read, whether any partition has an error).

    A Fetch may name 10,000 partitions and more, so this loop is kept lean (issue 19): one
    dict per partition built at once, and error codes as plain ints, so that a dict of
    ints and bytes is one the garbage collector does not track (an ErrorCode member would
    make it tracked, and every tracked survivor brings the next full collection nearer)."""
    responses, total, errors = [], 0, False
    committed = isolation == READ_COMMITTED
    for item in wanted:
        partition = item.partition
        if partition is None:
            errors = True
            responses.append(_error_response(item, committed))
            continue
        log = partition.log
        high_watermark = partition.high_watermark
        lso = partition.last_stable_offset
        upper = lso if committed else high_watermark
        budget = min(item.partition_max_bytes, max_bytes - total)
        error_code = 0
        try:
            # The first partition with data gets at least one whole batch (KIP-74):
            # log.read returns one even when it is larger than the budget.
            records = log.read(item.fetch_offset, max(budget, 1), upper) if total == 0 or budget > 0 else b""
        except OffsetOutOfRange:
            error_code = ErrorCode.offset_out_of_range.value
            errors = True
            records = b""
        except LogClosedError:   # deleted between the check and the read
            item.lose()
            errors = True
            responses.append(_error_response(item, committed))
            continue
        responses.append({
            "partition_index": item.index, "error_code": error_code,
            "high_watermark": high_watermark, "last_stable_offset": lso,
            "log_start_offset": log.log_start_offset,
            "aborted_transactions": (aborted_transactions(partition, item.fetch_offset, upper,
                                                          records) if committed else None),
            "preferred_read_replica": -1, "records": records})
        total += len(records)
    return responses, total, errors


def _error_response(item: _Wanted, committed: bool) -> dict:
    response = {"partition_index": item.index, "error_code": item.error_code.value,
                "high_watermark": -1, "last_stable_offset": -1, "log_start_offset": -1,
                "aborted_transactions": [] if committed else None,
                "preferred_read_replica": -1, "records": b""}
    if item.leader >= 0:   # v12+ (tagged): the new leader, so no Metadata round trip
        response["current_leader"] = {"leader_id": item.leader,
                                      "leader_epoch": item.leader_epoch}
    return response


def _caught_up(wanted: list[_Wanted], isolation: int) -> bool:
    """Every partition is readable and asked from its upper bound (high watermark or LSO):
    a read would return no records and no error. The usual state of a consumer reading
    along, whose Fetch then waits without a read first (issue 19)."""
    for item in wanted:
        partition = item.partition
        if partition is None:
            return False
        upper = (partition.last_stable_offset if isolation == READ_COMMITTED
                 else partition.high_watermark)
        if item.fetch_offset != upper:
            return False
    return bool(wanted)


async def _wait_for_data(wanted: list[_Wanted], timeout_s: float) -> None:
    """Until an append to one of the partitions or `timeout_s`, whichever comes first.
    One future, woken by the append (PartitionState.notify) or by a timer: a fetch is
    woken per record when a consumer reads along, and asyncio.wait_for would add a
    second future and two callbacks to each wake (issue 19)."""
    loop = asyncio.get_running_loop()
    waiter: asyncio.Future[None] = loop.create_future()
    partitions = [w.partition for w in wanted if w.partition is not None]
    for partition in partitions:
        partition.waiters.add(waiter)
    timer = loop.call_later(timeout_s, _wake, waiter)
    try:
        await waiter
    finally:
        timer.cancel()
        for partition in partitions:
            partition.waiters.discard(waiter)


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


def _drop_gone(ctx: RequestContext, wanted: list[_Wanted]) -> None:
    """After a wait: partitions whose topic was deleted (or deleted and created again
    under a new id) are answered with an error instead of read from a closed log."""
    for item in wanted:
        if item.partition is None:
            continue
        name = item.partition.topic
        info = ctx.broker.topic(name)
        if info is None or info.topic_id != item.topic_id:
            item.lose()
            if item.by_id and info is not None and ctx.broker.partition(name, item.index):
                item.error_code = ErrorCode.inconsistent_topic_id   # created again meanwhile


def _group(wanted: list[_Wanted], responses: list[dict], by_id: bool) -> list[dict]:
    """The partition responses under their topics, in request order (a request lists each
    topic's partitions together, so consecutive runs of one key are the usual case)."""
    key_name = "topic_id" if by_id else "topic"
    topics: dict[object, list[dict]] = {}
    key, parts = _NO_KEY, []
    for item, response in zip(wanted, responses):
        if item.topic_key != key:
            key = item.topic_key
            parts = topics.get(key)
            if parts is None:
                parts = topics[key] = []
        parts.append(response)
    return [{key_name: k, "partitions": p} for k, p in topics.items()]


_NO_KEY = object()


_CACHES: weakref.WeakKeyDictionary[object, FetchSessionCache] = weakref.WeakKeyDictionary()


def session_cache(state) -> FetchSessionCache:
    """The broker's fetch session cache (one per broker state)."""
    cache = _CACHES.get(state)
    if cache is None:
        cache = _CACHES[state] = FetchSessionCache(state.config.fetch_session_cache_slots)
    return cache


def _session_error(error: ErrorCode) -> dict:
    return {"throttle_time": 0, "error_code": error, "session_id": 0, "responses": []}


@handles(ApiKey.FETCH)
async def fetch(ctx: RequestContext, body) -> dict:
    by_id = ctx.api_version >= TOPIC_ID_VERSION
    session_id = getattr(body, "session_id", 0)
    session_epoch = getattr(body, "session_epoch", FINAL_EPOCH)
    cache = session_cache(ctx.broker)
    session = None
    requested = _requested(body, by_id)
    if session_epoch in (INITIAL_EPOCH, FINAL_EPOCH):   # a full fetch
        if session_id != 0:
            cache.remove(session_id)
    else:                                                # an incremental fetch
        session = cache.get(session_id, ctx.node_id)
        if session is None:
            return _session_error(ErrorCode.fetch_session_id_not_found)
        if session.epoch != session_epoch:
            return _session_error(ErrorCode.invalid_fetch_session_epoch)
        if session.by_id != by_id:
            return _session_error(ErrorCode.fetch_session_topic_id_error)
        session.update(requested, _forgotten(body, by_id))
        session.epoch = next_epoch(session_epoch)
        requested = [(key, c.fetch_offset, c.partition_max_bytes)
                     for key, c in session.partitions.items()]
    isolation = getattr(body, "isolation_level", READ_UNCOMMITTED)
    max_bytes = min(getattr(body, "max_bytes", INT32_MAX), _quota_window_bytes(ctx, body))
    min_bytes = min(body.min_bytes, max_bytes)
    wait_ms = min(int(body.max_wait.total_seconds() * 1000), FETCH_WAIT_MS_MAX)
    deadline = time.monotonic() + wait_ms / 1000
    wanted = _resolve(ctx, requested, by_id, session)
    while True:
        if min_bytes > 0 and _caught_up(wanted, isolation):
            remaining_s = deadline - time.monotonic()
            if remaining_s > 0:   # nothing to read anywhere: wait before building an answer
                await _wait_for_data(wanted, remaining_s)
                _drop_gone(ctx, wanted)
                continue
        responses, total, errors = _read_all(wanted, isolation, max_bytes)
        remaining_s = deadline - time.monotonic()
        if total >= min_bytes or errors or remaining_s <= 0 or not wanted:
            break
        await _wait_for_data(wanted, remaining_s)
        _drop_gone(ctx, wanted)
    throttle_ms = _record_fetched(ctx, body, responses)
    if throttle_ms > 0:
        # Kafka's getThrottledResponse: no records, the session (if any) untouched beyond
        # its epoch, none created; the connection is muted for the throttle time.
        return {"throttle_time": throttle_ms, "error_code": ErrorCode.none,
                "session_id": 0 if session is None else session.session_id,
                "responses": [], "node_endpoints": []}
    if session_epoch == INITIAL_EPOCH:
        session = cache.create(ctx.node_id, by_id, requested)
    if session is not None:
        if by_id:
            for item in wanted:
                if item.topic_name is not None:
                    session.resolved((item.topic_key, item.index), item.topic_name)
        answered = [(item, response) for item, response in zip(wanted, responses)
                    if session.must_answer(
                        (item.topic_key, item.index), error=response["error_code"] != ErrorCode.none,
                        has_records=bool(response["records"]),
                        high_watermark=response["high_watermark"],
                        last_stable_offset=response["last_stable_offset"],
                        log_start_offset=response["log_start_offset"])]
        if session_epoch != INITIAL_EPOCH:   # incremental: only what changed
            wanted = [item for item, _ in answered]
            responses = [response for _, response in answered]
    return {"throttle_time": 0, "error_code": ErrorCode.none,
            "session_id": 0 if session is None else session.session_id,
            "responses": _group(wanted, responses, by_id),
            "node_endpoints": _leader_endpoints(ctx, wanted)}


def _record_fetched(ctx: RequestContext, body, responses: list[dict]) -> int:
    """Count a consumer's fetched record bytes against its consumer_byte_rate quota; the
    throttle time it earns. Over the quota the bytes are taken back (they are not sent:
    the answer is empty), as KafkaApis.handleFetchRequest un-records them."""
    quotas = ctx.broker.quotas
    if not quotas.active() or getattr(body, "replica_id", -1) >= 0:
        return 0
    fetched = sum(len(response["records"] or b"") for response in responses)
    principal = ctx.session.principal if ctx.session is not None else ANONYMOUS
    user, client_id = quota_user(principal), ctx.client_id or ""
    throttle_ms = quotas.record(CONSUMER_BYTE_RATE, user, client_id, fetched)
    if throttle_ms > 0 and fetched:
        quotas.record(CONSUMER_BYTE_RATE, user, client_id, -fetched)
    return throttle_ms


def _quota_window_bytes(ctx: RequestContext, body) -> int:
    """The most a consumer may fetch in one quota window without being throttled
    (Kafka's getMaxValueInQuotaWindow); no bound for a follower or without a quota."""
    quotas = ctx.broker.quotas
    if not quotas.active() or getattr(body, "replica_id", -1) >= 0:
        return INT32_MAX
    principal = ctx.session.principal if ctx.session is not None else ANONYMOUS
    found = quotas.window_max(CONSUMER_BYTE_RATE, quota_user(principal), ctx.client_id or "")
    return INT32_MAX if found is None else int(min(found, INT32_MAX))


def _leader_endpoints(ctx: RequestContext, wanted: list[_Wanted]) -> list[dict]:
    """v16+: the addresses of the leaders named in NOT_LEADER_OR_FOLLOWER answers (KIP-951),
    on the listener the request came in on."""
    leaders = {item.leader for item in wanted if item.leader >= 0}
    if not leaders:   # the usual answer: no node list to build
        return []
    return [b for b in brokers(ctx.broker, ctx.listener) if b["node_id"] in leaders]
