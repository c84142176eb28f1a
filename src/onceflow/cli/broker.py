"""`onceflow broker`: run a broker in the foreground (subcommands: `broker stats`)."""

from __future__ import annotations

from pathlib import Path

import typer

from onceflow.cli.clients import CliError, exits_cleanly
from onceflow.console.settings import TOKEN_ENV, ConsoleSettings

# The admin port `--console` uses when none is given (the CLI's faults/stats default).
CONSOLE_ADMIN_PORT = 9644

# A group whose callback runs the broker when no subcommand is given, so that
# `onceflow broker --port 9092` keeps working and `onceflow broker stats` can exist.
broker_app = typer.Typer(name="broker", help="Run a broker, or inspect a running one.")


@broker_app.callback(invoke_without_command=True)
def broker(
    ctx: typer.Context,
    config_file: Path = typer.Option(
        None, "--config", help="A Kafka server.properties (listeners, log.dirs, log.retention.*, "
        "log.cleaner.*, ...); flags given here override it."),
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
    admin_port: int = typer.Option(
        None, "--admin-port", min=0,
        help="Serve fault injection and Prometheus /metrics over HTTP on this port (off by default)."),
    console: bool = typer.Option(
        False, "--console",
        help=f"Serve the web console on the admin port (--admin-port, default {CONSOLE_ADMIN_PORT})."),
    console_token: str = typer.Option(
        None, "--console-token", envvar=TOKEN_ENV, show_envvar=True,
        help="The console's login token (needed when --host is beyond localhost)."),
    # consumer groups (issue 4)
    offsets_topic_partitions: int = typer.Option(
        50, "--offsets-topic-partitions", min=1, help="Partitions of __consumer_offsets."),
    group_initial_rebalance_delay_ms: int = typer.Option(
        3_000, "--group-initial-rebalance-delay-ms", min=0,
        help="How long a new group waits for more members before its first rebalance."),
    group_min_session_timeout_ms: int = typer.Option(
        6_000, "--group-min-session-timeout-ms", min=0,
        help="Smallest session timeout a consumer may ask for."),
    # transactions (issue 5)
    transaction_state_partitions: int = typer.Option(
        50, "--transaction-state-partitions", min=1, help="Partitions of __transaction_state."),
    transaction_abort_interval_ms: int = typer.Option(
        10_000, "--transaction-abort-interval-ms", min=1,
        help="How often transactions past their timeout are looked for (and aborted)."),
    # Kafka 4's protocols (issue 16)
    transaction_version: int = typer.Option(
        1, "--transaction-version", min=1, max=2,
        help="Finalized transaction.version: 2 has Java 4.x producers use transactions V2."),
    group_consumer_session_timeout_ms: int = typer.Option(
        45_000, "--group-consumer-session-timeout-ms", min=1,
        help="Session timeout of consumer-protocol members (group.consumer.session.timeout.ms)."),
    group_consumer_heartbeat_interval_ms: int = typer.Option(
        5_000, "--group-consumer-heartbeat-interval-ms", min=1,
        help="Heartbeat interval given to consumer-protocol members."),
) -> None:
    """Run a broker in the foreground; SIGTERM or Ctrl-C stops it cleanly."""
    if ctx.invoked_subcommand is not None:
        return
    # Imported here, not at the top: the other commands are clients and never load the broker.
    from onceflow.broker.config import BrokerConfig
    from onceflow.broker.main import run_broker

    frontend = None
    if console:
        # The composition root: the broker gets the console as a factory and never imports
        # it (docs/architecture.md). Imported here for the same reason as the broker.
        from onceflow.console.mount import broker_frontend
        frontend = broker_frontend(console_token)
        admin_port = CONSOLE_ADMIN_PORT if admin_port is None else admin_port
        check_console_settings(host, console_token)
    fields = dict(
        data_dir=data_dir, host=host, port=port, nodes=nodes, advertised_host=advertised_host,
        advertised_port=advertised_port, fsync=fsync, num_partitions=num_partitions,
        auto_create_topics=auto_create_topics, admin_port=admin_port,
        offsets_topic_num_partitions=offsets_topic_partitions,
        group_initial_rebalance_delay_ms=group_initial_rebalance_delay_ms,
        group_min_session_timeout_ms=group_min_session_timeout_ms,
        transaction_state_num_partitions=transaction_state_partitions,
        transaction_abort_timed_out_cleanup_interval_ms=transaction_abort_interval_ms,
        transaction_version=transaction_version,
        consumer_group_session_timeout_ms=group_consumer_session_timeout_ms,
        consumer_group_heartbeat_interval_ms=group_consumer_heartbeat_interval_ms,
    )
    if config_file is None:
        config = BrokerConfig(**fields)
    else:
        config = config_from_file(config_file, _given_flags(ctx, fields))
    run_broker(config, frontend)


# BrokerConfig fields whose flag has another name (for "was this flag given?").
_FLAG_OF_FIELD = {
    "offsets_topic_num_partitions": "offsets_topic_partitions",
    "transaction_state_num_partitions": "transaction_state_partitions",
    "transaction_abort_timed_out_cleanup_interval_ms": "transaction_abort_interval_ms",
    "consumer_group_session_timeout_ms": "group_consumer_session_timeout_ms",
    "consumer_group_heartbeat_interval_ms": "group_consumer_heartbeat_interval_ms",
}


def _given_flags(ctx: typer.Context, fields: dict) -> dict:
    """The fields whose flag was given on the command line (or by environment): they
    override the config file; defaults do not."""
    given = {}
    for name, value in fields.items():
        source = ctx.get_parameter_source(_FLAG_OF_FIELD.get(name, name))
        # By name: typer may bring its own copy of click, with its own ParameterSource.
        if source is not None and source.name in ("COMMANDLINE", "ENVIRONMENT"):
            given[name] = value
    return given


@exits_cleanly
def config_from_file(path: Path, overrides: dict):
    """The BrokerConfig of a server.properties (one clear line and exit 1 when bad)."""
    from onceflow.broker.config_file import ConfigFileError, load_config_file

    try:
        return load_config_file(path, overrides)
    except ConfigFileError as exc:
        raise CliError(str(exc)) from None


@exits_cleanly
def check_console_settings(host: str, token: str | None) -> None:
    """The console's binding rules, checked before the broker starts (one line if not)."""
    ConsoleSettings("-", host=host, token=token)
