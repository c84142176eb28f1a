"""`onceflow produce` and `onceflow consume`, and what every client command shares.

Theory of operation: a command builds confluent-kafka clients from
`--bootstrap-servers`, first asks the cluster for its metadata (which proves a broker
answers and tells whether the topic exists) and only then does its work. Every failure a
person can cause or fix - nothing listening, an unknown topic, a bad argument - becomes a
`CliError`: one line on stderr and exit code 1, never a traceback. librdkafka's own log
lines go to a silent logger for the same reason; the errors that matter reach us through
`error_cb`, futures and delivery reports.

`topics.py` imports the shared pieces (`BootstrapOption`, `exits_cleanly`,
`connect_admin`, ...) from here.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import json
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Annotated, Any, ParamSpec, TypeVar

import typer
from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_END,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)
from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from onceflow.client.admin import (  # noqa: F401 - the commands import them from here
    METADATA_TIMEOUT_S,
    ClientError,
    ClientErrors,
    client_config,
    connect_admin,
    describe_kafka_error,
    fetch_metadata,
    new_client_errors,
    require_topic,
    unreachable_detail,
)
from onceflow.client.config import read_properties

# The CLI's name for the client layer's error: a command that raises it exits 1 with
# its message on one line.
CliError = ClientError

BOOTSTRAP_ENV = "ONCEFLOW_BOOTSTRAP"
BOOTSTRAP_DEFAULT = "127.0.0.1:9092"

# Bound on waiting for outstanding deliveries at the end of `produce`.
FLUSH_TIMEOUT_S = 30.0
# While the producer queue is full we serve delivery reports for this long, then retry.
QUEUE_FULL_POLL_S = 0.05
# Records produced between two services of delivery reports: keeps the callback backlog
# (and memory) small without paying for a poll per record.
PRODUCE_POLL_EVERY_RECORDS = 1_000
# Messages fetched per `Consumer.consume` call and how long one call may block.
CONSUME_BATCH_MAX = 500
CONSUME_POLL_S = 0.2
# How long `consume --group` may wait for the group to assign partitions (a join includes
# the coordinator's initial rebalance delay, 3 s in Kafka) before giving up.
GROUP_JOIN_TIMEOUT_S = 60.0
# Consumer-group id for partition-assigning reads (librdkafka insists on one even when
# no group protocol is used); unique so that two CLI readers never share offsets.
ANONYMOUS_GROUP_PREFIX = "onceflow-cli-"

P = ParamSpec("P")
R = TypeVar("R")

BootstrapOption = Annotated[
    str,
    typer.Option(
        "--bootstrap-servers",
        "-b",
        envvar=BOOTSTRAP_ENV,
        help="Comma-separated host:port list of brokers.",
    ),
]


COMMAND_CONFIG_ENV = "ONCEFLOW_COMMAND_CONFIG"
CommandConfigOption = Annotated[
    Path | None,
    typer.Option(
        "--command-config",
        envvar=COMMAND_CONFIG_ENV,
        help="Kafka client properties file (security.protocol, sasl.*, ssl.*), as Kafka's "
             "tools take it.",
    ),
]


def command_properties(path: Path | None) -> dict[str, str]:
    """The client properties of `--command-config` (none without it)."""
    return read_properties(path) if path is not None else {}


class OutputFormat(str, enum.Enum):
    table = "table"
    plain = "plain"
    json = "json"


class Isolation(str, enum.Enum):
    read_committed = "read_committed"
    read_uncommitted = "read_uncommitted"


def stdout() -> Console:
    # Built per call: typer's CliRunner swaps sys.stdout, and a console keeps its file.
    return Console(file=sys.stdout, soft_wrap=False)


def stderr() -> Console:
    # soft_wrap: an error stays one line however narrow the terminal.
    return Console(file=sys.stderr, soft_wrap=True)


def exits_cleanly(command: Callable[P, R]) -> Callable[P, R]:
    """Turn CliError, stray Kafka errors and Ctrl-C into one line and an exit code."""

    @functools.wraps(command)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return command(*args, **kwargs)
        except CliError as exc:
            report_error(str(exc))
        except KafkaException as exc:
            report_error(describe_kafka_error(exc.args[0]))
        except KeyboardInterrupt:
            raise typer.Exit(130) from None
        raise typer.Exit(1)

    return wrapper


def report_error(message: str) -> None:
    # escape: broker messages hold brackets ("t [0]") that rich would take for markup.
    stderr().print(f"[red]error:[/red] {escape(message)}", highlight=False)


# --------------------------------------------------------------------------- produce


def split_line(line: bytes, separator: bytes | None,
               line_number: int) -> tuple[bytes | None, bytes]:
    """(key, value) of one input line without its line ending (\\n or \\r\\n)."""
    line = line.removesuffix(b"\n").removesuffix(b"\r")
    if separator is None:
        return None, line
    key, found, value = line.partition(separator)
    if not found:
        raise CliError(f"line {line_number} has no key separator {separator.decode()!r}")
    return key, value


class DeliveryTally:
    """Counts failed deliveries; keeps the first failure to report it."""

    def __init__(self) -> None:
        self.failed = 0
        self.first_error: KafkaError | None = None

    def on_delivery(self, error: KafkaError | None, _message: Message) -> None:
        if error is None:
            return
        self.failed += 1
        if self.first_error is None:
            self.first_error = error


def produce_one(producer: Producer, topic: str, key: bytes | None, value: bytes,
                tally: DeliveryTally) -> None:
    while True:
        try:
            producer.produce(topic, value=value, key=key, on_delivery=tally.on_delivery)
            return
        except BufferError:  # local queue full: let deliveries drain it
            producer.poll(QUEUE_FULL_POLL_S)


def input_progress(source: Path | None) -> Progress:
    """A progress display on stderr (drawn only when stderr is a terminal)."""
    console = stderr()
    columns: list[Any] = [SpinnerColumn(), TextColumn("{task.description}")]
    if source is not None:
        columns += [BarColumn(), DownloadColumn()]
    columns += [TextColumn("{task.fields[records]} records"), TimeElapsedColumn()]
    return Progress(*columns, console=console, transient=True,
                    disable=not console.is_terminal)


def read_lines(stream: IO[bytes]) -> Iterator[tuple[int, bytes]]:
    """(bytes consumed so far, line) for each line of the stream."""
    consumed = 0
    for line in stream:
        consumed += len(line)
        yield consumed, line


def produce_stream(producer: Producer, topic: str, stream: IO[bytes], separator: bytes | None,
                   progress: Progress, total_bytes: int | None, tally: DeliveryTally) -> int:
    """Produce every line of `stream`; returns how many records were handed to librdkafka."""
    task = progress.add_task(f"producing to {topic}", total=total_bytes, records=0)
    count = 0
    for consumed, line in read_lines(stream):
        try:
            key, value = split_line(line, separator, count + 1)
        except CliError as exc:
            # Deliver what came before the bad line so the outcome is exact, then stop.
            finish_produce(producer, tally, count, topic)
            raise CliError(f"{exc}; the {count} records before it were produced") from None
        produce_one(producer, topic, key, value, tally)
        count += 1
        if count % PRODUCE_POLL_EVERY_RECORDS == 0:
            producer.poll(0)
            progress.update(task, completed=consumed, records=count)
    progress.update(task, completed=total_bytes, records=count)
    return count


def finish_produce(producer: Producer, tally: DeliveryTally, count: int, topic: str) -> None:
    remaining = producer.flush(FLUSH_TIMEOUT_S)
    if tally.first_error is not None:
        raise CliError(f"{tally.failed} of {count} records failed: "
                       f"{describe_kafka_error(tally.first_error, topic)}")
    if remaining:
        raise CliError(f"{remaining} of {count} records not acknowledged "
                       f"after {FLUSH_TIMEOUT_S:.0f} s")


@exits_cleanly
def produce(
    topic: Annotated[str, typer.Argument(help="Topic to write to.")],
    bootstrap_servers: BootstrapOption = BOOTSTRAP_DEFAULT,
    command_config: CommandConfigOption = None,
    key_separator: Annotated[str | None, typer.Option(
        help="Split each line at the first occurrence into key and value.")] = None,
    file: Annotated[Path | None, typer.Option(
        "--file", "-f", exists=True, dir_okay=False, readable=True,
        help="Read lines from this file instead of stdin.")] = None,
    acks: Annotated[str, typer.Option(help="acks: all, 1 or 0.")] = "all",
) -> None:
    """Produce one record per input line (stdin, or --file)."""
    properties = command_properties(command_config)
    _admin, metadata = connect_admin(bootstrap_servers, properties)
    require_topic(metadata, topic)
    errors = new_client_errors()
    producer = Producer({**client_config(bootstrap_servers, errors, properties), "acks": acks,
                         "linger.ms": 5, "allow.auto.create.topics": False})
    separator = key_separator.encode() if key_separator else None
    total_bytes = file.stat().st_size if file else None
    tally = DeliveryTally()
    with input_progress(file) as progress:
        # stdin is not ours to close: nullcontext leaves it open.
        with file.open("rb") if file else contextlib.nullcontext(sys.stdin.buffer) as stream:
            count = produce_stream(producer, topic, stream, separator, progress,
                                   total_bytes, tally)
        finish_produce(producer, tally, count, topic)
    stdout().print(f"produced {count} records to {topic}", highlight=False)


# --------------------------------------------------------------------------- consume


def consumer_config(bootstrap_servers: str, errors: ClientErrors, group: str | None,
                    isolation: Isolation, from_beginning: bool,
                    properties: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        **client_config(bootstrap_servers, errors, properties),
        "group.id": group or f"{ANONYMOUS_GROUP_PREFIX}{uuid.uuid4().hex[:12]}",
        # Without a group nothing is committed: a CLI read must not move anyone's offsets.
        "enable.auto.commit": group is not None,
        "auto.offset.reset": "earliest" if from_beginning else "latest",
        "isolation.level": isolation.value,
        "allow.auto.create.topics": False,
    }


class ReadClock:
    """Since when a read has been idle: `--timeout-ms` counts from the last record, or from
    the start of reading - which, in a group, is the assignment, not the join request."""

    def __init__(self, in_group: bool) -> None:
        self.created_at = time.monotonic()
        self.active_at: float | None = None if in_group else self.created_at

    def on_assign(self, _consumer: Consumer, _partitions: list[TopicPartition]) -> None:
        if self.active_at is None:
            self.active_at = time.monotonic()

    def saw_record(self) -> None:
        self.active_at = time.monotonic()

    def idle_expired(self, idle_timeout_ms: int | None) -> bool:
        now = time.monotonic()
        if self.active_at is None:
            if now - self.created_at > GROUP_JOIN_TIMEOUT_S:
                raise CliError(f"the group assigned no partitions within "
                               f"{GROUP_JOIN_TIMEOUT_S:.0f} s")
            return False
        return idle_timeout_ms is not None and (now - self.active_at) * 1000 >= idle_timeout_ms


def start_reading(consumer: Consumer, topic: str, partitions: list[int], group: str | None,
                  from_beginning: bool, clock: ReadClock) -> None:
    """Join the group when one is named, otherwise read every partition directly."""
    if group is not None:
        consumer.subscribe([topic], on_assign=clock.on_assign)
        return
    start = OFFSET_BEGINNING if from_beginning else OFFSET_END
    consumer.assign([TopicPartition(topic, p, start) for p in partitions])


def text(data: bytes | None) -> str | None:
    """Bytes for display: UTF-8 where possible, escapes elsewhere."""
    if data is None:
        return None
    return data.decode("utf-8", errors="backslashreplace")


def record_fields(message: Message) -> dict[str, Any]:
    headers = message.headers() or []
    return {
        "partition": message.partition(),
        "offset": message.offset(),
        "key": text(message.key()),
        "value": text(message.value()),
        "headers": {name: text(value) for name, value in headers},
    }


PLAIN_ESCAPES = str.maketrans({"\t": "\\t", "\n": "\\n", "\r": "\\r"})


class RecordPrinter:
    """Writes records as they arrive (plain, json) or as one table at the end."""

    def __init__(self, output_format: OutputFormat, topic: str) -> None:
        self.format = output_format
        self.rows: list[dict[str, Any]] = []
        self.topic = topic
        self.count = 0

    def add(self, fields: dict[str, Any]) -> None:
        self.count += 1
        if self.format is OutputFormat.json:
            sys.stdout.write(json.dumps(fields, ensure_ascii=False) + "\n")
        elif self.format is OutputFormat.plain:
            cells = [fields["partition"], fields["offset"], fields["key"], fields["value"]]
            line = "\t".join("" if c is None else str(c).translate(PLAIN_ESCAPES) for c in cells)
            sys.stdout.write(line + "\n")
        else:
            self.rows.append(fields)

    def finish(self) -> None:
        sys.stdout.flush()
        if self.format is OutputFormat.table:
            stdout().print(self.table())
        stderr().print(f"consumed {self.count} records from {self.topic}", highlight=False)

    def table(self) -> Table:
        table = Table("partition", "offset", "key", "value", "headers",
                      title=f"{self.topic}: {len(self.rows)} records")
        for row in self.rows:
            headers = ", ".join(f"{k}={v}" for k, v in row["headers"].items())
            table.add_row(str(row["partition"]), str(row["offset"]),
                          _cell(row["key"]), _cell(row["value"]), _cell(headers))
        return table


def _cell(value: str | None) -> str:
    if value is None:
        return "[dim](null)[/dim]"
    return escape(value.translate(PLAIN_ESCAPES))


def consume_loop(consumer: Consumer, printer: RecordPrinter, max_messages: int | None,
                 idle_timeout_ms: int | None, topic: str, clock: ReadClock) -> None:
    """Print records until max_messages, or until none arrived for idle_timeout_ms."""
    while max_messages is None or printer.count < max_messages:
        wanted = CONSUME_BATCH_MAX if max_messages is None else min(
            CONSUME_BATCH_MAX, max_messages - printer.count)
        for message in consumer.consume(wanted, CONSUME_POLL_S):
            if message.error() is not None:
                raise CliError(describe_kafka_error(message.error(), topic))
            printer.add(record_fields(message))
            clock.saw_record()
        if clock.idle_expired(idle_timeout_ms):
            break


@exits_cleanly
def consume(
    topic: Annotated[str, typer.Argument(help="Topic to read.")],
    bootstrap_servers: BootstrapOption = BOOTSTRAP_DEFAULT,
    command_config: CommandConfigOption = None,
    from_beginning: Annotated[bool, typer.Option(
        help="Start at the log start offset instead of the end.")] = False,
    max_messages: Annotated[int | None, typer.Option(
        min=1, help="Stop after this many records.")] = None,
    group: Annotated[str | None, typer.Option(
        help="Consumer group to join (commits offsets). Without it every partition is "
             "read directly and nothing is committed.")] = None,
    isolation: Annotated[Isolation, typer.Option(
        help="read_committed hides aborted and open transactions.")] = Isolation.read_uncommitted,
    timeout_ms: Annotated[int | None, typer.Option(
        min=0, help="Stop when no record arrived for this long, counted from the start of "
                    "reading (in a group: from the assignment). Default: wait forever.")] = None,
    output_format: Annotated[OutputFormat, typer.Option(
        "--format", help="table (at the end), or plain / json lines as records arrive.")
    ] = OutputFormat.table,
) -> None:
    """Print records of a topic: partition, offset, key, value (and headers)."""
    properties = command_properties(command_config)
    _admin, metadata = connect_admin(bootstrap_servers, properties)
    partitions = require_topic(metadata, topic)
    errors = new_client_errors()
    consumer = Consumer(consumer_config(bootstrap_servers, errors, group, isolation,
                                        from_beginning, properties))
    printer = RecordPrinter(output_format, topic)
    clock = ReadClock(in_group=group is not None)
    try:
        start_reading(consumer, topic, partitions, group, from_beginning, clock)
        consume_loop(consumer, printer, max_messages, timeout_ms, topic, clock)
    except KeyboardInterrupt:
        pass  # Ctrl-C ends a read: show what arrived
    finally:
        consumer.close()
    printer.finish()
