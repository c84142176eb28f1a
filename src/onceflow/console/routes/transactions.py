"""Transactions: the live table, hanging ones, and the aborts (confirm, then POST)."""

from __future__ import annotations

import time

from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Route

from onceflow.client.transactions import TRANSACTION_MAX_TIMEOUT_MS, describe_transaction
from onceflow.console.context import console_of
from onceflow.console.model import transactions as model
from onceflow.console.params import integer, partition_number
from onceflow.console.web import BadInput, blocking, live


def _now_ms() -> int:
    return int(time.time() * 1000)


async def transactions(request: Request) -> HTMLResponse:
    console = console_of(request)
    view = await blocking(model.transactions_view, console.backend, _now_ms())
    return console.renderer.page(request, "transactions.html", view=view,
                                 older_than_ms=TRANSACTION_MAX_TIMEOUT_MS)


async def transactions_events(request: Request) -> Response:
    console = console_of(request)

    def render(view: model.TransactionsView) -> dict[str, str]:
        return {"transactions": console.renderer.text(request, "fragments/transactions.html",
                                                      view=view)}

    return live(request, console.streams, console.renderer, console.settings.refresh_interval_s,
                lambda: model.transactions_view(console.backend, _now_ms()), render)


async def hanging(request: Request) -> HTMLResponse:
    console = console_of(request)
    older_than_ms = integer(request.query_params, "older_than_ms",
                            default=TRANSACTION_MAX_TIMEOUT_MS)
    found = await blocking(model.hanging_view, console.backend, older_than_ms, _now_ms())
    return console.renderer.page(request, "fragments/hanging.html", hanging=found,
                                 older_than_ms=older_than_ms, now_ms=_now_ms())


async def abort_confirm(request: Request) -> HTMLResponse:
    console = console_of(request)
    transactional_id = request.path_params["transactional_id"]
    described = await blocking(describe_transaction, console.backend.cluster(),
                                transactional_id)
    return console.renderer.page(request, "fragments/abort_confirm.html",
                                 transactional_id=transactional_id, described=described,
                                 abortable_state=model.ABORTABLE_STATE)


async def _form_int(request: Request, name: str, maximum: int = 2**63 - 1) -> int:
    form = await request.form()
    value = integer({name: str(form.get(name, ""))}, name, maximum=maximum)
    if value is None:
        raise BadInput(f"{name} is missing")
    return value


async def abort(request: Request) -> HTMLResponse:
    console = console_of(request)
    transactional_id = request.path_params["transactional_id"]
    producer_id = await _form_int(request, "producer_id")
    producer_epoch = await _form_int(request, "producer_epoch", maximum=2**15 - 1)
    described = await blocking(model.abort_by_fencing, console.backend, transactional_id,
                               producer_id, producer_epoch)
    return console.renderer.page(request, "fragments/abort_done.html", described=described,
                                 transactional_id=transactional_id)


async def abort_hanging(request: Request) -> HTMLResponse:
    console = console_of(request)
    form = await request.form()
    topic = str(form.get("topic", ""))
    if not topic:
        raise BadInput("topic is missing")
    index = partition_number(str(form.get("partition", "")))
    start_offset = await _form_int(request, "start_offset")
    target = await blocking(model.abort_hanging, console.backend, (topic, index), start_offset)
    return console.renderer.page(request, "fragments/abort_hanging_done.html", target=target)


ROUTES = [
    Route("/transactions", transactions),
    Route("/events/transactions", transactions_events),
    Route("/transactions/hanging", hanging),
    Route("/transactions/hanging/abort", abort_hanging, methods=["POST"]),
    Route("/transactions/{transactional_id:path}/abort", abort_confirm, methods=["GET"]),
    Route("/transactions/{transactional_id:path}/abort", abort, methods=["POST"]),
]
