"""Overview, topics, a topic, a partition, the records browser."""

from __future__ import annotations

import dataclasses
import time

from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from onceflow.client.admin import NotFoundError
from onceflow.console.context import console_of
from onceflow.console.decode import FULL_BYTES_MAX, decode
from onceflow.console.model import records as records_model
from onceflow.console.model import topics as topics_model
from onceflow.console.params import integer, isolation, partition_number, timestamp_ms
from onceflow.console.web import blocking, live

# Topics listed on one page of the topic list (the filter narrows it).
TOPICS_PER_PAGE = 500


def _overview_now(request: Request) -> dict:
    console = console_of(request)
    metadata = console.backend.metadata()
    brokers = sorted(metadata.brokers.values(), key=lambda b: b.id)
    return {"brokers": brokers, "controller": metadata.controller_id,
            "sample": console.series.latest(), "problem": console.sample_problem}


async def overview(request: Request) -> HTMLResponse:
    console = console_of(request)
    data = await blocking(_overview_now, request)
    return console.renderer.page(request, "overview.html", **data)


async def overview_events(request: Request) -> Response:
    console = console_of(request)

    def render(data: dict) -> dict[str, str]:
        points = [dataclasses.astuple(p) for p in console.series.points()]
        return {"stats": console.renderer.text(request, "fragments/overview_stats.html", **data),
                "series": console.renderer.env.filters["tojson_compact"](points)}

    return live(request, console.streams, console.renderer,
                console.settings.refresh_interval_s, lambda: _overview_now(request), render)


async def series_json(request: Request) -> JSONResponse:
    points = console_of(request).series.points()
    return JSONResponse([dataclasses.astuple(p) for p in points])


async def topics(request: Request) -> HTMLResponse:
    console = console_of(request)
    query = request.query_params.get("q", "").strip()
    found = await blocking(topics_model.topic_list, console.backend)
    shown = [t for t in found if query in t.name] if query else found
    return console.renderer.page(request, "topics.html", topics=shown[:TOPICS_PER_PAGE],
                                 total=len(found), matching=len(shown), query=query,
                                 per_page=TOPICS_PER_PAGE)


async def topic(request: Request) -> HTMLResponse:
    console = console_of(request)
    view = await blocking(topics_model.topic_view, console.backend, request.path_params["topic"])
    return console.renderer.page(request, "topic.html", view=view)


async def topic_configs(request: Request) -> HTMLResponse:
    console = console_of(request)
    notes: list[str] = []
    configs = await blocking(topics_model.topic_configs, console.backend,
                             request.path_params["topic"], notes)
    return console.renderer.page(request, "fragments/configs.html", configs=configs, notes=notes)


async def topic_events(request: Request) -> Response:
    console = console_of(request)
    name = request.path_params["topic"]

    def produce() -> list:
        indexes = console.backend.partitions_of(name)
        return topics_model.partition_rows(console.backend, name, indexes)

    def render(rows: list) -> dict[str, str]:
        return {"partitions": console.renderer.text(request, "fragments/partitions.html",
                                                    topic=name, partitions=rows)}

    return live(request, console.streams, console.renderer,
                console.settings.refresh_interval_s, produce, render)


def _partition_key(request: Request) -> tuple[str, int]:
    return request.path_params["topic"], partition_number(request.path_params["partition"])


def _existing_partition(request: Request) -> tuple[str, int]:
    """The partition named in the path; NotFoundError unless the cluster has it."""
    topic, index = _partition_key(request)
    if index not in console_of(request).backend.partitions_of(topic):
        raise NotFoundError(f"topic '{topic}' has no partition {index}")
    return topic, index


async def partition(request: Request) -> HTMLResponse:
    console = console_of(request)
    name, index = _partition_key(request)
    view = await blocking(topics_model.partition_view, console.backend, name, index)
    return console.renderer.page(request, "partition.html", view=view, now_ms=_now_ms())


async def partition_events(request: Request) -> Response:
    console = console_of(request)
    name, index = _partition_key(request)

    def render(view: topics_model.PartitionView) -> dict[str, str]:
        return {"offsets": console.renderer.text(request, "fragments/offsets.html", view=view),
                "producers": console.renderer.text(request, "fragments/producers.html",
                                                   view=view, now_ms=_now_ms()),
                "segments": console.renderer.text(request, "fragments/segments.html", view=view)}

    return live(request, console.streams, console.renderer, console.settings.refresh_interval_s,
                lambda: topics_model.partition_view(console.backend, name, index), render)


async def log_ends_events(request: Request) -> Response:
    """The records page's live line: the partition's ends now, and what was written since."""
    console = console_of(request)
    name, index = _partition_key(request)
    page_hw = integer(request.query_params, "hw")

    def render(rows: list) -> dict[str, str]:
        return {"partitions": console.renderer.text(request, "fragments/log_ends.html",
                                                    row=rows[0], page_hw=page_hw)}

    return live(request, console.streams, console.renderer, console.settings.refresh_interval_s,
                lambda: topics_model.partition_rows(console.backend, name, [index]), render)


def _now_ms() -> int:
    return int(time.time() * 1000)


async def records(request: Request) -> HTMLResponse:
    console = console_of(request)
    key = await blocking(_existing_partition, request)
    params = request.query_params
    offset = integer(params, "offset")
    at_ms = timestamp_ms(params, "timestamp")
    chosen = isolation(params)
    note = None
    if offset is None and at_ms is not None:
        offset = await blocking(records_model.offset_for_time, console.backend, key, at_ms)
        if offset is None:
            note = "no record at or after that time: showing the newest records"
    page = await blocking(records_model.records_page, console.backend, key, offset, chosen)
    return console.renderer.page(request, "records.html", page=page, note=note,
                                 timestamp=params.get("timestamp", ""))


async def record(request: Request) -> HTMLResponse:
    """One record in full (up to FULL_BYTES_MAX): the "show more" of the records table."""
    console = console_of(request)
    key = _partition_key(request)
    offset = integer(request.path_params, "offset")
    assert offset is not None
    found = await blocking(records_model.read_records, console.backend, key, offset,
                           offset + 1, 1, FULL_BYTES_MAX)
    content = found.get(offset)
    return console.renderer.page(request, "fragments/record_full.html", offset=offset,
                                 content=content, decode=decode)


ROUTES = [
    Route("/", overview),
    Route("/events/overview", overview_events),
    Route("/series.json", series_json),
    Route("/topics", topics),
    Route("/topics/{topic}", topic),
    Route("/events/topics/{topic}", topic_events),
    Route("/topics/{topic}/configs", topic_configs),
    Route("/topics/{topic}/{partition}", partition),
    Route("/events/topics/{topic}/{partition}", partition_events),
    Route("/topics/{topic}/{partition}/records", records),
    Route("/events/topics/{topic}/{partition}/ends", log_ends_events),
    Route("/topics/{topic}/{partition}/records/{offset}", record),
]
