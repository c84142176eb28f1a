"""The Java producer through lost Produce answers (issue 15): a lost answer stalls its
connection as a real network loss does (broker/faults.py), the client times out,
reconnects and retries, and with five requests in flight every record is stored exactly
once and in order. (Skipping one answer and sending the next, as the fault once did, is
something no real broker does, and the Java client could not match answers to requests.)
"""

from __future__ import annotations

import json
import subprocess
import time

from confluent_kafka import Consumer, TopicPartition

from tests.helpers import create_topic, unique
from tests.java_support import java_command

DROPS = 3
REQUEST_TIMEOUT_MS = 1_500  # the Java client's request.timeout.ms: how long a stall lasts
WAIT_S = 60  # generous: a loaded 2-core machine
READ_TIMEOUT_S = 30


def duplicates(broker, topic: str) -> float:
    registry = broker.server.state.metrics.registry
    return registry.get_sample_value("onceflow_producer_duplicates_total", {"topic": topic}) or 0


def fired(broker, rule_id: int) -> int:
    return sum(r["fired"] for r in broker.faults.rules() if r["id"] == rule_id)


def wait_for(condition, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def stored_values(bootstrap: str, topic: str) -> list[int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("check"),
                         "enable.auto.commit": False})
    try:
        partition = TopicPartition(topic, 0, 0)
        _low, high = consumer.get_watermark_offsets(partition, timeout=READ_TIMEOUT_S)
        consumer.assign([partition])
        values: list[int] = []
        deadline = time.monotonic() + READ_TIMEOUT_S
        while len(values) < high and time.monotonic() < deadline:
            for message in consumer.consume(10_000, timeout=0.5):
                assert not message.error(), message.error()
                values.append(int(message.value()))
        return values
    finally:
        consumer.close()


def test_java_idempotent_producer_with_five_in_flight_through_lost_answers(onceflow_broker):
    broker = onceflow_broker
    topic = create_topic(broker.bootstrap_servers, unique("java-lost"), 1)
    command = java_command("LostAnswers", broker.bootstrap_servers, topic,
                           str(REQUEST_TIMEOUT_MS))
    java = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        for drop in range(1, DROPS + 1):
            # One lost answer at a time: the next only once the client retried the last.
            rule = broker.faults.drop_responses("produce", count=1)
            wait_for(lambda rule=rule: fired(broker, rule) == 1, f"drop {drop} to fire")
            wait_for(lambda drop=drop: duplicates(broker, topic) >= drop,
                     f"the retry after drop {drop}")
        out, err = java.communicate("stop\n", timeout=WAIT_S)
    finally:
        broker.faults.clear()
        if java.poll() is None:
            java.kill()
            java.wait()
    assert java.returncode == 0, err[-4000:]
    [result] = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert result["errors"] == 0, result["first_error"]
    assert result["acked_in_order"]
    assert stored_values(broker.bootstrap_servers, topic) == list(range(result["sent"]))
