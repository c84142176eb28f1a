"""`onceflow txn list|describe|find-hanging|abort` and `onceflow producers describe`.

Theory of operation: these are the commands of Kafka's `kafka-transactions.sh`, for
people. The API calls live in `onceflow.client.transactions` (the console shares them);
each command connects a `Cluster` (AdminClient metadata, failing fast when nothing
answers; raw connections for the APIs the AdminClient lacks), calls them, and prints a
rich table:

- `txn list`: every coordinator's transactional ids, merged into one table;
- `txn describe ID`: the coordinator's view of one id;
- `producers describe T P`: the partition's active producers, with its log end and last
  stable offset (LSO) from ListOffsets;
- `txn find-hanging`: open transactions no coordinator will end (see
  `client.transactions.find_hanging`), with the LSO each holds back;
- `txn abort`: find the producer whose open transaction starts at `--start-offset` on the
  partition and write an ABORT marker for it there, as `kafka-transactions.sh abort`
  does. Use it for hanging transactions, never for live ones (their coordinator ends them).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated

import typer
from confluent_kafka import IsolationLevel
from rich.table import Table

from onceflow.cli.clients import (
    BOOTSTRAP_DEFAULT,
    BootstrapOption,
    CommandConfigOption,
    command_properties,
    CliError,
    exits_cleanly,
    stdout,
)
from onceflow.client.cluster import Cluster, Partition
from onceflow.client.transactions import (
    NOT_AVAILABLE,
    OPEN_STATES,
    TRANSACTION_MAX_TIMEOUT_MS,
    DescribedTransaction,
    HangingTransaction,
    ListedTransaction,
    ProducerState,
    abort_target,
    describe_producers,
    describe_transaction,
    find_hanging,
    list_transactions,
    now_ms,
    partitions_text,
    searched_partitions,
    write_abort_marker,
)

txn_app = typer.Typer(name="txn", no_args_is_help=True,
                      help="List, describe and abort transactions; find hanging ones.")
producers_app = typer.Typer(name="producers", no_args_is_help=True,
                            help="Describe the producers a partition knows.")

# ---------------------------------------------------------------- tables


def _offset(value: int | None) -> str:
    return NOT_AVAILABLE if value is None or value < 0 else str(value)


def listed_table(listed: Sequence[ListedTransaction]) -> Table:
    table = Table("transactional id", "coordinator", "producer id", "state",
                  title=f"{len(listed)} transaction{'' if len(listed) == 1 else 's'}")
    for t in listed:
        table.add_row(t.transactional_id, str(t.coordinator), str(t.producer_id), t.state)
    return table


def described_table(d: DescribedTransaction, now_ms: int) -> Table:
    table = Table("field", "value", title=f"transaction '{d.transactional_id}'")
    is_open = d.state in OPEN_STATES and d.start_time_ms is not None
    open_ms = max(now_ms - d.start_time_ms, 0) if is_open else None
    rows = [("state", d.state), ("coordinator", str(d.coordinator)),
            ("producer id", str(d.producer_id)), ("producer epoch", str(d.producer_epoch)),
            ("timeout ms", str(d.timeout_ms)),
            ("started at ms", _offset(d.start_time_ms)), ("open for ms", _offset(open_ms)),
            ("partitions", partitions_text(d.partitions) or NOT_AVAILABLE)]
    for name, value in rows:
        table.add_row(name, value)
    return table


def producers_table(partition: Partition, states: Sequence[ProducerState], log_end: int | None,
                    stable: int | None) -> Table:
    table = Table("producer id", "epoch", "coordinator epoch", "last sequence",
                  "last timestamp ms", "open transaction from",
                  title=f"{partition[0]}-{partition[1]}: {len(states)} active producer"
                        f"{'' if len(states) == 1 else 's'}",
                  caption=f"log end {_offset(log_end)}, last stable offset {_offset(stable)}")
    for s in sorted(states, key=lambda s: s.producer_id):
        table.add_row(str(s.producer_id), str(s.producer_epoch), str(s.coordinator_epoch),
                      str(s.last_sequence), str(s.last_timestamp_ms), _offset(s.txn_start_offset))
    return table


def hanging_table(hanging: Sequence[HangingTransaction], stable: dict[Partition, int],
                  now_ms: int) -> Table:
    table = Table("topic", "partition", "producer id", "epoch", "coordinator epoch",
                  "start offset", "last stable offset", "idle ms", "transactional id", "why",
                  title=f"{len(hanging)} hanging transaction{'' if len(hanging) == 1 else 's'}")
    for h in hanging:
        p = h.producer
        table.add_row(p.partition[0], str(p.partition[1]), str(p.producer_id),
                      str(p.producer_epoch), str(p.coordinator_epoch), str(p.txn_start_offset),
                      _offset(stable.get(p.partition)), str(now_ms - p.last_timestamp_ms),
                      h.transactional_id or NOT_AVAILABLE, h.reason)
    if hanging:
        first = hanging[0].producer
        table.caption = (f"abort one with: onceflow txn abort --topic {first.partition[0]} "
                         f"--partition {first.partition[1]} --start-offset {first.txn_start_offset}")
    return table


# ---------------------------------------------------------------- commands


@txn_app.command("list")
@exits_cleanly
def list_(
    bootstrap_servers: BootstrapOption = BOOTSTRAP_DEFAULT,
    command_config: CommandConfigOption = None,
    state: Annotated[list[str] | None, typer.Option(
        help="Only transactions in this state (Ongoing, PrepareCommit, ...); repeatable.")] = None,
    producer_id: Annotated[list[int] | None, typer.Option(
        help="Only this producer id; repeatable.")] = None,
    older_than_ms: Annotated[int, typer.Option(
        help="Only transactions open longer than this (brokers with ListTransactions v1+).")] = -1,
) -> None:
    """List the transactional ids every coordinator knows, with their states."""
    with Cluster.connect(bootstrap_servers, command_properties(command_config)) as cluster:
        listed = list_transactions(cluster, states=state or (), producer_ids=producer_id or (),
                                   older_than_ms=older_than_ms)
    stdout().print(listed_table(listed))


@txn_app.command("describe")
@exits_cleanly
def describe(
    transactional_id: Annotated[str, typer.Argument(help="Transactional id.")],
    bootstrap_servers: BootstrapOption = BOOTSTRAP_DEFAULT,
    command_config: CommandConfigOption = None,
) -> None:
    """Show a transactional id's state, producer, timeout, start time and partitions."""
    with Cluster.connect(bootstrap_servers, command_properties(command_config)) as cluster:
        described = describe_transaction(cluster, transactional_id)
    if described is None:
        raise CliError(f"unknown transactional id '{transactional_id}'")
    stdout().print(described_table(described, now_ms()))


@txn_app.command("find-hanging")
@exits_cleanly
def find_hanging_command(
    bootstrap_servers: BootstrapOption = BOOTSTRAP_DEFAULT,
    command_config: CommandConfigOption = None,
    topic: Annotated[str | None, typer.Option(help="Search only this topic.")] = None,
    partition: Annotated[int | None, typer.Option(help="Search only this partition.")] = None,
    older_than_ms: Annotated[int, typer.Option(
        min=0, help="Only transactions whose last write is older than this.")]
        = TRANSACTION_MAX_TIMEOUT_MS,
) -> None:
    """Find open transactions that hold an LSO back and that no coordinator will end."""
    with Cluster.connect(bootstrap_servers, command_properties(command_config)) as cluster:
        partitions = searched_partitions(cluster.metadata, topic, partition)
        hanging = find_hanging(cluster, partitions, older_than_ms, now_ms())
        stable = cluster.offsets({h.producer.partition for h in hanging},
                                 IsolationLevel.READ_COMMITTED)
    stdout().print(hanging_table(hanging, stable, now_ms()))


@txn_app.command("abort")
@exits_cleanly
def abort(
    topic: Annotated[str, typer.Option(help="Topic of the hanging transaction.")],
    partition: Annotated[int, typer.Option(help="Partition of the hanging transaction.")],
    bootstrap_servers: BootstrapOption = BOOTSTRAP_DEFAULT,
    command_config: CommandConfigOption = None,
    start_offset: Annotated[int | None, typer.Option(
        help="First offset of the transaction (see find-hanging or producers describe).")] = None,
    producer_id: Annotated[int | None, typer.Option(help="Instead of --start-offset.")] = None,
    producer_epoch: Annotated[int | None, typer.Option(help="With --producer-id.")] = None,
    coordinator_epoch: Annotated[int | None, typer.Option(help="With --producer-id.")] = None,
) -> None:
    """Abort a hanging transaction on one partition (writes an ABORT marker there)."""
    key = (topic, partition)
    with Cluster.connect(bootstrap_servers, command_properties(command_config)) as cluster:
        target = abort_target(cluster, key, start_offset, producer_id, producer_epoch,
                              coordinator_epoch)
        write_abort_marker(cluster, target)
        stable = cluster.offsets([key], IsolationLevel.READ_COMMITTED).get(key)
    stdout().print(f"aborted the transaction of producer {target.producer_id} (epoch "
                   f"{target.producer_epoch}) on {topic}-{partition}; last stable offset now "
                   f"{_offset(stable)}", highlight=False)


@producers_app.command("describe")
@exits_cleanly
def describe_producers_command(
    topic: Annotated[str, typer.Argument(help="Topic.")],
    partition: Annotated[int, typer.Argument(help="Partition.")],
    bootstrap_servers: BootstrapOption = BOOTSTRAP_DEFAULT,
    command_config: CommandConfigOption = None,
) -> None:
    """Show a partition's active producers: ids, epochs, sequences, open transactions."""
    key = (topic, partition)
    with Cluster.connect(bootstrap_servers, command_properties(command_config)) as cluster:
        states = describe_producers(cluster, [key]).get(key, [])
        log_end = cluster.offsets([key], IsolationLevel.READ_UNCOMMITTED).get(key)
        stable = cluster.offsets([key], IsolationLevel.READ_COMMITTED).get(key)
    stdout().print(producers_table(key, states, log_end, stable))
