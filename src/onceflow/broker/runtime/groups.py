"""`GroupRuntime`: drives the sans-IO `GroupCoordinator` on the broker's event loop.

Theory of operation
-------------------
The coordinator (onceflow.groups) decides; this class performs its effects. Its
contract, played here exactly as tests/groups/harness.py plays it:

1. A handler calls the coordinator and gets a `Result`: a response and `Append`s.
2. `persist` writes every append as one batch to its `__consumer_offsets` partition
   *synchronously*, in the order the coordinator produced them. This matters: replay
   keeps, per key, the record with the highest offset, so the log order must be the
   coordinator's decision order. Then a runtime-owned task waits until the batches are
   durable (the group committer's fsync) and calls `coordinator.complete`, which replays
   them and yields the response (and maybe follow-up appends, handled the same way).
   The task belongs to the runtime, not to the request: a client that disconnects while
   its commit is being fsync'd cancels only its wait, never the replay, which other
   members' answers may depend on.
3. JoinGroup and SyncGroup are answered through a callback, maybe much later (from a
   tick, another member's request or a replay): `answer` bridges it to a future.
4. Deadlines: after every interaction the loop timer is re-armed at
   `coordinator.next_deadline_ms()`; when it fires, `tick` runs and its appends are
   persisted like any others.

Startup: if `__consumer_offsets` exists, every partition is marked loading (group
requests get COORDINATOR_LOAD_IN_PROGRESS) and a task reads each partition on a worker
thread and replays it (`load_partition`). Otherwise the topic is created in the
background right after start (or, with `internal_topics_at_start=False`, on the first
FindCoordinator for a group, as Kafka does).

Routing: the coordinator holds every partition of the topic (one process presents all
nodes), but a group request is answered only by the node that leads the group's partition;
the others answer NOT_COORDINATOR, so clients exercise the same paths as with Kafka.

The machinery of steps 2 and 4, loading and routing is shared with the transaction
runtime: `onceflow.broker.runtime.common.CoordinatorRuntime` (which also runs the
compactor). This class adds the JoinGroup/SyncGroup callbacks.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from onceflow.broker.runtime.common import CoordinatorRuntime, internal_topic_configs
from onceflow.groups import CoordinatorConfig, GroupCoordinator, Result
from onceflow.groups.consumer.records import TopicMetadata
from onceflow.groups.consumer.target import TopicsImage

if TYPE_CHECKING:
    from onceflow.broker.config import BrokerConfig
    from onceflow.broker.state import BrokerState
    from onceflow.storage.log import PartitionLog

log = logging.getLogger("onceflow.groups")

T = TypeVar("T")

OFFSETS_TOPIC = "__consumer_offsets"


def coordinator_config(config: BrokerConfig, num_partitions: int) -> CoordinatorConfig:
    return CoordinatorConfig(
        offsets_topic_num_partitions=num_partitions,
        group_initial_rebalance_delay_ms=config.group_initial_rebalance_delay_ms,
        group_min_session_timeout_ms=config.group_min_session_timeout_ms,
        group_max_session_timeout_ms=config.group_max_session_timeout_ms,
        offsets_retention_ms=config.offsets_retention_ms,
        consumer_group_session_timeout_ms=config.consumer_group_session_timeout_ms,
        consumer_group_heartbeat_interval_ms=config.consumer_group_heartbeat_interval_ms,
        consumer_group_assignors=tuple(config.consumer_group_assignors),
        consumer_group_migration_policy=config.consumer_group_migration_policy,
        consumer_group_regex_refresh_interval_ms=config.consumer_group_regex_refresh_interval_ms,
    )


def offsets_topic_configs(config: BrokerConfig) -> dict[str, str]:
    """Kafka's __consumer_offsets settings: compacted, producer's compression."""
    return internal_topic_configs(config.offsets_topic_segment_bytes)


class GroupRuntime(CoordinatorRuntime):
    topic_name = OFFSETS_TOPIC
    log = log

    def __init__(self, state: BrokerState) -> None:
        super().__init__(state, state.config.offsets_topic_num_partitions)
        self.coordinator = GroupCoordinator(coordinator_config(state.config, self.num_partitions))
        # GROUP config resources (issue 15): a group's own session timeout and interval.
        self.coordinator.consumers.group_configs = state.group_configs
        self._topics_seen: dict[str, TopicMetadata] = {}
        self._topics_version = 0

    def topic_configs(self) -> dict[str, str]:
        return offsets_topic_configs(self.broker_config)

    @property
    def tombstone_retention_ms(self) -> int:
        return self.coordinator.config.tombstone_retention_ms

    async def answer(self, call: Callable[[Callable[[T], None]], Result[None]]) -> T:
        """Run a JoinGroup/SyncGroup-style `call(respond)`; its answer whenever it comes."""
        assert self._loop is not None, "start() first"
        answered: asyncio.Future[T] = self._loop.create_future()

        def respond(answer: T) -> None:
            if not answered.done():  # the client may have gone (cancelled)
                answered.set_result(answer)

        result = call(respond)
        if result.appends:
            self.submit(result)
        self.arm()
        return await answered

    def refresh_topics(self) -> None:
        """Hand the broker's current topics to the coordinator when they changed since the
        last call (consumer groups subscribe to them; regexes resolve against them). The
        image version counts changes, as Kafka's metadata offset does."""
        topics = {name: TopicMetadata(info.topic_id, name, info.num_partitions)
                  for name, info in self._state.topics().items()}
        if topics != self._topics_seen:
            self._topics_seen = topics
            self._topics_version += 1
            self.coordinator.update_topics(TopicsImage(self._topics_version, topics))

    def on_timer(self, now: int) -> None:
        self.refresh_topics()  # a fenced member's group recomputes its subscribed topics
        super().on_timer(now)

    def offsets_log(self, index: int) -> PartitionLog:
        """The PartitionLog of one __consumer_offsets partition (compaction, tools)."""
        return self.partition_log(index)
