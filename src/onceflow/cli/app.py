"""The `onceflow` command: one typer app, one module per command group."""

from __future__ import annotations

import typer

app = typer.Typer(
    name="onceflow",
    help="onceflow: a Kafka-compatible exactly-once broker and tools.",
    no_args_is_help=True,
    add_completion=False,
)


def _register() -> None:
    # Each command module adds its commands to `app`; kept in one place so the
    # command tree is visible here.
    from onceflow.cli import (  # noqa: F401
        broker, clients, console, faults, groups, outbox, pipeline, stats, topics, txn,
    )


def main() -> None:
    _register()
    app()
