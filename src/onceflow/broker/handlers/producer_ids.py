"""InitProducerId: durable producer ids, KIP-360 epoch bumps, transactional ids.

Theory of operation. An idempotent producer (no transactional id) asks once for a
producer id (PID); every batch it sends then carries that PID, an epoch and per-partition
sequence numbers, which the partitions' producer state checks (handlers/produce.py).
PIDs come from `ProducerIdAllocator` (storage/producer_ids.py), which reserves them in
durable blocks, so a PID is never handed out twice, also across crashes and restarts.

Answers, for a request without a transactional id:

- no current PID presented (v0-2, or v3+ with producer_id -1): a new PID, epoch 0.
  This is all Kafka ever answers here; librdkafka and the Java client always ask so.
- v3+ presenting a current PID and epoch (KIP-360: kafka-python does this to recover
  from OUT_OF_ORDER_SEQUENCE_NUMBER or UNKNOWN_PRODUCER_ID): the same PID with the epoch
  bumped by one, so the producer restarts its sequences at 0 and any of its batches
  still in flight with the old epoch are refused (INVALID_PRODUCER_EPOCH) instead of
  appended. The bump is granted only when it is safe: the PID was handed out already
  (below a freshly drawn id: the allocator only counts up), no partition has seen a
  newer epoch of it than the one presented, and the epoch is not exhausted. A retried
  bump whose answer was lost gets the same answer, since nothing was written with the
  new epoch yet. Otherwise the answer is a new PID, epoch 0, as Kafka gives: no client
  is ever failed by this path.

A request with a transactional id goes to the transaction coordinator (onceflow.txn)
if this node coordinates the id (else NOT_COORDINATOR; COORDINATOR_NOT_AVAILABLE before
`__transaction_state` exists): a new id gets a new PID with epoch 0, a known one the same
PID with epoch + 1, which fences older instances; an open transaction is aborted first
(CONCURRENT_TRANSACTIONS: the client retries). PIDs come from the same allocator as
above. Versions below 4 get INVALID_PRODUCER_EPOCH instead of PRODUCER_FENCED, which
they do not know. An empty transactional id is INVALID_REQUEST, as in Kafka.

Authorization (issue 13), as Kafka: a transactional id needs Write on it (else
TRANSACTIONAL_ID_AUTHORIZATION_FAILED); an idempotent producer needs IdempotentWrite on
the cluster or Write on some topic (else CLUSTER_AUTHORIZATION_FAILED).

Two-phase commit (v6, KIP-939): `enable2Pc` also needs TwoPhaseCommit on the id and the
broker setting transaction.two.phase.commit.enable (off: TRANSACTIONAL_ID_AUTHORIZATION_
FAILED); such a transaction has no timeout. `keepPreparedTxn` keeps an open two-phase
transaction for the new instance, answering its producer id and epoch as
ongoing_txn_producer_id/epoch (txn/handlers.py). Either flag without a transactional id is
INVALID_REQUEST.
"""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from onceflow.broker.handlers import ApiKey, RequestContext, handles
from onceflow.broker.handlers.transactions import old_fenced_error
from onceflow.broker.state import BrokerState
from onceflow.protocol.codec import to_ms
from onceflow.security.acl import Operation, ResourceType
from onceflow.storage.producer_ids import ProducerIdsExhausted

# Epochs are int16; after the last one a producer needs a new PID.
PRODUCER_EPOCH_MAX = 2**15 - 1
NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
PRODUCER_FENCED_MIN_VERSION = 4  # InitProducerId v4 introduced PRODUCER_FENCED
TWO_PHASE_COMMIT_MIN_VERSION = 6  # KIP-939: enable2Pc, keepPreparedTxn, ongoing txn fields


def _answer(error: ErrorCode, producer_id: int = NO_PRODUCER_ID,
            producer_epoch: int = NO_PRODUCER_EPOCH, ongoing: tuple[int, int] | None = None
            ) -> dict:
    answer = {"throttle_time": 0, "error_code": error, "producer_id": producer_id,
              "producer_epoch": producer_epoch}
    if ongoing is not None:  # v6 fields; the encoder of older versions has no place for them
        answer["ongoing_txn_producer_id"], answer["ongoing_txn_producer_epoch"] = ongoing
    return answer


def newest_epoch_seen(state: BrokerState, producer_id: int) -> int:
    """The newest epoch of `producer_id` any partition holds, -1 if none knows it."""
    epochs = [entry.producer_epoch for partition in state.partitions()
              if (entry := partition.producers.last_entry(producer_id)) is not None]
    return max(epochs, default=NO_PRODUCER_EPOCH)


def can_bump(state: BrokerState, producer_id: int, producer_epoch: int, fresh_id: int) -> bool:
    """Whether a KIP-360 request for (producer_id, producer_epoch) may keep its PID."""
    return (0 <= producer_id < fresh_id
            and 0 <= producer_epoch < PRODUCER_EPOCH_MAX
            and newest_epoch_seen(state, producer_id) <= producer_epoch)


def init_idempotent(state: BrokerState, producer_id: int, producer_epoch: int) -> dict:
    """The answer for a request without a transactional id (see the module docstring)."""
    if producer_id != NO_PRODUCER_ID and not state.recovered:
        # A partition not recovered yet may know a newer epoch: the client retries.
        return _answer(ErrorCode.coordinator_load_in_progress)
    try:
        # Drawn first: an upper bound of every PID handed out so far, and the answer
        # whenever a bump is not possible. A bump wastes it; PIDs are int64.
        fresh_id = state.producer_ids.next_id()
    except ProducerIdsExhausted:
        return _answer(ErrorCode.unknown_server_error)
    if producer_id != NO_PRODUCER_ID and can_bump(state, producer_id, producer_epoch, fresh_id):
        return _answer(ErrorCode.none, producer_id, producer_epoch + 1)
    return _answer(ErrorCode.none, fresh_id, 0)


@handles(ApiKey.INIT_PRODUCER_ID)
async def init_producer_id(ctx: RequestContext, body) -> dict:
    transactional_id = body.transactional_id
    two_phase = getattr(body, "enable2_pc", False)
    if transactional_id is None and (two_phase or getattr(body, "keep_prepared_txn", False)):
        return _answer(ErrorCode.invalid_request)
    if transactional_id is None:
        if not (ctx.authorized_cluster(Operation.IDEMPOTENT_WRITE) or (
                ctx.access is not None and ctx.access.authorized_any(
                    ctx.session, Operation.WRITE, ResourceType.TOPIC))):
            return _answer(ErrorCode.cluster_authorization_failed)
        return init_idempotent(ctx.broker, getattr(body, "producer_id", NO_PRODUCER_ID),
                               getattr(body, "producer_epoch", NO_PRODUCER_EPOCH))
    if transactional_id == "":
        return _answer(ErrorCode.invalid_request)
    if not ctx.authorized(Operation.WRITE, ResourceType.TRANSACTIONAL_ID, transactional_id):
        return _answer(ErrorCode.transactional_id_authorization_failed)
    if two_phase and not ctx.authorized(Operation.TWO_PHASE_COMMIT, ResourceType.TRANSACTIONAL_ID,
                                        transactional_id):
        return _answer(ErrorCode.transactional_id_authorization_failed)
    return await init_transactional(ctx, body, transactional_id)


async def init_transactional(ctx: RequestContext, body, transactional_id: str) -> dict:
    runtime = ctx.txns
    error = runtime.route(transactional_id, ctx.node_id)
    if error is not None:
        return _answer(error)
    result = await runtime.persist(runtime.coordinator.init_producer_id(
        transactional_id=transactional_id, transaction_timeout_ms=to_ms(body.transaction_timeout),
        producer_id=getattr(body, "producer_id", NO_PRODUCER_ID),
        producer_epoch=getattr(body, "producer_epoch", NO_PRODUCER_EPOCH), now_ms=ctx.now_ms(),
        enable_2pc=getattr(body, "enable2_pc", False),
        keep_prepared_txn=getattr(body, "keep_prepared_txn", False)))
    error = old_fenced_error(result.error, ctx.api_version, PRODUCER_FENCED_MIN_VERSION)
    ongoing = ((result.ongoing_txn_producer_id, result.ongoing_txn_producer_epoch)
               if ctx.api_version >= TWO_PHASE_COMMIT_MIN_VERSION else None)
    return _answer(error, result.producer_id, result.producer_epoch, ongoing)
