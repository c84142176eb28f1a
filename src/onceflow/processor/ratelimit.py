"""Per-partition rate limit: a token bucket driven by the caller's clock.

The subscription loop asks `try_take(now_ms)` before handing a record of a rate-limited
partition to a worker; when it is refused, `wait_ms(now_ms)` tells the loop how long to
sleep at most before the next token. Tokens refill continuously at `rate_per_s`, up to
`burst` (at least one record, by default a tenth of a second's worth), so a partition
that was idle cannot release more than `burst` records at once.
"""

from __future__ import annotations

import math


class TokenBucket:
    __slots__ = ("_burst", "_rate_per_ms", "_tokens", "_updated_ms")

    def __init__(self, rate_per_s: float, now_ms: int, burst: float | None = None) -> None:
        if rate_per_s <= 0:
            raise ValueError(f"rate_per_s must be > 0, got {rate_per_s}")
        self._rate_per_ms = rate_per_s / 1000.0
        self._burst = burst if burst is not None else max(1.0, rate_per_s / 10.0)
        self._tokens = self._burst
        self._updated_ms = now_ms

    def _refill(self, now_ms: int) -> None:
        elapsed_ms = max(0, now_ms - self._updated_ms)
        self._tokens = min(self._burst, self._tokens + elapsed_ms * self._rate_per_ms)
        self._updated_ms = now_ms

    def try_take(self, now_ms: int) -> bool:
        self._refill(now_ms)
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return True
        return False

    def wait_ms(self, now_ms: int) -> int:
        """Milliseconds until one token is available (0 if one is)."""
        self._refill(now_ms)
        if self._tokens >= 1.0:
            return 0
        return math.ceil((1.0 - self._tokens) / self._rate_per_ms)
