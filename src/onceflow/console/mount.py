"""Serving the console inside another asyncio program: the broker's admin port.

The broker's composition root (never the console) imports this: it builds the console
app with `extra_routes=admin_routes(answer)` - the admin endpoint's `/metrics` and
`/faults` answered by the broker's own `answer(method, path, body)` function, which this
module only adapts to ASGI - and `extras` for what the broker knows beyond the Kafka
protocol, then starts `EmbeddedConsole` on its event loop. uvicorn's `startup()` and
`shutdown()` are used without its main loop and signal handling: the host owns both.
"""

from __future__ import annotations

import socket
from collections.abc import Callable

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from onceflow.console.server import ConsoleServer, console_server, url_of

# The admin endpoint's own bound: a fault rule is a few dozen bytes of JSON.
ADMIN_BODY_BYTES_MAX = 64 * 1024
ADMIN_METHODS = ["GET", "POST", "DELETE", "PUT", "PATCH"]

AdminAnswer = Callable[[str, str, bytes], tuple[int, str, bytes]]


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

    return [Route(path, endpoint, methods=ADMIN_METHODS)
            for path in ("/metrics", "/faults", "/faults/{rule_id}")]


class EmbeddedConsole:
    """The console app served on the caller's running event loop."""

    def __init__(self, app: Starlette, host: str, port: int) -> None:
        self.host = host
        self.port = port
        self.server: ConsoleServer = console_server(app, host, port)
        self.url = ""

    async def start(self) -> str:
        """Listen and start the app (its lifespan); OSError when the port is taken."""
        # The socket is bound here: uvicorn's own bind ends the process on an error.
        family = socket.getaddrinfo(self.host, self.port, type=socket.SOCK_STREAM)[0][0]
        listener = socket.create_server((self.host, self.port), family=family)
        listener.setblocking(False)
        self.server.config.load()
        self.server.lifespan = self.server.config.lifespan_class(self.server.config)
        try:
            await self.server.startup(sockets=[listener])
        except SystemExit:  # uvicorn's answer to a failed lifespan startup
            listener.close()
            raise RuntimeError("the console failed to start; see the log") from None
        self.url = url_of(self.server, self.host)
        return self.url

    async def stop(self) -> None:
        self.server.should_exit = True
        await self.server.shutdown()
