"""Progress of a running pipeline: per query, what it has done and how far behind it is.

Theory of operation. Spark reports a progress record per micro-batch (and one every
`spark.sql.streaming.noDataProgressEventInterval` while idle): the batch id, its input rows,
the processing rate, and per source the batch's end offset and the source's latest offset.
`ProgressTracker` folds those records, as plain JSON dicts, into one `QueryStats` per query;
it does no I/O and takes the time as a parameter, so it is tested without Spark. The
pipeline runner polls the queries and feeds the tracker; a display shows the stats:

* `LiveDisplay`: a rich table redrawn in place, for a person at a terminal;
* `LogDisplay`: one line per finished batch, for CI logs, pipes and parent processes
  (the pizza demo reads these lines from its child driver).

Lag is `latestOffset - endOffset` summed over the source's topic-partitions, when both are
`{"topic": {"partition": offset}}` maps (the onceflow Kafka source; `latestOffset` is what
its `reportLatestOffset` says). Sources with other offset shapes show no lag.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from typing import IO, Any, Self

from rich.console import Console
from rich.live import Live
from rich.table import Table

NOT_AVAILABLE = "-"
LIVE_REFRESH_PER_S = 4


@dataclasses.dataclass
class QueryStats:
    """What one streaming query has done in this run (batch ids continue across runs)."""

    name: str
    state: str = "starting"  # starting | running | stopped | failed
    message: str = ""  # Spark's status message ("Processing new data", ...)
    last_batch_id: int | None = None
    batches: int = 0  # batches that ran in this run
    rows_last_batch: int = 0
    rows_per_s: float = 0.0
    rows_total: int = 0
    lag: int | None = None  # records available in the source and not yet processed
    busy_at_s: float | None = None  # last time it had data, or its first progress if none
    seen: tuple[int, str] | None = None  # (batchId, timestamp) of the last progress folded


def offsets_behind(latest: Any, end: Any) -> int | None:
    """Records between a batch's end offsets and the latest ones, both {topic: {part: n}}."""
    latest, end = _as_offsets(latest), _as_offsets(end)
    if latest is None or end is None:
        return None
    behind = 0
    for topic, partitions in latest.items():
        for partition, offset in partitions.items():
            behind += max(0, offset - end.get(topic, {}).get(partition, 0))
    return behind


def _as_offsets(value: Any) -> dict[str, dict[str, int]] | None:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    if not isinstance(value, dict):
        return None
    try:
        return {str(t): {str(p): int(o) for p, o in parts.items()} for t, parts in value.items()}
    except (AttributeError, TypeError, ValueError):
        return None


def source_lag(progress: dict[str, Any]) -> int | None:
    """Total lag over a progress record's sources, or None when no source tells it."""
    lags = [offsets_behind(s.get("latestOffset"), s.get("endOffset")) for s in progress.get("sources", [])]
    known = [lag for lag in lags if lag is not None]
    return sum(known) if known else None


def batch_ran(progress: dict[str, Any]) -> bool:
    # Idle progress records (no new data) carry no addBatch duration and no rows.
    return bool(progress.get("numInputRows")) or "addBatch" in progress.get("durationMs", {})


class ProgressTracker:
    """Folds progress records and statuses into QueryStats, one per query name."""

    def __init__(self, names: list[str]) -> None:
        self.stats = {name: QueryStats(name) for name in names}

    def observe(self, name: str, progress: dict[str, Any] | None, now_s: float) -> bool:
        """Fold one progress record; True when it is a batch not seen before that ran."""
        stats = self.stats[name]
        if progress is None:
            return False
        key = (int(progress.get("batchId", -1)), str(progress.get("timestamp", "")))
        if stats.seen is not None and key <= stats.seen:
            return False
        if stats.seen is None:
            stats.busy_at_s = now_s  # first trigger done: the idle clock starts now
        stats.seen = key
        lag = source_lag(progress)
        if lag is not None:
            stats.lag = lag
        if not batch_ran(progress):
            return False
        rows = int(progress.get("numInputRows") or 0)
        stats.last_batch_id = key[0]
        stats.batches += 1
        stats.rows_last_batch = rows
        stats.rows_per_s = float(progress.get("processedRowsPerSecond") or 0.0)
        stats.rows_total += rows
        if rows:
            stats.busy_at_s = now_s
        return True

    def observe_status(self, name: str, status: dict[str, Any] | None, active: bool,
                       failed: bool, now_s: float) -> None:
        stats = self.stats[name]
        if failed:
            stats.state = "failed"
        elif not active:
            stats.state = "stopped"
        elif status is not None:
            stats.message = str(status.get("message", ""))
            if stats.state == "starting" and stats.seen is not None:
                stats.state = "running"
            if status.get("isTriggerActive") and status.get("isDataAvailable"):
                stats.busy_at_s = now_s  # working on data right now: not idle

    def idle_for_s(self, now_s: float) -> float:
        """Seconds since any query last had data to process; 0 while a query has not
        finished its first trigger (starting a query - the source, its Python workers -
        can take longer than the idle time asked for)."""
        busy = [s.busy_at_s for s in self.stats.values()]
        if not busy or None in busy:
            return 0.0
        return now_s - max(b for b in busy if b is not None)

    def all(self) -> list[QueryStats]:
        return list(self.stats.values())


# ------------------------------------------------------------------------- displays


def _count(value: int | None) -> str:
    return NOT_AVAILABLE if value is None else f"{value:,}"


def describe_batch(pipeline: str, stats: QueryStats) -> str:
    """One log line for a finished batch."""
    lag = "" if stats.lag is None else f", lag {stats.lag:,}"
    return (f"{pipeline}/{stats.name} batch {stats.last_batch_id}: "
            f"{stats.rows_last_batch:,} rows ({stats.rows_per_s:,.0f} rows/s), "
            f"{stats.rows_total:,} total{lag}")


def stats_table(pipeline: str, stats: list[QueryStats]) -> Table:
    table = Table(title=f"pipeline {pipeline}", title_justify="left")
    table.add_column("query")
    table.add_column("state")
    for column in ("batch", "batches run", "rows last batch", "rows/s", "rows total", "lag"):
        table.add_column(column, justify="right")
    for s in stats:
        state = s.message if s.state in ("running", "starting") and s.message else s.state
        table.add_row(s.name, state, _count(s.last_batch_id), f"{s.batches:,}",
                      f"{s.rows_last_batch:,}", f"{s.rows_per_s:,.0f}", f"{s.rows_total:,}",
                      _count(s.lag))
    return table


class LogDisplay:
    """Plain lines: one per finished batch, one per query that stops."""

    def __init__(self, pipeline: str, file: IO[str] | None = None) -> None:
        self.pipeline = pipeline
        self.file = file or sys.stdout
        self._reported_states: dict[str, str] = {}

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.file.flush()

    def update(self, stats: list[QueryStats], new_batches: list[str]) -> None:
        for s in stats:
            if s.name in new_batches:
                self._line(describe_batch(self.pipeline, s))
            if s.state in ("stopped", "failed") and self._reported_states.get(s.name) != s.state:
                self._line(f"{self.pipeline}/{s.name} {s.state}: {s.batches:,} batches, "
                           f"{s.rows_total:,} rows in this run")
            self._reported_states[s.name] = s.state

    def note(self, text: str) -> None:
        self._line(f"{self.pipeline}: {text}")

    def _line(self, text: str) -> None:
        print(f"{time.strftime('%H:%M:%S')} {text}", file=self.file, flush=True)


class LiveDisplay:
    """A rich table redrawn in place while the pipeline runs, left on screen at the end."""

    def __init__(self, pipeline: str, console: Console) -> None:
        self.pipeline = pipeline
        self.console = console
        self._live = Live(stats_table(pipeline, []), console=console,
                          refresh_per_second=LIVE_REFRESH_PER_S)

    def __enter__(self) -> Self:
        self._live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._live.__exit__(*exc)

    def update(self, stats: list[QueryStats], new_batches: list[str]) -> None:
        self._live.update(stats_table(self.pipeline, stats))

    def note(self, text: str) -> None:
        self._live.console.print(f"{self.pipeline}: {text}", highlight=False)


Display = LogDisplay | LiveDisplay


def open_display(pipeline: str, file: IO[str] | None = None, live: bool | None = None) -> Display:
    """A live table when `file` (stdout by default) is a terminal, log lines otherwise."""
    file = file or sys.stdout
    console = Console(file=file)
    if live is None:
        live = console.is_terminal
    return LiveDisplay(pipeline, console) if live else LogDisplay(pipeline, file)
