"""The admin endpoint: a small opt-in HTTP server for fault injection and metrics.

    onceflow broker --admin-port 9644
    curl localhost:9644/metrics                                  # Prometheus text format
    curl localhost:9644/faults                                   # rules and nodes (JSON)
    curl -X POST localhost:9644/faults -d '{"kind": "drop_responses", "api": "produce", "count": 3}'
    curl -X DELETE localhost:9644/faults                         # every rule gone, nodes up
    curl -X DELETE localhost:9644/faults/4                       # rule 4 gone

Theory of operation. It runs on the broker's event loop, next to the Kafka listeners,
and only when `admin_port` is set. It binds to the broker's `--host` (127.0.0.1 by
default). With `--admin-token` (issue 13) every request must carry `Authorization: Bearer
<token>` (else 401, the token compared in constant time); with `--admin-tls` it speaks
HTTPS with the Kafka listeners' certificate (docs/security.md). The composition root may serve another `AdminFrontend` on the admin port
instead - the web console, which answers `/metrics` and `/faults` with the same `route`
handed to it in an `AdminContext`; the broker never imports it. Each connection carries one HTTP/1.1 request and is closed after the
answer. `route()` is a pure function from (method, path, body) to (status, content
type, body) over the broker's `FaultInjector` and `BrokerMetrics`; the socket code
around it only reads a bounded request and writes the answer. Invalid rules are
answered 400 with {"error": "..."}; nothing a peer sends can raise past `_serve`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import json
import logging
import ssl
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from onceflow.broker.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE

if TYPE_CHECKING:
    from onceflow.broker.faults import FaultInjector
    from onceflow.broker.metrics import BrokerMetrics

log = logging.getLogger("onceflow.broker.admin")

# A request line and headers longer than this are not from our CLI or curl.
REQUEST_HEAD_BYTES_MAX = 16 * 1024
# A fault rule is a few dozen bytes of JSON.
REQUEST_BODY_BYTES_MAX = 64 * 1024
# A client that does not finish its request within this long is dropped.
REQUEST_READ_TIMEOUT_S = 10.0
JSON_TYPE = "application/json"

_REASONS = {200: "OK", 201: "Created", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found",
            405: "Method Not Allowed", 413: "Payload Too Large", 500: "Internal Server Error"}

Answer = tuple[int, str, bytes]


def _json(status: int, value: Any) -> Answer:
    return status, JSON_TYPE, json.dumps(value, indent=1).encode() + b"\n"


def route(faults: FaultInjector, metrics: BrokerMetrics, method: str, path: str,
          body: bytes) -> Answer:
    """The answer to one admin request."""
    path = path.split("?", 1)[0].rstrip("/") or "/"
    if path == "/metrics":
        if method != "GET":
            return _json(405, {"error": "use GET"})
        return 200, METRICS_CONTENT_TYPE, metrics.render()
    if path == "/faults":
        if method == "GET":
            return _json(200, {"rules": faults.rules(), "nodes": faults.nodes()})
        if method == "POST":
            return _add_rule(faults, body)
        if method == "DELETE":
            return _json(200, {"cleared": faults.clear(), "nodes": faults.nodes()})
        return _json(405, {"error": "use GET, POST or DELETE"})
    if path.startswith("/faults/") and method == "DELETE":
        rule_id = path.removeprefix("/faults/")
        if not rule_id.isdigit() or not faults.remove(int(rule_id)):
            return _json(404, {"error": f"no active rule {rule_id}"})
        return _json(200, {"removed": int(rule_id)})
    return _json(404, {"error": "unknown path; try /metrics or /faults"})


def _add_rule(faults: FaultInjector, body: bytes) -> Answer:
    try:
        spec = json.loads(body or b"{}")
        if not isinstance(spec, dict):
            raise ValueError("the body must be a JSON object")
        return _json(201, faults.add(spec))
    except (ValueError, TypeError) as exc:  # json.JSONDecodeError is a ValueError
        return _json(400, {"error": str(exc)})


class SegmentView(NamedTuple):
    """One segment of a partition, as an admin frontend shows it."""

    base_offset: int
    next_offset: int          # exclusive end of its records
    size_bytes: int
    max_timestamp_ms: int     # the newest record's timestamp (-1: none yet)
    active: bool              # the segment appends go to


@dataclasses.dataclass(frozen=True)
class AdminContext:
    """What the broker hands a frontend served on its admin port."""

    answer: Callable[[str, str, bytes], Answer]   # /metrics and /faults: `route`, bound
    bootstrap_servers: str
    host: str                                     # where the admin port binds
    # A partition's segments (None: no such partition); callable from any thread but
    # the broker's loop thread.
    segments: Callable[[str, int], list[SegmentView] | None]


class AdminFrontend(Protocol):
    """What the broker starts on its admin port: `AdminServer`, or what a factory given
    to the broker by its composition root builds from an `AdminContext`."""

    title: str      # what it is, for the startup line ("admin endpoint", ...)
    url: str        # after start()

    async def start(self, host: str, port: int) -> None: ...

    async def stop(self) -> None: ...


AdminFrontendFactory = Callable[[AdminContext], AdminFrontend]


class AdminServer:
    """The HTTP listener (see the module docstring)."""

    title = "admin endpoint (faults, metrics)"

    def __init__(self, faults: FaultInjector, metrics: BrokerMetrics, advertised_host: str,
                 token: str | None = None, tls: ssl.SSLContext | None = None) -> None:
        self._faults = faults
        self._metrics = metrics
        self._advertised_host = advertised_host  # for `url`
        self._token = token
        self._tls = tls
        self._listener: asyncio.base_events.Server | None = None
        self.port = 0

    @property
    def url(self) -> str:
        scheme = "https" if self._tls is not None else "http"
        return f"{scheme}://{self._advertised_host}:{self.port}"

    async def start(self, host: str, port: int) -> None:
        self._listener = await asyncio.start_server(self._serve, host, port,
                                                    limit=REQUEST_HEAD_BYTES_MAX,
                                                    reuse_address=True, ssl=self._tls)
        self.port = self._listener.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._listener is not None:
            self._listener.close()
            await self._listener.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            answer = await asyncio.wait_for(self._answer(reader), REQUEST_READ_TIMEOUT_S)
        except (asyncio.TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError,
                ConnectionError, ValueError):
            answer = _json(400, {"error": "malformed or incomplete HTTP request"})
        except Exception:  # a bug of ours: log it, answer 500, keep the broker up
            log.exception("admin request failed")
            answer = _json(500, {"error": "internal error; see the broker log"})
        status, content_type, payload = answer
        challenge = "WWW-Authenticate: Bearer\r\n" if status == 401 else ""
        head = (f"HTTP/1.1 {status} {_REASONS.get(status, '')}\r\n{challenge}"
                f"Content-Type: {content_type}\r\nContent-Length: {len(payload)}\r\n"
                "Connection: close\r\n\r\n")
        try:
            writer.write(head.encode() + payload)
            await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()

    async def _answer(self, reader: asyncio.StreamReader) -> Answer:
        head = await reader.readuntil(b"\r\n\r\n")
        request_line, *header_lines = head.decode("latin-1").split("\r\n")
        method, path, _version = request_line.split(" ", 2)
        headers = {}
        for line in header_lines:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        if self._token is not None and not _bearer_ok(headers.get("authorization", ""),
                                                      self._token):
            return _json(401, {"error": "missing or wrong bearer token"})
        length = int(headers.get("content-length", "0"))
        if not 0 <= length <= REQUEST_BODY_BYTES_MAX:
            return _json(413, {"error": f"body over {REQUEST_BODY_BYTES_MAX} bytes"})
        body = await reader.readexactly(length) if length else b""
        return route(self._faults, self._metrics, method.upper(), path, body)


def _bearer_ok(authorization: str, token: str) -> bool:
    scheme, _, presented = authorization.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(presented.strip().encode(),
                                                              token.encode())
