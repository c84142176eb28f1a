"""FindCoordinator: which node coordinates a group or a transactional id.

A group's coordinator is the leader of its `__consumer_offsets` partition, a transactional
id's the leader of its `__transaction_state` partition (`partition_for(key)`, Kafka's hash
in both). The first lookup of each kind creates its topic, as Kafka does, so it is answered
at once. Any other key type is INVALID_REQUEST, and so is an empty transactional id.
With the authorizer on, a group needs Describe on it (else GROUP_AUTHORIZATION_FAILED), a
transactional id Describe on it (else TRANSACTIONAL_ID_AUTHORIZATION_FAILED), as in Kafka.
The coordinator's address is the one of the listener the request came in on.

Versions: v0 asks for one group and does not echo the key; v1-v3 add the key type and an
error message; v4+ (KIP-699) batches keys and answers one entry per key.
"""

from __future__ import annotations

import logging

from kio.schema.errors import ErrorCode

from onceflow.broker.handlers import ApiKey, RequestContext, handles
from onceflow.security.acl import Operation, ResourceType
from onceflow.storage.layout import StorageError

logger = logging.getLogger("onceflow.broker")

KEY_TYPE_GROUP = 0
KEY_TYPE_TRANSACTION = 1
BATCHED_KEYS_MIN_VERSION = 4


def _error(key: str, code: ErrorCode, message: str | None) -> dict:
    return {"key": key, "node_id": -1, "host": "", "port": -1, "error_code": code,
            "error_message": message}


async def _lookup(ctx: RequestContext, key: str, key_type: int) -> dict:
    if key_type == KEY_TYPE_TRANSACTION:
        if not key:
            return _error(key, ErrorCode.invalid_request, "empty transactional id")
        if not ctx.authorized(Operation.DESCRIBE, ResourceType.TRANSACTIONAL_ID, key):
            return _error(key, ErrorCode.transactional_id_authorization_failed, None)
        runtime = ctx.txns
    elif key_type == KEY_TYPE_GROUP:
        if not ctx.authorized(Operation.DESCRIBE, ResourceType.GROUP, key):
            return _error(key, ErrorCode.group_authorization_failed, None)
        runtime = ctx.groups
    else:
        return _error(key, ErrorCode.invalid_request, f"unknown key type {key_type}")
    try:
        await runtime.ensure_topic()
    except (OSError, StorageError) as exc:
        # Kafka's answer while its internal topic cannot be created: the client retries
        # (here: a full disk; the connection, which may carry fetches, stays open)
        logger.warning("cannot create %s: %s", runtime.topic_name, exc)
        return _error(key, ErrorCode.coordinator_not_available, None)
    node_id = runtime.coordinator_node(key)
    node = ctx.broker.cluster.nodes[node_id]
    host, port = node.endpoint(ctx.listener)
    return {"key": key, "node_id": node.node_id, "host": host, "port": port,
            "error_code": ErrorCode.none, "error_message": None}


@handles(ApiKey.FIND_COORDINATOR)
async def find_coordinator(ctx: RequestContext, body) -> dict:
    key_type = getattr(body, "key_type", KEY_TYPE_GROUP)  # v0: groups only
    if ctx.api_version >= BATCHED_KEYS_MIN_VERSION:
        coordinators = [await _lookup(ctx, key, key_type) for key in body.coordinator_keys]
        return {"throttle_time": 0, "coordinators": coordinators}
    single = await _lookup(ctx, body.key, key_type)
    del single["key"]  # v0-3 answer one key and do not echo it
    return {"throttle_time": 0, **single}
