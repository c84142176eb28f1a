"""Retry and dead-letter records: what a failed record turns into, and back.

A failed record becomes one output: to the retry topic while attempts remain, else
to the dead-letter topic. The output keeps the record's key (so retries of one key stay
in one retry partition), value and headers, plus `onceflow.*` headers:

| header | in | value |
|---|---|---|
| onceflow.attempt | retry, dlq | attempts made so far, decimal |
| onceflow.not-before-ms | retry | wall-clock ms before which the retry must not run |
| onceflow.origin-topic / -partition / -offset | retry, dlq | the original record |
| onceflow.error-type | retry, dlq | the exception's qualified class name |
| onceflow.error | retry, dlq | str(exception), at most ERROR_BYTES_MAX bytes |

The failed record completes once that output is durable (at-least-once: produced and
acknowledged; exactly-once: committed in the transaction with its offset), so a
failure is never lost and never doubled. Pure functions: the wall clock is a parameter.
"""

from __future__ import annotations

from onceflow.processor.config import RetryPolicy
from onceflow.processor.record import Headers, Output, Record

HEADER_PREFIX = "onceflow."
ATTEMPT = "onceflow.attempt"
NOT_BEFORE_MS = "onceflow.not-before-ms"
ORIGIN_TOPIC = "onceflow.origin-topic"
ORIGIN_PARTITION = "onceflow.origin-partition"
ORIGIN_OFFSET = "onceflow.origin-offset"
ERROR_TYPE = "onceflow.error-type"
ERROR = "onceflow.error"
ERROR_BYTES_MAX = 4096  # an exception message can be huge; headers must stay small
# A retry record's own headers are peer-controlled input: bound what we parse.
HEADER_VALUE_BYTES_MAX = 64


def retry_topic_for(policy: RetryPolicy, group_id: str) -> str:
    return policy.retry_topic or f"{group_id}-retry"


def dead_letter_topic_for(policy: RetryPolicy, group_id: str) -> str:
    return policy.dead_letter_topic or f"{group_id}-dlq"


def failure_output(
    record: Record, error: BaseException, policy: RetryPolicy, group_id: str, wall_ms: int
) -> tuple[Output, bool]:
    """The output a failed record turns into, and whether it is a retry (else DLQ)."""
    headers = _user_headers(record.headers)
    headers += [
        (ORIGIN_TOPIC, record.topic.encode()),
        (ORIGIN_PARTITION, str(record.partition).encode()),
        (ORIGIN_OFFSET, str(record.offset).encode()),
        (ATTEMPT, str(record.attempt).encode()),
        (ERROR_TYPE, _qualified_name(error).encode()),
        (ERROR, str(error).encode("utf-8", "replace")[:ERROR_BYTES_MAX]),
    ]
    if record.attempt < policy.max_attempts:
        not_before_ms = wall_ms + policy.backoff_for(record.attempt)
        headers.append((NOT_BEFORE_MS, str(not_before_ms).encode()))
        topic = retry_topic_for(policy, group_id)
        return Output(topic, record.value, record.key, headers), True
    return Output(dead_letter_topic_for(policy, group_id), record.value, record.key, headers), False


class RetryInfo:
    """What a record consumed from the retry topic says about itself."""

    __slots__ = ("attempt", "not_before_ms", "offset", "partition", "topic")

    def __init__(self, topic: str, partition: int, offset: int, attempt: int, not_before_ms: int):
        self.topic = topic
        self.partition = partition
        self.offset = offset
        self.attempt = attempt  # attempts already made: this delivery is attempt + 1
        self.not_before_ms = not_before_ms


def parse_retry_headers(headers: Headers | None) -> RetryInfo | None:
    """None when the headers are not a well-formed retry (e.g. a foreign record)."""
    if not headers:
        return None
    found: dict[str, bytes] = {}
    for name, value in headers:
        if name.startswith(HEADER_PREFIX) and value is not None:
            found[name] = value
    try:
        return RetryInfo(
            topic=found[ORIGIN_TOPIC].decode("utf-8"),
            partition=_small_int(found[ORIGIN_PARTITION]),
            offset=_small_int(found[ORIGIN_OFFSET]),
            attempt=_small_int(found[ATTEMPT]),
            not_before_ms=_small_int(found.get(NOT_BEFORE_MS, b"0")),
        )
    except (KeyError, ValueError, UnicodeDecodeError):
        return None


def _small_int(raw: bytes) -> int:
    if len(raw) > HEADER_VALUE_BYTES_MAX:
        raise ValueError("header value too long")
    return int(raw)


def _user_headers(headers: Headers | None) -> Headers:
    return [(k, v) for k, v in headers or () if not k.startswith(HEADER_PREFIX)]


def _qualified_name(error: BaseException) -> str:
    kind = type(error)
    return f"{kind.__module__}.{kind.__qualname__}"
