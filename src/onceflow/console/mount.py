"""Serving the console on the broker's admin port.

The broker never imports the console, nor the console the broker. The composition root
above both (`onceflow broker --console` in the CLI, `onceflow.node.Broker(console=True)`)
hands the broker `broker_frontend(...)`: a factory the broker calls with what it offers
(`BrokerAdmin` here, the broker's `AdminContext` - the same fields, matched by shape):
its bootstrap servers, the admin endpoint's own `answer(method, path, body)` for
`/metrics` and `/faults` (adapted to ASGI by `admin_routes`), and a partition's segments.
The factory builds the console app and an `EmbeddedConsole` that the broker starts on
its admin port, on its own event loop: uvicorn's `startup()` and `shutdown()` without its
main loop and signal handling, which the broker owns.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Any, Protocol

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from onceflow.console.app import create_app
from onceflow.console.server import ConsoleServer, console_server, url_of
from onceflow.console.settings import ConsoleSettings

# The admin endpoint's own bound: a fault rule is a few dozen bytes of JSON.
ADMIN_BODY_BYTES_MAX = 64 * 1024
ADMIN_METHODS = ["GET", "POST", "DELETE", "PUT", "PATCH"]
ADMIN_PATHS = ("/metrics", "/faults", "/faults/{rule_id}")

AdminAnswer = Callable[[str, str, bytes], tuple[int, str, bytes]]


class BrokerAdmin(Protocol):
    """What the broker hands its admin port's frontend (its `AdminContext`)."""

    answer: AdminAnswer
    bootstrap_servers: str
    host: str
    segments: Callable[[str, int], list[Any] | None]


def admin_routes(answer: AdminAnswer) -> list[BaseRoute]:
    """`/metrics`, `/faults` and `/faults/{id}` answered by `answer(method, path, body)`."""

    async def endpoint(request: Request) -> Response:
        body = b""
        async for chunk in request.stream():
            body += chunk
            if len(body) > ADMIN_BODY_BYTES_MAX:
                return Response(b'{"error": "body too large"}\n', 413,
                                media_type="application/json")
        status, content_type, payload = answer(request.method, request.url.path, body)
        return Response(payload, status, headers={"Content-Type": content_type})

    return [Route(path, endpoint, methods=ADMIN_METHODS) for path in ADMIN_PATHS]


class EmbeddedConsole:
    """The console app served on the caller's running event loop (an `AdminFrontend`)."""

    title = "onceflow console (and the admin endpoint: /metrics, /faults)"

    def __init__(self, app: Starlette) -> None:
        self.app = app
        self.server: ConsoleServer | None = None
        self.url = ""

    async def start(self, host: str, port: int) -> None:
        """Listen and start the app (its lifespan); OSError when the port is taken."""
        # The socket is bound here: uvicorn's own bind ends the process on an error.
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        listener = socket.create_server((host, port), family=family)
        listener.setblocking(False)
        server = self.server = console_server(self.app, host, port)
        server.config.load()
        server.lifespan = server.config.lifespan_class(server.config)
        try:
            await server.startup(sockets=[listener])
        except SystemExit:  # uvicorn's answer to a failed lifespan startup
            listener.close()
            raise RuntimeError("the console failed to start; see the log") from None
        self.url = url_of(server, host)

    async def stop(self) -> None:
        if self.server is not None:
            self.server.should_exit = True
            await self.server.shutdown()


def broker_frontend(token: str | None = None,
                    properties: dict[str, str] | None = None) -> Callable[[BrokerAdmin],
                                                                          EmbeddedConsole]:
    """The factory the composition root hands the broker (see the module docstring)."""

    def build(broker: BrokerAdmin) -> EmbeddedConsole:
        settings = ConsoleSettings(broker.bootstrap_servers, properties or {}, broker.host,
                                   token=token)
        return EmbeddedConsole(create_app(settings, extras=broker,
                                          extra_routes=admin_routes(broker.answer)))

    return build
