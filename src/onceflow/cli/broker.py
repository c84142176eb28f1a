"""`onceflow broker`: run a broker in the foreground."""

from __future__ import annotations

from pathlib import Path

import typer

from onceflow.cli.app import app


@app.command()
def broker(
    data_dir: Path = typer.Option(Path("data"), "--data-dir", help="Where the logs live."),
    host: str = typer.Option("127.0.0.1", "--host", help="Bind address."),
    port: int = typer.Option(9092, "--port", help="First node's port (0: any free port)."),
    nodes: int = typer.Option(1, "--nodes", min=1, max=16, help="Present one process as N brokers."),
    advertised_host: str = typer.Option(None, "--advertised-host", help="Host clients are told to use."),
    advertised_port: int = typer.Option(None, "--advertised-port", help="First node's advertised port."),
    fsync: bool = typer.Option(True, "--fsync/--no-fsync",
                               help="fsync before answering acks=all (off: page cache only)."),
    num_partitions: int = typer.Option(1, "--num-partitions", help="Partitions of auto-created topics."),
    auto_create_topics: bool = typer.Option(True, "--auto-create-topics/--no-auto-create-topics"),
) -> None:
    """Run a broker in the foreground; SIGTERM or Ctrl-C stops it cleanly."""
    from onceflow.broker.config import BrokerConfig
    from onceflow.broker.main import run_broker

    config = BrokerConfig(
        data_dir=data_dir, host=host, port=port, nodes=nodes, advertised_host=advertised_host,
        advertised_port=advertised_port, fsync=fsync, num_partitions=num_partitions,
        auto_create_topics=auto_create_topics,
    )
    run_broker(config)
