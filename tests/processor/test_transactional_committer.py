"""The exactly-once commit cycle against a recording fake producer: one transaction
with the covered outputs and the offsets; abort and rewind on error; fatal raises."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, KafkaException

from onceflow.processor import Output, ProcessorError
from onceflow.processor.commit import TransactionalCommitter
from onceflow.processor.lanes import Mailbox
from onceflow.processor.metrics import LatencyHistogram, PartitionCounters
from onceflow.processor.partition import PartitionContext
from onceflow.processor.record import Record


class FakeProducer:
    def __init__(self, fail_commit: KafkaError | None = None) -> None:
        self.calls: list[tuple] = []
        self.fail_commit = fail_commit

    def init_transactions(self, timeout: float) -> None:
        self.calls.append(("init",))

    def begin_transaction(self) -> None:
        self.calls.append(("begin",))

    def produce(self, topic: str, **kwargs: object) -> None:
        self.calls.append(("produce", topic, kwargs["value"]))

    def send_offsets_to_transaction(self, offsets, metadata, timeout) -> None:
        self.calls.append(("offsets", [(tp.partition, tp.offset, tp.metadata) for tp in offsets]))

    def commit_transaction(self, timeout: float) -> None:
        if self.fail_commit is not None:
            raise KafkaException(self.fail_commit)
        self.calls.append(("commit",))

    def abort_transaction(self, timeout: float) -> None:
        self.calls.append(("abort",))

    def poll(self, timeout: float) -> int:
        return 0

    def flush(self, timeout: float) -> int:
        return 0


class FakeConsumer:
    def consumer_group_metadata(self) -> str:
        return "group-metadata"


def context_with_outputs() -> PartitionContext:
    """Offsets 0..4 registered; 0, 1, 3 completed with one output each."""
    ctx = PartitionContext(
        "in",
        0,
        max_pending_records=10,
        start_offset=0,
        done_ranges=None,
        concurrency=1,
        mailbox=Mailbox(),
        counters=PartitionCounters(),
        latency=LatencyHistogram(),
    )
    for offset in range(5):
        record = Record("in", 0, offset, b"k")
        ctx.accept(record)
    for offset in (0, 1, 3):
        ctx.outputs[offset] = [Output("out", f"o{offset}".encode())]
        ctx.window.complete(offset)
    return ctx


def test_one_transaction_with_covered_outputs_and_offsets() -> None:
    producer = FakeProducer()
    committer = TransactionalCommitter(producer, FakeConsumer(), 1024, timeout_s=5)
    ctx = context_with_outputs()
    assert committer.commit([ctx])
    kinds = [call[0] for call in producer.calls]
    assert kinds == ["init", "begin", "produce", "produce", "produce", "offsets", "commit"]
    produced = [call[2] for call in producer.calls if call[0] == "produce"]
    assert produced == [b"o0", b"o1", b"o3"]  # 3 is covered by the offset map
    (offsets,) = [call[1] for call in producer.calls if call[0] == "offsets"]
    assert offsets[0][:2] == (0, 2) and offsets[0][2].startswith("o1:")
    assert ctx.outputs == {}
    assert committer.commit([ctx])  # nothing new: no empty transaction
    assert [call[0] for call in producer.calls].count("begin") == 1


def test_without_offset_map_only_outputs_below_watermark_commit() -> None:
    producer = FakeProducer()
    committer = TransactionalCommitter(producer, FakeConsumer(), 0, timeout_s=5)
    ctx = context_with_outputs()
    assert committer.commit([ctx])
    produced = [call[2] for call in producer.calls if call[0] == "produce"]
    assert produced == [b"o0", b"o1"]
    assert list(ctx.outputs) == [3]  # waits for a later transaction


def test_abortable_error_aborts_and_asks_for_rewind() -> None:
    error = KafkaError(KafkaError._STATE, "abortable", txn_requires_abort=True)
    producer = FakeProducer(fail_commit=error)
    committer = TransactionalCommitter(producer, FakeConsumer(), 1024, timeout_s=5)
    ctx = context_with_outputs()
    assert not committer.commit([ctx])
    assert producer.calls[-1] == ("abort",)
    assert ctx.committed == (0, "")  # nothing marked committed
    assert committer.aborted == 1


def test_fatal_error_stops_the_processor() -> None:
    producer = FakeProducer(fail_commit=KafkaError(KafkaError._FENCED, "fenced", fatal=True))
    committer = TransactionalCommitter(producer, FakeConsumer(), 1024, timeout_s=5)
    with pytest.raises(ProcessorError):
        committer.commit([context_with_outputs()])
