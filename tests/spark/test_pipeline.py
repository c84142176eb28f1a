"""Pipelines: the declarative API and its validation, the runner's stop conditions and
failures, `onceflow pipeline run` / `status`, the progress display, and the pizza demo.

The runner tests use the session's SparkSession in this process; `onceflow pipeline run`
and the demo run their own drivers as child processes, as a user would.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from onceflow.cli.app import app
from onceflow.demo.processes import descendants, kill_tree
from onceflow.spark import checkpoint
from onceflow.spark.monitor import LogDisplay, ProgressTracker, offsets_behind
from onceflow.spark.pipeline import (
    DatabaseSink,
    KafkaSink,
    KafkaSource,
    Pipeline,
    PipelineError,
    SparkSink,
    SparkSource,
    Until,
    as_until,
    load_pipeline,
)
from tests.spark.support import create_topic, produce, read_committed, unique, wait_for
from tests.test_processes import alive

CLI_DRIVER_TIMEOUT_S = 240


def json_records(count: int, start: int = 0) -> list[tuple[bytes, bytes]]:
    return [(str(i).encode(), json.dumps({"id": i, "n": i % 7}).encode())
            for i in range(start, start + count)]


def kafka_to_memory(name: str, topic: str, tmp_path: Path, **changes) -> Pipeline:
    """Records of `topic` whose n is even, as (id, n) rows in the memory table `name`."""
    from pyspark.sql import functions as F

    def keep_even(records):
        parsed = records.select(F.from_json(F.col("value").cast("string"), "id INT, n INT").alias("r"))
        return parsed.where(F.col("r.n") % 2 == 0).select("r.id", "r.n")

    settings = {"name": name, "source": KafkaSource(topics=[topic], max_records_per_trigger=100),
                "transform": keep_even, "sinks": [SparkSink(format="memory", name=name)],
                "checkpoint": str(tmp_path / "checkpoints"), "trigger_seconds": 0.2}
    return Pipeline(**(settings | changes))


def expected_even(count: int) -> list[int]:
    return [i for i in range(count) if i % 7 % 2 == 0]


def memory_ids(spark, table: str) -> list[int]:
    return sorted(row.id for row in spark.table(table).collect())


# ------------------------------------------------------------------- declarations


def _sink() -> KafkaSink:
    return KafkaSink(topic="out")


@pytest.mark.parametrize(("build", "message"), [
    (lambda: Pipeline(name="p", source=KafkaSource(topics=["t"]), sinks=[], checkpoint="c"),
     "has no sinks"),
    (lambda: Pipeline(name="p", source=KafkaSource(topics=["t"]), sinks=[_sink()], checkpoint="c",
                      transform="upper"), "transform must be a function"),
    (lambda: Pipeline(name="p", source="orders", sinks=[_sink()], checkpoint="c"),
     "source must be a KafkaSource or SparkSource"),
    (lambda: Pipeline(name="p", source=KafkaSource(topics=["t"]), sinks=[_sink(), _sink()],
                      checkpoint="c"), "sink names must differ.*kafka-out"),
    (lambda: Pipeline(name="p", source=KafkaSource(topics=["t"]), sinks=[_sink()], checkpoint=""),
     "needs a checkpoint"),
    (lambda: Pipeline(name="no spaces", source=KafkaSource(topics=["t"]), sinks=[_sink()],
                      checkpoint="c"), "pipeline name 'no spaces'"),
    (lambda: Pipeline(name="p", source=KafkaSource(topics=["t"]), sinks=[_sink()], checkpoint="c",
                      trigger_seconds=-1), "trigger_seconds"),
    (lambda: KafkaSource(topics=[]), "needs topics"),
    (lambda: KafkaSource(topics=["t"], max_records_per_trigger=0), "positive integer"),
    (lambda: KafkaSource(topics=["t"], starting_offsets="beginning"), "starting_offsets"),
    (lambda: KafkaSink(topic=""), "needs a topic"),
    (lambda: KafkaSink(topic="t", transform=42), "transform must be a function"),
    (lambda: DatabaseSink(url="mysql://x", table="t"), "sqlite:/// or postgresql://"),
    (lambda: DatabaseSink(url="sqlite:///x.db", table="t", mode="upsert"), "key_columns"),
    (lambda: DatabaseSink(url="sqlite:///x.db", table="t", output_mode="update"),
     "update mode.*complete"),
    (lambda: SparkSink(format=""), "needs a format"),
])
def test_declaration_errors(build, message: str) -> None:
    with pytest.raises(PipelineError, match=message):
        build()


def test_declarations_fill_in_names_and_options() -> None:
    sink = KafkaSink(topic="pizza-income", progress_topic="progress")
    database = DatabaseSink(url="sqlite:///x.db", table="totals", mode="upsert", key_columns="meal")
    assert (sink.name, database.name) == ("kafka-pizza-income", "db-totals")
    assert sink.writer_options("b:1") == {"kafka.bootstrap.servers": "b:1", "topic": "pizza-income",
                                          "exactlyOnce": "true", "progressTopic": "progress"}
    assert database.writer_options(None) == {"url": "sqlite:///x.db", "table": "totals",
                                             "mode": "upsert", "keyColumns": "meal"}
    pipeline = Pipeline(name="p", source=KafkaSource(topics="orders"), sinks=sink, checkpoint="ck")
    assert pipeline.source.topics == ("orders",) and pipeline.sinks == (sink,)
    assert pipeline.query_checkpoint(sink) == str(Path("ck").resolve() / "kafka-pizza-income")
    assert pipeline.replace(checkpoint="hdfs://nn/ck").query_checkpoint(sink) == "hdfs://nn/ck/kafka-pizza-income"


def test_bootstrap_servers_precedence(monkeypatch: pytest.MonkeyPatch) -> None:
    for env in ("ONCEFLOW_BOOTSTRAP_SERVERS", "ONCEFLOW_BOOTSTRAP"):
        monkeypatch.delenv(env, raising=False)
    pipeline = Pipeline(name="p", source=KafkaSource(topics=["t"]), sinks=[_sink()], checkpoint="c")
    with pytest.raises(PipelineError, match="no bootstrap servers.*--bootstrap-servers"):
        pipeline.resolve_bootstrap()
    monkeypatch.setenv("ONCEFLOW_BOOTSTRAP_SERVERS", "env:9092")
    assert pipeline.resolve_bootstrap() == "env:9092"
    assert pipeline.replace(bootstrap_servers="file:9092").resolve_bootstrap() == "file:9092"
    assert pipeline.replace(bootstrap_servers="file:9092").resolve_bootstrap("flag:9092") == "flag:9092"
    monkeypatch.delenv("ONCEFLOW_BOOTSTRAP_SERVERS")
    rate = Pipeline(name="p", source=SparkSource("rate"), sinks=[SparkSink(format="noop")], checkpoint="c")
    assert rate.resolve_bootstrap() is None  # nothing Kafka: nothing needed


def test_until_values() -> None:
    assert as_until(None) == Until.forever() == as_until("forever")
    assert as_until("available_now").available_now
    assert as_until(2.5).idle_s == 2.5
    for bad in ("soon", -1, True):
        with pytest.raises(PipelineError):
            as_until(bad)


INVALID_PIPELINE = """
from onceflow.spark.pipeline import KafkaSource, Pipeline
pipeline = Pipeline(name="p", source=KafkaSource(topics=["t"]), sinks=[], checkpoint="c")
"""


def test_load_pipeline_errors(tmp_path: Path) -> None:
    cases = {
        "missing.py": (None, "no such file"),
        "empty.py": ("x = 1\n", "defines no `pipeline`"),
        "wrong.py": ("pipeline = 'orders'\n", "`pipeline` is a str"),
        "broken.py": ("pipeline = (\n", "syntax error"),
        "raises.py": ("raise RuntimeError('no config')\n", "RuntimeError: no config"),
        "invalid.py": (INVALID_PIPELINE, "has no sinks"),
    }
    for name, (text, message) in cases.items():
        if text is not None:
            (tmp_path / name).write_text(text)
        with pytest.raises(PipelineError, match=message):
            load_pipeline(tmp_path / name)


# ------------------------------------------------------------------------ monitor


def progress_record(batch: int, rows: int, end: dict, latest: dict, ran: bool = True) -> dict:
    return {"batchId": batch, "timestamp": f"2026-01-01T00:00:{batch:02d}.000Z",
            "numInputRows": rows, "processedRowsPerSecond": rows * 2.0,
            "durationMs": {"addBatch": 10} if ran else {"triggerExecution": 1},
            "sources": [{"endOffset": json.dumps(end), "latestOffset": json.dumps(latest)}]}


def test_tracker_counts_batches_once_and_computes_lag() -> None:
    assert offsets_behind({"t": {"0": 10, "1": 5}}, {"t": {"0": 4, "1": 5}}) == 6
    assert offsets_behind("1234", "1000") is None  # not a Kafka-shaped offset
    tracker = ProgressTracker(["q"])
    assert tracker.idle_for_s(now_s=100.0) == 0.0  # not idle before the first trigger ends
    first = progress_record(0, 100, {"t": {"0": 100}}, {"t": {"0": 250}})
    assert tracker.observe("q", first, now_s=1.0)
    assert not tracker.observe("q", first, now_s=2.0)  # the same record polled again
    assert tracker.observe("q", progress_record(1, 150, {"t": {"0": 250}}, {"t": {"0": 250}}), now_s=3.0)
    idle = progress_record(2, 0, {"t": {"0": 250}}, {"t": {"0": 260}}, ran=False)
    assert not tracker.observe("q", idle, now_s=20.0)
    stats = tracker.stats["q"]
    assert (stats.batches, stats.rows_total, stats.rows_last_batch, stats.last_batch_id) == (2, 250, 150, 1)
    assert stats.lag == 10 and stats.rows_per_s == 300.0
    assert tracker.idle_for_s(now_s=20.0) == 17.0


# --------------------------------------------------------------- runner (in process)


def test_run_until_idle_processes_everything(spark, bootstrap: str, tmp_path: Path) -> None:
    topic = create_topic(bootstrap, unique("pl-idle"), partitions=2)
    produce(bootstrap, topic, json_records(400))
    name = unique("mem").replace("-", "_")
    lines = tmp_path / "progress.log"
    with open(lines, "w") as log:
        result = kafka_to_memory(name, topic, tmp_path).run(
            spark, Until.idle(2.0), display=LogDisplay(name, log), bootstrap_servers=bootstrap)
    assert result.reason == "no new data for 2 s"
    assert memory_ids(spark, name) == expected_even(400)
    (stats,) = result.stats
    assert stats.rows_total == 400 and stats.batches >= 4  # 100 records per trigger at most
    assert stats.lag == 0 and stats.state == "stopped"
    text = lines.read_text()
    assert f"{name}/{name} batch 0: " in text and "stopped: no new data" in text
    assert not [q for q in spark.streams.active if q.name == name]


def test_sigterm_stops_the_queries_cleanly(spark, bootstrap: str, tmp_path: Path) -> None:
    topic = create_topic(bootstrap, unique("pl-term"))
    produce(bootstrap, topic, json_records(150))
    name = unique("mem").replace("-", "_")
    pipeline = kafka_to_memory(name, topic, tmp_path)
    sent: list[float] = []

    def terminate_when_done() -> None:
        wait_for(lambda: spark.catalog.tableExists(name) and len(memory_ids(spark, name)) == len(expected_even(150)),
                 "all rows in the memory table", 120)
        sent.append(time.monotonic())
        os.kill(os.getpid(), signal.SIGTERM)

    before = signal.getsignal(signal.SIGTERM)
    threading.Thread(target=terminate_when_done, daemon=True).start()
    with open(tmp_path / "progress.log", "w") as log:
        result = pipeline.run(spark, display=LogDisplay(name, log), bootstrap_servers=bootstrap)
    assert sent and result.reason == "stop requested (signal)"
    assert signal.getsignal(signal.SIGTERM) is before  # the handler is put back
    assert not [q for q in spark.streams.active if q.name == name]


def test_failing_query_stops_the_others_and_raises(spark, bootstrap: str, tmp_path: Path) -> None:
    from pyspark.sql import functions as F
    from pyspark.sql.types import IntegerType

    topic = create_topic(bootstrap, unique("pl-fail"))
    produce(bootstrap, topic, json_records(20))

    @F.udf(returnType=IntegerType(), useArrow=False)
    def explode_on_13(n):
        if n == 13:
            raise ValueError("order 13 is cursed")
        return n

    healthy, failing = unique("ok").replace("-", "_"), unique("bad").replace("-", "_")
    pipeline = Pipeline(
        name="fails", source=KafkaSource(topics=[topic]),
        transform=lambda records: records.selectExpr("CAST(CAST(key AS STRING) AS INT) AS id"),
        sinks=[SparkSink(format="memory", name=healthy),
               SparkSink(format="memory", name=failing,
                         transform=lambda rows: rows.select(explode_on_13("id").alias("id")))],
        checkpoint=str(tmp_path / "checkpoints"), trigger_seconds=0.2)
    with open(tmp_path / "progress.log", "w") as log, \
            pytest.raises(PipelineError, match=f"query {failing} failed(.|\n)*order 13 is cursed"):
        pipeline.run(spark, Until.idle(30), display=LogDisplay("fails", log), bootstrap_servers=bootstrap)
    assert not [q for q in spark.streams.active if q.name in (healthy, failing)]


def test_analysis_errors_fail_before_anything_runs(spark, bootstrap: str, tmp_path: Path) -> None:
    topic = create_topic(bootstrap, unique("pl-bad"))
    pipeline = Pipeline(name="typo", source=KafkaSource(topics=[topic]),
                        transform=lambda records: records.select("no_such_column"),
                        sinks=[SparkSink(format="noop")], checkpoint=str(tmp_path / "ck"))
    with pytest.raises(PipelineError, match="pipeline typo transform failed.*no_such_column"):
        pipeline.run(spark, Until.idle(1), bootstrap_servers=bootstrap)
    returns_none = pipeline.replace(transform=lambda records: None)
    with pytest.raises(PipelineError, match="must return the streaming DataFrame"):
        returns_none.run(spark, Until.idle(1), bootstrap_servers=bootstrap)
    assert not (tmp_path / "ck").exists()


# --------------------------------------------------------------------------- CLI

PIPELINE_FILE = '''
from pyspark.sql import functions as F
from onceflow.spark.pipeline import DatabaseSink, KafkaSink, KafkaSource, Pipeline

def keep_even(records):
    parsed = records.select(F.from_json(F.col("value").cast("string"), "id INT, n INT").alias("r"))
    return parsed.where(F.col("r.n") % 2 == 0).select("r.id", "r.n")

pipeline = Pipeline(
    name="evens",
    source=KafkaSource(topics=[{topic!r}], max_records_per_trigger=100),
    transform=keep_even,
    sinks=[KafkaSink(topic={output!r},
                     transform=lambda rows: rows.selectExpr("CAST(id AS STRING) AS key",
                                                            "to_json(struct(id, n)) AS value")),
           DatabaseSink(url={url!r}, table="evens")],
    checkpoint="not-used-the-command-line-says",
)
'''


def test_cli_run_available_now_then_status(bootstrap: str, tmp_path: Path) -> None:
    topic = create_topic(bootstrap, unique("pl-cli"), partitions=2)
    output = create_topic(bootstrap, unique("pl-cli-out"), partitions=2)
    produce(bootstrap, topic, json_records(500))
    url = f"sqlite:///{tmp_path / 'evens.db'}"
    file = tmp_path / "evens.py"
    file.write_text(PIPELINE_FILE.format(topic=topic, output=output, url=url))
    checkpoints = tmp_path / "checkpoints"
    command = [sys.executable, "-m", "onceflow", "pipeline", "run", str(file), "--master", "local[2]",
               "-b", bootstrap, "--checkpoint", str(checkpoints), "--available-now"]
    done = subprocess.run(command, check=False, capture_output=True, text=True, timeout=CLI_DRIVER_TIMEOUT_S,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for query in (f"kafka-{output}", "db-evens"):
        assert f"evens/{query} batch 0: " in done.stdout
        assert f"evens/{query} stopped: " in done.stdout
    assert "stopped (backlog processed)" in done.stdout
    written = sorted(json.loads(m.value())["id"] for m in read_committed(bootstrap, output))
    assert written == expected_even(500)
    with sqlite3.connect(tmp_path / "evens.db") as database:
        assert sorted(r[0] for r in database.execute("SELECT id FROM evens")) == expected_even(500)

    status = CliRunner().invoke(app, ["pipeline", "status", str(checkpoints)])
    assert status.exit_code == 0, status.output
    for query in (f"kafka-{output}", "db-evens"):
        state = checkpoint.read_state(checkpoints / query)
        assert state.in_flight == () and state.last_planned == state.last_committed >= 4
        assert sum(state.committed_offsets.source_offsets[0][topic].values()) == 500
        assert query in status.output and "in flight" in status.output
    assert f"{topic}[0]=" in status.output and f"{topic}[1]=" in status.output

    # What a crash leaves: the last batch planned and not committed.
    crashed = tmp_path / "crashed"
    shutil.copytree(checkpoints / "db-evens", crashed)
    last = max(checkpoint.batches_committed(crashed))
    (crashed / "commits" / str(last)).unlink()
    status = CliRunner().invoke(app, ["pipeline", "status", str(crashed)])
    assert status.exit_code == 0, status.output
    assert f"batch {last} was planned and not committed" in status.output


def test_cli_errors(tmp_path: Path) -> None:
    runner = CliRunner()
    missing = runner.invoke(app, ["pipeline", "run", str(tmp_path / "nope.py")])
    assert missing.exit_code == 1 and "no such file" in missing.output
    both = runner.invoke(app, ["pipeline", "run", "x.py", "--available-now", "--until-idle", "3"])
    assert both.exit_code == 1 and "exclude each other" in both.output
    status = runner.invoke(app, ["pipeline", "status", str(tmp_path)])
    assert status.exit_code == 1 and "no Spark query checkpoint" in status.output


# -------------------------------------------------------------------------- demo


@pytest.mark.slow
def test_pizza_demo_end_to_end(tmp_path: Path) -> None:
    from onceflow.demo import pipeline as demo_pipeline

    orders = 1_200
    command = [sys.executable, "-m", "onceflow.demo.pipeline", "--data-dir", str(tmp_path / "pizza"),
               "--orders", str(orders), "--records-per-trigger", "400"]
    done = subprocess.run(command, check=False, capture_output=True, text=True, timeout=400, cwd=tmp_path,
                          env={**os.environ, "COLUMNS": "160"})
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "SIGKILL" in done.stdout and "planned but not committed" in done.stdout
    assert "exactly once, after 1 driver crash" in done.stdout
    # Independently of the demo's own check: the database against the input.
    expected = demo_pipeline.expected_pizza(demo_pipeline.make_orders(orders))
    with sqlite3.connect(tmp_path / "pizza" / "pizza.db") as database:
        rows = database.execute("SELECT order_id, income_cents FROM pizza_orders").fetchall()
        total = database.execute("SELECT orders, income_cents FROM pizza_totals").fetchall()
    assert sorted(rows) == sorted(expected.items())
    assert total == [(len(expected), sum(expected.values()))]


def test_pizza_demo_stopped_leaves_no_driver_behind(tmp_path: Path) -> None:
    """The demo's Spark driver runs in a session of its own (so the demo's SIGKILLs reach
    only it); a SIGTERM to the demo must still take the driver, its JVM and workers along."""
    data_dir = tmp_path / "pizza"
    demo = subprocess.Popen([sys.executable, "-m", "onceflow.demo.pipeline", "--data-dir",
                             str(data_dir), "--orders", "600"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp_path)
    try:
        # Running: the driver has started its JVM and planned a batch.
        wait_for(lambda: any(checkpoint.batches_planned(c) for c in
                             (checkpoint.query_checkpoints(data_dir / "checkpoints")
                              if (data_dir / "checkpoints").is_dir() else [])),
                 "the demo's driver to plan a batch", timeout_s=180, poll_s=0.2)
        tree = descendants(demo.pid)
        assert len(tree) >= 2, "no driver process under the demo"
        demo.send_signal(signal.SIGTERM)
        assert demo.wait(60) == 128 + signal.SIGTERM
        wait_for(lambda: not any(alive(pid) for pid in tree),
                 "the driver's processes to be gone", timeout_s=30, poll_s=0.2)
    finally:
        kill_tree(demo.pid)
        demo.wait(10)
