"""Who a connection is and what it may do: sessions, users and the authorizer of one broker.

Theory of operation. Every connection gets a `Session` when accepted: its listener, the
peer's address and its principal - `User:ANONYMOUS` on PLAINTEXT and on SSL without a
client certificate, `User:<certificate subject>` with mTLS, and on SASL listeners the
user named by a successful login (`security.sasl.SaslSession` runs the exchange). `Access`
holds what the sessions share: the durable users and ACLs (`security.store`) and, when
`--authorizer` is on, the `security.acl.Authorizer` every handler asks through
`RequestContext.authorized`. With the authorizer off every check passes, as in Kafka
without `authorizer.class.name`. Changes to users and ACLs are persisted before they
apply (store.py), so an answered CreateAcls survives `kill -9`.
"""

from __future__ import annotations

import dataclasses
import logging

from onceflow.broker.config import BrokerConfig
from onceflow.security.acl import AclBinding, AclFilter, Authorizer, Operation, ResourceType
from onceflow.security.listeners import Listener
from onceflow.security.principal import parse_mapping_rules
from onceflow.security.sasl import SaslSession
from onceflow.security.scram import ScramCredential, parse_add_scram
from onceflow.security.store import SecurityData, SecurityStore

log = logging.getLogger("onceflow.broker")

ANONYMOUS = "User:ANONYMOUS"


@dataclasses.dataclass(slots=True)
class Session:
    """The security side of one connection."""

    listener: Listener
    host: str = ""                    # the peer's IP address (ACL host matching)
    principal: str = ANONYMOUS
    sasl: SaslSession | None = None   # on SASL listeners

    @property
    def authenticated(self) -> bool:
        return self.sasl is None or self.sasl.logged_in


class Access:
    """Users, ACLs and the authorizer of one broker process."""

    def __init__(self, config: BrokerConfig) -> None:
        self._config = config
        self.store = SecurityStore(config.data_dir, fsync=config.fsync)
        if config.add_scram:
            data = self.store.data
            for spec in config.add_scram:
                user, credential = parse_add_scram(spec)
                data = data.with_credential(user, credential)
            self.store.replace(data)
        # ssl.principal.mapping.rules (checked by the CLI; a bad value raises here)
        self.principal_mapper = parse_mapping_rules(config.ssl_principal_mapping_rules)
        self.authorizer = (Authorizer(config.super_users, self.store.data.acls,
                                      config.allow_everyone_if_no_acl_found)
                           if config.authorizer else None)

    def session(self, listener: Listener, host: str) -> Session:
        sasl = None
        if listener.sasl:
            sasl = SaslSession(self._config.sasl_mechanisms, self.store.credential,
                               self.store.password_ok,
                               reauth_ms=self._config.connections_max_reauth_ms)
        return Session(listener, host, sasl=sasl)

    # -- authorization -----------------------------------------------------

    def authorized(self, session: Session | None, operation: Operation,
                   resource_type: ResourceType, name: str) -> bool:
        if self.authorizer is None or session is None:
            return True
        allowed = self.authorizer.authorize(session.principal, session.host, operation,
                                            resource_type, name)
        if not allowed:
            log.debug("authorization denied: %s from %s %s on %s:%s", session.principal,
                     session.host, operation.name, resource_type.name, name)
        return allowed

    def authorized_any(self, session: Session | None, operation: Operation,
                       resource_type: ResourceType) -> bool:
        if self.authorizer is None or session is None:
            return True
        return self.authorizer.authorize_any(session.principal, session.host, operation,
                                             resource_type)

    # -- ACLs ----------------------------------------------------------------

    def acls(self) -> list[AclBinding]:
        return sorted(self.store.data.acls)

    def create_acls(self, bindings: list[AclBinding]) -> None:
        assert self.authorizer is not None
        data = self.store.data
        self.store.replace(dataclasses.replace(data, acls=data.acls | frozenset(bindings)))
        for acl in bindings:
            self.authorizer.add(acl)

    def delete_acls(self, filters: list[AclFilter]) -> list[list[AclBinding]]:
        """The bindings each filter matched (a binding counts once, for its first filter)."""
        assert self.authorizer is not None
        matched: list[list[AclBinding]] = []
        remaining = set(self.store.data.acls)
        for acl_filter in filters:
            hits = sorted(acl for acl in remaining if acl_filter.matches(acl))
            remaining.difference_update(hits)
            matched.append(hits)
        self.store.replace(dataclasses.replace(self.store.data, acls=frozenset(remaining)))
        for hits in matched:
            for acl in hits:
                self.authorizer.remove(acl)
        return matched

    # -- users ---------------------------------------------------------------

    def users(self) -> dict[str, dict[str, ScramCredential]]:
        return self.store.data.users

    def alter_users(self, data: SecurityData) -> None:
        self.store.replace(data)
