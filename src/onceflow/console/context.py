"""`Console`: what the routes share, kept on the Starlette app's state."""

from __future__ import annotations

import dataclasses

from starlette.requests import Request

from onceflow.console.backend import Backend
from onceflow.console.guard import Sessions
from onceflow.console.model.overview import Series
from onceflow.console.settings import ConsoleSettings
from onceflow.console.web import Renderer, Streams


@dataclasses.dataclass
class Console:
    settings: ConsoleSettings
    backend: Backend
    renderer: Renderer
    sessions: Sessions
    streams: Streams
    series: Series
    sample_problem: str | None = None     # why the last overview sample failed, if it did


def console_of(request: Request) -> Console:
    return request.app.state.console
