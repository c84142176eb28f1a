"""The `onceflow` command: one typer app, one module per command group.

Each command module builds its own typer group (or plain command functions) and imports
nothing from here; this module only assembles them, so the whole command tree is
visible in one place and the imports point one way (app -> commands -> clients.py's
shared options and helpers).
"""

from __future__ import annotations

import typer

from onceflow.cli import (
    broker,
    clients,
    console,
    faults,
    groups,
    outbox,
    pipeline,
    quotas,
    security,
    spark,
    stats,
    topics,
    txn,
)

app = typer.Typer(
    name="onceflow",
    help="onceflow: a Kafka-compatible exactly-once broker and tools.",
    no_args_is_help=True,
    add_completion=False,
)

app.command()(clients.produce)
app.command()(clients.consume)
app.command("console")(console.console)
broker.broker_app.command("stats")(stats.stats)
app.add_typer(broker.broker_app)
app.add_typer(faults.faults_app)
app.add_typer(groups.groups_app)
app.add_typer(outbox.outbox_app)
app.add_typer(pipeline.pipeline_app)
app.add_typer(spark.spark_app)
app.add_typer(topics.topics_app)
app.add_typer(txn.txn_app)
app.add_typer(txn.producers_app)
app.add_typer(security.acl_app)
app.add_typer(security.user_app)
app.add_typer(quotas.quotas_app)


def main() -> None:
    app()
