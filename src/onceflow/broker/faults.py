"""Fault injection: make the broker misbehave on purpose, as networks and brokers do.

Users test their own applications' exactly-once handling against onceflow, so the
broker can, on request, lose the answer to a request it performed (the lost ACK of
the exactly-once literature), delay answers, answer with an error without performing
the request, cut connections, refuse connections, and - with `nodes=N` - take a node
down so its partitions' leadership moves to another node. Behind every fault the
broker keeps Kafka's exactly-once semantics: a producer that retries after a lost
answer is recognised as a duplicate, also by the node that took over leadership
(storage is shared, so the new leader has the same producer state).

Theory of operation. `FaultInjector` holds an ordered list of active rules. Request
rules (`drop_responses`, `delay_responses`, `fail_requests`, `close_connections`)
match on the request's API and, optionally, the node it reached; connection rules
(`refuse_connections`) match on the node. A rule fires at most `count` times (None:
until cleared) or, for `refuse_connections(seconds=...)`, until its deadline. The
first active rule that matches fires; one request meets at most one fault.

Two hooks: each accepted connection calls `refuses`, and the request pipeline
(broker/pipeline.py) calls `intercept` for each request. The injector knows nothing of
the server: `attach` hands it the cluster view, the metrics and a way to close one
node's connections, which is all it acts on. `intercept` returns the handler's coroutine unchanged when no
rule matches (with no rule at all, one truthiness test); otherwise a coroutine that
does what the rule says:

- drop: perform the request, and lose its answer the way a network loses one: the
  connection goes dead at that moment (`LOST_ANSWER`, see below);
- delay: perform it, hold the response `ms` milliseconds (later responses on that
  connection wait too: Kafka answers in request order);
- fail: do not perform it, answer `error_code` (Produce: every partition; APIs in
  `FAILABLE_APIS` only, since each answer has its own shape);
- close: close the connection instead of performing it, or just after performing
  it (`perform=True`, the other way an ACK gets lost).

A lost answer stalls its connection, because a real broker cannot skip one answer and
send the next (Kafka answers in request order, and clients such as the Java producer
match answers to requests by that order). What really loses an answer is a connection
whose path broke after the request arrived: from then on nothing crosses it in either
direction, and TCP keeps retransmitting until the client's request timeout
(request.timeout.ms, librdkafka's socket.timeout.ms) makes it close the connection and
reconnect. So the dropped request's work returns `LOST_ANSWER`, and the connection
(broker/connection.py) then writes nothing more; requests it had already read are
performed (their answers are lost too), and what arrives later is read and discarded,
never performed - which also lets the broker notice when the client closes. A stalled
connection the client never closes is closed after Kafka's connections.max.idle.ms.

Rules are added and removed from any thread (tests call them while the broker runs
on its own loop thread): the rule list is guarded by a lock. Node changes run on the
broker's loop (they close connections), so calls from other threads are handed to
it and wait for the result. The same operations come as JSON through `add(spec)` for
the admin endpoint (broker/admin.py) and the `onceflow faults` command.

Crash points (issue 5): `crash_after("prepare_commit")` makes the broker *process* exit
(os._exit, like a SIGKILL: nothing flushed, nothing closed) the next time the named point
is reached - for "prepare_commit", right after a PrepareCommit is durable in
__transaction_state and before its markers are written - so tests can show recovery from
the worst moment. Refused for an in-process broker, which would take its host with it.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import dataclasses
import enum
import logging
import os
import re
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from onceflow.protocol.apis import ApiKey
from onceflow.protocol.codec import Request, RequestHeader, build_response, encode_response

if TYPE_CHECKING:
    from onceflow.broker.cluster import Cluster
    from onceflow.broker.metrics import BrokerMetrics

__all__ = ["FAILABLE_APIS", "LOST_ANSWER", "FaultInjector", "FaultKind", "LostAnswer",
           "parse_api", "parse_error_code"]

# A delayed response holds its connection's later responses too; past five minutes no
# client is still waiting, so a longer delay is a typo.
DELAY_MS_MAX = 300_000
# refuse_connections(seconds=...) beyond an hour is a broker that is down: use node_down.
REFUSE_SECONDS_MAX = 3_600
# Spent rules kept for `rules()` (what fired, how often); older ones are forgotten.
SPENT_RULES_KEPT = 100
# How long a call from another thread waits for the broker loop to apply a node change.
LOOP_CALL_TIMEOUT_S = 10.0
INJECTED_MESSAGE = "injected by onceflow fault injection"
# Points `crash_after` may name (reached by the transaction runtime), and the exit status
# of a crash there (a test tells it from a SIGKILL: -9).
CRASH_POINTS = frozenset({"prepare_commit"})
CRASH_EXIT_CODE = 99

log = logging.getLogger("onceflow.faults")


class LostAnswer:
    """The type of `LOST_ANSWER`: what the work of a request whose answer is lost returns
    instead of the answer. The connection stalls on it (module docstring)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "LOST_ANSWER"


LOST_ANSWER = LostAnswer()


class FaultKind(str, enum.Enum):
    DROP_RESPONSES = "drop_responses"
    DELAY_RESPONSES = "delay_responses"
    FAIL_REQUESTS = "fail_requests"
    CLOSE_CONNECTIONS = "close_connections"
    REFUSE_CONNECTIONS = "refuse_connections"


_REQUEST_KINDS = frozenset({FaultKind.DROP_RESPONSES, FaultKind.DELAY_RESPONSES,
                            FaultKind.FAIL_REQUESTS, FaultKind.CLOSE_CONNECTIONS})


@dataclasses.dataclass(slots=True)
class FaultRule:
    rule_id: int
    kind: FaultKind
    api_key: int | None = None  # None: any request
    node_id: int | None = None  # None: any node
    remaining: int | None = 1  # fires left; None: until cleared (or the deadline)
    deadline_s: float | None = None  # time.monotonic() after which the rule is spent
    delay_ms: int = 0
    error_code: int = 0
    perform: bool = False  # close_connections: perform the request, then close
    fired: int = 0

    def spent(self, now_s: float) -> bool:
        return self.remaining == 0 or (self.deadline_s is not None and now_s >= self.deadline_s)

    def matches(self, api_key: int | None, node_id: int) -> bool:
        return ((self.api_key is None or self.api_key == api_key)
                and (self.node_id is None or self.node_id == node_id))

    def describe(self, active: bool) -> dict[str, Any]:
        """A JSON-ready description (the admin endpoint's and `rules()`'s format)."""
        return {
            "id": self.rule_id, "kind": self.kind.value, "active": active,
            "api": None if self.api_key is None else ApiKey(self.api_key).name.lower(),
            "node_id": self.node_id, "remaining": self.remaining, "fired": self.fired,
            "seconds_left": None if self.deadline_s is None
            else max(0.0, round(self.deadline_s - time.monotonic(), 3)),
            "ms": self.delay_ms, "error": ErrorCode(self.error_code).name.upper(),
            "perform": self.perform,
        }


# --- parsing of user input (Python API, JSON, command line) --------------------------------


def parse_api(api: str | int | None) -> int | None:
    """"produce", "Produce", "INIT_PRODUCER_ID", "InitProducerId", "init-producer-id" or
    22 -> the API key; None, "*" or "any" -> None (every API). ValueError if unknown."""
    if api is None or api in ("*", "any"):
        return None
    if isinstance(api, int) or (isinstance(api, str) and api.isdigit()):
        return int(ApiKey(int(api)))
    snake = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", api).replace("-", "_").upper()
    try:
        return int(ApiKey[snake])
    except KeyError:
        raise ValueError(f"unknown API {api!r}") from None


def parse_error_code(error: str | int) -> int:
    """"NOT_LEADER_OR_FOLLOWER", "not_leader_or_follower" or 6 -> 6; ValueError if unknown."""
    if isinstance(error, int) or (isinstance(error, str) and error.lstrip("-").isdigit()):
        return int(ErrorCode(int(error)))
    try:
        return int(ErrorCode[error.lower()])
    except KeyError:
        raise ValueError(f"unknown error code {error!r}") from None


def _check_count(count: int | None) -> int | None:
    if count is not None and count < 1:
        raise ValueError(f"count must be at least 1 (or None: until cleared), got {count}")
    return count


# --- error answers for fail_requests --------------------------------------------------------


def _produce_error(body: Any, code: int) -> dict | None:
    if body.acks == 0:
        return None  # Kafka never answers acks=0
    return {"throttle_time": 0, "responses": [
        {"name": getattr(t, "name", None), "topic_id": getattr(t, "topic_id", None),
         "partition_responses": [
            {"index": p.index, "error_code": code, "base_offset": -1, "log_append_time": -1,
             "log_start_offset": -1, "record_errors": [], "error_message": INJECTED_MESSAGE}
            for p in t.partition_data]}
        for t in body.topic_data]}


def _fetch_error(body: Any, code: int) -> dict:
    def partition(p: Any) -> dict:
        return {"partition_index": p.partition, "error_code": code, "high_watermark": -1,
                "last_stable_offset": -1, "log_start_offset": -1, "aborted_transactions": None,
                "preferred_read_replica": -1, "records": b""}

    def topic(t: Any) -> dict:
        key = {"topic_id": t.topic_id} if hasattr(t, "topic_id") else {"topic": t.topic}
        return {**key, "partitions": [partition(p) for p in t.partitions]}

    return {"throttle_time": 0, "error_code": ErrorCode.none, "session_id": 0,
            "responses": [topic(t) for t in body.topics]}


def _list_offsets_error(body: Any, code: int) -> dict:
    return {"throttle_time": 0, "topics": [
        {"name": t.name, "partitions": [
            {"partition_index": p.partition_index, "error_code": code, "timestamp": -1,
             "offset": -1, "leader_epoch": -1} for p in t.partitions]}
        for t in body.topics]}


def _init_producer_id_error(body: Any, code: int) -> dict:
    return {"throttle_time": 0, "error_code": code, "producer_id": -1, "producer_epoch": -1}


def _find_coordinator_error(body: Any, code: int) -> dict:
    one = {"node_id": -1, "host": "", "port": -1, "error_code": code,
           "error_message": INJECTED_MESSAGE}
    keys = getattr(body, "coordinator_keys", None)
    if keys is not None:  # v4+: one answer per key
        return {"throttle_time": 0, "coordinators": [{"key": k, **one} for k in keys]}
    return {"throttle_time": 0, **one}


# API -> the body of an answer that puts the error everywhere the request asked about.
FAILABLE_APIS: dict[int, Callable[[Any, int], dict | None]] = {
    ApiKey.PRODUCE: _produce_error,
    ApiKey.FETCH: _fetch_error,
    ApiKey.LIST_OFFSETS: _list_offsets_error,
    ApiKey.INIT_PRODUCER_ID: _init_producer_id_error,
    ApiKey.FIND_COORDINATOR: _find_coordinator_error,
}


def error_payload(request: Request, code: int, metrics: BrokerMetrics | None) -> bytes | None:
    """The encoded error answer to `request` (None: the request gets no answer), counted
    in the metrics like any answer: the client does see these errors."""
    header: RequestHeader = request.header
    body = FAILABLE_APIS[header.api_key](request.body, code)
    if metrics is not None:
        metrics.observe_response(header.api_key, body)
    return None if body is None else encode_response(header, build_response(header, **body))


# --- what a fired rule does to one request ---------------------------------------------------

Work = Coroutine[Any, Any, "Any"]
Close = Callable[[str], None]


async def _ready(payload: bytes | None) -> bytes | None:
    return payload


async def _dropped(work: Work) -> LostAnswer:
    await work  # performed; the answer is lost, and the connection with it
    return LOST_ANSWER


async def _delayed(work: Work, delay_ms: int) -> bytes | None:
    payload = await work
    await asyncio.sleep(delay_ms / 1000)
    return payload


async def _performed_then_closed(work: Work, close: Close) -> None:
    await work
    close("fault injection: connection closed after performing the request")
    return None


def _act(rule: FaultRule, request: Request, work: Work, close: Close,
         metrics: BrokerMetrics | None) -> Awaitable[Any]:
    if rule.kind is FaultKind.DROP_RESPONSES:
        return _dropped(work)
    if rule.kind is FaultKind.DELAY_RESPONSES:
        return _delayed(work, rule.delay_ms)
    if rule.kind is FaultKind.CLOSE_CONNECTIONS and rule.perform:
        return _performed_then_closed(work, close)
    work.close()  # never performed
    if rule.kind is FaultKind.FAIL_REQUESTS:
        return _ready(error_payload(request, rule.error_code, metrics))
    assert rule.kind is FaultKind.CLOSE_CONNECTIONS, rule.kind
    # Closed now, before the connection reads on: no later request of it is performed.
    close("fault injection: connection closed instead of performing the request")
    return _ready(None)


# --- the injector ---------------------------------------------------------------------------


class FaultInjector:
    """The fault rules of one broker (see the module docstring). Thread-safe."""

    def __init__(self) -> None:
        # What the injector acts on, given by `attach` once the broker runs: the cluster
        # view (node up/down), the metrics (faults fired) and a way to close every
        # connection of one node. Nothing else of the broker.
        self._cluster: Cluster | None = None
        self._metrics: BrokerMetrics | None = None
        self._close_node: Callable[[int, str], None] | None = None
        self._lock = threading.Lock()
        self._rules: list[FaultRule] = []  # active, in the order they were added
        self._spent: collections.deque[FaultRule] = collections.deque(maxlen=SPENT_RULES_KEPT)
        self._next_id = 1
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None
        self._crash_points: set[str] = set()

    def attach(self, loop: asyncio.AbstractEventLoop, cluster: Cluster, metrics: BrokerMetrics,
               close_node: Callable[[int, str], None]) -> None:
        """Called by the server, on its loop thread, once it runs. `close_node(node_id,
        reason)` closes every connection that reached node `node_id`."""
        self._cluster, self._metrics, self._close_node = cluster, metrics, close_node
        self._loop, self._loop_thread = loop, threading.get_ident()

    # -- request and connection rules (Python API) ---

    def drop_responses(self, api: str | int | None = "produce", count: int | None = 1, *,
                       node_id: int | None = None) -> int:
        """Perform the next `count` matching requests but lose their answers: each one's
        connection stalls until the client closes it (module docstring). Returns the
        rule id."""
        return self._add(FaultKind.DROP_RESPONSES, api, count, node_id)

    def delay_responses(self, api: str | int | None = "produce", ms: int = 1_000,
                        count: int | None = 1, *, node_id: int | None = None) -> int:
        if not 0 <= ms <= DELAY_MS_MAX:
            raise ValueError(f"ms must be in [0, {DELAY_MS_MAX}], got {ms}")
        return self._add(FaultKind.DELAY_RESPONSES, api, count, node_id, delay_ms=ms)

    def fail_requests(self, api: str | int = "produce",
                      error_code: str | int = "NOT_LEADER_OR_FOLLOWER",
                      count: int | None = 1, *, node_id: int | None = None) -> int:
        """Answer the next `count` matching requests with `error_code`, unperformed."""
        api_key = parse_api(api)
        if api_key not in FAILABLE_APIS:
            names = ", ".join(ApiKey(k).name.lower() for k in FAILABLE_APIS)
            raise ValueError(f"fail_requests supports these APIs: {names}")
        return self._add(FaultKind.FAIL_REQUESTS, api_key, count, node_id,
                         error_code=parse_error_code(error_code))

    def close_connections(self, api: str | int | None = "produce", count: int | None = 1, *,
                          perform: bool = False, node_id: int | None = None) -> int:
        """Close the connection of the next `count` matching requests, instead of performing
        them (or right after, with perform=True)."""
        return self._add(FaultKind.CLOSE_CONNECTIONS, api, count, node_id, perform=perform)

    def refuse_connections(self, seconds: float | None = None, count: int | None = None, *,
                           node_id: int | None = None) -> int:
        """Close new connections as soon as they are accepted: for `seconds`, or the next
        `count` of them (default: the next one)."""
        if seconds is not None and count is not None:
            raise ValueError("give seconds or count, not both")
        if seconds is None:
            return self._add(FaultKind.REFUSE_CONNECTIONS, None, count or 1, node_id)
        if not 0 < seconds <= REFUSE_SECONDS_MAX:
            raise ValueError(f"seconds must be in (0, {REFUSE_SECONDS_MAX}], got {seconds}")
        return self._add(FaultKind.REFUSE_CONNECTIONS, None, None, node_id,
                         deadline_s=time.monotonic() + seconds)

    def crash_after(self, point: str) -> None:
        """Exit the broker process the next time `point` is reached (see the module
        docstring). ValueError for an unknown point or an in-process broker."""
        if point not in CRASH_POINTS:
            raise ValueError(f"unknown crash point {point!r}; one of {sorted(CRASH_POINTS)}")
        if self._loop_thread is not None and self._loop_thread != threading.main_thread().ident:
            raise ValueError("crash points exit the process: only for a broker process")
        with self._lock:
            self._crash_points.add(point)

    def reached(self, point: str) -> None:
        """Called by the broker at `point`: exits the process if a crash is armed there."""
        if not self._crash_points:
            return
        with self._lock:
            armed = point in self._crash_points
        if armed:
            log.critical("fault injection: crashing at %s", point)
            logging.shutdown()
            os._exit(CRASH_EXIT_CODE)

    def remove(self, rule_id: int) -> bool:
        with self._lock:
            kept = [r for r in self._rules if r.rule_id != rule_id]
            removed = len(kept) != len(self._rules)
            self._rules = kept
        return removed

    def rules(self) -> list[dict[str, Any]]:
        """Active rules, then recently spent ones, as JSON-ready dicts."""
        now = time.monotonic()
        with self._lock:
            self._retire(now)
            crashes = [{"kind": "crash_after", "point": p, "active": True}
                       for p in sorted(self._crash_points)]
            return ([r.describe(True) for r in self._rules] + crashes
                    + [r.describe(False) for r in self._spent])

    def clear(self) -> int:
        """Remove every rule and bring every node back up; returns how many rules went."""
        with self._lock:
            count, self._rules = len(self._rules) + len(self._crash_points), []
            self._spent.clear()
            self._crash_points.clear()
        if self._loop is not None and self._cluster is not None:
            for node in self._cluster.nodes:
                if not node.up:
                    self.node_up(node.node_id)
        return count

    # -- nodes ---

    def node_down(self, node_id: int) -> None:
        """Take node `node_id` down: its connections close, new ones are refused, it leaves
        the metadata, and the partitions it led move to another live node."""
        self._on_loop(self._set_node, node_id, False)

    def node_up(self, node_id: int) -> None:
        self._on_loop(self._set_node, node_id, True)

    def nodes(self) -> list[dict[str, Any]]:
        cluster = self._cluster
        return [] if cluster is None else [
            {"node_id": n.node_id, "host": n.host, "port": n.port, "up": n.up}
            for n in cluster.nodes]

    def _set_node(self, node_id: int, up: bool) -> None:
        cluster, close_node = self._cluster, self._close_node
        assert cluster is not None and close_node is not None, "attach() first"
        if not 0 <= node_id < len(cluster.nodes):
            raise ValueError(f"no node {node_id}: nodes are 0..{len(cluster.nodes) - 1}")
        cluster.set_node_up(node_id, up)  # ValueError for the last live node
        if not up:
            close_node(node_id, f"fault injection: node {node_id} down")

    def _on_loop(self, fn: Callable[..., Any], *args: Any) -> Any:
        if self._loop is None:
            raise RuntimeError("the broker is not running")
        if threading.get_ident() == self._loop_thread:
            return fn(*args)
        done: concurrent.futures.Future[Any] = concurrent.futures.Future()

        def run() -> None:
            try:
                done.set_result(fn(*args))
            except BaseException as exc:  # noqa: BLE001 - handed to the calling thread
                done.set_exception(exc)

        self._loop.call_soon_threadsafe(run)
        return done.result(LOOP_CALL_TIMEOUT_S)

    # -- JSON form (admin endpoint, CLI) ---

    def add(self, spec: dict[str, Any]) -> dict[str, Any]:
        """Apply one JSON rule: {"kind": "drop_responses", "api": "produce", "count": 2}, or
        {"kind": "node_down", "node_id": 1}. Returns what was done; ValueError if invalid."""
        kind = spec.get("kind")
        if kind == "crash_after":
            point = str(spec.get("point", ""))
            self.crash_after(point)
            return {"kind": kind, "point": point, "active": True}
        if kind in ("node_down", "node_up"):
            node_id = _int(spec, "node_id", required=True)
            (self.node_down if kind == "node_down" else self.node_up)(node_id)
            return {"kind": kind, "node_id": node_id, "nodes": self.nodes()}
        node_id = _int(spec, "node_id")
        count = _int(spec, "count", default=1) if spec.get("count", 1) is not None else None
        api = spec.get("api", "produce")
        if kind == FaultKind.DROP_RESPONSES:
            rule_id = self.drop_responses(api, count, node_id=node_id)
        elif kind == FaultKind.DELAY_RESPONSES:
            rule_id = self.delay_responses(api, _int(spec, "ms", required=True), count,
                                           node_id=node_id)
        elif kind == FaultKind.FAIL_REQUESTS:
            rule_id = self.fail_requests(api, spec.get("error", "NOT_LEADER_OR_FOLLOWER"), count,
                                         node_id=node_id)
        elif kind == FaultKind.CLOSE_CONNECTIONS:
            rule_id = self.close_connections(api, count, perform=bool(spec.get("perform")),
                                             node_id=node_id)
        elif kind == FaultKind.REFUSE_CONNECTIONS:
            seconds = spec.get("seconds")
            rule_id = self.refuse_connections(
                None if seconds is None else float(seconds),
                None if seconds is not None else count, node_id=node_id)
        else:
            kinds = [k.value for k in FaultKind] + ["node_down", "node_up", "crash_after"]
            raise ValueError(f"unknown fault kind {kind!r}; one of {', '.join(kinds)}")
        return self._describe(rule_id)

    def _describe(self, rule_id: int) -> dict[str, Any]:
        with self._lock:
            for rule in self._rules:
                if rule.rule_id == rule_id:
                    return rule.describe(True)
        return {"id": rule_id, "active": False}

    # -- hooks called by the connections and the request pipeline, on the loop thread ---

    def intercept(self, request: Request, node_id: int, work: Work,
                  close: Close) -> Awaitable[Any]:
        """The coroutine the connection runs for `request`: `work` itself unless a rule
        fires for it."""
        if not self._rules:  # the common case, without taking the lock
            return work
        rule = self._fire(_REQUEST_KINDS, request.header.api_key, node_id)
        if rule is None:
            return work
        return _act(rule, request, work, close, self._metrics)

    def refuses(self, node_id: int) -> bool:
        """Whether a connection just accepted by node `node_id` must be closed at once."""
        if self._cluster is not None and not self._cluster.nodes[node_id].up:
            return True
        if not self._rules:
            return False
        return self._fire({FaultKind.REFUSE_CONNECTIONS}, None, node_id) is not None

    def _fire(self, kinds: set[FaultKind] | frozenset[FaultKind], api_key: int | None,
              node_id: int) -> FaultRule | None:
        now = time.monotonic()
        with self._lock:
            self._retire(now)
            rule = next((r for r in self._rules
                         if r.kind in kinds and r.matches(api_key, node_id)), None)
            if rule is None:
                return None
            rule.fired += 1
            if rule.remaining is not None:
                rule.remaining -= 1
            fired = dataclasses.replace(rule)  # a snapshot: the rule may change after
            self._retire(now)
        if self._metrics is not None:
            self._metrics.fault_injected(fired.kind.value, api_key)
        return fired

    def _retire(self, now_s: float) -> None:
        """Move spent rules to the history (caller holds the lock)."""
        if any(rule.spent(now_s) for rule in self._rules):
            self._spent.extend(r for r in self._rules if r.spent(now_s))
            self._rules = [r for r in self._rules if not r.spent(now_s)]

    def _add(self, kind: FaultKind, api: str | int | None, count: int | None,
             node_id: int | None, **params: Any) -> int:
        rule = FaultRule(0, kind, parse_api(api) if kind in _REQUEST_KINDS else None, node_id,
                         _check_count(count), **params)
        with self._lock:
            rule.rule_id, self._next_id = self._next_id, self._next_id + 1
            self._rules.append(rule)
        return rule.rule_id


def _int(spec: dict[str, Any], name: str, *, required: bool = False,
         default: int | None = None) -> int | None:
    value = spec.get(name, default)
    if value is None:
        if required:
            raise ValueError(f"{name} is required")
        return None
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{name} must be an integer, got {value!r}") from None
