"""Broker CPU per long-polling Fetch woken by a Produce, measured in lock step.

    PYTHONPATH=src .venv/bin/python bench/fetch_cpu.py            # 4 x 1,000 rounds
    PYTHONPATH=/other/tree/src .venv/bin/python bench/fetch_cpu.py

Theory of operation: bench/request_cpu.py --consumer divides the broker's CPU by the
records produced, but how many Fetch requests a confluent-kafka consumer sends for them
depends on how fast the broker answers (a slower broker answers fewer, larger fetches), so
on a shared machine its figure moves with the load more than with the code. Here the client
is one thread in lock step over raw sockets, so the work per round is fixed: it sends a
Fetch (v12, min_bytes 1, max_wait 5 s) for the next offset, which finds nothing and waits;
then a one-record Produce (v9, acks=1) on another connection; it reads the Produce answer
and then the Fetch answer, which carries the record. The broker is the in-process embedded
one (broker/embedded.py), and only its event-loop thread's CPU time is counted (from
/proc/self/task/<tid>/stat), so the client's own work does not count. Phases of Produce
requests alone alternate with these (four of each, the best of each kept: on a shared
machine noise only adds); the difference per round is the cost of one Fetch that waits,
is woken and answers one record: decode, handler, wait and wake, encode, the socket calls.
With `--count-calls` the loop thread's Python function calls are counted instead (cProfile,
enabled on that thread only): no C work, but a figure that a loaded machine does not move.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import socket
import struct
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from onceflow import Broker
from onceflow.protocol.apis import ApiKey
from onceflow.protocol.codec import RequestHeader, build_entity, encode_request, request_type
from onceflow.protocol.records import SimpleRecord, build_batch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from throughput import create_topic_via_admin

TOPIC = "fetch-cpu"
VALUE = b"x" * 100
FETCH_VERSION, PRODUCE_VERSION = 12, 9
TICKS_PER_S = os.sysconf("SC_CLK_TCK")


class RawConnection:
    """One socket speaking Kafka's framing in lock step."""

    def __init__(self, bootstrap: str) -> None:
        host, port = bootstrap.rsplit(":", 1)
        self._sock = socket.create_connection((host, int(port)))
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._correlation_id = 0

    def send(self, api_key: int, version: int, **fields: object) -> None:
        self._correlation_id += 1
        header = RequestHeader(api_key, version, self._correlation_id, "fetch-cpu")
        self._sock.sendall(encode_request(header, build_entity(request_type(api_key, version),
                                                               **fields)))

    def receive(self) -> bytes:
        (size,) = struct.unpack(">i", self._exactly(4))
        return self._exactly(size)

    def _exactly(self, size: int) -> bytes:
        data = bytearray()
        while len(data) < size:
            chunk = self._sock.recv(size - len(data))
            if not chunk:
                raise ConnectionError("broker closed the connection")
            data += chunk
        return bytes(data)

    def close(self) -> None:
        self._sock.close()


def thread_cpu_s(native_id: int) -> float:
    fields = Path(f"/proc/self/task/{native_id}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS_PER_S   # utime, stime


def produce(connection: RawConnection) -> None:
    batch = build_batch([SimpleRecord(None, VALUE)], base_timestamp_ms=int(time.time() * 1000))
    connection.send(ApiKey.PRODUCE, PRODUCE_VERSION, transactional_id=None, acks=1,
                    timeout=30_000, topic_data=[{"name": TOPIC, "partition_data": [
                        {"index": 0, "records": batch}]}])


def fetch(connection: RawConnection, offset: int) -> None:
    connection.send(ApiKey.FETCH, FETCH_VERSION, replica_id=-1, max_wait=5000, min_bytes=1,
                    max_bytes=52_428_800, isolation_level=1, session_id=0, session_epoch=-1,
                    topics=[{"topic": TOPIC, "partitions": [
                        {"partition": 0, "current_leader_epoch": -1, "fetch_offset": offset,
                         "last_fetched_epoch": -1, "log_start_offset": -1,
                         "partition_max_bytes": 1_048_576}]}],
                    forgotten_topics_data=[], rack_id="")


def rounds(producer: RawConnection, consumer: RawConnection | None, offset: int,
           count: int) -> None:
    for i in range(count):
        if consumer is not None:
            fetch(consumer, offset + i)
            time.sleep(0.0002)   # let the Fetch reach the broker and wait
        produce(producer)
        producer.receive()
        if consumer is not None and len(consumer.receive()) < len(VALUE):
            raise AssertionError("a Fetch answer without the record: it did not wait")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=1000, help="rounds per phase")
    parser.add_argument("--count-calls", action="store_true",
                        help="count the loop thread's Python function calls (cProfile) instead "
                             "of its CPU time: slower, but the same on a loaded machine")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="onceflow-bench-fetch-cpu-") as tmp:
        # fsync off: the flushes of the produce path would only add noise to the difference.
        broker = Broker(Path(tmp) / "data", fsync=False).start()
        try:
            create_topic_via_admin(broker.bootstrap_servers, TOPIC, 1)
            loop_thread = broker._thread.native_id   # the event loop's thread
            producer, consumer = RawConnection(broker.bootstrap_servers), RawConnection(
                broker.bootstrap_servers)
            rounds(producer, consumer, 0, 200)   # warm-up
            offset = 200
            results = {}
            for phase, reader in (("produce alone", None), ("produce + fetch", consumer)) * 4:
                if args.count_calls:
                    profile = cProfile.Profile()
                    in_loop(broker, profile.enable)
                before = thread_cpu_s(loop_thread)
                rounds(producer, reader, offset, args.rounds)
                offset += args.rounds
                if args.count_calls:
                    in_loop(broker, profile.create_stats)
                    cost = pstats.Stats(profile).total_calls / args.rounds
                else:
                    cost = (thread_cpu_s(loop_thread) - before) / args.rounds * 1e6
                results.setdefault(phase, []).append(cost)
            producer.close()
            consumer.close()
        finally:
            broker.stop()
    alone, both = min(results["produce alone"]), min(results["produce + fetch"])
    unit = "Python calls" if args.count_calls else "us"
    what = "Python function calls" if args.count_calls else "CPU"
    print(f"broker loop {what} per round, best of four: produce alone {alone:.0f} {unit}, "
          f"produce + waiting fetch {both:.0f} {unit}, so {both - alone:.0f} {unit} per fetch")
    return 0


def in_loop(broker: Broker, function: Callable[[], object]) -> None:
    """Run `function` on the broker's event-loop thread (cProfile profiles its caller's)."""
    done = threading.Event()

    def run() -> None:
        function()
        done.set()

    broker._loop.call_soon_threadsafe(run)
    if not done.wait(30):
        raise TimeoutError("the broker's loop did not run the call")


if __name__ == "__main__":
    sys.exit(main())
