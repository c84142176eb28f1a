"""Broker CPU of the request path alone: one-record Produce requests (acks=1) fed to the
request pipeline in-process, no sockets, no client.

    PYTHONPATH=src .venv/bin/python bench/request_path.py               # us per request
    PYTHONPATH=src .venv/bin/python bench/request_path.py --profile 30  # + cProfile top 30

Theory of operation: bench/request_cpu.py measures the whole broker process under a real
client, which includes the event loop, the sockets and whatever else the machine does. To
see what one change to the Python request path buys, this script starts a BrokerServer
on a uvloop loop (fsync on, one topic of one partition), builds the Produce v9 request
librdkafka sends for one 100-byte record, and runs `RequestPipeline.start` on that frame
N times, each request completing at once as an acks=1 produce does, then prints the
thread CPU per request (median of the rounds). Run it on two trees for an A/B.
"""

from __future__ import annotations

import argparse
import cProfile
import datetime
import pstats
import statistics
import sys
import tempfile
import time
from pathlib import Path

import uvloop
from kio.schema.produce.v9.request import PartitionProduceData, ProduceRequest, TopicProduceData
from kio.schema.types import TopicName

from onceflow.broker.config import BrokerConfig
from onceflow.broker.pipeline import Peer
from onceflow.broker.server import BrokerServer
from onceflow.protocol.codec import encode_request
from onceflow.protocol.header import RequestHeader
from onceflow.protocol.records import SimpleRecord, build_batch

TOPIC = "request-path"
PRODUCE_VERSION = 9


def produce_frame(correlation_id: int) -> bytes:
    batch = build_batch([SimpleRecord(None, b"x" * 100)], base_timestamp_ms=int(time.time() * 1000))
    body = ProduceRequest(
        transactional_id=None, acks=1, timeout=datetime.timedelta(seconds=30),
        topic_data=(TopicProduceData(name=TopicName(TOPIC), partition_data=(
            PartitionProduceData(index=0, records=batch),)),))
    frame = encode_request(RequestHeader(0, PRODUCE_VERSION, correlation_id, "rdkafka"), body)
    return frame[4:]  # without the size prefix, as the connection hands frames on


def run_once(pipeline, frame: bytes, peer: Peer) -> None:
    work = pipeline.start(frame, peer, lambda reason: None)
    try:
        work.send(None)
    except StopIteration:
        return
    raise RuntimeError("an acks=1 produce waited")


async def measure(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="onceflow-bench-request-path-") as tmp:
        server = BrokerServer(BrokerConfig(data_dir=Path(tmp), port=0, fsync=True))
        await server.start()
        try:
            server.state.store.create_topic(TOPIC, 1, {})
            pipeline = server.connections.pipeline
            peer = Peer(node_id=0, client_host="/127.0.0.1")
            frame = produce_frame(1)
            for _ in range(200):   # warm up: the log opens, caches fill
                run_once(pipeline, frame, peer)
            rounds = []
            for _ in range(args.rounds):
                start = time.thread_time_ns()
                for _ in range(args.requests):
                    run_once(pipeline, frame, peer)
                rounds.append((time.thread_time_ns() - start) / args.requests / 1000)
            print(f"Produce v{PRODUCE_VERSION}, one 100-byte record, acks=1: "
                  f"{statistics.median(rounds):.1f} us per request (rounds: "
                  f"{', '.join(f'{r:.1f}' for r in rounds)})")
            if args.profile:
                profile = cProfile.Profile()
                profile.enable()
                for _ in range(args.requests):
                    run_once(pipeline, frame, peer)
                profile.disable()
                pstats.Stats(profile).sort_stats("tottime").print_stats(args.profile)
        finally:
            await server.stop()
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="also print the top N functions of a cProfile run")
    args = parser.parse_args()
    return uvloop.run(measure(args))


if __name__ == "__main__":
    sys.exit(main())
