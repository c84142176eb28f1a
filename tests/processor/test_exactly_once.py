"""Exactly-once mode: outputs and input offsets commit in one transaction per commit
interval, so a read_committed reader sees each input's output exactly once, also
after the processing process is SIGKILLed again and again.

Against librdkafka's mock cluster (2.16) the crash test cannot pass, and says so with
an xfail after running: the mock acknowledges TxnOffsetCommit without storing the
offsets, its read_committed fetches return aborted and open-transaction records, and
it does not fence a transactional id's older epoch. Run it against a real broker with
ONCEFLOW_PROCESSOR_BROKER=onceflow (or =external) once transactions are served.
"""

from __future__ import annotations

import random
import time
from collections import Counter

import processor_support as support
import pytest

from onceflow.processor import Output, Processor, ProcessorConfig, Record

KILLS = 10
RECORDS = 2000
STARTED_TIMEOUT_S = 20  # a restarted worker must process something within this


def expected_values(topic: str, ends: dict[int, int]) -> Counter[bytes]:
    return Counter(f"{topic}:{p}:{o}".encode() for p, end in ends.items() for o in range(end))


@pytest.mark.timeout(60)
def test_outputs_commit_once_without_crashes(kafka_bootstrap: str, make_topic) -> None:
    topic = make_topic("eos-plain")
    out_topic = make_topic("eos-plain-out")
    support.produce(kafka_bootstrap, topic, ((str(i % 50).encode(), b"x") for i in range(500)))
    group = support.unique("eos-plain")

    def handle(record: Record) -> Output:
        return Output(
            out_topic, f"{record.topic}:{record.partition}:{record.offset}".encode(), record.key
        )

    config = ProcessorConfig(
        concurrency=8,
        commit_interval_ms=100,
        exactly_once=True,
        transactional_id=f"{group}-tx",
        transaction_timeout_ms=10_000,
    )
    with Processor(
        bootstrap_servers=kafka_bootstrap,
        group_id=group,
        topics=[topic],
        handler=handle,
        config=config,
    ) as processor:
        processor.start()
        assert support.wait_until(lambda: processor.statistics().total("processed") >= 500, 30)
        assert support.wait_until(lambda: processor.metrics.transactions["committed"] >= 1, 10)
    outputs = support.read_all(kafka_bootstrap, out_topic, expected=500, timeout_s=10)
    assert Counter(m.value() for m in outputs) == expected_values(
        topic, support.end_offsets(kafka_bootstrap, topic)
    )
    assert processor.metrics.transactions["aborted"] == 0


@pytest.mark.timeout(60)
def test_exactly_once_survives_repeated_sigkill(
    kafka_bootstrap: str, make_topic, on_mock: bool, tmp_path
) -> None:
    topic = make_topic("eos")
    support.create_topic(kafka_bootstrap, f"{topic}-out", mock=on_mock)
    support.produce(kafka_bootstrap, topic, ((str(i % 100).encode(), b"x") for i in range(RECORDS)))
    group = support.unique("eos")
    session_ms = support.env_session_timeout_ms(on_mock)
    anchor = support.GroupAnchor(
        kafka_bootstrap, group, mock=on_mock, session_timeout_ms=session_ms
    )
    try:
        run_with_kills(kafka_bootstrap, group, topic, tmp_path / "eos.log", on_mock, session_ms)
    finally:
        anchor.close()


def run_with_kills(
    bootstrap: str, group: str, topic: str, log, on_mock: bool, session_ms: int
) -> None:
    args = ["eos", bootstrap, group, topic, str(log), str(session_ms)]
    rng = random.Random()
    for _ in range(KILLS):
        before = len(support.processed_lines(log))
        worker = support.Worker(args, log)
        # Kill at a random moment once this life has started processing.
        assert support.wait_until(
            lambda before=before: len(support.processed_lines(log)) > before,
            timeout_s=STARTED_TIMEOUT_S,
        ), log.with_suffix(".stderr").read_text()[-2000:]
        time.sleep(rng.uniform(0.0, 0.5))
        worker.kill()
    final = support.Worker(args, log)
    try:
        expected = expected_values(topic, support.end_offsets(bootstrap, topic))
        finished = support.wait_for_values(bootstrap, f"{topic}-out", set(expected), timeout_s=25)
    finally:
        final.stop()
    assert finished, "the final life did not output every input"
    # Read after the graceful stop: the last transaction has committed.
    outputs = support.read_all(bootstrap, f"{topic}-out", expected=len(expected), timeout_s=10)
    seen = Counter(m.value() for m in outputs)
    missing = expected - seen
    duplicated = {value: n for value, n in seen.items() if n > 1}
    processed = len(support.processed_lines(log))
    report = f"{len(missing)} missing, {len(duplicated)} duplicated, {processed} handler runs"
    if on_mock and (missing or duplicated):
        pytest.xfail(f"mock cluster has no transactional offsets/read_committed: {report}")
    assert not missing and not duplicated, report
    assert processed > RECORDS  # the kills did force re-processing
