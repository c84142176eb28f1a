"""One group consumer in its own process, for the consumer group tests (leave, crash).

    group_worker.py CLIENT BOOTSTRAP GROUP TOPIC LOG_PATH SESSION_TIMEOUT_MS [INSTANCE_ID]

CLIENT is confluent, kafka-python or aiokafka. The worker subscribes to TOPIC in GROUP,
and for every polled batch: "processes" each record by appending "r PARTITION OFFSET VALUE"
to LOG_PATH (one unbuffered O_APPEND write per batch, so a SIGKILL never leaves a line
half-written), then commits the next offsets synchronously (manual commit after
processing). Whenever its assignment changes it logs "a P1,P2,..."; a failed commit
(rebalance in progress, stale generation) logs "f ..." and the records are simply
processed again by their next owner (at least once).

SIGTERM: final commit, close (a dynamic member sends LeaveGroup), log "closed", exit 0.
SIGKILL is the crash: no LeaveGroup, the coordinator notices when the session expires.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import threading

POLL_S = 0.2
RECORDS_PER_POLL_MAX = 200
# Far below the 5-minute default: a rebalance waits at most this long for members to
# rejoin, so a test never hangs on a client that is slow to notice a rebalance.
MAX_POLL_INTERVAL_MS = 15_000


class Log:
    def __init__(self, path: str) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._assignment: tuple[int, ...] | None = None

    def write(self, lines: list[str]) -> None:
        if lines:
            os.write(self._fd, ("\n".join(lines) + "\n").encode())

    def records(self, records: list[tuple[int, int, bytes]]) -> None:
        self.write([f"r {p} {o} {v.decode()}" for p, o, v in records])

    def assignment(self, partitions: set[int]) -> None:
        current = tuple(sorted(partitions))
        if current != self._assignment and (current or self._assignment is not None):
            self._assignment = current
            self.write([f"a {','.join(map(str, current))}"])


def run_confluent(args: dict, log: Log, stop: threading.Event) -> None:
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    config = {"bootstrap.servers": args["bootstrap"], "group.id": args["group"],
              "enable.auto.commit": False, "auto.offset.reset": "earliest",
              "session.timeout.ms": args["session_ms"],
              "heartbeat.interval.ms": args["session_ms"] // 6,
              "max.poll.interval.ms": MAX_POLL_INTERVAL_MS}
    if args["instance"]:
        config["group.instance.id"] = args["instance"]
    consumer = Consumer(config)
    consumer.subscribe([args["topic"]])
    while not stop.is_set():
        messages = [m for m in consumer.consume(RECORDS_PER_POLL_MAX, timeout=POLL_S)
                    if not m.error()]
        log.assignment({tp.partition for tp in consumer.assignment()})
        if not messages:
            continue
        log.records([(m.partition(), m.offset(), m.value()) for m in messages])
        next_offsets = {m.partition(): m.offset() + 1 for m in messages}
        try:
            consumer.commit(offsets=[TopicPartition(args["topic"], p, o)
                                     for p, o in next_offsets.items()], asynchronous=False)
        except KafkaException as exc:
            log.write([f"f {exc.args[0].name()}"])
    consumer.close()


def run_kafka_python(args: dict, log: Log, stop: threading.Event) -> None:
    from kafka import KafkaConsumer
    from kafka.errors import KafkaError
    from kafka.structs import OffsetAndMetadata

    consumer = KafkaConsumer(
        args["topic"], bootstrap_servers=args["bootstrap"], group_id=args["group"],
        enable_auto_commit=False, auto_offset_reset="earliest",
        session_timeout_ms=args["session_ms"], heartbeat_interval_ms=args["session_ms"] // 6,
        max_poll_interval_ms=MAX_POLL_INTERVAL_MS, group_instance_id=args["instance"])
    while not stop.is_set():
        batches = consumer.poll(timeout_ms=int(POLL_S * 1000), max_records=RECORDS_PER_POLL_MAX)
        log.assignment({tp.partition for tp in consumer.assignment()})
        records = [(m.partition, m.offset, m.value) for ms in batches.values() for m in ms]
        if not records:
            continue
        log.records(records)
        offsets = {tp: OffsetAndMetadata(ms[-1].offset + 1, "", -1) for tp, ms in batches.items()}
        try:
            consumer.commit(offsets)
        except KafkaError as exc:
            log.write([f"f {type(exc).__name__}"])
    consumer.close()


async def run_aiokafka(args: dict, log: Log, stop: asyncio.Event) -> None:
    from aiokafka import AIOKafkaConsumer
    from aiokafka.errors import KafkaError

    consumer = AIOKafkaConsumer(
        args["topic"], bootstrap_servers=args["bootstrap"], group_id=args["group"],
        enable_auto_commit=False, auto_offset_reset="earliest",
        session_timeout_ms=args["session_ms"], heartbeat_interval_ms=args["session_ms"] // 6,
        max_poll_interval_ms=MAX_POLL_INTERVAL_MS, group_instance_id=args["instance"])
    await consumer.start()
    while not stop.is_set():
        batches = await consumer.getmany(timeout_ms=int(POLL_S * 1000),
                                         max_records=RECORDS_PER_POLL_MAX)
        log.assignment({tp.partition for tp in consumer.assignment()})
        records = [(m.partition, m.offset, m.value) for ms in batches.values() for m in ms]
        if not records:
            continue
        log.records(records)
        try:
            await consumer.commit({tp: ms[-1].offset + 1 for tp, ms in batches.items()})
        except KafkaError as exc:
            log.write([f"f {type(exc).__name__}"])
    await consumer.stop()


def main() -> None:
    client, bootstrap, group, topic, log_path, session_ms = sys.argv[1:7]
    args = {"bootstrap": bootstrap, "group": group, "topic": topic,
            "session_ms": int(session_ms), "instance": sys.argv[7] if len(sys.argv) > 7 else None}
    log = Log(log_path)
    if client == "aiokafka":
        async def run() -> None:
            stop = asyncio.Event()
            asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
            await run_aiokafka(args, log, stop)
        asyncio.run(run())
    else:
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        {"confluent": run_confluent, "kafka-python": run_kafka_python}[client](args, log, stop)
    log.write(["closed"])


if __name__ == "__main__":
    main()
