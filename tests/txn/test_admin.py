"""DescribeTransactions and ListTransactions (Kafka's fields and filters)."""

from kio.schema.errors import ErrorCode

from onceflow.txn import TopicPartition
from tests.txn.harness import FakeBroker

E = ErrorCode


def fleet() -> tuple[FakeBroker, dict[str, int]]:
    """idle: Empty; open: Ongoing since t0; done: CompleteCommit; old-open: Ongoing since t0-30s."""
    b = FakeBroker()
    pids = {t: b.producer(t)[0] for t in ("idle", "open", "done", "old-open")}
    b.add("old-open", pids["old-open"], 0, ("x", 0))
    b.now_ms += 30_000
    b.add("open", pids["open"], 0, ("x", 1), ("y", 0))
    b.add("done", pids["done"], 0, ("x", 2))
    b.end("done", pids["done"], 0)
    return b, pids


def test_describe():
    b, pids = fleet()
    described = {d.transactional_id: d for d in b.coord.describe_transactions(
        ["open", "idle", "missing", ""])}
    d = described["open"]
    assert (d.error, d.transaction_state, d.transaction_timeout_ms, d.producer_id,
            d.producer_epoch) == (E.none, "Ongoing", 60_000, pids["open"], 0)
    assert d.transaction_start_time_ms == b.now_ms
    assert d.topics == (("x", (1,)), ("y", (0,)))
    assert described["idle"].transaction_state == "Empty"
    assert described["idle"].transaction_start_time_ms == -1 and described["idle"].topics == ()
    assert described["missing"].error is E.transactional_id_not_found
    assert described[""].error is E.invalid_request


def test_describe_during_markers_lists_partitions_still_without_one():
    b, pids = fleet()
    b.marker_errors[TopicPartition("y", 0)].append(E.not_leader_or_follower)
    b.end("open", pids["open"], 0)
    (d,) = b.coord.describe_transactions(["open"])
    assert (d.transaction_state, d.topics) == ("PrepareCommit", (("y", (0,)),))


def names(result) -> set[str]:
    assert result.error is E.none
    return {t.transactional_id for t in result.transactions}


def test_list_filters():
    b, pids = fleet()
    ls = b.coord.list_transactions
    now = b.now_ms
    assert names(ls(now_ms=now)) == {"idle", "open", "done", "old-open"}
    assert names(ls(state_filters=["Ongoing"], now_ms=now)) == {"open", "old-open"}
    assert names(ls(producer_id_filters=[pids["idle"], pids["done"]], now_ms=now)) == {
        "idle", "done"}
    # running longer than 10 s: Kafka compares now - start in every state, so Empty ids
    # (start -1) match too; the CLI combines it with the Ongoing filter
    assert names(ls(state_filters=["Ongoing"], duration_filter_ms=10_000, now_ms=now)) == {
        "old-open"}
    assert "idle" in names(ls(duration_filter_ms=10_000, now_ms=now))
    assert names(ls(transactional_id_pattern=".*open", now_ms=now)) == {"open", "old-open"}
    assert names(ls(transactional_id_pattern="open", now_ms=now)) == {"open"}  # whole id
    result = ls(state_filters=["Ongoing", "Bogus"], now_ms=now)
    assert result.unknown_state_filters == ("Bogus",)
    listed = {t.transactional_id: t for t in ls(now_ms=now).transactions}
    assert (listed["done"].producer_id, listed["done"].transaction_state) == (
        pids["done"], "CompleteCommit")
    assert ls(transactional_id_pattern="(", now_ms=now).error is E.invalid_request
