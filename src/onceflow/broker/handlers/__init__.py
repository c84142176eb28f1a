"""Request handlers, one module per API family, registered by API key.

A handler is `async def handle(ctx, body) -> dict | None`: it gets the decoded kio
request body and returns the response as plain data (built by `protocol.codec.build_response`), or
None when Kafka sends no response (Produce with acks=0). Its synchronous part runs
before its first `await`, and the connection starts handlers in arrival order, so
state changes (appends) happen in request order even when waits overlap.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Awaitable, Callable
from typing import Any

from kio.schema.errors import ErrorCode

from onceflow.broker.access import Access, Session
from onceflow.broker.runtime.groups import GroupRuntime
from onceflow.broker.runtime.txn import TxnRuntime
from onceflow.broker.state import BrokerState, now_ms
from onceflow.protocol.apis import SUPPORTED, ApiKey
from onceflow.security.acl import CLUSTER_NAME, Operation, ResourceType


@dataclasses.dataclass(frozen=True, slots=True)
class RequestContext:
    broker: BrokerState        # partitions, logs, producer state, topics, cluster, metrics
    groups: GroupRuntime       # consumer groups (issue 4)
    txns: TxnRuntime           # transactions (issue 5)
    node_id: int               # the node this connection reached
    api_key: int
    api_version: int
    client_id: str | None
    client_host: str = ""      # "/<peer ip>", as Kafka reports members (issue 4)
    session: Session | None = None  # listener and principal of the connection (issue 13)
    access: Access | None = None    # users, ACLs, authorizer (issue 13)

    def now_ms(self) -> int:
        return now_ms()

    @property
    def listener(self) -> str | None:
        return None if self.session is None else self.session.listener.name

    def authorized(self, operation: Operation, resource_type: ResourceType,
                   name: str) -> bool:
        """Whether the connection's principal may do `operation` on the resource (always
        True with the authorizer off)."""
        return self.access is None or self.access.authorized(self.session, operation,
                                                             resource_type, name)

    def authorized_cluster(self, operation: Operation) -> bool:
        return self.authorized(operation, ResourceType.CLUSTER, CLUSTER_NAME)


def route_group(ctx: RequestContext, group_id: str, operation: Operation) -> ErrorCode | None:
    """The group-level error of a group request: GROUP_AUTHORIZATION_FAILED without
    `operation` on the group (issue 13, checked first as Kafka does), else the
    coordinator's routing error (NOT_COORDINATOR ...), None when the request may go on."""
    if not ctx.authorized(operation, ResourceType.GROUP, group_id):
        return ErrorCode.group_authorization_failed
    return ctx.groups.route(group_id, ctx.node_id)


Handler = Callable[[RequestContext, Any], Awaitable[dict | None]]
HANDLERS: dict[int, Handler] = {}

_MODULES = (
    "api_versions",
    "metadata",
    "produce",
    "fetch",
    "list_offsets",
    "topics",
    "configs",
    "list_config_resources",  # issue 15: ListConfigResources (74)
    "log_dirs",      # issue 15: DescribeLogDirs, ElectLeaders
    "reassignments",  # issue 15: Alter/ListPartitionReassignments
    "describe_topic_partitions",  # issue 15: KIP-966
    "delete_records",
    "coordinators",
    "groups",        # issue 4: JoinGroup .. DeleteGroups
    "offsets",       # issue 4: OffsetCommit, OffsetFetch, OffsetDelete; issue 5: TxnOffsetCommit
    "producer_ids",
    "transactions",  # issue 5: AddPartitionsToTxn .. EndTxn, Describe/ListTransactions, DescribeProducers
    "consumer_groups",  # issue 16: ConsumerGroupHeartbeat, ConsumerGroupDescribe (KIP-848)
    "sasl",          # issue 13: SaslHandshake, SaslAuthenticate
    "users",         # issue 13: Describe/AlterUserScramCredentials
    "acls",          # issue 13: CreateAcls, DescribeAcls, DeleteAcls
    "client_quotas",  # issue 15: Describe/AlterClientQuotas
)


def handles(api_key: ApiKey) -> Callable[[Handler], Handler]:
    def register(handler: Handler) -> Handler:
        assert api_key not in HANDLERS, f"two handlers for {api_key!r}"
        HANDLERS[api_key] = handler
        return handler

    return register


def load_all() -> dict[int, Handler]:
    """Import every handler module; every advertised API must have a handler."""
    for module in _MODULES:
        importlib.import_module(f"{__name__}.{module}")
    missing = sorted(ApiKey(key).name for key in SUPPORTED if key not in HANDLERS)
    assert not missing, f"advertised in protocol.apis.SUPPORTED without a handler: {missing}"
    return HANDLERS
