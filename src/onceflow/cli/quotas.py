"""`onceflow quotas describe|alter` (issue 15): client quotas, like Kafka's
`kafka-configs.sh --entity-type users/clients --describe / --alter --add-config ...`.

Theory of operation: no Python Kafka client has the client quota APIs, so each command
connects a `Cluster` (client/cluster.py: AdminClient metadata, raw connections) and
sends one DescribeClientQuotas or AlterClientQuotas (KIP-546) to the first broker, then
prints a table or Kafka's error message. `--user-default` / `--client-default` name the
defaults (`<default>` in Kafka's tools).
"""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from onceflow.cli.clients import (
    BOOTSTRAP_DEFAULT,
    BootstrapOption,
    CliError,
    CommandConfigOption,
    command_properties,
    exits_cleanly,
    stdout,
)
from onceflow.client.cluster import Cluster
from onceflow.protocol.apis import ApiKey

VERSIONS = (0, 1)
MATCH_EXACT, MATCH_DEFAULT = 0, 1
DEFAULT_NAME = "<default>"

quotas_app = typer.Typer(
    name="quotas",
    help="Describe and alter client quotas (user, client-id). See docs/quotas.md.",
    no_args_is_help=True,
)

UserOption = Annotated[str | None, typer.Option("--user", help="A user (principal name).")]
UserDefaultOption = Annotated[bool, typer.Option("--user-default", help="The users' default.")]
ClientOption = Annotated[str | None, typer.Option("--client-id", help="A client id.")]
ClientDefaultOption = Annotated[bool, typer.Option(
    "--client-default", help="The client ids' default.")]


def entity_of(user: str | None, user_default: bool, client_id: str | None,
              client_default: bool) -> dict[str, str | None]:
    """{entity type: name, None for the default} from the command line."""
    if (user is not None and user_default) or (client_id is not None and client_default):
        raise CliError("give a name or the default of a type, not both")
    entity: dict[str, str | None] = {}
    if user is not None or user_default:
        entity["user"] = user
    if client_id is not None or client_default:
        entity["client-id"] = client_id
    return entity


def parse_configs(text: str) -> dict[str, float]:
    """"producer_byte_rate=1048576,request_percentage=50" -> {key: value}."""
    configs: dict[str, float] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        try:
            configs[key.strip()] = float(value)
        except ValueError:
            raise CliError(f"'{item}': expected key=number") from None
        if not sep:
            raise CliError(f"'{item}': expected key=number")
    return configs


@quotas_app.command("describe")
@exits_cleanly
def describe(
    user: UserOption = None, user_default: UserDefaultOption = False,
    client_id: ClientOption = None, client_default: ClientDefaultOption = False,
    strict: Annotated[bool, typer.Option(help="Only entities of exactly these types.")] = False,
    bootstrap_servers: BootstrapOption = BOOTSTRAP_DEFAULT,
    command_config: CommandConfigOption = None,
) -> None:
    """Show quotas: every entity, or those matching the given user and/or client id."""
    entity = entity_of(user, user_default, client_id, client_default)
    components = [{"entity_type": t, "match": n,
                   "match_type": MATCH_DEFAULT if n is None else MATCH_EXACT}
                  for t, n in entity.items()]
    with Cluster.connect(bootstrap_servers, command_properties(command_config)) as cluster:
        answer = cluster.call(cluster.node_ids()[0], ApiKey.DESCRIBE_CLIENT_QUOTAS, VERSIONS,
                              components=components, strict=strict)
    if answer.error_code != 0:
        raise CliError(f"{answer.error_code.name.upper()}: {answer.error_message}")
    table = Table("entity", "quota", "value")
    for entry in answer.entries:
        name = ", ".join(f"{e.entity_type}={DEFAULT_NAME if e.entity_name is None else e.entity_name}"
                         for e in entry.entity)
        for value in entry.values:
            table.add_row(name, value.key, _number(value.value))
    stdout().print(table)


@quotas_app.command("alter")
@exits_cleanly
def alter(
    user: UserOption = None, user_default: UserDefaultOption = False,
    client_id: ClientOption = None, client_default: ClientDefaultOption = False,
    add_config: Annotated[str, typer.Option(
        help="key=value,... e.g. producer_byte_rate=1048576")] = "",
    delete_config: Annotated[str, typer.Option(help="key,... to remove.")] = "",
    validate_only: Annotated[bool, typer.Option(help="Check, change nothing.")] = False,
    bootstrap_servers: BootstrapOption = BOOTSTRAP_DEFAULT,
    command_config: CommandConfigOption = None,
) -> None:
    """Set or remove quotas of one entity (a user, a client id, or both)."""
    entity = entity_of(user, user_default, client_id, client_default)
    if not entity:
        raise CliError("name an entity: --user/--user-default and/or --client-id/--client-default")
    ops = [{"key": k, "value": v, "remove": False} for k, v in parse_configs(add_config).items()]
    ops += [{"key": k.strip(), "value": 0.0, "remove": True}
            for k in delete_config.split(",") if k.strip()]
    if not ops:
        raise CliError("nothing to change: give --add-config and/or --delete-config")
    with Cluster.connect(bootstrap_servers, command_properties(command_config)) as cluster:
        answer = cluster.call(cluster.node_ids()[0], ApiKey.ALTER_CLIENT_QUOTAS, VERSIONS,
                              validate_only=validate_only, entries=[{
                                  "entity": [{"entity_type": t, "entity_name": n}
                                             for t, n in entity.items()],
                                  "ops": ops}])
    [result] = answer.entries
    if result.error_code != 0:
        raise CliError(f"{result.error_code.name.upper()}: {result.error_message}")
    stdout().print("validated" if validate_only else "altered")


def _number(value: float) -> str:
    """1048576.0 -> "1048576" (byte rates are whole numbers), 12.5 -> "12.5"."""
    return f"{value:.0f}" if value.is_integer() else repr(value)
