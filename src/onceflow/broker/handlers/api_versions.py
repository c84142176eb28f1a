"""ApiVersions: the one table of what the broker speaks (protocol.apis.SUPPORTED).

From v3 the client names its software (KIP-511); like Kafka, a name or version
that does not match Kafka's pattern is answered INVALID_REQUEST.
"""

from __future__ import annotations

import re

from kio.schema.errors import ErrorCode

from onceflow.broker.handlers import ApiKey, RequestContext, handles
from onceflow.protocol.apis import SUPPORTED

# Kafka's ApiVersionsRequest.SOFTWARE_NAME_VERSION_PATTERN.
_SOFTWARE_PATTERN = re.compile(r"[a-zA-Z0-9](?:[a-zA-Z0-9\-.]*[a-zA-Z0-9])?")


def api_keys() -> list[dict]:
    return [
        {"api_key": key, "min_version": low, "max_version": high}
        for key, (low, high) in sorted(SUPPORTED.items())
    ]


def _software_ok(body) -> bool:
    name = getattr(body, "client_software_name", None)
    version = getattr(body, "client_software_version", None)
    if name is None and version is None:   # v0-2 carry neither
        return True
    return all(v is not None and _SOFTWARE_PATTERN.fullmatch(v) for v in (name, version))


@handles(ApiKey.API_VERSIONS)
async def api_versions(ctx: RequestContext, body) -> dict:
    error = ErrorCode.none if _software_ok(body) else ErrorCode.invalid_request
    return {"error_code": error, "api_keys": api_keys(), "throttle_time": 0}
