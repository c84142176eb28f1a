"""ACLs and the authorizer: a pure function of (principal, host, operation, resource, ACLs).

Theory of operation (Kafka's StandardAuthorizer, facts only). An ACL binds a resource
pattern (resource type, name, LITERAL or PREFIXED) to an entry (principal, host,
operation, ALLOW or DENY). To decide whether `principal` on `host` may do `operation`
on a resource:

1. a super user may do everything;
2. the ACLs whose pattern matches the resource are gathered: LITERAL with the same name,
   LITERAL `*` (wildcard), PREFIXED whose name the resource's name starts with;
3. if one of them is a DENY matching the principal (or `User:*`), the host (or `*`) and
   the operation (or ALL), the answer is no: deny wins;
4. else an ALLOW matching the same way says yes, where an ALLOW of READ, WRITE, DELETE or
   ALTER also allows DESCRIBE and an ALLOW of ALTER_CONFIGS allows DESCRIBE_CONFIGS;
5. else no, also when no ACL matches the resource at all
   (`allow.everyone.if.no.acl.found`, false by default).

Filters (DescribeAcls, DeleteAcls) match bindings with ANY for "whatever value" and MATCH
for "every pattern that would match this resource name" (literal, wildcard, prefixes).
The codes below are Kafka's (ResourceType, AclOperation, AclPermissionType, PatternType).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable


class ResourceType(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1
    TOPIC = 2
    GROUP = 3
    CLUSTER = 4
    TRANSACTIONAL_ID = 5
    DELEGATION_TOKEN = 6
    USER = 7


class Operation(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1
    ALL = 2
    READ = 3
    WRITE = 4
    CREATE = 5
    DELETE = 6
    ALTER = 7
    DESCRIBE = 8
    CLUSTER_ACTION = 9
    DESCRIBE_CONFIGS = 10
    ALTER_CONFIGS = 11
    IDEMPOTENT_WRITE = 12
    CREATE_TOKENS = 13
    DESCRIBE_TOKENS = 14
    TWO_PHASE_COMMIT = 15  # KIP-939: on a transactional id, InitProducerId with enable2Pc


class Permission(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1
    DENY = 2
    ALLOW = 3


class PatternType(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1
    MATCH = 2
    LITERAL = 3
    PREFIXED = 4


# The one name of the cluster resource (Kafka's "kafka-cluster").
CLUSTER_NAME = "kafka-cluster"
WILDCARD = "*"
WILDCARD_PRINCIPAL = "User:*"

# An ALLOW of any of these operations also allows the key (Kafka's implied operations).
_IMPLIED_BY = {
    Operation.DESCRIBE: frozenset({Operation.DESCRIBE, Operation.READ, Operation.WRITE,
                                   Operation.DELETE, Operation.ALTER}),
    Operation.DESCRIBE_CONFIGS: frozenset({Operation.DESCRIBE_CONFIGS,
                                           Operation.ALTER_CONFIGS}),
}

# Resource types a binding may name, and operations a binding may grant.
BINDABLE_TYPES = frozenset({ResourceType.TOPIC, ResourceType.GROUP, ResourceType.CLUSTER,
                            ResourceType.TRANSACTIONAL_ID})
BINDABLE_OPERATIONS = frozenset(Operation) - {Operation.UNKNOWN, Operation.ANY}


@dataclasses.dataclass(frozen=True, slots=True, order=True)
class AclBinding:
    """One ACL: a resource pattern and an access control entry."""

    resource_type: ResourceType
    resource_name: str
    pattern_type: PatternType  # LITERAL or PREFIXED
    principal: str             # "User:name" or "User:*"
    host: str                  # an IP address or "*"
    operation: Operation
    permission: Permission     # ALLOW or DENY

    def invalid_reason(self) -> str | None:
        """Why Kafka would refuse to create this binding, or None."""
        if self.resource_type not in BINDABLE_TYPES:
            return f"Invalid resource type {self.resource_type.name}"
        if self.pattern_type not in (PatternType.LITERAL, PatternType.PREFIXED):
            return f"Invalid pattern type {self.pattern_type.name}"
        if not self.resource_name:
            return "Resource name must not be empty"
        if self.resource_type == ResourceType.CLUSTER and self.resource_name != CLUSTER_NAME:
            return f"The only valid name for the CLUSTER resource is {CLUSTER_NAME}"
        if self.operation not in BINDABLE_OPERATIONS:
            return f"Invalid operation {self.operation.name}"
        if self.permission not in (Permission.ALLOW, Permission.DENY):
            return f"Invalid permission type {self.permission.name}"
        if not self.principal.startswith("User:") or len(self.principal) <= len("User:"):
            return f"Invalid principal {self.principal!r}: expected User:<name>"
        if not self.host:
            return "Host must not be empty"
        return None

    def to_json(self) -> list:
        return [int(self.resource_type), self.resource_name, int(self.pattern_type),
                self.principal, self.host, int(self.operation), int(self.permission)]

    @classmethod
    def from_json(cls, row: list) -> AclBinding:
        rtype, name, pattern, principal, host, operation, permission = row
        return cls(ResourceType(rtype), name, PatternType(pattern), principal, host,
                   Operation(operation), Permission(permission))


@dataclasses.dataclass(frozen=True, slots=True)
class AclFilter:
    """A DescribeAcls/DeleteAcls filter; None in a string field matches any value."""

    resource_type: ResourceType = ResourceType.ANY
    resource_name: str | None = None
    pattern_type: PatternType = PatternType.ANY
    principal: str | None = None
    host: str | None = None
    operation: Operation = Operation.ANY
    permission: Permission = Permission.ANY

    def invalid_reason(self) -> str | None:
        for value, enum_type in ((self.resource_type, ResourceType),
                                 (self.pattern_type, PatternType),
                                 (self.operation, Operation), (self.permission, Permission)):
            if value == enum_type.UNKNOWN:
                return f"Invalid {enum_type.__name__} filter: UNKNOWN"
        return None

    def matches(self, acl: AclBinding) -> bool:
        return (self._matches_pattern(acl)
                and self.principal in (None, acl.principal)
                and self.host in (None, acl.host)
                and self.operation in (Operation.ANY, acl.operation)
                and self.permission in (Permission.ANY, acl.permission))

    def _matches_pattern(self, acl: AclBinding) -> bool:
        if self.resource_type not in (ResourceType.ANY, acl.resource_type):
            return False
        if self.pattern_type == PatternType.MATCH:
            # every pattern that applies to a resource called `resource_name`
            return self.resource_name is None or _pattern_matches(acl, self.resource_name)
        if self.pattern_type not in (PatternType.ANY, acl.pattern_type):
            return False
        return self.resource_name in (None, acl.resource_name)


def _pattern_matches(acl: AclBinding, name: str) -> bool:
    if acl.pattern_type == PatternType.LITERAL:
        return acl.resource_name in (name, WILDCARD)
    return name.startswith(acl.resource_name)


class Authorizer:
    """Kafka's deny-by-default authorizer over a set of ACLs (see the module docstring)."""

    def __init__(self, super_users: Iterable[str] = (), acls: Iterable[AclBinding] = (),
                 allow_everyone_if_no_acl_found: bool = False) -> None:
        self.super_users = frozenset(super_users)
        self.allow_everyone_if_no_acl_found = allow_everyone_if_no_acl_found
        # resource type -> its bindings; small sets, scanned per check.
        self._by_type: dict[ResourceType, set[AclBinding]] = {t: set() for t in BINDABLE_TYPES}
        for acl in acls:
            self.add(acl)

    def add(self, acl: AclBinding) -> None:
        self._by_type[acl.resource_type].add(acl)

    def remove(self, acl: AclBinding) -> None:
        self._by_type[acl.resource_type].discard(acl)

    def acls(self) -> list[AclBinding]:
        return sorted(acl for bindings in self._by_type.values() for acl in bindings)

    def authorize(self, principal: str, host: str, operation: Operation,
                  resource_type: ResourceType, name: str) -> bool:
        if principal in self.super_users:
            return True
        matching = [acl for acl in self._by_type.get(resource_type, ())
                    if _pattern_matches(acl, name)]
        if not matching:
            return self.allow_everyone_if_no_acl_found
        applies = [acl for acl in matching
                   if acl.principal in (principal, WILDCARD_PRINCIPAL)
                   and acl.host in (host, WILDCARD)]
        if any(acl.permission == Permission.DENY
               and acl.operation in (operation, Operation.ALL) for acl in applies):
            return False
        granting = _IMPLIED_BY.get(operation, frozenset({operation})) | {Operation.ALL}
        return any(acl.permission == Permission.ALLOW and acl.operation in granting
                   for acl in applies)

    def authorize_any(self, principal: str, host: str, operation: Operation,
                      resource_type: ResourceType) -> bool:
        """Whether some resource of `resource_type` allows `operation` to `principal`
        (Kafka's authorizeByResourceType: the idempotent producer's Write on any topic)."""
        if principal in self.super_users:
            return True
        applies = [acl for acl in self._by_type.get(resource_type, ())
                   if acl.principal in (principal, WILDCARD_PRINCIPAL)
                   and acl.host in (host, WILDCARD)]
        denied_everywhere = any(
            acl.permission == Permission.DENY and acl.operation in (operation, Operation.ALL)
            and acl.pattern_type == PatternType.LITERAL and acl.resource_name == WILDCARD
            for acl in applies)
        if denied_everywhere:
            return False
        return any(acl.permission == Permission.ALLOW
                   and acl.operation in (operation, Operation.ALL) for acl in applies)
