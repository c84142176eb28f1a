"""`onceflow pipeline run FILE` and `onceflow pipeline status CHECKPOINT`.

Theory of operation: `run` executes FILE (Python that defines `pipeline = Pipeline(...)`,
see docs/pipelines.md), applies the command line's overrides (checkpoint, bootstrap
servers), checks everything that can be checked without Spark - so a typo costs a second,
not a JVM start - then builds the SparkSession (`onceflow.spark.session`, which registers
the onceflow data sources) and runs the pipeline in the foreground. Progress is a live
table on a terminal and one line per micro-batch otherwise. Ctrl-C and SIGTERM stop the
queries cleanly (exit 0); a batch cut short is replayed on the next start. A failing
query is one error message and exit code 1.

`status` reads a checkpoint directory without Spark (onceflow.spark.checkpoint): for each
query, the last batch planned and the last committed, and the source offsets they end at.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from onceflow.cli.clients import (
    CliError,
    CommandConfigOption,
    command_properties,
    exits_cleanly,
    stdout,
)
from onceflow.spark import checkpoint as checkpoints
from onceflow.spark.session import DEFAULT_MASTER

pipeline_app = typer.Typer(name="pipeline", no_args_is_help=True,
                           help="Run exactly-once pipelines on Spark; inspect their checkpoints.")

# Offsets shown per query in `status` before "... and N more": a topic with hundreds of
# partitions stays readable.
OFFSETS_SHOWN_MAX = 12


@pipeline_app.command("run")
@exits_cleanly
def run(
    file: Annotated[Path, typer.Argument(help="Python file defining `pipeline = Pipeline(...)`.")],
    master: Annotated[str, typer.Option(help="Spark master URL: local[*], local[2], spark://host:7077...")] = DEFAULT_MASTER,
    bootstrap_servers: Annotated[str | None, typer.Option(
        "--bootstrap-servers", "-b",
        help="Kafka brokers; default: the pipeline's, else $ONCEFLOW_BOOTSTRAP_SERVERS.")] = None,
    # A str, not a Path: Path("hdfs://nn/cp") would turn the URI into "hdfs:/nn/cp".
    checkpoint: Annotated[str | None, typer.Option(
        help="Checkpoint directory (or URI: hdfs://..., s3a://...) instead of the pipeline's.")] = None,
    available_now: Annotated[bool, typer.Option(
        "--available-now", help="Process what the source holds now, then stop.")] = False,
    until_idle: Annotated[float | None, typer.Option(
        help="Stop once no query had new data for this many seconds.", min=0.1)] = None,
    live: Annotated[bool | None, typer.Option(
        "--live/--log", help="Progress as a live table or as log lines (default: live on a terminal).",
        show_default=False)] = None,
    command_config: CommandConfigOption = None,
    archive: Annotated[str | None, typer.Option(
        help="Environment archive for the executors (`onceflow spark pack`); path or URI.")] = None,
) -> None:
    """Run a pipeline until stopped (Ctrl-C / SIGTERM), --available-now, or --until-idle.

    --command-config: Kafka client properties (security.protocol, sasl.*, ssl.*) for the
    Kafka source and the Kafka sinks on the pipeline's cluster, passed as kafka.* options."""
    from onceflow.spark.monitor import open_display
    from onceflow.spark.pipeline import PipelineError, Until, load_pipeline

    if available_now and until_idle is not None:
        raise CliError("--available-now and --until-idle exclude each other")
    until = (Until.backlog_processed() if available_now
             else Until.idle(until_idle) if until_idle is not None else Until.forever())
    try:
        pipeline = load_pipeline(file)
        if checkpoint is not None:
            pipeline = pipeline.replace(checkpoint=str(checkpoint))
        pipeline = pipeline.with_kafka_properties(command_properties(command_config))
        bootstrap = pipeline.resolve_bootstrap(bootstrap_servers)
    except PipelineError as exc:
        raise CliError(str(exc)) from None
    spark = _spark_session(master, pipeline.name, archive)
    try:
        result = pipeline.run(spark, until, display=open_display(pipeline.name, live=live),
                              bootstrap_servers=bootstrap)
    except PipelineError as exc:
        raise CliError(str(exc)) from None
    finally:
        spark.stop()
    rows = ", ".join(f"{s.name} {s.rows_total:,} rows in {s.batches:,} batches" for s in result.stats)
    # soft_wrap: one line however narrow the terminal (or a pipe, which rich takes as 80).
    stdout().print(f"pipeline {pipeline.name} stopped ({result.reason}): {rows}",
                   highlight=False, soft_wrap=True)


def _spark_session(master: str, name: str, archive: str | None = None) -> Any:
    try:
        from onceflow.spark import session
    except ImportError as exc:  # pragma: no cover - the spark extra is missing
        raise CliError(f"pipelines need the spark extra (pip install 'onceflow[spark]'): {exc}") from None
    from py4j.protocol import Py4JError
    from pyspark.errors import PySparkException

    try:
        return session(master, app_name=f"onceflow-{name}", archive=archive)
    except (PySparkException, Py4JError, OSError) as exc:  # no Java, a bad master URL
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CliError(f"cannot start Spark with master {master}: {first}") from None


@pipeline_app.command("status")
@exits_cleanly
def status(
    # A str, not a Path: Path("hdfs://nn/cp") would turn the URI into "hdfs:/nn/cp".
    checkpoint: Annotated[str, typer.Argument(
        help="A pipeline's checkpoint directory, or one query's (<checkpoint>/<sink name>); "
             "a path or a file: URI.")],
) -> None:
    """Show each query's last planned and last committed micro-batch and their offsets."""
    try:
        states = [checkpoints.read_state(path) for path in checkpoints.query_checkpoints(checkpoint)]
    except checkpoints.CheckpointError as exc:
        raise CliError(str(exc)) from None
    if not states:
        raise CliError(f"{checkpoint}: no Spark query checkpoint here or in its subdirectories")
    console = stdout()
    console.print(status_table(checkpoint, states))
    for state in states:
        for line in _status_notes(state):
            console.print(line, highlight=False, soft_wrap=True)


def status_table(root: str | Path, states: list[checkpoints.CheckpointState]) -> Table:
    table = Table(title=f"checkpoint {root}", title_justify="left")
    table.add_column("query")
    for column in ("last planned", "last committed", "in flight"):
        table.add_column(column, justify="right")
    for state in states:
        table.add_row(state.path.name, _batch(state.last_planned), _batch(state.last_committed),
                      ", ".join(map(str, state.in_flight)) or "-")
    return table


def _status_notes(state: checkpoints.CheckpointState) -> list[str]:
    """Offsets and ids as lines of their own: long, and a table would fold them."""
    name, committed = state.path.name, state.committed_offsets
    notes = [f"{name}: query id {state.query_id or '-'}"]
    if committed is not None:
        notes.append(f"{name}: batch {committed.batch_id} committed, up to "
                     f"{format_offsets(committed.source_offsets)}")
    if state.in_flight and state.planned_offsets is not None:
        notes.append(f"{name}: batch {state.in_flight[-1]} was planned and not committed; the "
                     f"next start replays it, up to {format_offsets(state.planned_offsets.source_offsets)}")
    return notes


def _batch(batch_id: int | None) -> str:
    return "-" if batch_id is None else str(batch_id)


def format_offsets(source_offsets: tuple[Any, ...]) -> str:
    """`orders[0]=120 orders[1]=98` for Kafka-shaped offsets, JSON for anything else."""
    parts: list[str] = []
    for offsets in source_offsets:
        if isinstance(offsets, dict) and all(isinstance(v, dict) for v in offsets.values()):
            parts.extend(f"{topic}[{p}]={n}" for topic, by_partition in sorted(offsets.items())
                         for p, n in sorted(by_partition.items(), key=lambda item: (len(item[0]), item[0])))
        else:
            parts.append("-" if offsets is None else json.dumps(offsets))
    shown = " ".join(parts[:OFFSETS_SHOWN_MAX])
    more = len(parts) - OFFSETS_SHOWN_MAX
    return shown + (f" ... and {more} more" if more > 0 else "")
