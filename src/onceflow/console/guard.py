"""The console's front door: sessions, login, cross-site request protection, Host checks.

Theory of operation. `Guard` is ASGI middleware in front of every route:

* **Sessions** are a cookie signed with HMAC-SHA256 under a key made at start (so a
  restart logs everyone out): `{"auth": bool, "csrf": token, "exp": seconds}`. Every
  visitor gets one; its `csrf` value is the cross-site request token.
* **Login** is asked when the settings require it (a bind beyond localhost, or a token
  given): a visitor whose session is not `auth` is sent to `/login` (pages) or answered
  401 (fragments, event streams, actions). The token is compared in constant time and a
  failed attempt waits `LOGIN_FAILURE_DELAY_S` before its answer.
* **Cross-site requests**: every request that changes something is a POST and must carry
  the session's csrf token in the `X-CSRF-Token` header (htmx sends it on every request:
  the base template sets `hx-headers`); a page of another site cannot read it, and the
  cookie is `SameSite=Strict`. An `Origin` header, when present, must name this host.
* **Host**: bound to loopback, the console answers only requests whose `Host` is a
  loopback name, so a web page cannot reach it through DNS rebinding.

Nothing here logs a token, a cookie or a password.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import time
from http.cookies import SimpleCookie
from typing import Any
from urllib.parse import quote, urlsplit

from starlette.datastructures import Headers
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from onceflow.console.settings import ConsoleSettings, is_loopback

COOKIE = "onceflow_console"
SESSION_SECONDS = 12 * 3600
LOGIN_FAILURE_DELAY_S = 1.0
# Paths served without a session check: the login itself and the assets it needs.
OPEN_PREFIXES = ("/login", "/static/")
# Paths of the broker's admin endpoint mounted beside the console: their own rules apply.
PASS_THROUGH_PREFIXES = ("/metrics", "/faults")
# Event streams: answered 401, not sent to the login page.
DATA_PREFIXES = ("/events/",)
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
CSRF_HEADER = "x-csrf-token"


class Sessions:
    """Signed session cookies (see the module docstring)."""

    def __init__(self) -> None:
        self._key = secrets.token_bytes(32)

    def new(self, authenticated: bool, now_s: float) -> dict[str, Any]:
        return {"auth": authenticated, "csrf": secrets.token_urlsafe(24),
                "exp": int(now_s) + SESSION_SECONDS}

    def encode(self, session: dict[str, Any]) -> str:
        payload = base64.urlsafe_b64encode(json.dumps(session, separators=(",", ":")).encode())
        signature = hmac.new(self._key, payload, hashlib.sha256).hexdigest()
        return f"{payload.decode()}.{signature}"

    def decode(self, value: str | None, now_s: float) -> dict[str, Any] | None:
        if not value or "." not in value:
            return None
        payload, _, signature = value.rpartition(".")
        expected = hmac.new(self._key, payload.encode(), hashlib.sha256).hexdigest()
        if not hmac.compare_digest(expected, signature):
            return None
        try:
            session = json.loads(base64.urlsafe_b64decode(payload))
        except ValueError:
            return None
        if not isinstance(session, dict) or session.get("exp", 0) < now_s:
            return None
        return session

    def cookie_header(self, session: dict[str, Any]) -> str:
        return (f"{COOKIE}={self.encode(session)}; Path=/; HttpOnly; SameSite=Strict; "
                f"Max-Age={SESSION_SECONDS}")


def token_matches(settings: ConsoleSettings, given: str) -> bool:
    if settings.token is None:
        return False
    return hmac.compare_digest(settings.token.encode(), given.encode())


def safe_next(target: str | None) -> str:
    """Only a path on this site (never `//host` or `https://...`) may follow a login."""
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/"
    return target


class Guard:
    """ASGI middleware (see the module docstring)."""

    def __init__(self, app: ASGIApp, settings: ConsoleSettings, sessions: Sessions) -> None:
        self.app = app
        self.settings = settings
        self.sessions = sessions

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]
        if path.startswith(PASS_THROUGH_PREFIXES):
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        refusal = self._refusal(scope, headers)
        if refusal is not None:
            await refusal(scope, receive, send)
            return
        now_s = time.time()
        cookie = SimpleCookie(headers.get("cookie", ""))
        session = self.sessions.decode(cookie[COOKIE].value if COOKIE in cookie else None, now_s)
        fresh = session is None
        if session is None:
            session = self.sessions.new(not self.settings.requires_login, now_s)
        scope.setdefault("state", {})["session"] = session
        denied = self._denied(scope, headers, session, path)
        if denied is not None:
            await denied(scope, receive, send)
            return
        if not fresh:
            await self.app(scope, receive, send)
            return

        async def send_with_cookie(message: dict) -> None:
            if message["type"] == "http.response.start":
                message.setdefault("headers", []).append(
                    (b"set-cookie", self.sessions.cookie_header(session).encode()))
            await send(message)

        await self.app(scope, receive, send_with_cookie)

    def _refusal(self, scope: Scope, headers: Headers) -> Response | None:
        host = headers.get("host", "")
        if is_loopback(self.settings.host) and not is_loopback(_hostname(host)):
            return PlainTextResponse("this console answers only to localhost", 421)
        origin = headers.get("origin")
        if scope["method"] not in SAFE_METHODS and origin is not None \
                and origin != "null" and urlsplit(origin).netloc != host:
            return PlainTextResponse("cross-site request refused", 403)
        if scope["method"] not in SAFE_METHODS and origin == "null":
            return PlainTextResponse("cross-site request refused", 403)
        return None

    def _denied(self, scope: Scope, headers: Headers, session: dict[str, Any],
                path: str) -> Response | None:
        if path.startswith(OPEN_PREFIXES):
            return None
        if not session.get("auth"):
            if scope["method"] == "GET" and _is_page(path, headers):
                query = scope.get("query_string", b"").decode("latin-1")
                target = path + (f"?{query}" if query else "")
                return RedirectResponse(f"/login?next={quote(target, safe='')}", 303)
            return PlainTextResponse("login required", 401)
        if scope["method"] not in SAFE_METHODS:
            given = headers.get(CSRF_HEADER, "")
            if not hmac.compare_digest(given.encode(), str(session.get("csrf", "")).encode()):
                return PlainTextResponse("missing or wrong cross-site request token: reload "
                                         "the page", 403)
        return None


def _is_page(path: str, headers: Headers) -> bool:
    """A page a person opened (sent to the login), not a fragment, stream or data."""
    return not (path.startswith(DATA_PREFIXES) or path.endswith(".json")
                or "hx-request" in headers
                or "text/event-stream" in headers.get("accept", ""))


def _hostname(host_header: str) -> str:
    """The host of a Host header without its port (`[::1]:8080` -> `::1`)."""
    if host_header.startswith("["):
        return host_header[1:].split("]", 1)[0]
    return host_header.rsplit(":", 1)[0] if host_header.count(":") == 1 else host_header
