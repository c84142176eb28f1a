"""What one broker process holds while it runs, shared by every handler.

`BrokerState` owns the storage `Store`, the group committer (fsync), the cluster
view, the producer id allocator, the metrics and the per-partition runtime state
(fetch waiters, producer state). Everything here runs on the broker's event loop
thread, startup recovery included, except the fsyncs, which the group committer does on
its own thread, and the periodic write of the recovery checkpoint (a worker thread). It knows
nothing of the coordinators: their runtimes (broker/runtime/) sit above it and append
through its partitions like any producer.

Producer state (idempotence). Each `PartitionState` holds a `ProducerStateManager`
that always equals a replay of its log. `PartitionState.append` is the one way
batches enter a log: prepare (validate, mutate nothing), append, commit, in one
synchronous step, so the next pipelined request is checked against this one. When
an append rolls the log to a new segment, the state as of the new segment's base
offset is snapshotted first (Kafka does the same). At a clean shutdown every
partition snapshots at its log end. Opening a partition loads the newest valid
snapshot and replays the batches after it, so a retry that arrives after a crash
and restart is still recognised as a duplicate.

Transactions (issue 5). The producer state also knows each partition's open
transactions, hence its last stable offset (LSO: the first offset of the earliest
transaction not yet decided, clamped to [log start, high watermark]); read_committed
fetches stop there. When an ABORT marker completes a transaction, `append` records it
in the aborted-transaction index of the marker's segment. Opening a partition rebuilds
that index from the producer-state snapshot onward with the same replay, so after a
crash both the LSO and the index equal what the log says.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import re
import resource
import threading
import time
from pathlib import Path

from onceflow.broker.cluster import Cluster
from onceflow.broker.config import BrokerConfig
from onceflow.broker.config_file import log_defaults_of
from onceflow.broker.metrics import BrokerMetrics
from onceflow.broker.quotas import QUOTAS_FILE, ClientQuotas
from onceflow.protocol.records import EndTxnMarker, end_txn_marker
from onceflow.storage.group_commit import GroupCommitter
from onceflow.storage.layout import StorageError
from onceflow.storage.log import AppendInfo, PartitionLog, RetentionResult
from onceflow.storage.open_files import OPEN_FILES
from onceflow.storage.producer_ids import ProducerIdAllocator
from onceflow.storage.producer_state import (
    AppendOrigin,
    AppendPlan,
    BatchHeaderLike,
    CompletedTxn,
    Duplicate,
    ProducerStateManager,
    Rejected,
)
from onceflow.storage.resource_configs import RESOURCE_CONFIGS_FILE, ResourceConfigs
from onceflow.storage.store import Store, TopicInfo
from onceflow.storage.txn_index import AbortedTxn

logger = logging.getLogger("onceflow.broker")

# The durable producer id counter, in the data directory (storage/producer_ids.py).
PRODUCER_IDS_FILE = "producer_ids"

# Kafka's rule for topic names (Topic.java): at most 249 characters of
# [a-zA-Z0-9._-], and not "." or "..".
TOPIC_NAME_LENGTH_MAX = 249
_TOPIC_NAME = re.compile(r"^[a-zA-Z0-9._-]+$")

# Kafka's ConfigResource type of dynamic broker configs (storage.resource_configs).
RESOURCE_BROKER = 4
RESOURCE_GROUP = 32
# The node whose per-node log.* values the one shared log store follows (node ids of one
# process share its storage; with --nodes 1 this is simply the broker's own).
STORAGE_NODE_ID = 0

# Internal topics; clients see is_internal=True for these.
INTERNAL_TOPICS = frozenset({"__consumer_offsets", "__transaction_state"})

# Tests only: when set, the startup recovery of a broker started afterwards waits for this
# event before it opens its first partition (partitions stay "not ready").
RECOVERY_GATE: threading.Event | None = None

# Partitions are opened before the broker listens for up to this long, as Kafka opens every
# log before it listens; the rest are opened in the background while the broker already
# answers. 3 s covers 10,000-20,000 small logs after a crash (about 0.1 ms each): every
# request then finds its partition ready. Each request answered while the pass runs delays
# it: at 10,000 partitions, 1 s here left a quarter of them to a background pass that the
# clients' retried Fetches of every partition made last 2-3 s instead of 0.5 s, and the
# last partition answered 5.3-6.2 s after the restart instead of 4.1-4.4 s
# (docs/benchmarks.md, "Restart after kill -9").
RECOVERY_INLINE_MS = 3000
# The background pass opens partitions on the event loop for at most this long at a time,
# then lets the loop answer what arrived: a request waits at most about this long for it.
RECOVERY_SLICE_MS = 20


def topic_name_error(name: str | None) -> str | None:
    """Why `name` is not a valid topic name, or None if it is."""
    if not name:
        return "topic name is empty"
    if name in (".", ".."):
        return "topic name cannot be '.' or '..'"
    if len(name) > TOPIC_NAME_LENGTH_MAX:
        return f"topic name is longer than {TOPIC_NAME_LENGTH_MAX} characters"
    if not _TOPIC_NAME.match(name):
        return "topic name may contain only ASCII letters, digits, '.', '_' and '-'"
    return None


def now_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclasses.dataclass(eq=False, slots=True)
class PartitionState:
    """Runtime state of one partition: its log, its producers, the fetches waiting on it."""

    topic: str
    index: int
    log: PartitionLog
    producers: ProducerStateManager = dataclasses.field(default_factory=ProducerStateManager)
    waiters: set[asyncio.Future[None]] = dataclasses.field(default_factory=set)
    snapshot_fsync: bool = True

    @property
    def high_watermark(self) -> int:
        # One replica: everything written is replicated, so HW = LEO.
        return self.log.log_end_offset

    @property
    def last_stable_offset(self) -> int:
        """The first offset of the earliest undecided transaction, or the high watermark;
        clamped to [log start, high watermark] (a transaction may have started in a deleted
        segment). read_committed fetches and ListOffsets stop here."""
        high_watermark = self.high_watermark
        first_unstable = self.producers.first_unstable_offset()
        if first_unstable is None:
            return high_watermark
        return min(max(first_unstable, self.log.log_start_offset), high_watermark)

    def aborted_transactions(self, fetch_offset: int, upper_offset: int) -> list[AbortedTxn]:
        """Aborted transactions overlapping [fetch_offset, upper_offset) (fetch responses)."""
        return self.log.aborted_transactions(fetch_offset, upper_offset)

    def append(self, headers: list[BatchHeaderLike], batches: list, now_ms: int, *,
               origin: AppendOrigin = AppendOrigin.CLIENT,
               marker: EndTxnMarker | None = None,
               transaction_version: int = 0) -> AppendInfo | Duplicate | Rejected:
        """Prepare, append and commit `batches` in one synchronous step.

        A `Duplicate` or `Rejected` appends nothing. Raises what `PartitionLog.append`
        raises (LogFailedError), with the producer state unchanged.
        """
        plan = self.producers.prepare(headers, origin=origin, marker=marker,
                                      transaction_version=transaction_version)
        if not isinstance(plan, AppendPlan):
            return plan
        active_base = self.log.segment_base_offsets[-1]
        appended = self.log.append(batches, now_ms)
        if self.log.segment_base_offsets[-1] != active_base:
            # The log rolled before writing these batches: the state (not yet committed)
            # is exactly that of the log below the new segment's base offset.
            self.snapshot(appended.first_offset)
        stamp = appended.log_append_time_ms
        completed = self.producers.commit(plan, appended.first_offset, appended.last_offset,
                                          log_append_time_ms=stamp if stamp >= 0 else None)
        for txn in completed:
            if txn.aborted:
                self.log.append_aborted_txn(aborted_entry(txn))
        self.producers.on_high_watermark_updated(self.high_watermark)
        self.notify()
        return appended

    def snapshot(self, offset: int) -> None:
        """Snapshot the producer state as of `offset` (exclusive). Best effort: a failed
        snapshot only means a longer replay after a restart, so it is logged, not raised."""
        try:
            self.producers.write_snapshot(self.log.directory, offset, fsync=self.snapshot_fsync)
        except OSError as exc:
            logger.error("%s-%d: producer state snapshot at %d failed: %s",
                      self.topic, self.index, offset, exc)

    def notify(self) -> None:
        """Wake every fetch waiting for data on this partition."""
        for waiter in self.waiters:
            if not waiter.done():
                waiter.set_result(None)
        self.waiters.clear()


def raise_open_files_limit() -> int:
    """Raises the soft RLIMIT_NOFILE to the hard limit (as a JVM does at start), so that
    sockets and segment files run out as late as the system allows. Returns the soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError) as exc:  # RLIM_INFINITY hard limits on some systems
            logger.warning("could not raise the open files limit from %d: %s", soft, exc)
    return soft


class BrokerState:
    def __init__(self, config: BrokerConfig, cluster: Cluster) -> None:
        self.config = config
        self.cluster = cluster
        Path(config.data_dir).mkdir(parents=True, exist_ok=True)
        cluster.load_assignments(Path(config.data_dir))
        raise_open_files_limit()
        OPEN_FILES.set_files_max(config.log_max_open_files)
        # Dynamic broker, group and client-metrics configs (issue 15), persisted.
        self.resource_configs = ResourceConfigs.load(
            Path(config.data_dir) / RESOURCE_CONFIGS_FILE, fsync=config.fsync)
        self.store = Store(Path(config.data_dir), now_ms(), log_defaults=self.log_defaults())
        self.resource_configs.subscribe(self._on_config_change)
        self.committer = GroupCommitter(fsync_enabled=config.fsync)
        self.producer_ids = ProducerIdAllocator(Path(config.data_dir) / PRODUCER_IDS_FILE,
                                                fsync=config.fsync)
        self.metrics = BrokerMetrics()
        # Client quotas (issue 15): persisted; byte rates enforced (docs/quotas.md).
        self.quotas = ClientQuotas.load(Path(config.data_dir) / QUOTAS_FILE,
                                        config.quota_window_num, config.quota_window_size_seconds)
        self._partitions: dict[tuple[str, int], PartitionState] = {}
        # Recovery in the background (docs/logs.md, "Startup and recovery"): the store
        # opens no log at startup; `start_recovery` opens every partition that existed at
        # startup on a worker thread, internal topics first, while the broker already
        # answers. Until its turn a partition is "not ready" (`ready`); anything else
        # that needs it opens it on demand. `_open_lock` makes each open happen once.
        self._open_lock = threading.Lock()
        self._recovering: set[tuple[str, int]] = {
            (name, index) for name, info in self.topics().items()
            for index in range(info.num_partitions)}
        self._recover_next: collections.deque[tuple[str, int]] = collections.deque()
        self._recovery_stop = False
        self._recovery_task: asyncio.Task[None] | None = None
        self._checkpoint_task: asyncio.Task[None] | None = None

    # -- dynamic broker configs ---------------------------------------------

    def broker_config(self, key: str, node_id: int) -> str | None:
        """The dynamic value of broker key `key` for `node_id`: its own (DYNAMIC_BROKER_CONFIG)
        over the cluster default (DYNAMIC_DEFAULT_BROKER_CONFIG); None when neither is set
        (then the static --config value or Kafka's default applies)."""
        own = self.resource_configs.get(RESOURCE_BROKER, str(node_id))
        if key in own:
            return own[key]
        return self.resource_configs.get(RESOURCE_BROKER, "").get(key)

    def add_broker_config_listener(self, listener) -> None:
        """`listener()` is called on the event loop after any dynamic broker config changed
        (per node or the default); it re-reads what it needs with `broker_config`."""
        self.resource_configs.subscribe(
            lambda resource_type, _name: listener() if resource_type == RESOURCE_BROKER else None)

    def log_defaults(self) -> dict[str, str]:
        """Topic config defaults: static log.* keys < dynamic cluster default < the storage
        node's own dynamic values."""
        dynamic = (self.resource_configs.get(RESOURCE_BROKER, "")
                   | self.resource_configs.get(RESOURCE_BROKER, str(STORAGE_NODE_ID)))
        return dict(self.config.log_defaults) | log_defaults_of(dynamic)

    def group_configs(self, group_id: str) -> dict[str, str]:
        """A group's own configs (GROUP resource, type 32), validated when stored."""
        return self.resource_configs.get(RESOURCE_GROUP, group_id)

    @property
    def producer_id_expiration_ms(self) -> int:
        value = self.broker_config("producer.id.expiration.ms", STORAGE_NODE_ID)
        return int(value) if value is not None else self.config.producer_id_expiration_ms

    def _on_config_change(self, resource_type: int, _name: str) -> None:
        if resource_type == RESOURCE_BROKER:
            self.store.set_log_defaults(self.log_defaults())

    # -- topics -------------------------------------------------------------

    def topics(self) -> dict[str, TopicInfo]:
        return self.store.topics()

    def topic(self, name: str) -> TopicInfo | None:
        return self.store.topics().get(name)

    def topic_by_id(self, topic_id) -> TopicInfo | None:
        for info in self.store.topics().values():
            if info.topic_id == topic_id:
                return info
        return None

    def partition(self, topic: str, index: int) -> PartitionState | None:
        """The partition, or None when the topic or partition does not exist."""
        key = (topic, index)
        state = self._partitions.get(key)
        if state is not None:
            return state
        info = self.topic(topic)
        if info is None or not 0 <= index < info.num_partitions:
            return None
        with self._open_lock:
            return self._open_locked(key)

    def _open_locked(self, key: tuple[str, int]) -> PartitionState:
        """Opens (recovers) the log and its producer state (caller holds _open_lock)."""
        state = self._partitions.get(key)
        if state is None:
            partition_log = self.store.partition(*key)
            producers = load_producer_state(partition_log, now_ms(),
                                            self.producer_id_expiration_ms)
            state = PartitionState(key[0], key[1], partition_log, producers,
                                   snapshot_fsync=self.config.fsync)
            self._partitions[key] = state
        self._recovering.discard(key)
        return state

    def ready(self, topic: str, index: int) -> bool:
        """False while the partition waits for its turn in the startup recovery: produce,
        fetch and list offsets then answer NOT_LEADER_OR_FOLLOWER, as Kafka does for a
        partition it does not host yet, and the partition is recovered next."""
        key = (topic, index)
        if key not in self._recovering or key in self._partitions:
            return True
        self._recover_next.append(key)
        return False

    @property
    def recovered(self) -> bool:
        """Whether every partition that existed at startup is open."""
        return not self._recovering

    def start_recovery(self) -> None:
        """Opens every partition not opened yet (internal topics first): now, for up to
        RECOVERY_INLINE_MS, then in slices on the event loop between the requests it
        answers meanwhile.
        (On a thread, each system call of an open gave the interpreter lock to the loop and
        waited up to a switch interval to get it back whenever the loop was busy: with
        10,000 partitions and clients retrying, that doubled the pass.)"""
        self._checkpoint_task = asyncio.get_running_loop().create_task(
            self._checkpoint_every(self.config.recovery_checkpoint_interval_ms), name="onceflow-checkpoint")
        keys = sorted(self._recovering, key=lambda k: (k[0] not in INTERNAL_TOPICS, k))
        started, pending = time.monotonic(), iter(keys)
        if RECOVERY_GATE is None and not self._recover_slice(
                pending, started + RECOVERY_INLINE_MS / 1000):
            if keys:
                logger.info("recovered %d partitions in %.2f s", len(keys),
                            time.monotonic() - started)
            return
        self._recovery_task = asyncio.get_running_loop().create_task(
            self._recover_in_slices(len(keys), pending, started, RECOVERY_GATE),
            name="onceflow-recovery")

    async def _checkpoint_every(self, interval_ms: int) -> None:
        """Kafka's log.flush.offset.checkpoint.interval.ms: every log's recovery point to the
        data directory's checkpoint, so that after a crash only what lies past it is
        re-validated (storage/checkpoint.py)."""
        while True:
            await asyncio.sleep(interval_ms / 1000)
            try:
                await asyncio.to_thread(self.store.checkpoint_recovery_points, self.config.fsync)
            except OSError as exc:  # a longer scan after a crash, never data: retry next time
                logger.error("writing the recovery checkpoint failed: %s", exc)

    async def _recover_in_slices(self, count: int, pending, started: float,
                                 gate: threading.Event | None) -> None:
        while gate is not None and not gate.is_set() and not self._recovery_stop:
            await asyncio.sleep(0.05)
        while not self._recovery_stop:
            deadline = time.monotonic() + RECOVERY_SLICE_MS / 1000
            if not self._recover_slice(pending, deadline):
                break
            await asyncio.sleep(0)  # the requests that arrived meanwhile
        if not self._recovery_stop:
            logger.info("recovered %d partitions in %.2f s", count, time.monotonic() - started)

    def _recover_slice(self, pending, deadline: float | None) -> bool:
        """Opens partitions, those asked for by `ready` first, then from `pending`, until
        `deadline` (monotonic seconds; None: all). False once none is left."""
        while True:
            try:
                key = self._recover_next.popleft()
            except IndexError:
                key = next(pending, None)
                if key is None:
                    return False
            with self._open_lock:
                if key not in self._recovering:  # done on demand, or its topic was deleted
                    continue
                try:
                    self._open_locked(key)
                except Exception as exc:  # noqa: BLE001 - one bad log must not stop the rest
                    self._recovering.discard(key)  # opened on demand at its next use
                    logger.error("%s-%d: recovery failed: %s", key[0], key[1], exc)
            if deadline is not None and time.monotonic() >= deadline:
                return True

    def partitions(self) -> list[PartitionState]:
        """The partitions opened so far."""
        return list(self._partitions.values())

    def forget_topic(self, name: str) -> None:
        with self._open_lock:
            self._recovering.difference_update([k for k in self._recovering if k[0] == name])
            for key in [k for k in self._partitions if k[0] == name]:
                self._partitions.pop(key).notify()

    async def enforce_retention(self) -> int:
        """One retention pass (log.retention.check.interval.ms) over every partition, on a
        worker thread so that produce and fetch never wait for it (the log's locks keep it
        consistent with appends and reads). Returns how many segments went."""
        logs = [(p.topic, p.log) for p in self.partitions()]
        results = await asyncio.to_thread(_enforce_retention, logs, now_ms())
        for topic, result in results:
            self.metrics.segments_deleted(topic, result.segments_deleted, result.bytes_deleted)
        return sum(result.segments_deleted for _, result in results)

    def leader(self, info: TopicInfo, partition: int) -> int:
        return self.cluster.leader(info.name, partition, replication_factor(info))

    def expire_producers(self) -> int:
        """Forget producers idle for producer.id.expiration.ms; returns how many entries went."""
        now, expiration_ms = now_ms(), self.producer_id_expiration_ms
        return sum(len(p.producers.remove_expired(now, expiration_ms)) for p in self.partitions())

    def close(self) -> None:
        """After the coordinator runtimes are closed (they append through the partitions)."""
        self._recovery_stop = True
        for task in (self._recovery_task, self._checkpoint_task):
            if task is not None:
                task.cancel()
        for state in self._partitions.values():
            state.notify()
            # Clean shutdown: the next open loads this and replays nothing.
            state.snapshot(state.log.log_end_offset)
        self.committer.close()
        self.store.close()


def aborted_entry(txn: CompletedTxn) -> AbortedTxn:
    return AbortedTxn(txn.producer_id, txn.first_offset, txn.last_offset,
                      txn.last_stable_offset)


def load_producer_state(partition_log: PartitionLog, now: int,
                        expiration_ms: int) -> ProducerStateManager:
    """The producer state of a just-opened log: newest valid snapshot, then a replay of
    every idempotent or transactional batch after it (the log is the truth). The
    aborted-transaction index is rebuilt from the snapshot on by the same replay: its
    entries below the snapshot were made durable before the snapshot was written."""
    producers = ProducerStateManager()
    names, partition_log.opened_listing = partition_log.opened_listing, None
    start = producers.load_latest_snapshot(
        partition_log.directory, log_start_offset=partition_log.log_start_offset,
        log_end_offset=partition_log.log_end_offset, now_ms=now,
        producer_id_expiration_ms=expiration_ms, names=names)
    partition_log.truncate_txn_index(start)
    replayed = 0
    # A log that recovery just re-validated knows whether it holds any producer's batch
    batches = partition_log.batches_from(start) if partition_log.needs_producer_replay(start) \
        else ()
    for header in batches:
        if header.base_offset < start or header.producer_id < 0:
            continue  # before the snapshot, or a plain producer's batch: no state
        marker = None
        if header.is_control:
            marker = end_txn_marker(partition_log.read(header.base_offset, header.size_bytes,
                                                       header.base_offset + 1))
            if marker is None:
                continue  # a control batch other than COMMIT/ABORT carries no producer state
        for txn in producers.replay(header, header.base_offset, marker):
            if txn.aborted:
                partition_log.append_aborted_txn(aborted_entry(txn))
        replayed += 1
    producers.on_high_watermark_updated(partition_log.log_end_offset)
    if replayed:
        logger.info("%s: producer state rebuilt from offset %d (%d batches replayed)",
                 partition_log.directory.name, start, replayed)
    return producers


def _enforce_retention(logs: list[tuple[str, PartitionLog]], now: int,
                       ) -> list[tuple[str, RetentionResult]]:
    """(worker thread) Retention of each log; a failed or closed log is skipped (a failed
    log reports itself when it fails; a deleted topic's log is closed)."""
    results = []
    for topic, partition_log in logs:
        try:
            result = partition_log.enforce_retention(now)
        except StorageError as exc:
            logger.debug("retention skipped %s: %s", partition_log.directory.name, exc)
            continue
        if result.segments_deleted:
            results.append((topic, result))
    return results


def replication_factor(info: TopicInfo) -> int:
    return getattr(info, "replication_factor", 1)
