"""`onceflow topics create|list|describe|delete`: topic administration for people.

Theory of operation: each command opens one confluent-kafka AdminClient through
`clients.connect_admin` (which fails fast, in one line, when no broker answers), sends
one admin request, waits a bounded time for its future and prints a rich table or a
one-line confirmation. Kafka errors in the answers (an existing or unknown topic, an
invalid replication factor) become `CliError`s, reported without a traceback.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Mapping
from typing import Annotated, Any

import typer
from confluent_kafka import KafkaException, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    ClusterMetadata,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    NewTopic,
    OffsetSpec,
    ResourceType,
    TopicMetadata,
)
from rich.markup import escape
from rich.table import Column, Table

from onceflow.cli.clients import (
    BOOTSTRAP_DEFAULT,
    BootstrapOption,
    CommandConfigOption,
    command_properties,
    CliError,
    connect_admin,
    describe_kafka_error,
    exits_cleanly,
    require_topic,
    stdout,
)

# How long the broker may take to answer one admin request (create, delete, describe).
ADMIN_TIMEOUT_S = 30.0

topics_app = typer.Typer(
    name="topics",
    help="Create, list, describe and delete topics.",
    no_args_is_help=True,
)


def parse_configs(pairs: list[str]) -> dict[str, str]:
    """`["k=v", ...]` -> `{"k": "v"}`; CliError for an entry without `=`."""
    configs: dict[str, str] = {}
    for pair in pairs:
        name, found, value = pair.partition("=")
        if not found or not name:
            raise CliError(f"--config expects name=value, got {pair!r}")
        configs[name.strip()] = value.strip()
    return configs


def wait_all(futures: Mapping[Any, concurrent.futures.Future], topic: str) -> dict[Any, Any]:
    """Results of admin futures by key; Kafka errors and timeouts become CliError."""
    results = {}
    for key, future in futures.items():
        try:
            results[key] = future.result(timeout=ADMIN_TIMEOUT_S)
        except KafkaException as exc:
            raise CliError(describe_kafka_error(exc.args[0], topic)) from None
        except concurrent.futures.TimeoutError:
            raise CliError(f"no answer from the broker within {ADMIN_TIMEOUT_S:.0f} s") from None
    return results


def replication_factor(topic: TopicMetadata) -> int:
    return max((len(p.replicas) for p in topic.partitions.values()), default=0)


@topics_app.command("create")
@exits_cleanly
def create(
    name: Annotated[str, typer.Argument(help="Topic name.")],
    partitions: Annotated[int, typer.Option("--partitions", "-p", min=1)] = 1,
    replication_factor_: Annotated[int, typer.Option(
        "--replication-factor", "-r", min=1)] = 1,
    config: Annotated[list[str] | None, typer.Option(
        "--config", "-c", help="Topic config name=value; repeatable.")] = None,
    bootstrap_servers: BootstrapOption = BOOTSTRAP_DEFAULT,
    command_config: CommandConfigOption = None,
) -> None:
    """Create a topic."""
    configs = parse_configs(config or [])
    admin, _metadata = connect_admin(bootstrap_servers, command_properties(command_config))
    new_topic = NewTopic(name, num_partitions=partitions,
                         replication_factor=replication_factor_, config=configs)
    wait_all(admin.create_topics([new_topic], request_timeout=ADMIN_TIMEOUT_S), name)
    stdout().print(f"created topic {name} ({partitions} partitions, "
                   f"replication factor {replication_factor_})", highlight=False)


@topics_app.command("list")
@exits_cleanly
def list_(bootstrap_servers: BootstrapOption = BOOTSTRAP_DEFAULT,
          command_config: CommandConfigOption = None) -> None:
    """List topics with their partition counts."""
    _admin, metadata = connect_admin(bootstrap_servers, command_properties(command_config))
    table = Table("topic", "partitions", "replication factor",
                  title=f"{len(metadata.topics)} topics")
    for name in sorted(metadata.topics):
        topic = metadata.topics[name]
        table.add_row(name, str(len(topic.partitions)), str(replication_factor(topic)))
    stdout().print(table)


@topics_app.command("delete")
@exits_cleanly
def delete(
    name: Annotated[str, typer.Argument(help="Topic name.")],
    bootstrap_servers: BootstrapOption = BOOTSTRAP_DEFAULT,
    command_config: CommandConfigOption = None,
) -> None:
    """Delete a topic and its data."""
    admin, metadata = connect_admin(bootstrap_servers, command_properties(command_config))
    require_topic(metadata, name)
    wait_all(admin.delete_topics([name], request_timeout=ADMIN_TIMEOUT_S), name)
    stdout().print(f"deleted topic {name}", highlight=False)


def log_offsets(admin: AdminClient, name: str, partitions: list[int],
                spec: OffsetSpec) -> dict[int, int]:
    """partition -> offset for `spec` (earliest: log start; latest: log end, exclusive)."""
    request = {TopicPartition(name, p): spec for p in partitions}
    futures = admin.list_offsets(request, request_timeout=ADMIN_TIMEOUT_S)
    return {tp.partition: info.offset for tp, info in wait_all(futures, name).items()}


def topic_configs(admin: AdminClient, name: str) -> dict[str, ConfigEntry]:
    resource = ConfigResource(ResourceType.TOPIC, name)
    futures = admin.describe_configs([resource], request_timeout=ADMIN_TIMEOUT_S)
    return next(iter(wait_all(futures, name).values()))


def partitions_table(name: str, metadata: ClusterMetadata, starts: dict[int, int],
                     ends: dict[int, int]) -> Table:
    topic = metadata.topics[name]
    table = Table("partition", "leader", "replicas", "isr", "log start", "log end",
                  title=f"{name}: {len(topic.partitions)} partitions, "
                        f"replication factor {replication_factor(topic)}")
    for index in sorted(topic.partitions):
        part = topic.partitions[index]
        table.add_row(str(index), str(part.leader), _ids(part.replicas), _ids(part.isrs),
                      str(starts[index]), str(ends[index]))
    return table


def configs_table(name: str, configs: dict[str, ConfigEntry]) -> Table:
    # fold: a narrow terminal wraps long names instead of cutting them.
    table = Table(Column("config", overflow="fold"), Column("value", overflow="fold"),
                  "source", title=f"{name}: configs")
    for key in sorted(configs):
        entry = configs[key]
        value = "(sensitive)" if entry.is_sensitive else ("" if entry.value is None
                                                          else entry.value)
        # Values set on the topic stand out from broker and static defaults.
        style = None if entry.is_default else "bold"
        table.add_row(key, escape(value), ConfigSource(entry.source).name.lower(), style=style)
    return table


def _ids(node_ids: list[int]) -> str:
    return ",".join(str(n) for n in node_ids)


@topics_app.command("describe")
@exits_cleanly
def describe(
    name: Annotated[str, typer.Argument(help="Topic name.")],
    bootstrap_servers: BootstrapOption = BOOTSTRAP_DEFAULT,
    command_config: CommandConfigOption = None,
) -> None:
    """Show partitions (leaders, replicas, log start/end offsets) and configs."""
    admin, metadata = connect_admin(bootstrap_servers, command_properties(command_config))
    partitions = require_topic(metadata, name)
    starts = log_offsets(admin, name, partitions, OffsetSpec.earliest())
    ends = log_offsets(admin, name, partitions, OffsetSpec.latest())
    console = stdout()
    console.print(partitions_table(name, metadata, starts, ends))
    console.print(configs_table(name, topic_configs(admin, name)))
