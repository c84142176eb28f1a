"""ApiVersions: the one table of what the broker speaks (protocol.apis.SUPPORTED)."""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from onceflow.broker.handlers import ApiKey, RequestContext, handles
from onceflow.protocol.apis import SUPPORTED


def api_keys() -> list[dict]:
    return [
        {"api_key": key, "min_version": low, "max_version": high}
        for key, (low, high) in sorted(SUPPORTED.items())
    ]


@handles(ApiKey.API_VERSIONS)
async def api_versions(ctx: RequestContext, body) -> dict:
    return {"error_code": ErrorCode.none, "api_keys": api_keys(), "throttle_time": 0}
