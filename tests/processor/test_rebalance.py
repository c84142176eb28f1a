"""Two, then three processor instances in one group, while records keep arriving:
partitions move between them and no record is lost; the final commit covers all."""

from __future__ import annotations

import threading
import time

import processor_support as support
import pytest

from onceflow.processor import Processor, ProcessorConfig, Record

RECORDS = 3000
PRODUCE_S = 4.0


class Collector:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.by_instance: dict[str, list[tuple[int, int]]] = {}

    def handler(self, name: str):
        self.by_instance[name] = []

        def handle(record: Record) -> None:
            time.sleep(0.001)
            with self.lock:
                self.by_instance[name].append((record.partition, record.offset))

        return handle

    def union(self) -> set[tuple[int, int]]:
        with self.lock:
            return {pair for pairs in self.by_instance.values() for pair in pairs}


def produce_slowly(bootstrap: str, topic: str) -> None:
    per_step = 100
    for step in range(RECORDS // per_step):
        batch = [(str((step * per_step + i) % 300).encode(), b"x") for i in range(per_step)]
        support.produce(bootstrap, topic, batch)
        time.sleep(PRODUCE_S / (RECORDS // per_step))


def stop_one_by_one(processors: list[Processor]) -> None:
    """Stop instances in turn, each time waiting until the others own every partition
    again, so the last one commits in a settled group."""
    for index, processor in enumerate(processors):
        processor.stop()
        rest = processors[index + 1 :]
        if rest:
            assert support.wait_until(
                lambda rest=rest: (
                    sum(len(p.statistics().assigned) for p in rest) == support.PARTITIONS
                ),
                timeout_s=15,
            )


@pytest.mark.timeout(60)
@pytest.mark.parametrize("strategy", ["cooperative-sticky", "range", "consumer-protocol"])
def test_two_then_three_instances_lose_nothing(
    kafka_bootstrap: str, make_topic, group_config, on_mock: bool, strategy: str
) -> None:
    if strategy == "consumer-protocol" and on_mock:
        pytest.skip("librdkafka's mock cluster does not speak ConsumerGroupHeartbeat")
    topic = make_topic("rebalance")
    group = support.unique("rebalance")
    collector = Collector()
    consumer_protocol = strategy == "consumer-protocol"
    config = ProcessorConfig(concurrency=8, commit_interval_ms=200, revoke_timeout_ms=3000,
                             group_protocol="consumer" if consumer_protocol else "classic")
    # the consumer protocol takes its timeouts and assignor from the broker
    consumer_config = {} if consumer_protocol else {
        **group_config, "partition.assignment.strategy": strategy}

    def instance(name: str) -> Processor:
        return Processor(
            bootstrap_servers=kafka_bootstrap,
            group_id=group,
            topics=[topic],
            handler=collector.handler(name),
            config=config,
            consumer_config=consumer_config,
        )

    producer = threading.Thread(target=produce_slowly, args=(kafka_bootstrap, topic))
    processors = [instance("a"), instance("b")]
    for processor in processors:
        processor.start()
    producer.start()
    try:
        assert support.wait_until(lambda: len(collector.union()) >= RECORDS // 4, timeout_s=20)
        third = instance("c")
        processors.append(third)
        third.start()
        assert support.wait_until(lambda: bool(third.statistics().assigned), timeout_s=20)
        producer.join(30)
        everything = {
            (p, o)
            for p, end in support.end_offsets(kafka_bootstrap, topic).items()
            for o in range(end)
        }
        assert len(everything) == RECORDS
        assert support.wait_until(lambda: collector.union() >= everything, timeout_s=20)
        stop_one_by_one(processors)
    finally:
        for processor in processors:
            processor.stop()
    assert collector.by_instance["c"], "the third instance never processed anything"
    ends = support.end_offsets(kafka_bootstrap, topic)
    assert {
        tp.partition: tp.offset for tp in support.committed(kafka_bootstrap, group, topic)
    } == ends
    total = sum(len(pairs) for pairs in collector.by_instance.values())
    assert total - RECORDS < RECORDS // 10  # a handful of redeliveries at most
