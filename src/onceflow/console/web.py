"""What every console route shares: templates, blocking calls off the loop, errors as
pages, live fragments over server-sent events.

Theory of operation. A page is rendered on the server from a model value (the `model`
package reads the cluster with blocking clients, on a worker thread bounded by
`CALL_TIMEOUT_S`, so a slow cluster never blocks the event loop and never hangs a page).
Parts of a page that change are template fragments; the page's event stream
(`live()`) renders the same fragments again every refresh interval and sends those that
changed as SSE events, which htmx's sse extension swaps in place (`sse-swap="name"`).
Errors become pages or fragments with one sentence: a `ClientError` (the cluster said
no, or is unreachable) 502, `NotFoundError` 404, `BadInput` (a malformed offset or time
in the URL) 400, a timeout 504; anything else is our bug, logged with its traceback and
shown as "internal error" without one.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import functools
import json
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import anyio
import jinja2
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response, StreamingResponse

from onceflow.client.admin import ClientError, NotFoundError

log = logging.getLogger("onceflow.console")

HERE = Path(__file__).parent
# The longest a page waits for the cluster; the clients' own timeouts are shorter, this
# bounds what they do not (a broker that accepts and never answers).
CALL_TIMEOUT_S = 20.0
# Calls slower than this are logged: the cluster (or the console) is struggling.
SLOW_CALL_S = 3.0
# Open event streams at once (each refreshes its page every interval): bounds the load a
# forgotten wall of browser tabs puts on the cluster.
STREAMS_MAX = 64
# A comment line keeps idle streams from being closed by proxies.
KEEPALIVE_S = 15.0

T = TypeVar("T")


class BadInput(ValueError):
    """A malformed parameter in the URL or a form: answered 400 with the message."""


async def blocking(fn: Callable[..., T], *args: Any) -> T:
    """`fn(*args)` on a worker thread, at most CALL_TIMEOUT_S (then TimeoutError; the
    thread finishes on its own, bounded by the clients' timeouts)."""
    started = time.monotonic()
    try:
        with anyio.fail_after(CALL_TIMEOUT_S):
            return await anyio.to_thread.run_sync(functools.partial(fn, *args),
                                                  abandon_on_cancel=True)
    finally:
        took_s = time.monotonic() - started
        if took_s > SLOW_CALL_S:
            log.warning("%s took %.1f s", getattr(fn, "__qualname__", fn), took_s)


# ---------------------------------------------------------------- templates


def _number(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.1f}"
    return f"{value:,}"


def _duration(ms: Any) -> str:
    if ms is None:
        return "-"
    seconds = ms / 1000
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def _time(ms: Any) -> str:
    if ms is None or ms < 0:
        return "-"
    moment = datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _bytes(size: Any) -> str:
    if size is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:,.0f} {unit}" if unit == "B" else f"{size:,.1f} {unit}"
        size /= 1024
    return str(size)


def make_templates() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(HERE / "templates"),
                             autoescape=True, undefined=jinja2.StrictUndefined,
                             trim_blocks=True, lstrip_blocks=True)
    env.filters.update(number=_number, duration=_duration, time=_time, bytes=_bytes,
                       tojson_compact=lambda v: json.dumps(v, separators=(",", ":")))
    return env


class Renderer:
    """Templates with what every page needs (the request's csrf token, the nav)."""

    def __init__(self, env: jinja2.Environment, cluster_name: str) -> None:
        self.env = env
        self.cluster_name = cluster_name

    def text(self, request: Request, template: str, **context: Any) -> str:
        session = request.scope.get("state", {}).get("session", {})
        return self.env.get_template(template).render(
            request=request, csrf=session.get("csrf", ""), cluster=self.cluster_name,
            logged_in=bool(session.get("auth")), **context)

    def page(self, request: Request, template: str, status_code: int = 200,
             **context: Any) -> HTMLResponse:
        # no-store: a live page is never shown from a cache, and browsers keep no-store
        # pages out of their back/forward cache, where a page would hold its event stream
        # (one of the six connections a browser allows per site) open after it is left.
        return HTMLResponse(self.text(request, template, **context), status_code,
                            headers={"Cache-Control": "no-store"})

    def error(self, request: Request, message: str, status: int) -> HTMLResponse:
        template = "fragments/error.html" if "hx-request" in request.headers else "error.html"
        return self.page(request, template, status, message=message, status=status)


def error_status(exc: BaseException) -> tuple[int, str]:
    """(HTTP status, message for the page) of an exception a route let through."""
    if isinstance(exc, NotFoundError):
        return 404, str(exc)
    if isinstance(exc, BadInput):
        return 400, str(exc)
    if isinstance(exc, ClientError):
        return 502, str(exc)
    if isinstance(exc, TimeoutError):
        return 504, f"the cluster did not answer within {CALL_TIMEOUT_S:.0f} s"
    log.error("console request failed", exc_info=exc)
    return 500, "internal error of the console; its log has the details"


# ---------------------------------------------------------------- live fragments


Fragments = Mapping[str, str]


class Streams:
    """Counts open event streams (at most STREAMS_MAX) and ends them all on `close()`, so a
    server stops at once instead of waiting for streams that never end by themselves."""

    def __init__(self) -> None:
        self.open = 0
        self.closing = asyncio.Event()

    def close(self) -> None:
        self.closing.set()


def sse_event(name: str, data: str) -> str:
    lines = "".join(f"data: {line}\n" for line in data.splitlines() or [""])
    return f"event: {name}\n{lines}\n"


def live(request: Request, streams: Streams, renderer: Renderer, interval_s: float,
         produce: Callable[[], Any], render: Callable[[Any], Fragments]) -> Response:
    """An event stream: every `interval_s`, `produce()` on a worker thread, `render` it to
    named fragments, send those that changed."""
    if streams.open >= STREAMS_MAX or streams.closing.is_set():
        return Response("too many open pages; close some", 503)

    async def events() -> AsyncIterator[str]:
        streams.open += 1
        sent: dict[str, str] = {}
        quiet_s = 0.0
        try:
            while not streams.closing.is_set() and not await request.is_disconnected():
                try:
                    fragments = dict(render(await blocking(produce)))
                    fragments.setdefault("problem", "")
                except Exception as exc:  # noqa: BLE001 - shown in the page's problem slot
                    status, message = error_status(exc)
                    fragments = {"problem": renderer.text(request, "fragments/error.html",
                                                          message=message, status=status)}
                changed = [sse_event(k, v) for k, v in fragments.items() if sent.get(k) != v]
                sent.update(fragments)
                if changed:
                    quiet_s = 0.0
                    yield "".join(changed)
                elif quiet_s >= KEEPALIVE_S:
                    quiet_s = 0.0
                    yield ": keepalive\n\n"
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(streams.closing.wait(), interval_s)
                quiet_s += interval_s
        finally:
            streams.open -= 1

    return StreamingResponse(events(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})
