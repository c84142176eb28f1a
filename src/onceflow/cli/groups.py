"""`onceflow groups list|describe GROUP`: consumer groups for people.

Theory of operation: like `topics`, each command opens one confluent-kafka AdminClient
(`clients.connect_admin`, which fails fast when no broker answers) and waits a bounded
time for each admin future. `describe` combines four answers: the group's description
(DescribeGroups: state, assignor, members and their assignments), its committed offsets
(OffsetFetch), the log end offsets of those partitions (ListOffsets) and from these the
lag per partition (log end - committed; "-" when nothing is committed). Partitions that
are assigned but never committed, and committed but no longer assigned, are both shown.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Mapping
from typing import Annotated, Any

import typer
from confluent_kafka import (
    ConsumerGroupState,
    ConsumerGroupTopicPartitions,
    KafkaError,
    KafkaException,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, ConsumerGroupDescription, OffsetSpec
from rich.table import Table

from onceflow.cli.clients import (
    BOOTSTRAP_DEFAULT,
    BootstrapOption,
    CliError,
    connect_admin,
    describe_kafka_error,
    exits_cleanly,
    stdout,
)

# How long the broker may take to answer one admin request.
ADMIN_TIMEOUT_S = 30.0
NO_OFFSET = -1  # librdkafka's OFFSET_INVALID: nothing committed
NOT_AVAILABLE = "-"

groups_app = typer.Typer(
    name="groups",
    help="List and describe consumer groups: members, assignments, offsets, lag.",
    no_args_is_help=True,
)


def _wait(future: concurrent.futures.Future, group: str | None = None) -> Any:
    try:
        return future.result(timeout=ADMIN_TIMEOUT_S)
    except KafkaException as exc:
        error = exc.args[0]
        if isinstance(error, KafkaError) and error.code() == KafkaError.GROUP_ID_NOT_FOUND:
            raise CliError(f"unknown group '{group}'") from None
        raise CliError(describe_kafka_error(error)) from None
    except concurrent.futures.TimeoutError:
        raise CliError(f"no answer from the broker within {ADMIN_TIMEOUT_S:.0f} s") from None


def _state(state: Any) -> str:
    return state.name.lower() if hasattr(state, "name") else str(state)


@groups_app.command("list")
@exits_cleanly
def list_(bootstrap_servers: BootstrapOption = BOOTSTRAP_DEFAULT) -> None:
    """List consumer groups with their states."""
    admin, _metadata = connect_admin(bootstrap_servers)
    listed = _wait(admin.list_consumer_groups(request_timeout=ADMIN_TIMEOUT_S))
    groups = sorted(listed.valid, key=lambda g: g.group_id)
    table = Table("group", "type", "state", "simple", title=f"{len(groups)} groups")
    for group in groups:  # type: classic or consumer (KIP-848), from ListGroups v5
        table.add_row(group.group_id, _state(getattr(group, "type", "")), _state(group.state),
                      "yes" if group.is_simple_consumer_group else "no")
    stdout().print(table)


# ---------------------------------------------------------------- describe


def _describe(admin: AdminClient, group: str) -> ConsumerGroupDescription:
    futures = admin.describe_consumer_groups([group], request_timeout=ADMIN_TIMEOUT_S)
    description = _wait(futures[group], group)
    if description.state in (ConsumerGroupState.DEAD, ConsumerGroupState.UNKNOWN):
        raise CliError(f"unknown group '{group}'")
    return description


def _committed(admin: AdminClient, group: str) -> dict[tuple[str, int], int]:
    futures = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)],
                                                request_timeout=ADMIN_TIMEOUT_S)
    found = _wait(futures[group], group)
    return {(tp.topic, tp.partition): tp.offset for tp in found.topic_partitions}


def _log_end_offsets(admin: AdminClient,
                     partitions: set[tuple[str, int]]) -> dict[tuple[str, int], int]:
    if not partitions:
        return {}
    request = {TopicPartition(t, p): OffsetSpec.latest() for t, p in partitions}
    ends = {}
    for tp, future in admin.list_offsets(request, request_timeout=ADMIN_TIMEOUT_S).items():
        try:
            ends[(tp.topic, tp.partition)] = future.result(timeout=ADMIN_TIMEOUT_S).offset
        except KafkaException:  # a deleted topic's committed offsets: no log end to compare
            continue
    return ends


def _owners(description: ConsumerGroupDescription) -> dict[tuple[str, int], str]:
    return {(tp.topic, tp.partition): member.client_id or member.member_id
            for member in description.members
            for tp in (member.assignment.topic_partitions if member.assignment else [])}


def _group_type(description: ConsumerGroupDescription) -> str:
    """"consumer group, " for KIP-848 groups (confluent-kafka names the type), else ""."""
    kind = getattr(description, "type", None)
    return f"{_state(kind)} group, " if kind is not None and _state(kind) != "unknown" else ""


def members_table(description: ConsumerGroupDescription) -> Table:
    table = Table("member id", "instance id", "client id", "host", "assignment",
                  title=f"{description.group_id}: {_group_type(description)}"
                        f"{_state(description.state)}, "
                        f"assignor {description.partition_assignor or NOT_AVAILABLE}, "
                        f"{len(description.members)} member"
                        f"{'' if len(description.members) == 1 else 's'}")
    for member in sorted(description.members, key=lambda m: m.member_id):
        partitions = member.assignment.topic_partitions if member.assignment else []
        table.add_row(member.member_id, member.group_instance_id or NOT_AVAILABLE,
                      member.client_id, member.host, _assignment_text(partitions))
    return table


def _assignment_text(partitions: list[TopicPartition]) -> str:
    by_topic: dict[str, list[int]] = {}
    for tp in partitions:
        by_topic.setdefault(tp.topic, []).append(tp.partition)
    return " ".join(f"{t}:{','.join(map(str, sorted(ps)))}" for t, ps in sorted(by_topic.items()))


TopicPartitionKey = tuple[str, int]


def offsets_table(group: str, committed: Mapping[TopicPartitionKey, int],
                  ends: Mapping[TopicPartitionKey, int],
                  owners: Mapping[TopicPartitionKey, str]) -> Table:
    table = Table("topic", "partition", "committed", "log end", "lag", "owner",
                  title=f"{group}: offsets")
    total_lag = 0
    for key in sorted(set(committed) | set(owners)):
        offset, end = committed.get(key, NO_OFFSET), ends.get(key)
        lag = end - offset if end is not None and offset >= 0 else None
        total_lag += lag or 0
        table.add_row(key[0], str(key[1]), str(offset) if offset >= 0 else NOT_AVAILABLE,
                      NOT_AVAILABLE if end is None else str(end),
                      NOT_AVAILABLE if lag is None else str(lag),
                      owners.get(key, NOT_AVAILABLE))
    table.caption = f"total lag {total_lag}"
    return table


@groups_app.command("describe")
@exits_cleanly
def describe(
    group: Annotated[str, typer.Argument(help="Consumer group id.")],
    bootstrap_servers: BootstrapOption = BOOTSTRAP_DEFAULT,
) -> None:
    """Show a group's members and assignments, committed offsets, log end offsets, lag."""
    admin, _metadata = connect_admin(bootstrap_servers)
    description = _describe(admin, group)
    committed = _committed(admin, group)
    owners = _owners(description)
    ends = _log_end_offsets(admin, set(committed) | set(owners))
    console = stdout()
    console.print(members_table(description))
    console.print(offsets_table(group, committed, ends, owners))
