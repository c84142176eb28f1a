"""`onceflow console`: the web console for any Kafka-compatible cluster (docs/console.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from onceflow.cli.clients import BOOTSTRAP_DEFAULT, BootstrapOption, exits_cleanly
from onceflow.client.config import read_properties
from onceflow.console.settings import TOKEN_ENV, ConsoleSettings


@exits_cleanly
def console(
    bootstrap_servers: BootstrapOption = BOOTSTRAP_DEFAULT,
    command_config: Annotated[Path | None, typer.Option(
        "--command-config", help="Kafka client properties (security.protocol, sasl.*, ssl.*) "
                                 "for every client the console makes.")] = None,
    host: Annotated[str, typer.Option(
        help="Bind address. Beyond localhost a login token is required.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="HTTP port (0: any free).")] = 8080,
    token: Annotated[str | None, typer.Option(
        envvar=TOKEN_ENV, show_envvar=True,
        help="Login token (needed beyond localhost; at least 16 characters).")] = None,
) -> None:
    """Serve the web console: topics, records, transactions, LSOs, groups, pipelines."""
    # Imported here: the other commands start faster without uvicorn and Starlette.
    from onceflow.console.server import serve

    properties = read_properties(command_config) if command_config is not None else {}
    serve(ConsoleSettings(bootstrap_servers, properties, host, port, token))
