"""Serve the console on its own: `onceflow console --bootstrap-servers HOST:PORT`.

uvicorn runs the ASGI app on one event loop; the console's blocking Kafka calls run on
worker threads. One line on stdout says where it listens once it does (scripts and
tests wait for it); SIGINT/SIGTERM stop it, open event streams included, within
`SHUTDOWN_TIMEOUT_S`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
from collections.abc import Iterator

import uvicorn
from starlette.applications import Starlette

from onceflow.console.app import create_app
from onceflow.console.settings import ConsoleSettings
from onceflow.console.web import Streams

# Open event streams never end by themselves: a stop waits this long for them.
SHUTDOWN_TIMEOUT_S = 2
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class ConsoleServer(uvicorn.Server):
    """uvicorn's server that ends the console's event streams when it shuts down, and
    that takes SIGINT/SIGTERM as a request to stop (exit status 0, as `onceflow broker`)
    instead of raising the signal again after its shutdown."""

    def __init__(self, config: uvicorn.Config, streams: Streams) -> None:
        super().__init__(config)
        self.streams = streams

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield  # signals reach only the main thread: the host stops us
            return
        loop = asyncio.get_running_loop()
        for sig in STOP_SIGNALS:
            loop.add_signal_handler(sig, self.handle_exit, sig, None)
        try:
            yield
        finally:
            for sig in STOP_SIGNALS:
                loop.remove_signal_handler(sig)

    async def shutdown(self, sockets: list | None = None) -> None:
        self.streams.close()
        await super().shutdown(sockets)


def console_server(app: Starlette, host: str, port: int) -> ConsoleServer:
    """A server for the console `app` (see `ConsoleServer`)."""
    config = uvicorn.Config(app, host=host, port=port, lifespan="on", log_level="warning",
                            access_log=False, timeout_graceful_shutdown=SHUTDOWN_TIMEOUT_S)
    return ConsoleServer(config, app.state.console.streams)


def url_of(server: uvicorn.Server, host: str) -> str:
    port = server.servers[0].sockets[0].getsockname()[1]
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}"


async def _announce(server: uvicorn.Server, settings: ConsoleSettings) -> None:
    while not server.started:
        if server.should_exit:
            return
        await asyncio.sleep(0.05)
    login = "login with the token" if settings.requires_login else "no login (localhost)"
    print(f"onceflow console at {url_of(server, settings.host)} for "
          f"{settings.bootstrap_servers} ({login})", flush=True)


async def _serve(server: uvicorn.Server, settings: ConsoleSettings) -> None:
    announce = asyncio.create_task(_announce(server, settings))
    try:
        await server.serve()
    finally:
        announce.cancel()


def serve(settings: ConsoleSettings) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    server = console_server(create_app(settings), settings.host, settings.port)
    asyncio.run(_serve(server, settings))
