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
    # security (issue 13), Kafka's names: docs/security.md
    listeners: str = typer.Option(
        None, "--listeners",
        help="NAME://host:port,... (PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL or a mapped "
             "name); replaces --host/--port."),
    listener_security_protocol_map: str = typer.Option(
        None, "--listener-security-protocol-map", help="NAME:PROTOCOL,... for custom names."),
    advertised_listeners: str = typer.Option(
        None, "--advertised-listeners", help="NAME://host:port,... told to clients."),
    ssl_certfile: Path = typer.Option(None, "--ssl-certfile", help="Server certificate (PEM)."),
    ssl_keyfile: Path = typer.Option(None, "--ssl-keyfile", help="Its private key (PEM)."),
    ssl_cafile: Path = typer.Option(None, "--ssl-cafile",
                                    help="CA certificates that client certificates must chain to."),
    ssl_client_auth: str = typer.Option(
        "none", "--ssl-client-auth", help="none, requested or required (ssl.client.auth)."),
    ssl_principal_mapping_rules: str = typer.Option(
        "DEFAULT", "--ssl-principal-mapping-rules",
        help="mTLS principal names from certificate subjects, Kafka's syntax: "
             "RULE:pattern/replacement/[LU],...,DEFAULT (ssl.principal.mapping.rules)."),
    connections_max_reauth_ms: int = typer.Option(
        0, "--connections-max-reauth-ms", min=0,
        help="SASL clients re-authenticate within this many ms, else their connection is "
             "closed (connections.max.reauth.ms, KIP-368); 0: never."),
    sasl_mechanisms: str = typer.Option(
        "SCRAM-SHA-512,SCRAM-SHA-256,PLAIN", "--sasl-mechanisms",
        help="Enabled SASL mechanisms (sasl.enabled.mechanisms); OAUTHBEARER takes "
             "unsecured test tokens only."),
    add_scram: list[str] = typer.Option(
        [], "--add-scram",
        help="'SCRAM-SHA-512=[name=admin,password=admin-secret]' (repeatable)."),
    authorizer: bool = typer.Option(False, "--authorizer",
                                    help="Enforce ACLs, deny by default."),
    super_users: str = typer.Option(None, "--super-users", help="User:a;User:b (super.users)."),
    admin_token: str = typer.Option(
        None, "--admin-token", envvar="ONCEFLOW_ADMIN_TOKEN", show_envvar=True,
        help="Require 'Authorization: Bearer <token>' on the admin port."),
    admin_tls: bool = typer.Option(False, "--admin-tls",
                                   help="Serve the admin port over HTTPS (--ssl-certfile)."),
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
    security = check_security_settings(
        listeners=listeners, listener_security_protocol_map=listener_security_protocol_map,
        advertised_listeners=advertised_listeners, ssl_certfile=ssl_certfile,
        ssl_keyfile=ssl_keyfile, ssl_cafile=ssl_cafile, ssl_client_auth=ssl_client_auth,
        ssl_principal_mapping_rules=ssl_principal_mapping_rules,
        sasl_mechanisms=sasl_mechanisms, add_scram=add_scram, authorizer=authorizer,
        super_users=super_users)
    if admin_tls and ssl_certfile is None:
        raise typer.BadParameter("--admin-tls needs --ssl-certfile and --ssl-keyfile")
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
        admin_token=admin_token, admin_tls=admin_tls,
        connections_max_reauth_ms=connections_max_reauth_ms,
        **security,
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
def check_security_settings(**options) -> dict:
    """The security options as BrokerConfig fields, checked before the broker starts
    (one line naming the bad option if not; a password never appears in it)."""
    from onceflow.security.listeners import ListenerError, parse_advertised, parse_listeners
    from onceflow.security.principal import MappingRuleError, parse_mapping_rules
    from onceflow.security.sasl import MECHANISMS
    from onceflow.security.scram import CredentialError, parse_add_scram

    mechanisms = tuple(m.strip().upper() for m in options["sasl_mechanisms"].split(",")
                       if m.strip())
    unknown = [m for m in mechanisms if m not in MECHANISMS]
    if unknown:
        raise typer.BadParameter(f"unknown SASL mechanism(s) {unknown}; known: {MECHANISMS}")
    if options["ssl_client_auth"] not in ("none", "requested", "required"):
        raise typer.BadParameter("--ssl-client-auth is none, requested or required")
    try:
        parse_mapping_rules(options["ssl_principal_mapping_rules"])
    except MappingRuleError as exc:
        raise typer.BadParameter(str(exc)) from None
    try:
        if options["listeners"]:
            parsed = parse_listeners(options["listeners"],
                                     options["listener_security_protocol_map"])
            parse_advertised(options["advertised_listeners"], parsed)
            if any(lsn.tls for lsn in parsed) and not options["ssl_certfile"]:
                raise ListenerError("an SSL or SASL_SSL listener needs --ssl-certfile")
    except ListenerError as exc:
        raise typer.BadParameter(str(exc)) from None
    for spec in options["add_scram"]:
        try:
            parse_add_scram(spec)
        except (CredentialError, ValueError) as exc:
            # the message names the syntax, never the value (it holds a password)
            raise typer.BadParameter(f"--add-scram: {exc}") from None
    super_users = tuple(u.strip() for u in (options["super_users"] or "").split(";")
                        if u.strip())
    return dict(options, sasl_mechanisms=mechanisms, add_scram=tuple(options["add_scram"]),
                super_users=super_users)


@exits_cleanly
def check_console_settings(host: str, token: str | None) -> None:
    """The console's binding rules, checked before the broker starts (one line if not)."""
    ConsoleSettings("-", host=host, token=token)
