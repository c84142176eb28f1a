"""Decode cost of one small Produce request: the direct decoder against the generic path.

    PYTHONPATH=src .venv/bin/python bench/produce_decode.py

Theory of operation: issue 19 found decoding to be about a quarter of the broker's CPU per
one-record Produce request. This times `decode_request` on the request librdkafka sends
for one record with `linger.ms` 0 (Produce v10, null transactional id, acks 1, timeout
30 s, one topic, one partition, one uncompressed batch of one 100-byte record), and the
same at v13 (topic id instead of name), once through the direct decoder
(protocol/produce_request.py, the default) and once through the generic path
(`direct=False`: bounds walk, kio's reader, records put back). The two variants alternate
in `--rounds` rounds in one process, so a shared machine's load falls on both alike;
printed per variant: the best and the median round, in microseconds per request.
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import time
from collections.abc import Callable

from kio.static.primitive import Records

from onceflow.protocol.apis import ApiKey
from onceflow.protocol.codec import RequestHeader, decode_request, encode_request, request_type
from onceflow.protocol.records import SimpleRecord, build_batch

TOPIC = "bench"
TOPIC_ID = "6d1f3c2a-0b7e-4c55-9a4e-2f1d8c3b5a71"


def produce_frame(version: int) -> bytes:
    """A one-record Produce request as librdkafka shapes it (no size prefix)."""
    request_cls = request_type(ApiKey.PRODUCE, version)
    topic_cls = request_cls.__dataclass_fields__["topic_data"].type.__args__[0]
    partition_cls = topic_cls.__dataclass_fields__["partition_data"].type.__args__[0]
    batch = build_batch([SimpleRecord(None, b"x" * 100)], base_timestamp_ms=1_700_000_000_000)
    partition = partition_cls(index=0, records=Records(batch))
    if version >= 13:
        import uuid
        topic = topic_cls(topic_id=uuid.UUID(TOPIC_ID), partition_data=(partition,))
    else:
        topic = topic_cls(name=TOPIC, partition_data=(partition,))
    body = request_cls(transactional_id=None, acks=1,
                       timeout=datetime.timedelta(milliseconds=30_000), topic_data=(topic,))
    return encode_request(RequestHeader(ApiKey.PRODUCE, version, 1, "rdkafka"), body)[4:]


def per_call_us(call: Callable[[], object], calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        call()
    return (time.perf_counter() - start) / calls * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=20_000, help="decodes per round")
    args = parser.parse_args()
    print(f"{'request':<24} {'variant':<8} {'best us':>8} {'median us':>10}")
    for version in (10, 13):
        frame = produce_frame(version)
        direct = decode_request(frame)
        generic = decode_request(frame, direct=False)
        assert direct.body == generic.body  # the same request, both ways
        variants: dict[str, Callable[[], object]] = {
            "generic": lambda frame=frame: decode_request(frame, direct=False),
            "direct": lambda frame=frame: decode_request(frame),
        }
        rounds: dict[str, list[float]] = {name: [] for name in variants}
        for _ in range(args.rounds):
            for name, call in variants.items():
                rounds[name].append(per_call_us(call, args.calls))
        for name, times in rounds.items():
            label = f"Produce v{version}, {len(frame)} B"
            print(f"{label:<24} {name:<8} {min(times):>8.2f} {statistics.median(times):>10.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
