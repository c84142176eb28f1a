"""What one coordinator call works with: settings, the clock reading, timers, and the
appends it produces. Created by `GroupCoordinator` for each call; handlers never read a
clock or write anywhere themselves."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from onceflow.groups.api import Append
from onceflow.groups.config import CoordinatorConfig
from onceflow.groups.records import NO_PRODUCER_EPOCH, NO_PRODUCER_ID, Record
from onceflow.groups.timers import Timers

if TYPE_CHECKING:
    from onceflow.groups.group import Group

# timer kinds
SESSION = "session"  # a member's heartbeat (session) deadline
PENDING_MEMBER = "pending-member"  # a member id handed out with MEMBER_ID_REQUIRED
JOIN = "join"  # the end of a join phase (rebalance timeout or initial delay)
SYNC = "sync"  # the deadline for all members to send SyncGroup
OFFSETS_EXPIRATION = ("offsets-expiration",)  # the periodic offsets retention check


def timer_key(kind: str, group: Group, member_id: str | None = None) -> tuple:
    """Timer keys name the group *incarnation*, so a deadline of a deleted group can never
    fire on a new group of the same id."""
    return (kind, group.group_id, group.incarnation, member_id)


@dataclass(slots=True)
class Ctx:
    config: CoordinatorConfig
    timers: Timers
    now_ms: int
    new_uuid: Callable[[], str]
    appends: list[Append] = field(default_factory=list)

    def append(self, partition: int, records: list[Record], intent: Any = None,
               producer_id: int = NO_PRODUCER_ID,
               producer_epoch: int = NO_PRODUCER_EPOCH) -> None:
        if records:
            self.appends.append(Append(partition, tuple(records), intent, producer_id,
                                       producer_epoch))

    def schedule(self, kind: str, group: Group, delay_ms: int,
                 member_id: str | None = None) -> None:
        self.timers.schedule(timer_key(kind, group, member_id), self.now_ms + delay_ms)

    def cancel(self, kind: str, group: Group, member_id: str | None = None) -> None:
        self.timers.cancel(timer_key(kind, group, member_id))

    def schedule_session(self, group: Group, member_id: str, timeout_ms: int) -> None:
        self.schedule(SESSION, group, timeout_ms, member_id)

    def cancel_session(self, group: Group, member_id: str) -> None:
        self.cancel(SESSION, group, member_id)

    def cancel_all(self, group: Group) -> None:
        """Forget every deadline of a group that is going away."""
        self.cancel(JOIN, group)
        self.cancel(SYNC, group)
        for member_id in group.members:
            self.cancel_session(group, member_id)
        for member_id in group.pending_members:
            self.cancel(PENDING_MEMBER, group, member_id)
