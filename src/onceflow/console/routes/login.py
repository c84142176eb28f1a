"""Login and logout (see `guard.py` for when a login is needed)."""

from __future__ import annotations

import asyncio
import time

from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route

from onceflow.console.context import console_of
from onceflow.console.guard import LOGIN_FAILURE_DELAY_S, safe_next, token_matches

# A token is a few dozen characters; a larger form is not a login.
LOGIN_FORM_BYTES_MAX = 4096


async def login_page(request: Request) -> HTMLResponse:
    console = console_of(request)
    return console.renderer.page(request, "login.html", failed=False,
                                 next=safe_next(request.query_params.get("next")))


async def login(request: Request) -> Response:
    console = console_of(request)
    length = int(request.headers.get("content-length") or 0)
    form = await request.form() if 0 < length <= LOGIN_FORM_BYTES_MAX else {}
    target = safe_next(str(form.get("next", "")))
    if not token_matches(console.settings, str(form.get("token", ""))):
        await asyncio.sleep(LOGIN_FAILURE_DELAY_S)  # slows guessing; the loop stays free
        return console.renderer.page(request, "login.html", 401, failed=True, next=target)
    session = console.sessions.new(True, time.time())
    answer = RedirectResponse(target, 303)
    answer.headers.append("set-cookie", console.sessions.cookie_header(session))
    return answer


async def logout(request: Request) -> Response:
    console = console_of(request)
    session = console.sessions.new(False, time.time())
    answer = RedirectResponse("/login", 303)
    answer.headers.append("set-cookie", console.sessions.cookie_header(session))
    return answer


ROUTES = [
    Route("/login", login_page, methods=["GET"]),
    Route("/login", login, methods=["POST"]),
    Route("/logout", logout, methods=["POST"]),
]
