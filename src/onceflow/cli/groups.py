"""`onceflow groups list|describe|reset-offsets`: consumer groups for people.

Theory of operation: the numbers come from `onceflow.client.groups` (the console shows
the same ones): members and assignments, committed offsets, the high watermark and the
last stable offset of each partition, and the lag to the end that `--isolation` names
(a `read_committed` consumer can only read up to the LSO). `reset-offsets` is
`kafka-consumer-groups.sh --reset-offsets`: it prints the plan and changes nothing
unless `--execute` is given, and then only for a group without members.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated

import typer
from confluent_kafka.admin import ConsumerGroupDescription
from rich.table import Table

from onceflow.cli.clients import (
    BOOTSTRAP_DEFAULT,
    BootstrapOption,
    CommandConfigOption,
    command_properties,
    CliError,
    connect_admin,
    exits_cleanly,
    stdout,
)
from onceflow.client.groups import (
    Isolation,
    PartitionOffsets,
    ResetStep,
    ResetStrategy,
    apply_reset,
    assignment_text,
    describe_group,
    describe_group_or_none,
    group_offsets,
    list_groups,
    partitions_of,
    plan_reset,
    state_name,
    total_lag,
)

NOT_AVAILABLE = "-"

groups_app = typer.Typer(
    name="groups",
    help="List and describe consumer groups: members, assignments, offsets, lag; reset offsets.",
    no_args_is_help=True,
)

IsolationOption = Annotated[Isolation, typer.Option(
    "--isolation", help="Lag to the last stable offset (read_committed consumers) or to the "
                        "high watermark (read_uncommitted).")]


@groups_app.command("list")
@exits_cleanly
def list_(bootstrap_servers: BootstrapOption = BOOTSTRAP_DEFAULT,
          command_config: CommandConfigOption = None) -> None:
    """List consumer groups with their states."""
    admin, _metadata = connect_admin(bootstrap_servers, command_properties(command_config))
    groups = list_groups(admin)
    table = Table("group", "type", "state", "simple", title=f"{len(groups)} groups")
    for group in groups:  # type: classic or consumer (KIP-848), from ListGroups v5
        table.add_row(group.group_id, state_name(getattr(group, "type", "")),
                      state_name(group.state),
                      "yes" if group.is_simple_consumer_group else "no")
    stdout().print(table)


def _text(value: int | None) -> str:
    return NOT_AVAILABLE if value is None else str(value)


def _group_type(description: ConsumerGroupDescription) -> str:
    """"consumer group, " for KIP-848 groups (confluent-kafka names the type), else ""."""
    kind = getattr(description, "type", None)
    name = state_name(kind) if kind is not None else "unknown"
    return f"{name} group, " if name != "unknown" else ""


def members_table(description: ConsumerGroupDescription) -> Table:
    table = Table("member id", "instance id", "client id", "host", "assignment",
                  title=f"{description.group_id}: {_group_type(description)}"
                        f"{state_name(description.state)}, "
                        f"assignor {description.partition_assignor or NOT_AVAILABLE}, "
                        f"{len(description.members)} member"
                        f"{'' if len(description.members) == 1 else 's'}")
    for member in sorted(description.members, key=lambda m: m.member_id):
        partitions = member.assignment.topic_partitions if member.assignment else []
        table.add_row(member.member_id, member.group_instance_id or NOT_AVAILABLE,
                      member.client_id, member.host, assignment_text(partitions))
    return table


def offsets_table(group: str, rows: Sequence[PartitionOffsets], isolation: Isolation) -> Table:
    table = Table("topic", "partition", "committed", "log end", "last stable", "lag", "owner",
                  title=f"{group}: offsets, lag to the "
                        f"{'last stable offset' if isolation is Isolation.read_committed else 'log end'}")
    for row in rows:
        table.add_row(row.topic, str(row.partition), _text(row.committed), _text(row.log_end),
                      _text(row.stable), _text(row.lag(isolation)), row.owner or NOT_AVAILABLE)
    table.caption = f"total lag {total_lag(rows, isolation)}"
    return table


@groups_app.command("describe")
@exits_cleanly
def describe(
    group: Annotated[str, typer.Argument(help="Consumer group id.")],
    bootstrap_servers: BootstrapOption = BOOTSTRAP_DEFAULT,
    command_config: CommandConfigOption = None,
    isolation: IsolationOption = Isolation.read_uncommitted,
) -> None:
    """Show a group's members and assignments, committed offsets, log end offsets, lag."""
    admin, _metadata = connect_admin(bootstrap_servers, command_properties(command_config))
    description = describe_group(admin, group)
    rows = group_offsets(admin, group, description)
    console = stdout()
    console.print(members_table(description))
    console.print(offsets_table(group, rows, isolation))


def reset_table(group: str, steps: Sequence[ResetStep], executed: bool) -> Table:
    table = Table("topic", "partition", "current offset", "new offset",
                  title=f"{group}: {'offsets reset' if executed else 'reset plan (dry run)'}")
    for step in steps:
        table.add_row(step.topic, str(step.partition), _text(step.current), str(step.new))
    if not executed:
        table.caption = "nothing changed: add --execute to apply"
    return table


@groups_app.command("reset-offsets")
@exits_cleanly
def reset_offsets(
    group: Annotated[str, typer.Argument(help="Consumer group id.")],
    bootstrap_servers: BootstrapOption = BOOTSTRAP_DEFAULT,
    command_config: CommandConfigOption = None,
    to_earliest: Annotated[bool, typer.Option("--to-earliest")] = False,
    to_latest: Annotated[bool, typer.Option("--to-latest")] = False,
    to_offset: Annotated[int | None, typer.Option("--to-offset")] = None,
    shift_by: Annotated[int | None, typer.Option("--shift-by")] = None,
    to_datetime_ms: Annotated[int | None, typer.Option(
        "--to-datetime-ms", help="The first offset at or after this time (epoch ms).")] = None,
    topic: Annotated[str | None, typer.Option(
        help="Every partition of this topic (default: the partitions the group has).")] = None,
    execute: Annotated[bool, typer.Option(help="Apply the plan (default: dry run).")] = False,
) -> None:
    """Reset a group's committed offsets, like kafka-consumer-groups.sh --reset-offsets."""
    chosen = [(ResetStrategy.earliest, None) if to_earliest else None,
              (ResetStrategy.latest, None) if to_latest else None,
              (ResetStrategy.offset, to_offset) if to_offset is not None else None,
              (ResetStrategy.shift_by, shift_by) if shift_by is not None else None,
              (ResetStrategy.datetime, to_datetime_ms) if to_datetime_ms is not None else None]
    chosen = [c for c in chosen if c is not None]
    if len(chosen) != 1:
        raise CliError("give exactly one of --to-earliest, --to-latest, --to-offset, "
                       "--shift-by, --to-datetime-ms")
    (strategy, value), = chosen
    admin, metadata = connect_admin(bootstrap_servers, command_properties(command_config))
    description = describe_group_or_none(admin, group)
    rows = group_offsets(admin, group, description) if description is not None else []
    partitions = partitions_of(metadata.topics, rows, topic)
    if not partitions:
        raise CliError(f"group '{group}' has no offsets: name a --topic")
    steps = plan_reset(admin, group, partitions, strategy, value)
    if execute:
        apply_reset(admin, group, steps)
    stdout().print(reset_table(group, steps, execute))
