"""Parameters from URLs and forms, checked: anything malformed is `BadInput` (400) with a
sentence that names the parameter, never a stack trace."""

from __future__ import annotations

import datetime
from collections.abc import Mapping

from onceflow.console.web import BadInput

# Kafka offsets and timestamps are signed 64-bit.
INT64_MAX = 2**63 - 1
ISOLATIONS = ("read_committed", "read_uncommitted")


def integer(values: Mapping[str, str], name: str, *, default: int | None = None,
            minimum: int = 0, maximum: int = INT64_MAX) -> int | None:
    raw = values.get(name, "")
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw.strip())
    except ValueError:
        raise BadInput(f"{name} must be a whole number, not {raw[:40]!r}") from None
    if not minimum <= value <= maximum:
        raise BadInput(f"{name} must be between {minimum} and {maximum}, not {value}")
    return value


def partition_number(raw: str) -> int:
    return integer({"partition": raw}, "partition", maximum=2**31 - 1)  # type: ignore[return-value]


def timestamp_ms(values: Mapping[str, str], name: str) -> int | None:
    """Epoch milliseconds, or an ISO 8601 time (UTC unless it names a zone)."""
    raw = (values.get(name) or "").strip()
    if not raw:
        return None
    if raw.lstrip("-").isdigit():
        return integer(values, name)
    try:
        moment = datetime.datetime.fromisoformat(raw)  # 3.11 reads a trailing Z
    except ValueError:
        raise BadInput(f"{name} must be epoch milliseconds or an ISO 8601 time such as "
                       f"2026-01-31T12:00:00Z, not {raw[:40]!r}") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.UTC)
    value = int(moment.timestamp() * 1000)
    if value < 0:
        raise BadInput(f"{name} is before 1970")
    return value


def isolation(values: Mapping[str, str], default: str = "read_uncommitted") -> str:
    value = values.get("isolation") or default
    if value not in ISOLATIONS:
        raise BadInput(f"isolation must be read_committed or read_uncommitted, not {value[:40]!r}")
    return value
