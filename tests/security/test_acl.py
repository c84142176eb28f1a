"""The authorizer as a pure function, filters, and the durable store (Kafka's rules)."""

from __future__ import annotations

import pytest

from onceflow.security.acl import (
    AclBinding,
    AclFilter,
    Authorizer,
    Operation,
    PatternType,
    Permission,
    ResourceType,
)
from onceflow.security.scram import ScramCredential
from onceflow.security.store import SecurityData, SecurityFileCorrupt, SecurityStore

T, G, C, X = ResourceType.TOPIC, ResourceType.GROUP, ResourceType.CLUSTER, ResourceType.TRANSACTIONAL_ID
LIT, PRE = PatternType.LITERAL, PatternType.PREFIXED
ALLOW, DENY = Permission.ALLOW, Permission.DENY


def acl(rtype, name, op, permission=ALLOW, pattern=LIT, principal="User:alice", host="*"):
    return AclBinding(rtype, name, pattern, principal, host, op, permission)


def test_deny_by_default_and_super_users():
    authorizer = Authorizer(super_users=["User:admin"])
    assert not authorizer.authorize("User:alice", "1.2.3.4", Operation.READ, T, "t")
    assert authorizer.authorize("User:admin", "1.2.3.4", Operation.DELETE, T, "t")
    assert Authorizer(allow_everyone_if_no_acl_found=True).authorize(
        "User:alice", "h", Operation.READ, T, "t")


def test_literal_prefixed_wildcard_and_implied_describe():
    authorizer = Authorizer(acls=[
        acl(T, "orders", Operation.WRITE),
        acl(T, "logs-", Operation.READ, pattern=PRE),
        acl(G, "*", Operation.READ, principal="User:*"),
        acl(T, "cfg", Operation.ALTER_CONFIGS),
    ])
    ok = authorizer.authorize
    assert ok("User:alice", "h", Operation.WRITE, T, "orders")
    assert ok("User:alice", "h", Operation.DESCRIBE, T, "orders")       # Write implies Describe
    assert not ok("User:alice", "h", Operation.READ, T, "orders")
    assert not ok("User:alice", "h", Operation.WRITE, T, "orders2")      # literal is exact
    assert ok("User:alice", "h", Operation.READ, T, "logs-app")          # prefixed
    assert not ok("User:alice", "h", Operation.READ, T, "log")
    assert ok("User:bob", "h", Operation.READ, G, "any-group")           # wildcard both ways
    assert ok("User:alice", "h", Operation.DESCRIBE_CONFIGS, T, "cfg")   # AlterConfigs implies
    assert not ok("User:alice", "h", Operation.ALTER, T, "cfg")


def test_deny_wins_and_host_matching():
    authorizer = Authorizer(acls=[
        acl(T, "t", Operation.ALL),
        acl(T, "t", Operation.WRITE, DENY, host="10.0.0.9"),
        acl(T, "secret", Operation.READ, host="10.0.0.1"),
    ])
    ok = authorizer.authorize
    assert ok("User:alice", "10.0.0.1", Operation.WRITE, T, "t")
    assert not ok("User:alice", "10.0.0.9", Operation.WRITE, T, "t")
    assert ok("User:alice", "10.0.0.9", Operation.READ, T, "t")
    assert ok("User:alice", "10.0.0.1", Operation.READ, T, "secret")
    assert not ok("User:alice", "10.0.0.2", Operation.READ, T, "secret")
    # A DENY of ALL on a prefix beats an ALLOW on the literal name.
    authorizer.add(acl(T, "s", Operation.ALL, DENY, pattern=PRE))
    assert not ok("User:alice", "10.0.0.1", Operation.READ, T, "secret")


def test_authorize_any_for_idempotent_producers():
    authorizer = Authorizer(acls=[acl(T, "orders", Operation.WRITE)])
    assert authorizer.authorize_any("User:alice", "h", Operation.WRITE, T)
    assert not authorizer.authorize_any("User:bob", "h", Operation.WRITE, T)


def test_filters():
    bindings = [acl(T, "orders", Operation.WRITE), acl(T, "o", Operation.READ, pattern=PRE),
                acl(T, "*", Operation.DESCRIBE), acl(G, "g", Operation.READ, principal="User:bob")]
    def matched(f):
        return [b for b in bindings if f.matches(b)]
    assert matched(AclFilter()) == bindings
    assert matched(AclFilter(resource_type=G)) == bindings[3:]
    assert matched(AclFilter(T, "orders", PatternType.LITERAL)) == bindings[:1]
    assert matched(AclFilter(T, "orders", PatternType.MATCH)) == bindings[:3]
    assert matched(AclFilter(principal="User:bob")) == bindings[3:]
    assert matched(AclFilter(operation=Operation.READ, permission=ALLOW)) == [bindings[1], bindings[3]]


def test_invalid_bindings():
    assert acl(C, "other", Operation.ALTER).invalid_reason()
    assert acl(T, "t", Operation.ANY).invalid_reason()
    assert acl(T, "t", Operation.READ, principal="alice").invalid_reason()
    assert acl(T, "t", Operation.READ, pattern=PatternType.MATCH).invalid_reason()
    assert acl(C, "kafka-cluster", Operation.ALTER).invalid_reason() is None


def test_store_round_trip_and_corruption(tmp_path):
    store = SecurityStore(tmp_path)
    credential = ScramCredential.from_password("SCRAM-SHA-256", "correct-horse-battery")
    data = SecurityData().with_credential("alice", credential)
    store.replace(SecurityData(data.users, frozenset({acl(T, "t", Operation.READ)})))
    raw = store.path.read_bytes()
    assert b"correct-horse" not in raw   # salted keys only
    again = SecurityStore(tmp_path)
    assert again.data == store.data and again.password_ok("alice", "correct-horse-battery")
    assert not again.password_ok("alice", "correct-horse-batterY")
    flipped = bytearray(raw)
    flipped[-5] ^= 0x01
    store.path.write_bytes(bytes(flipped))
    with pytest.raises(SecurityFileCorrupt):
        SecurityStore(tmp_path)
