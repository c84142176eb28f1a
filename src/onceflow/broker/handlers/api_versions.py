"""ApiVersions: the one table of what the broker speaks (protocol.apis.SUPPORTED).

From v3 the client names its software (KIP-511); like Kafka, a name or version
that does not match Kafka's pattern is answered INVALID_REQUEST.
"""

from __future__ import annotations

import re

from kio.schema.errors import ErrorCode

from onceflow.broker.handlers import ApiKey, RequestContext, handles
from onceflow.protocol.apis import FEATURES, SUPPORTED

# ApiVersions v3 carries the features (KIP-584) in tagged fields.
FEATURES_MIN_VERSION = 3
# Kafka's finalized-features epoch is the metadata offset they were finalized at; ours
# never change while the broker runs, so any fixed non-negative value says "valid".
FINALIZED_FEATURES_EPOCH = 0

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


def features(levels: dict[str, int]) -> dict:
    """The features of an ApiVersions v3+ answer; `levels` overrides finalized levels."""
    finalized = [(f.name, levels.get(f.name, f.default_level)) for f in FEATURES]
    return {
        "supported_features": [{"name": f.name, "min_version": f.min_level,
                                "max_version": f.max_level} for f in FEATURES],
        "finalized_features_epoch": FINALIZED_FEATURES_EPOCH,
        "finalized_features": [{"name": name, "min_version_level": level,
                                "max_version_level": level}
                               for name, level in finalized if level != 0],
    }


@handles(ApiKey.API_VERSIONS)
async def api_versions(ctx: RequestContext, body) -> dict:
    error = ErrorCode.none if _software_ok(body) else ErrorCode.invalid_request
    answer = {"error_code": error, "api_keys": api_keys(), "throttle_time": 0}
    if ctx.api_version >= FEATURES_MIN_VERSION:
        answer.update(features(ctx.broker.config.feature_levels()))
    return answer
