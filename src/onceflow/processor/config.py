"""Configuration of a `Processor`: static settings, retry policy, run-time properties.

`ProcessorConfig` is fixed for the life of a processor. `Properties` is the part that
can change while it runs (`Processor.update_properties`): concurrency, rate limit and
blocked keys. Each bound has a unit in its name and a reason in its comment.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from onceflow.processor import offset_map

# A worker thread per lane of every assigned partition, but never more than this.
THREADS_MAX_DEFAULT = 1024
# Lanes per partition: a sanity bound, far above any useful value.
CONCURRENCY_MAX = 4096


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Retries through a retry topic, then a dead-letter topic.

    A failed record is produced to `retry_topic` with its attempt count and a
    not-before time in headers; the processor also consumes that topic and runs the
    record again once the back-off has passed. After `max_attempts` attempts in all
    (the first one included) the record goes to `dead_letter_topic`, with the error in
    its headers. `max_attempts=1` sends failures straight to the dead-letter topic.
    Topic names default to "<group_id>-retry" and "<group_id>-dlq".
    """

    max_attempts: int = 3
    backoff_ms: int = 1000
    backoff_multiplier: float = 2.0
    backoff_max_ms: int = 60_000
    retry_topic: str | None = None
    dead_letter_topic: str | None = None

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be >= 1")
        if self.backoff_ms < 0 or self.backoff_max_ms < self.backoff_ms:
            raise ValueError("need 0 <= backoff_ms <= backoff_max_ms")
        if self.backoff_multiplier < 1.0:
            raise ValueError("backoff_multiplier must be >= 1")

    def backoff_for(self, attempt: int) -> int:
        """Delay before attempt number `attempt + 1`, after attempt `attempt` failed."""
        delay = self.backoff_ms * self.backoff_multiplier ** (attempt - 1)
        return int(min(delay, self.backoff_max_ms))


@dataclass(frozen=True, slots=True)
class Properties:
    """Settings that can change at run time, without a restart."""

    concurrency: int = 8  # lanes per partition: records of one key never run concurrently
    rate_limit_per_s: float | None = None  # records per second per partition; None = no limit
    blocked_keys: frozenset[bytes] = frozenset()  # records with these keys are skipped

    def __post_init__(self) -> None:
        if not 1 <= self.concurrency <= CONCURRENCY_MAX:
            raise ValueError(f"concurrency must be in [1, {CONCURRENCY_MAX}]")
        if self.rate_limit_per_s is not None and self.rate_limit_per_s <= 0:
            raise ValueError("rate_limit_per_s must be > 0 or None")
        keys = frozenset(k.encode("utf-8") if isinstance(k, str) else k for k in self.blocked_keys)
        object.__setattr__(self, "blocked_keys", keys)

    def replace(self, **changes: object) -> Properties:
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]


GROUP_PROTOCOLS = ("classic", "consumer")


@dataclass(frozen=True, slots=True)
class ProcessorConfig:
    """Static settings of a processor. Times are in milliseconds."""

    concurrency: int = 8  # initial Properties.concurrency
    rate_limit_per_s: float | None = None  # initial Properties.rate_limit_per_s
    blocked_keys: frozenset[bytes] = frozenset()  # initial Properties.blocked_keys

    # Per partition: records fetched and not yet below the committed watermark. At this
    # bound the partition is paused; it resumes once it has drained to a quarter below.
    max_pending_records: int = 10_000
    commit_interval_ms: int = 1000
    poll_batch_records: int = 500  # records per consume() call
    poll_timeout_ms: int = 100  # longest wait in consume(); also the loop's tick
    revoke_timeout_ms: int = 10_000  # on revoke: wait this long for in-flight records
    shutdown_timeout_ms: int = 30_000  # on stop: drain fetched records this long
    deferred_timeout_ms: int | None = None  # default for Record.defer(); None = no timeout
    auto_offset_reset: str = "earliest"  # where a partition without commits starts
    retry: RetryPolicy | None = None  # None: failures are logged, counted and skipped

    # Completed offsets above the watermark, kept in the commit metadata (0 disables).
    offset_map_bytes_max: int = offset_map.BYTES_MAX_DEFAULT
    threads_max: int = THREADS_MAX_DEFAULT

    # Exactly-once: outputs and offsets commit in one transaction per commit interval.
    # Needs a transactional_id that is unique per processor instance and stable across
    # its restarts (so a restart aborts the transaction its crashed predecessor left).
    exactly_once: bool = False
    transactional_id: str | None = None
    transaction_timeout_ms: int = 60_000

    handler_kind: str = "auto"  # "auto" | "thread" | "asyncio"

    # "classic" (JoinGroup/SyncGroup, with the cooperative-sticky assignor) or "consumer":
    # Kafka 4's consumer group protocol (KIP-848), where the broker assigns partitions and
    # moves them one by one - no group-wide pause when a member joins or leaves. Needs a
    # broker that speaks it (onceflow, Kafka 4.0+); see docs/processor.md.
    group_protocol: str = "classic"

    def __post_init__(self) -> None:
        if self.max_pending_records < 1:
            raise ValueError("max_pending_records must be >= 1")
        if self.commit_interval_ms < 1 or self.poll_timeout_ms < 1:
            raise ValueError("commit_interval_ms and poll_timeout_ms must be >= 1")
        if self.poll_batch_records < 1:
            raise ValueError("poll_batch_records must be >= 1")
        if self.exactly_once and not self.transactional_id:
            raise ValueError("exactly_once needs a transactional_id (stable per instance)")
        if self.group_protocol not in GROUP_PROTOCOLS:
            raise ValueError(f"group_protocol must be one of {GROUP_PROTOCOLS}")
        if self.handler_kind not in ("auto", "thread", "asyncio"):
            raise ValueError("handler_kind must be 'auto', 'thread' or 'asyncio'")
        if self.offset_map_bytes_max < 0:
            raise ValueError("offset_map_bytes_max must be >= 0")
        self.initial_properties()  # validates concurrency, rate and keys

    def initial_properties(self) -> Properties:
        return Properties(
            concurrency=self.concurrency,
            rate_limit_per_s=self.rate_limit_per_s,
            blocked_keys=frozenset(self.blocked_keys),
        )

    @property
    def resume_pending_records(self) -> int:
        """A paused partition resumes at or below this many pending records."""
        return self.max_pending_records - max(1, self.max_pending_records // 4)
