"""Fetch decode and encode per call: where decoding goes, and encoding old against new.

    PYTHONPATH=src .venv/bin/python bench/fetch_codec.py

Theory of operation: issue 19's consumer reading along a producer of one-record requests
sends a Fetch per record, so the per-call cost of reading its request and writing its answer
counts as much as a Produce's. This times, in one process and interleaved (best of
`--rounds` rounds of `--calls` calls each): decoding a Fetch request frame with
codec.decode_request, and its parts (the header, the bounds walker, kio's reader); and
encoding the handler's answer dict with the generic path (build_response + kio's writer)
and with protocol/fetch_response.py. Shapes: what librdkafka sends and gets at that load
(Fetch v16, one topic by id, one partition, one 170-byte batch in the answer), and a
10-partition one.
"""

from __future__ import annotations

import argparse
import time
import uuid
from collections.abc import Callable

from kio.schema.errors import ErrorCode

from onceflow.protocol.apis import ApiKey
from onceflow.protocol.codec import (
    RequestHeader,
    _api_codec,
    _decode_header,
    build_entity,
    build_response,
    decode_request,
    encode_request,
    encode_response_chunks,
    request_type,
)
from onceflow.protocol.fetch_response import encode_fetch_response
from onceflow.protocol.walker import _NO_TAGS, _walk_entity, _walk_tagged_fields

VERSION = 16
TOPIC_ID = uuid.UUID(int=0x1234)
HEADER = RequestHeader(ApiKey.FETCH, VERSION, 1, "rdkafka")


def request_frame(partitions: int) -> bytes:
    body = build_entity(request_type(ApiKey.FETCH, VERSION), replica_id=-1, max_wait=500,
                        min_bytes=1, max_bytes=52_428_800, isolation_level=1, session_id=0,
                        session_epoch=-1, forgotten_topics_data=[], rack_id="",
                        topics=[{"topic_id": TOPIC_ID, "partitions": [
                            {"partition": i, "current_leader_epoch": 0, "fetch_offset": 1000,
                             "last_fetched_epoch": -1, "log_start_offset": -1,
                             "partition_max_bytes": 1_048_576} for i in range(partitions)]}])
    return encode_request(HEADER, body)[4:]


def answer(partitions: int) -> dict:
    return {"throttle_time": 0, "error_code": ErrorCode.none, "session_id": 0,
            "node_endpoints": [],
            "responses": [{"topic_id": TOPIC_ID, "partitions": [
                {"partition_index": i, "error_code": ErrorCode.none, "high_watermark": 1001,
                 "last_stable_offset": 1001, "log_start_offset": 0, "aborted_transactions": [],
                 "preferred_read_replica": -1, "records": b"\x00" * 170}
                for i in range(partitions)]}]}


def per_call_us(function: Callable[[], object], calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        function()
    return (time.perf_counter() - start) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    for partitions in (1, 10):
        for name, us in measure(partitions, args.calls, args.rounds).items():
            print(f"Fetch v{VERSION}, {partitions:2} partition(s), {name:34} {us:6.1f} us per call")


def measure(partitions: int, calls: int, rounds: int) -> dict[str, float]:
    frame, body = request_frame(partitions), answer(partitions)
    view = memoryview(frame).toreadonly()
    codec = _api_codec(ApiKey.FETCH, VERSION)
    _, header_end = _decode_header(view)
    body_start = _walk_tagged_fields(_NO_TAGS, view, header_end, len(view), [])
    variants = {
        "decode (decode_request)": lambda: decode_request(frame),
        "  of which the header": lambda: _decode_header(view),
        "  of which the bounds walker": lambda: _walk_entity(codec.request_shape, view,
                                                             body_start, len(view), []),
        "  of which kio's reader": lambda: codec.read_request(view, body_start),
        "encode, generic (build + kio)": lambda: encode_response_chunks(
            HEADER, build_response(HEADER, **body)),
        "encode, direct (fetch_response.py)": lambda: encode_fetch_response(1, VERSION, body),
    }
    best = dict.fromkeys(variants, float("inf"))
    for _ in range(rounds):
        for name, function in variants.items():
            best[name] = min(best[name], per_call_us(function, calls))
    return best


if __name__ == "__main__":
    main()
