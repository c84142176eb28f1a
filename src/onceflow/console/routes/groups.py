"""Consumer groups (with onceflow processors' windows) and offset resets; pipelines."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Route

from onceflow.client.groups import Isolation, ResetStep, ResetStrategy
from onceflow.console.context import console_of
from onceflow.console.model import groups as model
from onceflow.console.model import pipelines as pipelines_model
from onceflow.console.params import integer, isolation, timestamp_ms
from onceflow.console.web import BadInput, blocking, live


async def groups(request: Request) -> HTMLResponse:
    console = console_of(request)
    found = await blocking(model.groups_list, console.backend)
    return console.renderer.page(request, "groups.html", groups=found)


def _isolation(request: Request) -> Isolation:
    return Isolation(isolation(request.query_params))


async def group(request: Request) -> HTMLResponse:
    console = console_of(request)
    view = await blocking(model.group_view, console.backend, request.path_params["group"],
                          _isolation(request))
    return console.renderer.page(request, "group.html", view=view,
                                 group_id=request.path_params["group"],
                                 strategies=list(ResetStrategy))


async def group_events(request: Request) -> Response:
    console = console_of(request)
    name, chosen = request.path_params["group"], _isolation(request)

    def render(view: model.GroupView) -> dict[str, str]:
        return {"group": console.renderer.text(request, "fragments/group.html", view=view,
                                               group_id=name)}

    return live(request, console.streams, console.renderer, console.settings.refresh_interval_s,
                lambda: model.group_view(console.backend, name, chosen), render)


async def _reset_request(request: Request) -> tuple[ResetStrategy, int | None, str | None, bool]:
    form = await request.form()
    values = {k: str(v) for k, v in form.items()}
    try:
        strategy = ResetStrategy(values.get("strategy", ""))
    except ValueError:
        raise BadInput(f"unknown reset strategy {values.get('strategy', '')[:40]!r}") from None
    value: int | None = None
    if strategy is ResetStrategy.offset:
        value = integer(values, "value")
    elif strategy is ResetStrategy.shift_by:
        value = integer(values, "value", minimum=-(2**63))
    elif strategy is ResetStrategy.datetime:
        value = timestamp_ms(values, "value")
    if value is None and strategy not in (ResetStrategy.earliest, ResetStrategy.latest):
        raise BadInput(f"{strategy.value} needs a value")
    return strategy, value, values.get("topic") or None, values.get("execute") == "yes"


async def reset(request: Request) -> HTMLResponse:
    """Dry run (the plan) unless `execute=yes`: then the same plan is applied."""
    console = console_of(request)
    name = request.path_params["group"]
    strategy, value, topic, execute = await _reset_request(request)
    steps: list[ResetStep] = await blocking(model.reset_plan, console.backend, name, strategy,
                                            value, topic)
    if execute:
        await blocking(model.reset_apply, console.backend, name, steps)
    return console.renderer.page(request, "fragments/reset.html", steps=steps, executed=execute,
                                 group_id=name, strategy=strategy, value=value, topic=topic)


async def pipelines(request: Request) -> HTMLResponse:
    console = console_of(request)
    view = await blocking(pipelines_model.pipelines_view, console.backend)
    return console.renderer.page(request, "pipelines.html", view=view)


async def pipelines_events(request: Request) -> Response:
    console = console_of(request)

    def render(view: pipelines_model.PipelinesView) -> dict[str, str]:
        return {"pipelines": console.renderer.text(request, "fragments/pipelines.html",
                                                   view=view)}

    return live(request, console.streams, console.renderer, console.settings.refresh_interval_s,
                lambda: pipelines_model.pipelines_view(console.backend), render)


ROUTES = [
    Route("/groups", groups),
    Route("/groups/{group}", group),
    Route("/events/groups/{group}", group_events),
    Route("/groups/{group}/reset", reset, methods=["POST"]),
    Route("/pipelines", pipelines),
    Route("/events/pipelines", pipelines_events),
]
