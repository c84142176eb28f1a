"""FindCoordinator, until the group and transaction coordinators exist.

Answered COORDINATOR_NOT_AVAILABLE for every key, which clients treat as "retry
later". It is advertised now because librdkafka enables lz4 compression only when
the broker advertises FindCoordinator (it takes the API as a marker of a modern
broker); without it, lz4 batches would silently go out uncompressed.
"""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from onceflow.broker.handlers import ApiKey, RequestContext, handles

MESSAGE = "onceflow does not coordinate groups or transactions yet"


def _not_available(key: str) -> dict:
    return {"key": key, "node_id": -1, "host": "", "port": -1,
            "error_code": ErrorCode.coordinator_not_available, "error_message": MESSAGE}


@handles(ApiKey.FIND_COORDINATOR)
async def find_coordinator(ctx: RequestContext, body) -> dict:
    keys = getattr(body, "coordinator_keys", None)
    if keys is not None and ctx.api_version >= 4:   # v4+: batched keys
        return {"throttle_time": 0, "coordinators": [_not_available(k) for k in keys]}
    single = _not_available("")
    del single["key"]   # v0-3 answer one key and do not echo it
    return {"throttle_time": 0, **single}
