"""`create_app`: the console as an ASGI application (Starlette).

Theory of operation: one Starlette app holds the shared `Console` (the cluster backend,
templates, sessions, the overview's series) on its state; routes come from the
`routes` modules; `Guard` (sessions, login, cross-site checks) wraps everything; static
files (our CSS/JS and the vendored htmx, its SSE extension and uPlot, copied from npm at
build time by scripts/console-assets.sh) are served from the package, so the console
works offline. The lifespan runs the sampler behind the overview's charts: every
`SAMPLE_INTERVAL_S` a sample of the whole cluster on a worker thread.

The app can be served alone (`onceflow console`, `server.py`) or mounted beside the
broker's admin endpoint by the broker's composition root (`extra_routes` carries the
admin endpoint's routes), which then passes `Extras` for what only the broker knows.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Sequence

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Mount
from starlette.staticfiles import StaticFiles

from onceflow.client.admin import ClientError
from onceflow.console.backend import Backend, Extras
from onceflow.console.context import Console
from onceflow.console.guard import Guard, Sessions
from onceflow.console.model.overview import Series, sample_pause_s, take_sample
from onceflow.console.routes import cluster, groups, login, transactions
from onceflow.console.settings import ConsoleSettings
from onceflow.console.web import (
    HERE,
    BadInput,
    Renderer,
    Streams,
    blocking,
    error_status,
    make_templates,
)

log = logging.getLogger("onceflow.console")

VENDOR_DIR = HERE / "static" / "vendor"
# What scripts/console-assets.sh copies from npm; the console refuses to start without it.
VENDOR_FILES = ("htmx.min.js", "sse.min.js", "uPlot.iife.min.js", "uPlot.min.css")


def missing_assets() -> list[str]:
    return [name for name in VENDOR_FILES if not (VENDOR_DIR / name).is_file()]


async def _sample_forever(console: Console) -> None:
    while True:
        started = time.monotonic()
        try:
            console.series.add(await blocking(take_sample, console.backend,
                                              int(time.time() * 1000)))
            console.sample_problem = None
        except Exception as exc:  # noqa: BLE001 - shown on the overview, retried next tick
            console.sample_problem = error_status(exc)[1]
        await asyncio.sleep(sample_pause_s(time.monotonic() - started))


def create_app(settings: ConsoleSettings, *, extras: Extras | None = None,
               extra_routes: Sequence[BaseRoute] = (), sample: bool = True) -> Starlette:
    """The console app for `settings` (see the module docstring)."""
    missing = missing_assets()
    if missing:
        raise RuntimeError(f"the console's JavaScript is missing ({', '.join(missing)}): run "
                           "scripts/console-assets.sh (make does it) to copy it from npm")
    backend = Backend(settings.bootstrap_servers, settings.properties, extras)
    console = Console(settings, backend, Renderer(make_templates(), settings.bootstrap_servers),
                      Sessions(), Streams(), Series())

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        sampler = asyncio.create_task(_sample_forever(console)) if sample else None
        try:
            yield
        finally:
            if sampler is not None:
                sampler.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await sampler
            await asyncio.to_thread(backend.close)

    async def on_error(request: Request, exc: Exception) -> Response:
        if isinstance(exc, HTTPException):
            return console.renderer.error(request, exc.detail, exc.status_code)
        status, message = error_status(exc)
        return console.renderer.error(request, message, status)

    routes = [*extra_routes, *login.ROUTES, *cluster.ROUTES, *transactions.ROUTES,
              *groups.ROUTES, Mount("/static", StaticFiles(directory=HERE / "static"),
                                    name="static")]
    # Expected failures are answered by Starlette's ExceptionMiddleware; `Exception` (our
    # bugs) by its ServerErrorMiddleware, which also logs the traceback.
    handled = (ClientError, BadInput, TimeoutError, HTTPException, Exception)
    app = Starlette(routes=routes, lifespan=lifespan,
                    exception_handlers=dict.fromkeys(handled, on_error))
    app.state.console = console
    app.add_middleware(Guard, settings=settings, sessions=console.sessions)
    return app
