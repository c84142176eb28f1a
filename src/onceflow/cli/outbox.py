"""`onceflow outbox init|relay|status`: the transactional outbox from the command line.

Theory of operation: `relay` runs `onceflow.outbox.Relay` - fence older relays of the same
name, read the next sequence number from the progress topic, then publish committed
outbox rows in Kafka transactions - and reports its progress at most once a second.
`--once` stops when the outbox is drained (for cron jobs and tests); otherwise it polls
until Ctrl-C or SIGTERM, which end it between batches. `status` reads the same progress
record (read_committed, without fencing anybody) and counts the rows behind it. Database
and Kafka failures become one line on stderr and exit code 1 (`clients.exits_cleanly`).
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from typing import Annotated, TypeVar

import typer
from rich.table import Table

from onceflow import db
from onceflow.cli.clients import (
    BOOTSTRAP_DEFAULT,
    BootstrapOption,
    CliError,
    CommandConfigOption,
    command_properties,
    exits_cleanly,
    stdout,
)
from onceflow.outbox import progress as progress_topic
from onceflow.outbox import relay as relay_module
from onceflow.outbox import store

T = TypeVar("T")

DB_ENV = "ONCEFLOW_DB"
# The relay prints a progress line at most this often.
REPORT_INTERVAL_S = 1.0

outbox_app = typer.Typer(name="outbox", no_args_is_help=True,
                         help="The transactional outbox: database rows to Kafka, exactly once.")

DbOption = Annotated[str, typer.Option("--db", envvar=DB_ENV,
                                       help="Database URL: sqlite:///path.db or "
                                            "postgresql://user@host:port/dbname.")]
TableOption = Annotated[str, typer.Option("--table", help="The outbox table.")]
NameOption = Annotated[str | None, typer.Option(
    "--name", help="Relay name: its transactional id and progress key (default: the table).")]
ProgressTopicOption = Annotated[str, typer.Option(
    "--progress-topic", help="Compacted topic holding each relay's next sequence number.")]


class _Reporter:
    """Prints what the relay did, at most once per REPORT_INTERVAL_S."""

    def __init__(self) -> None:
        self.rows = self.batches = self.aborted = 0
        self.reported_rows = 0
        self.last_report_s = time.monotonic()
        self.next_seq = 0

    def on_batch(self, report: relay_module.BatchReport) -> None:
        self.rows += report.rows
        self.batches += 1 if report.rows else 0
        self.aborted += 1 if report.aborted else 0
        self.next_seq = report.next_seq
        now_s = time.monotonic()
        if self.rows != self.reported_rows and now_s - self.last_report_s >= REPORT_INTERVAL_S:
            self.line()
            self.last_report_s, self.reported_rows = now_s, self.rows

    def line(self) -> None:
        aborted = f", {self.aborted} aborted and retried" if self.aborted else ""
        say(f"{time.strftime('%H:%M:%S')} published {self.rows} rows in {self.batches} "
            f"transactions{aborted}; next seq {self.next_seq}")


@outbox_app.command("init")
@exits_cleanly
def init(database_url: DbOption, table: TableOption = store.DEFAULT_TABLE) -> None:
    """Create the outbox table (idempotent)."""
    with _connect(database_url) as database:
        outbox_id = store.create_outbox(database, table)
        say(f"outbox '{table}' ready in {database.display} (outbox id {outbox_id})")


@outbox_app.command("relay")
@exits_cleanly
def relay(
    database_url: DbOption,
    bootstrap_servers: BootstrapOption = BOOTSTRAP_DEFAULT,
    name: NameOption = None,
    table: TableOption = store.DEFAULT_TABLE,
    progress_topic_name: ProgressTopicOption = progress_topic.DEFAULT_PROGRESS_TOPIC,
    batch: Annotated[int, typer.Option(min=1, max=store.ROWS_PER_READ_MAX,
                                       help="Rows per Kafka transaction.")]
        = relay_module.BATCH_ROWS_DEFAULT,
    once: Annotated[bool, typer.Option("--once", help="Stop when the outbox is drained.")]
        = False,
    poll_ms: Annotated[int, typer.Option(min=10, help="Pause when nothing is pending.")]
        = relay_module.POLL_INTERVAL_MS_DEFAULT,
    prune: Annotated[bool, typer.Option("--prune", help="Delete rows once published.")]
        = False,
    command_config: CommandConfigOption = None,
) -> None:
    """Publish committed outbox rows to Kafka, each exactly once and in order."""
    config = relay_module.RelayConfig(database_url, bootstrap_servers, name, table,
                                      progress_topic_name, batch, poll_ms, prune,
                                      command_properties(command_config))
    stopping: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, _frame: stopping.append(signum))
    instance = relay_module.Relay(config)
    try:
        next_seq = _guarded(instance.open)
        pending = store.backlog(instance.database, next_seq, table).rows
        say(f"relay '{config.relay_name}' (transactional id {config.transactional_id}): "
            f"{db.redact(database_url)} -> {bootstrap_servers}; next seq {next_seq}, "
            f"{pending} rows pending")
        reporter = _Reporter()
        reporter.next_seq = next_seq
        _guarded(lambda: instance.run(once=once, should_stop=lambda: bool(stopping),
                                      on_batch=reporter.on_batch))
        reporter.line()
    finally:
        instance.close()
        signal.signal(signal.SIGTERM, previous)


@outbox_app.command("status")
@exits_cleanly
def status(
    database_url: DbOption,
    bootstrap_servers: BootstrapOption = BOOTSTRAP_DEFAULT,
    name: NameOption = None,
    table: TableOption = store.DEFAULT_TABLE,
    progress_topic_name: ProgressTopicOption = progress_topic.DEFAULT_PROGRESS_TOPIC,
    command_config: CommandConfigOption = None,
) -> None:
    """Show a relay's next sequence number and the rows waiting behind it."""
    relay_name = name or table
    properties = command_properties(command_config)
    with _connect(database_url) as database:
        outbox_id = _guarded(lambda: store.outbox_id(database, table))
        found = _guarded(lambda: progress_topic.read(bootstrap_servers, progress_topic_name,
                                                     relay_name, properties=properties))
        next_seq = found.next_seq if found is not None else 0
        waiting = store.backlog(database, next_seq, table)
    rows = [("relay", relay_name), ("outbox", f"{table} in {database.display}"),
            ("outbox id", outbox_id),
            ("next seq", str(next_seq) if found else "0 (nothing published yet)"),
            ("last seq in outbox", "-" if waiting.last_seq is None else str(waiting.last_seq)),
            ("backlog rows", str(waiting.rows)),
            ("oldest pending since", waiting.oldest_pending or "-")]
    if found is not None and found.outbox_id != outbox_id:
        rows.append(("warning", f"the progress belongs to outbox {found.outbox_id}"))
    result = Table("field", "value", title=f"outbox relay '{relay_name}'")
    for field, value in rows:
        result.add_row(field, value)
    stdout().print(result)


def say(line: str) -> None:
    # Plain lines, never wrapped: they end up in log files more often than on terminals.
    print(line, flush=True)


def _connect(url: str) -> db.Database:
    return _guarded(lambda: db.connect(url))


def _guarded(call: Callable[[], T]) -> T:
    """Run `call`, turning onceflow's database/outbox errors into CliError."""
    try:
        return call()
    except (db.DatabaseError, store.OutboxError, relay_module.RelayError,
            progress_topic.ProgressError) as exc:
        raise CliError(str(exc)) from None
