"""Helpers of the Spark tests: put records in, read committed records out, and run a
Spark driver in a child process that a test can SIGKILL in the middle of a micro-batch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Self

from confluent_kafka import Consumer, Producer, TopicPartition

from onceflow.demo.processes import kill_tree
from onceflow.spark import checkpoint as spark_checkpoint
from tests.helpers import create_topic, unique, wait_for

__all__ = ["DriverProcess", "batches_committed", "batches_started", "create_topic", "produce",
           "read_committed", "unique", "wait_for"]

READ_IDLE_S = 3.0


def produce(bootstrap: str, topic: str, records: list[tuple[bytes | None, bytes]],
            partition: int | None = None) -> None:
    """Produce (key, value) pairs with acks=all and wait for every delivery."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "enable.idempotence": True})
    failures: list[str] = []

    def on_delivery(error, _message) -> None:
        if error is not None:
            failures.append(str(error))

    for key, value in records:
        kwargs = {} if partition is None else {"partition": partition}
        producer.produce(topic, value=value, key=key, on_delivery=on_delivery, **kwargs)
        producer.poll(0)
    assert producer.flush(30) == 0, "records still in flight after 30 s"
    assert not failures, failures[:3]


def read_committed(bootstrap: str, topic: str, timeout_s: float = 60.0) -> list:
    """Every record of `topic` a read_committed consumer sees, up to each partition's LSO."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("reader"),
                         "isolation.level": "read_committed", "enable.auto.commit": False,
                         "enable.partition.eof": True})
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in partitions}
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        records, done = [], {p for p, end in ends.items() if end == 0}
        deadline = time.monotonic() + timeout_s
        while len(done) < len(ends):
            assert time.monotonic() < deadline, f"read of {topic} did not reach its LSOs {ends}"
            message = consumer.poll(0.5)
            if message is None:
                continue
            if message.error():
                if message.error().code() == -191:  # _PARTITION_EOF
                    if consumer.position([TopicPartition(topic, message.partition())])[0].offset >= ends[message.partition()]:
                        done.add(message.partition())
                    continue
                raise AssertionError(str(message.error()))
            records.append(message)
            if message.offset() + 1 >= ends[message.partition()]:
                done.add(message.partition())
        return records
    finally:
        consumer.close()


class DriverProcess:
    """A Spark driver (a Python script or `onceflow pipeline run`) in a child process group.

    `kill()` SIGKILLs the whole process tree: the Python driver, its JVM and its Python workers,
    the way a machine failure would take them.
    """

    def __init__(self, command: list[str], log_path: Path, env: dict[str, str] | None = None) -> None:
        self.command = command
        self.log_path = log_path
        self.env = {**os.environ, **(env or {})}
        self.process: subprocess.Popen | None = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.kill()  # a failed test leaves no Spark driver running behind it

    def start(self) -> DriverProcess:
        with open(self.log_path, "a") as log:
            log.write(f"\n=== start {' '.join(self.command)}\n")
            log.flush()
            self.process = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT,
                                            env=self.env, start_new_session=True)
        return self

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            kill_tree(self.process.pid)
            self.process.wait()

    def wait(self, timeout_s: float) -> int:
        assert self.process is not None
        try:
            return self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"driver did not finish in {timeout_s:.0f} s; log:\n{self.tail()}") from None

    def wait_mid_batch(self, checkpoint: Path, after_batch: int, timeout_s: float = 120.0) -> int:
        """Wait until a batch later than `after_batch` is planned and not yet committed in this
        driver's `checkpoint`; return it. A timeout fails with the driver's log."""
        try:
            return spark_checkpoint.wait_mid_batch([checkpoint], after_batch, timeout_s)[1]
        except TimeoutError as exc:
            raise AssertionError(f"{exc}; driver log:\n{self.tail()}") from None

    def tail(self, chars: int = 4000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:]

    @staticmethod
    def python(script: Path, *args: str) -> list[str]:
        return [sys.executable, str(script), *args]


def batches_started(checkpoint: Path) -> set[int]:
    """Micro-batch ids whose offsets Spark has written (the batch is planned or running)."""
    return spark_checkpoint.batches_planned(checkpoint)


def batches_committed(checkpoint: Path) -> set[int]:
    """Micro-batch ids Spark has marked done in its commit log."""
    return spark_checkpoint.batches_committed(checkpoint)


def json_values(records: list) -> list[dict]:
    return [json.loads(record.value()) for record in records]
