"""What one broker process holds while it runs, shared by every handler.

`BrokerState` owns the storage `Store`, the group committer (fsync), the cluster
view and the per-partition runtime state (fetch waiters). Everything here runs on
the broker's event loop thread, except the fsyncs, which the group committer does
on its own thread.
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
import time
from pathlib import Path

from onceflow.broker.cluster import Cluster
from onceflow.broker.config import BrokerConfig
from onceflow.storage.group_commit import GroupCommitter
from onceflow.storage.log import PartitionLog
from onceflow.storage.store import Store, TopicInfo

# Kafka's rule for topic names (Topic.java): at most 249 characters of
# [a-zA-Z0-9._-], and not "." or "..".
TOPIC_NAME_LENGTH_MAX = 249
_TOPIC_NAME = re.compile(r"^[a-zA-Z0-9._-]+$")

# Internal topics; clients see is_internal=True for these.
INTERNAL_TOPICS = frozenset({"__consumer_offsets", "__transaction_state"})


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
    """Runtime state of one partition: its log and the fetches waiting on it."""

    topic: str
    index: int
    log: PartitionLog
    waiters: set[asyncio.Future[None]] = dataclasses.field(default_factory=set)

    @property
    def high_watermark(self) -> int:
        # One replica: everything written is replicated, so HW = LEO.
        return self.log.log_end_offset

    def notify(self) -> None:
        """Wake every fetch waiting for data on this partition."""
        for waiter in self.waiters:
            if not waiter.done():
                waiter.set_result(None)
        self.waiters.clear()


class BrokerState:
    def __init__(self, config: BrokerConfig, cluster: Cluster) -> None:
        self.config = config
        self.cluster = cluster
        Path(config.data_dir).mkdir(parents=True, exist_ok=True)
        self.store = Store(Path(config.data_dir), now_ms())
        self.committer = GroupCommitter(fsync_enabled=config.fsync)
        self._partitions: dict[tuple[str, int], PartitionState] = {}
        # Open (and so recover) every partition now, as Kafka loads its logs at
        # startup, rather than on first use.
        for name, info in self.topics().items():
            for index in range(info.num_partitions):
                self.partition(name, index)

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
        state = PartitionState(topic, index, self.store.partition(topic, index))
        self._partitions[key] = state
        return state

    def forget_topic(self, name: str) -> None:
        for key in [k for k in self._partitions if k[0] == name]:
            self._partitions.pop(key).notify()

    def enforce_retention(self) -> None:
        now = now_ms()
        for name, info in self.topics().items():
            for index in range(info.num_partitions):
                partition = self.partition(name, index)
                if partition is not None:
                    partition.log.enforce_retention(now)

    def leader(self, info: TopicInfo, partition: int) -> int:
        return self.cluster.leader(info.name, partition, replication_factor(info))

    def close(self) -> None:
        for state in self._partitions.values():
            state.notify()
        self.committer.close()
        self.store.close()


def replication_factor(info: TopicInfo) -> int:
    return getattr(info, "replication_factor", 1)
