"""kafkajs, an independent implementation of the Kafka protocol (with transactions),
against the onceflow broker: idempotent and transactional produce, sendOffsets, and a
read_committed group consumer. confluent-kafka then reads the same topic back, so both
clients agree on what was committed."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition

from tests.helpers import unique

JS_DIR = Path(__file__).resolve().parents[1] / "js"
PLAIN, COMMITTED, ABORTED = 1000, 100, 50


@pytest.fixture(scope="module")
def node() -> str:
    # `make test` installs Node.js and kafkajs (scripts/setup.sh); missing means a broken
    # setup, which must fail rather than skip.
    path = shutil.which("node")
    assert path, "node not found: scripts/setup.sh installs it"
    assert (JS_DIR / "node_modules" / "kafkajs").is_dir(), "kafkajs not installed: run scripts/setup.sh"
    return path


def test_kafkajs_transactions_and_read_committed(node: str, onceflow_broker) -> None:
    bootstrap = onceflow_broker.bootstrap_servers
    topic, offsets_topic, group = unique("kjs"), unique("kjs-offsets"), unique("kjs-group")
    done = subprocess.run([node, str(JS_DIR / "kafkajs_check.js"), bootstrap, topic, offsets_topic, group],
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["seen"] == {"plain": PLAIN, "committed": COMMITTED, "aborted": 0,
                              "headers_ok": PLAIN + COMMITTED}
    assert report["group_offset"] == 42

    kinds = _read_committed_kinds(bootstrap, topic)
    assert kinds == {"plain": PLAIN, "committed": COMMITTED}


def _read_committed_kinds(bootstrap: str, topic: str) -> dict[str, int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("cross"),
                         "isolation.level": "read_committed", "enable.partition.eof": True})
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(3)])
        kinds: dict[str, int] = {}
        eof: set[int] = set()
        for _ in range(2000):
            message = consumer.poll(0.5)
            if message is None:
                continue
            if message.error():
                eof.add(message.partition())
                if len(eof) == 3:
                    break
                continue
            kind = json.loads(message.value())["kind"]
            kinds[kind] = kinds.get(kind, 0) + 1
        return kinds
    finally:
        consumer.close()
