"""Client quotas (KIP-13, KIP-55, KIP-546): the quota values set per entity, kept durably.

Theory of operation. An entity is a set of (type, name) pairs: `user`, `client-id` or
both, or `ip` alone; a name of None is the type's default (`<default>` in Kafka's tools).
`ClientQuotas` holds entity -> {key: value}. `alter` validates a request's entries as
Kafka's ClientQuotaControlManager does (entity types, combinations, keys and values; a
bad entry fails alone with INVALID_REQUEST), prepares the new state as a value, writes it
to one checked file (storage.layout's write_checked_file: temp file, fsync, rename) and
only then applies it, so a crash leaves the old or the new state. `describe` filters as
Kafka's ClientQuotasImage does (exact name, default, or any name of a type; `strict`
asks for entities with no other types).

Enforcement (`ClientQuotas.record`) is Kafka's ClientQuotaManager for the byte-rate
quotas: a Produce request's size counts against `producer_byte_rate`, a consumer Fetch
answer's record bytes against `consumer_byte_rate`, per the quota that applies to the
request's (user, client-id) - the most specific of Kafka's eight levels, from
<user, client-id> down to <default client-id> - and per the metric tags that level
implies (a user-level quota is shared by all of that user's clients, a default applies to
each user or client on its own). The rate is a sliding window of `quota.window.num` (11)
samples of `quota.window.size.seconds` (1); when a request takes it over the bound, the
throttle time is (rate - bound) / bound * window, the answer carries it and the connection
stops reading for that long (KIP-219), so the client's average comes down to the bound.

`request_percentage` is Kafka's ClientRequestQuotaManager: the time a client's requests
keep the broker busy, as a percentage of one request thread. onceflow handles requests on
one event loop, so the time counted is what the request's handler spends running on that
loop (`LoopTimer`: the sum of its coroutine's steps; waits for fsync or a long poll do
not count). A millisecond counts as 0.1 (percent over one second) into the same window;
the throttle time is bounded by one window sample (`quota.window.size.seconds`), as
Kafka bounds it.

A consumer Fetch asks for at most what its `consumer_byte_rate` allows in one window
(`window_max`, Kafka's getMaxValueInQuotaWindow): KafkaApis caps the fetch's max_bytes
there, so that no single answer is guaranteed to throttle the client. `connection_creation_rate` is stored but not enforced.

File layout: magic "OFCQ" | version u16 | length u32 | crc32c u32 | body (UTF-8 JSON, a
list of {"entity": {type: name|null}, "values": {key: value}}).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import math
import threading
import time
from collections.abc import Coroutine, Generator, Iterable, Mapping
from pathlib import Path
from typing import Any

from kio.schema.errors import ErrorCode

from onceflow.storage.layout import read_checked_file, write_checked_file

__all__ = [
    "CONSUMER_BYTE_RATE",
    "PRODUCER_BYTE_RATE",
    "QUOTAS_FILE",
    "REQUEST_PERCENTAGE",
    "ClientQuotas",
    "Entity",
    "LoopTimer",
    "QuotaError",
    "RateWindow",
    "quota_user",
]

QUOTAS_FILE = "client-quotas.state"
FILE_MAGIC = b"OFCQ"
FILE_VERSION = 1

USER, CLIENT_ID, IP = "user", "client-id", "ip"
ENTITY_TYPES = (USER, CLIENT_ID, IP)
MATCH_EXACT, MATCH_DEFAULT, MATCH_SPECIFIED = 0, 1, 2
# Keys and whether their values are whole numbers (Kafka's QuotaConfig: LONG vs DOUBLE).
USER_CLIENT_KEYS = {"producer_byte_rate": True, "consumer_byte_rate": True,
                    "request_percentage": False, "controller_mutation_rate": False}
IP_KEYS = {"connection_creation_rate": True}
LONG_MAX = 2.0 ** 63 - 1
INT_MAX = 2 ** 31 - 1
PRODUCER_BYTE_RATE, CONSUMER_BYTE_RATE = "producer_byte_rate", "consumer_byte_rate"
REQUEST_PERCENTAGE = "request_percentage"
# Kafka's ClientRequestQuotaManager.NanosToPercentagePerSecond: a request thread busy for
# one second is 100 (percent).
PERCENT_PER_NS = 100.0 / 1e9
# Kafka's quota.window.num and quota.window.size.seconds defaults.
QUOTA_WINDOW_NUM = 11
QUOTA_WINDOW_S = 1.0
# Rate windows of clients not heard from for this long are dropped (Kafka expires inactive
# quota sensors after an hour).
WINDOW_IDLE_EXPIRY_S = 3600.0
# Entities kept: each is an admin's decision, so a thousand times more than any real
# deployment is a bound that only stops a runaway script.
ENTITIES_MAX = 100_000

# An entity: sorted ((type, name or None for the default), ...).
Entity = tuple[tuple[str, str | None], ...]


class QuotaError(Exception):
    """A request Kafka answers with an error code (INVALID_REQUEST, UNSUPPORTED_VERSION)."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


def check_entity(pairs: Iterable[tuple[str, str | None]]) -> Entity:
    """The entity of an AlterClientQuotas entry, validated; QuotaError otherwise."""
    seen: dict[str, str | None] = {}
    for entity_type, name in pairs:
        if entity_type in seen:
            raise QuotaError(ErrorCode.invalid_request,
                             f"Invalid client quota entity, duplicate entity entry {entity_type}")
        if entity_type not in ENTITY_TYPES:
            raise QuotaError(ErrorCode.invalid_request,
                             f"Unhandled client quota entity type: {entity_type}")
        if name is not None and not name:
            raise QuotaError(ErrorCode.invalid_request, f"Empty {entity_type} not supported")
        seen[entity_type] = name
    if not seen:
        raise QuotaError(ErrorCode.invalid_request, "Invalid empty client quota entity")
    if IP in seen and len(seen) > 1:
        raise QuotaError(ErrorCode.invalid_request, "Invalid quota entity combination, IP "
                         "entity should not be combined with User or ClientId")
    if IP in seen and seen[IP] is not None and not _is_ip(seen[IP]):
        raise QuotaError(ErrorCode.invalid_request,
                         f"{seen[IP]} is not a valid IP or resolvable host.")
    return tuple(sorted(seen.items()))


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
        return True
    except ValueError:
        return False


def check_value(entity: Entity, key: str, value: float) -> None:
    keys = IP_KEYS if entity[0][0] == IP else USER_CLIENT_KEYS
    if key not in keys:
        raise QuotaError(ErrorCode.invalid_request, f"Invalid configuration key {key}")
    if not value > 0.0:  # also NaN
        raise QuotaError(ErrorCode.invalid_request, f"Quota {key} must be greater than 0")
    if keys[key]:
        limit = INT_MAX if key == "connection_creation_rate" else LONG_MAX
        if value > limit or math.isinf(value):
            kind = "an INT" if limit == INT_MAX else "a LONG"
            raise QuotaError(ErrorCode.invalid_request,
                             f"Proposed value for {key} is too large for {kind}.")
        if abs(math.fmod(value, 1.0)) > 1e-6:
            raise QuotaError(ErrorCode.invalid_request, f"{key} cannot be a fractional value.")


@dataclasses.dataclass(frozen=True, slots=True)
class Filter:
    exact: Mapping[str, str | None]  # type -> name (None: the default)
    specified: frozenset[str]        # types that must be present, any name
    strict: bool

    def matches(self, entity: Entity) -> bool:
        names = dict(entity)
        if self.strict and len(names) != len(self.exact) + len(self.specified):
            return False
        return (all(t in names and names[t] == n for t, n in self.exact.items())
                and all(t in names for t in self.specified))


def check_filter(components: Iterable[tuple[str, int, str | None]], strict: bool) -> Filter:
    """A DescribeClientQuotas filter, validated as Kafka's ClientQuotasImage.describe."""
    exact: dict[str, str | None] = {}
    specified: set[str] = set()
    for entity_type, match_type, match in components:
        if not entity_type:
            raise QuotaError(ErrorCode.invalid_request, "Invalid empty entity type.")
        if entity_type in exact or entity_type in specified:
            raise QuotaError(ErrorCode.invalid_request, f"Entity type {entity_type} cannot "
                             "appear more than once in the filter.")
        if entity_type not in ENTITY_TYPES:
            raise QuotaError(ErrorCode.unsupported_version,
                             f"Unsupported entity type {entity_type}")
        if match_type == MATCH_EXACT:
            if match is None:
                raise QuotaError(ErrorCode.invalid_request, "Request specified "
                                 "MATCH_TYPE_EXACT, but set match string to null.")
            exact[entity_type] = match
        elif match_type in (MATCH_DEFAULT, MATCH_SPECIFIED):
            if match is not None:
                name = "MATCH_TYPE_DEFAULT" if match_type == MATCH_DEFAULT else \
                    "MATCH_TYPE_SPECIFIED"
                raise QuotaError(ErrorCode.invalid_request,
                                 f"Request specified {name}, but also specified a match string.")
            if match_type == MATCH_DEFAULT:
                exact[entity_type] = None
            else:
                specified.add(entity_type)
        else:
            raise QuotaError(ErrorCode.invalid_request, f"Unknown match type {match_type}")
    types = set(exact) | specified
    if IP in types and types & {USER, CLIENT_ID}:
        raise QuotaError(ErrorCode.invalid_request, "Invalid entity filter component "
                         "combination. IP filter component should not be used with user "
                         "or clientId filter component.")
    return Filter(exact, frozenset(specified), strict)


# One alteration: (key, value) with None for a removal.
Ops = list[tuple[str, float | None]]


class RateWindow:
    """Kafka's Rate over a SampledStat: `samples` buckets of `window_s` seconds; the rate is
    the sum of the live buckets over the elapsed window, which counts at least
    samples - 1 whole buckets (so a first burst is not divided by a few milliseconds)."""

    __slots__ = ("_buckets", "last_used", "samples", "window_s")

    def __init__(self, samples: int = QUOTA_WINDOW_NUM, window_s: float = QUOTA_WINDOW_S) -> None:
        self.samples, self.window_s = samples, window_s
        self._buckets: list[list[float]] = []   # [start_s, total], oldest first
        self.last_used = 0.0

    def record(self, value: float, now_s: float) -> None:
        self._purge(now_s)
        if not self._buckets or now_s >= self._buckets[-1][0] + self.window_s:
            self._buckets.append([now_s, 0.0])
            del self._buckets[:-self.samples]
        self._buckets[-1][1] += value
        self.last_used = now_s

    def _purge(self, now_s: float) -> None:
        horizon = now_s - self.samples * self.window_s
        while self._buckets and self._buckets[0][0] + self.window_s <= horizon:
            self._buckets.pop(0)

    def window_size_s(self, now_s: float) -> float:
        self._purge(now_s)
        elapsed = now_s - self._buckets[0][0] if self._buckets else 0.0
        full = int(elapsed / self.window_s)
        if full < self.samples - 1:
            elapsed += (self.samples - 1 - full) * self.window_s
        return elapsed

    def rate(self, now_s: float) -> float:
        return sum(total for _start, total in self._buckets) / self.window_size_s(now_s)


class LoopTimer:
    """Runs a coroutine and counts the time its steps spend on the event loop (`busy_ns`),
    leaving out the time it waits: a request's share of the one loop that serves all
    clients, what Kafka counts as request-thread time."""

    __slots__ = ("_coro", "busy_ns")

    def __init__(self, coro: Coroutine[Any, Any, Any]) -> None:
        self._coro = coro
        self.busy_ns = 0

    def __await__(self) -> Generator[Any, Any, Any]:
        coro, sent, thrown = self._coro, None, None
        while True:
            started = time.perf_counter_ns()
            try:
                yielded = coro.send(sent) if thrown is None else coro.throw(thrown)
            except StopIteration as done:
                return done.value
            finally:
                self.busy_ns += time.perf_counter_ns() - started
            try:
                sent, thrown = (yield yielded), None
            except BaseException as exc:  # noqa: BLE001 - handed on: the coroutine decides
                sent, thrown = None, exc


class ClientQuotas:
    """The quota values of one broker, persisted in `path` (module docstring). Thread-safe."""

    def __init__(self, path: Path, values: dict[Entity, dict[str, float]],
                 window_num: int = QUOTA_WINDOW_NUM, window_s: float = QUOTA_WINDOW_S) -> None:
        self._path = path
        self._values = values
        self._lock = threading.Lock()
        self._window_num, self._window_s = window_num, window_s
        self._windows: dict[tuple[str, str, str], RateWindow] = {}
        self._last_expiry_s = 0.0

    def active(self) -> bool:
        """Whether any quota is set (else nothing is counted)."""
        return bool(self._values)

    def record(self, key: str, user: str, client_id: str, value: float,
               now_s: float | None = None, throttle_max_ms: int | None = None) -> int:
        """Count `value` (bytes, or percent for request_percentage) of `key`'s quota for a
        request of (user, client-id); the throttle time in ms it earns (0 within the quota
        or without one), at most `throttle_max_ms` if given."""
        if not self._values:
            return 0
        found = self.bound(key, user, client_id)
        if found is None:
            return 0
        bound, tags = found
        now_s = time.monotonic() if now_s is None else now_s
        with self._lock:
            window = self._windows.get((key, *tags))
            if window is None:
                window = self._windows[(key, *tags)] = RateWindow(self._window_num, self._window_s)
            window.record(value, now_s)
            rate = window.rate(now_s)
            self._expire(now_s)
            if rate <= bound:
                return 0
            throttle_ms = round((rate - bound) / bound * window.window_size_s(now_s) * 1000)
        return throttle_ms if throttle_max_ms is None else min(throttle_ms, throttle_max_ms)

    def record_request_time(self, user: str, client_id: str, busy_ns: int,
                            now_s: float | None = None) -> int:
        """Count `busy_ns` of loop time against the client's request_percentage quota; the
        throttle time it earns, at most one window sample (Kafka's maxThrottleTimeMs)."""
        return self.record(REQUEST_PERCENTAGE, user, client_id, busy_ns * PERCENT_PER_NS,
                           now_s, round(self._window_s * 1000))

    def _expire(self, now_s: float) -> None:
        if now_s - self._last_expiry_s < WINDOW_IDLE_EXPIRY_S / 10:
            return
        self._last_expiry_s = now_s
        for tags in [t for t, w in self._windows.items() if now_s - w.last_used > WINDOW_IDLE_EXPIRY_S]:
            del self._windows[tags]

    def window_max(self, key: str, user: str, client_id: str) -> float | None:
        """The most the client may count against `key` in one quota window without being
        throttled when nothing else was counted (Kafka's getMaxValueInQuotaWindow: the
        quota times the window's full samples); None without a quota."""
        found = self.bound(key, user, client_id) if self._values else None
        return None if found is None else found[0] * (self._window_num - 1) * self._window_s

    def bound(self, key: str, user: str, client_id: str) -> tuple[float, tuple[str, str]] | None:
        """The `key` quota for (user, client-id) and the (user, client-id) tags its rate is
        kept under, as Kafka's DefaultQuotaCallback resolves them; None: no quota."""
        levels = (
            (((CLIENT_ID, client_id), (USER, user)), (user, client_id)),
            (((CLIENT_ID, None), (USER, user)), (user, client_id)),
            (((USER, user),), (user, "")),
            (((CLIENT_ID, client_id), (USER, None)), (user, client_id)),
            (((CLIENT_ID, None), (USER, None)), (user, client_id)),
            (((USER, None),), (user, "")),
            (((CLIENT_ID, client_id),), ("", client_id)),
            (((CLIENT_ID, None),), ("", client_id)),
        )
        values = self._values
        for entity, tags in levels:
            found = values.get(entity, {}).get(key)
            if found is not None:
                return found, tags
        return None

    @classmethod
    def load(cls, path: Path, window_num: int = QUOTA_WINDOW_NUM,
             window_s: float = QUOTA_WINDOW_S) -> ClientQuotas:
        """The quotas in `path` (none if it does not exist); CorruptFileError if damaged."""
        try:
            _version, body = read_checked_file(path, FILE_MAGIC, (FILE_VERSION,))
        except FileNotFoundError:
            return cls(path, {}, window_num, window_s)
        values = {tuple(sorted((t, n) for t, n in row["entity"].items())): dict(row["values"])
                  for row in json.loads(body)}
        return cls(path, values, window_num, window_s)

    def describe(self, quota_filter: Filter) -> list[tuple[Entity, dict[str, float]]]:
        with self._lock:
            return [(e, dict(v)) for e, v in sorted(self._values.items(), key=_sort_key)
                    if quota_filter.matches(e)]

    def values(self) -> dict[Entity, dict[str, float]]:
        with self._lock:
            return {e: dict(v) for e, v in self._values.items()}

    def prepare(self, entity: Entity, ops: Ops,
                base: dict[Entity, dict[str, float]]) -> dict[Entity, dict[str, float]]:
        """`base` with one entry's ops applied (a new value; `base` is not changed).
        QuotaError if an op is invalid: then nothing of this entry applies."""
        for key, value in ops:
            if value is not None:
                check_value(entity, key, value)
        current = dict(base.get(entity, {}))
        for key, value in ops:
            if value is None:
                current.pop(key, None)
            else:
                current[key] = value
        new = dict(base)
        if current:
            new[entity] = current
        else:
            new.pop(entity, None)
        if len(new) > ENTITIES_MAX:
            raise QuotaError(ErrorCode.invalid_request,
                             f"Too many client quota entities (at most {ENTITIES_MAX})")
        return new

    def commit(self, values: dict[Entity, dict[str, float]], fsync: bool = True) -> None:
        """Persist `values` (from `prepare`), then make them the broker's."""
        body = json.dumps([{"entity": dict(e), "values": v}
                           for e, v in sorted(values.items(), key=_sort_key)]).encode()
        with self._lock:
            write_checked_file(self._path, FILE_MAGIC, FILE_VERSION, body, fsync)
            self._values = values


def quota_user(principal: str) -> str:
    """The user a quota is looked up for: the principal's name (`User:alice` -> alice)."""
    return principal.split(":", 1)[1] if ":" in principal else principal


def _sort_key(item: tuple[Entity, dict[str, float]]) -> list[tuple[str, str]]:
    return [(t, "" if n is None else "\0" + n) for t, n in item[0]]
