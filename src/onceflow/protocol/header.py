"""The request header: the four fields every Kafka request starts with.

Its own module, below codec.py and errors.py: the codec parses it and `UnsupportedVersion`
(errors.py) carries it, so that the broker can still answer an ApiVersions request whose
version it does not speak.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True, slots=True)
class RequestHeader:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
