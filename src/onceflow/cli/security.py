"""`onceflow acl add|list|remove` and `onceflow user add|list|remove` (issue 13).

Theory of operation: the counterparts of Kafka's `kafka-acls.sh` and `kafka-configs.sh
--alter --add-config 'SCRAM-SHA-256=[...]'`. Each command opens one confluent-kafka
AdminClient through `clients.connect_admin`, with the client properties of
`--command-config` (security.protocol, sasl.*, ssl.*: the admin must itself log in as a
super user or a principal with Cluster Alter/Describe), sends one request
(CreateAcls, DescribeAcls, DeleteAcls, AlterUserScramCredentials,
DescribeUserScramCredentials), waits a bounded time and prints a table or one line.
A password is read from a prompt (or `ONCEFLOW_USER_PASSWORD`), never from the command
line, and the client salts it: it never reaches the broker.
"""

from __future__ import annotations

import enum
from pathlib import Path
from typing import Annotated

import typer
from confluent_kafka import KafkaException
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    ResourcePatternType,
    ResourceType,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialDeletion,
    UserScramCredentialUpsertion,
)
from rich.table import Table

from onceflow.cli.clients import (
    BOOTSTRAP_DEFAULT,
    BootstrapOption,
    CliError,
    CommandConfigOption,
    command_properties,
    connect_admin,
    describe_kafka_error,
    exits_cleanly,
    stdout,
)

ADMIN_TIMEOUT_S = 30.0
PASSWORD_ENV = "ONCEFLOW_USER_PASSWORD"
CLUSTER_NAME = "kafka-cluster"

acl_app = typer.Typer(name="acl", help="Add, list and remove ACLs (kafka-acls.sh).",
                      no_args_is_help=True)
user_app = typer.Typer(name="user", help="Add, list and remove SCRAM users.",
                       no_args_is_help=True)

class Mechanism(str, enum.Enum):
    sha256 = "SCRAM-SHA-256"
    sha512 = "SCRAM-SHA-512"


_MECHANISMS = {Mechanism.sha256: ScramMechanism.SCRAM_SHA_256,
               Mechanism.sha512: ScramMechanism.SCRAM_SHA_512}


def _admin(bootstrap_servers: str, command_config: Path | None):
    admin, _metadata = connect_admin(bootstrap_servers, command_properties(command_config))
    return admin


def _result(future):
    try:
        return future.result(timeout=ADMIN_TIMEOUT_S)
    except KafkaException as exc:
        raise CliError(describe_kafka_error(exc.args[0])) from None


# ------------------------------------------------------------------------------- ACLs


def _resource(topic: str | None, group: str | None, transactional_id: str | None,
              cluster: bool) -> tuple[ResourceType, str] | None:
    chosen = [(ResourceType.TOPIC, topic), (ResourceType.GROUP, group),
              (ResourceType.TRANSACTIONAL_ID, transactional_id)]
    chosen = [(t, n) for t, n in chosen if n is not None]
    if cluster:
        chosen.append((ResourceType.BROKER, CLUSTER_NAME))
    if len(chosen) > 1:
        raise CliError("name one resource: --topic, --group, --transactional-id or --cluster")
    return chosen[0] if chosen else None


def _operations(names: list[str]) -> list[AclOperation]:
    known = {o.name.replace("_", ""): o for o in AclOperation if o.value > 1}
    operations = []
    for name in names:
        found = known.get(name.upper().replace("-", "").replace("_", ""))
        if found is None:
            raise CliError(f"unknown operation {name!r}; one of {', '.join(known)}")
        operations.append(found)
    return operations


TopicOption = Annotated[str | None, typer.Option("--topic", help="A topic (or prefix).")]
GroupOption = Annotated[str | None, typer.Option("--group", help="A consumer group.")]
TxnOption = Annotated[str | None, typer.Option("--transactional-id", help="A transactional id.")]
ClusterOption = Annotated[bool, typer.Option("--cluster", help="The cluster resource.")]
PrefixedOption = Annotated[bool, typer.Option("--prefixed", help="Match names by prefix.")]
PrincipalOption = Annotated[str, typer.Option("--principal", help="User:name or User:*.")]
OperationOption = Annotated[list[str], typer.Option(
    "--operation", help="Read, Write, Create, Delete, Alter, Describe, ClusterAction, "
                        "DescribeConfigs, AlterConfigs, IdempotentWrite, All (repeatable).")]
DenyOption = Annotated[bool, typer.Option("--deny", help="A DENY ACL (default: ALLOW).")]
HostOption = Annotated[str, typer.Option("--host", help="The client host the ACL applies to.")]


def _bindings(principal: str, operations: list[str], topic, group, transactional_id,
              cluster: bool, prefixed: bool, deny: bool, host: str) -> list[AclBinding]:
    resource = _resource(topic, group, transactional_id, cluster)
    if resource is None:
        raise CliError("name a resource: --topic, --group, --transactional-id or --cluster")
    pattern = ResourcePatternType.PREFIXED if prefixed else ResourcePatternType.LITERAL
    permission = AclPermissionType.DENY if deny else AclPermissionType.ALLOW
    return [AclBinding(resource[0], resource[1], pattern, principal, host, op, permission)
            for op in _operations(operations)]


@acl_app.command("add")
@exits_cleanly
def acl_add(principal: PrincipalOption, operation: OperationOption,
            topic: TopicOption = None, group: GroupOption = None,
            transactional_id: TxnOption = None, cluster: ClusterOption = False,
            prefixed: PrefixedOption = False, deny: DenyOption = False, host: HostOption = "*",
            bootstrap_servers: BootstrapOption = BOOTSTRAP_DEFAULT,
            command_config: CommandConfigOption = None) -> None:
    """Add ACLs: one per --operation."""
    bindings = _bindings(principal, operation, topic, group, transactional_id, cluster,
                         prefixed, deny, host)
    admin = _admin(bootstrap_servers, command_config)
    for future in admin.create_acls(bindings).values():
        _result(future)
    stdout().print(f"added {len(bindings)} ACL(s)")


@acl_app.command("list")
@exits_cleanly
def acl_list(principal: Annotated[str | None, typer.Option("--principal")] = None,
             topic: TopicOption = None, group: GroupOption = None,
             transactional_id: TxnOption = None, cluster: ClusterOption = False,
             bootstrap_servers: BootstrapOption = BOOTSTRAP_DEFAULT,
             command_config: CommandConfigOption = None) -> None:
    """List ACLs (all, or those of a principal or a resource, prefixes that match included)."""
    resource = _resource(topic, group, transactional_id, cluster)
    rtype, name = resource if resource is not None else (ResourceType.ANY, None)
    pattern = ResourcePatternType.MATCH if name is not None else ResourcePatternType.ANY
    admin = _admin(bootstrap_servers, command_config)
    found = _result(admin.describe_acls(AclBindingFilter(
        rtype, name, pattern, principal, None, AclOperation.ANY, AclPermissionType.ANY)))
    table = Table("resource", "name", "pattern", "principal", "host", "operation", "permission")
    for b in sorted(found, key=lambda b: (b.restype.name, b.name, b.principal,
                                          b.operation.name)):
        table.add_row(b.restype.name, b.name, b.resource_pattern_type.name, b.principal,
                      b.host, b.operation.name, b.permission_type.name)
    stdout().print(table)


@acl_app.command("remove")
@exits_cleanly
def acl_remove(principal: PrincipalOption, operation: OperationOption,
               topic: TopicOption = None, group: GroupOption = None,
               transactional_id: TxnOption = None, cluster: ClusterOption = False,
               prefixed: PrefixedOption = False, deny: DenyOption = False,
               host: HostOption = "*", bootstrap_servers: BootstrapOption = BOOTSTRAP_DEFAULT,
               command_config: CommandConfigOption = None) -> None:
    """Remove the ACLs that `acl add` with the same options made."""
    filters = [AclBindingFilter(b.restype, b.name, b.resource_pattern_type, b.principal,
                                b.host, b.operation, b.permission_type)
               for b in _bindings(principal, operation, topic, group, transactional_id,
                                  cluster, prefixed, deny, host)]
    admin = _admin(bootstrap_servers, command_config)
    removed = sum(len(_result(f)) for f in admin.delete_acls(filters).values())
    stdout().print(f"removed {removed} ACL(s)")


# ------------------------------------------------------------------------------ users


MechanismOption = Annotated[Mechanism, typer.Option("--mechanism")]


@user_app.command("add")
@exits_cleanly
def user_add(name: Annotated[str, typer.Argument(help="The user name.")],
             mechanism: MechanismOption = Mechanism.sha512,
             iterations: Annotated[int, typer.Option("--iterations", min=4096,
                                                     max=16384)] = 4096,
             password: Annotated[str, typer.Option(
                 "--password", envvar=PASSWORD_ENV, prompt=True, hide_input=True,
                 confirmation_prompt=True, show_default=False,
                 help=f"Asked for when not in {PASSWORD_ENV}.")] = "",
             bootstrap_servers: BootstrapOption = BOOTSTRAP_DEFAULT,
             command_config: CommandConfigOption = None) -> None:
    """Create or update a user's SCRAM credential (the client salts the password)."""
    admin = _admin(bootstrap_servers, command_config)
    upsert = UserScramCredentialUpsertion(
        name, ScramCredentialInfo(_MECHANISMS[mechanism], iterations), password.encode())
    for future in admin.alter_user_scram_credentials([upsert]).values():
        _result(future)
    stdout().print(f"user {name}: {mechanism.value} credential set")


@user_app.command("list")
@exits_cleanly
def user_list(bootstrap_servers: BootstrapOption = BOOTSTRAP_DEFAULT,
              command_config: CommandConfigOption = None) -> None:
    """Users and their SCRAM mechanisms and iteration counts."""
    admin = _admin(bootstrap_servers, command_config)
    described = _result(admin.describe_user_scram_credentials())
    table = Table("user", "mechanism", "iterations")
    for user in sorted(described):
        for info in described[user].scram_credential_infos:
            table.add_row(user, info.mechanism.name.replace("_", "-"), str(info.iterations))
    stdout().print(table)


@user_app.command("remove")
@exits_cleanly
def user_remove(name: Annotated[str, typer.Argument(help="The user name.")],
                mechanism: MechanismOption = Mechanism.sha512,
                bootstrap_servers: BootstrapOption = BOOTSTRAP_DEFAULT,
                command_config: CommandConfigOption = None) -> None:
    """Delete a user's credential for one mechanism."""
    admin = _admin(bootstrap_servers, command_config)
    deletion = UserScramCredentialDeletion(name, _MECHANISMS[mechanism])
    for future in admin.alter_user_scram_credentials([deletion]).values():
        _result(future)
    stdout().print(f"user {name}: {mechanism.value} credential removed")
