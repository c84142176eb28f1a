"""SIGKILL of the processing process, then a restart: every record is processed at
least once, and records that the last commit covered — below the watermark or in the
offset map — are not processed again."""

from __future__ import annotations

import processor_support as support
import pytest

from onceflow.processor import offset_map

RECORDS = 2000


def covered_by_commit(bootstrap: str, group: str, topic: str) -> tuple[set[tuple[int, int]], int]:
    """(partition, offset) pairs the committed offsets and maps say are done, and how
    many of those lie above the watermarks (the offset maps' share)."""
    covered: set[tuple[int, int]] = set()
    above = 0
    for tp in support.committed(bootstrap, group, topic):
        if tp.offset < 0:
            continue
        covered.update((tp.partition, o) for o in range(tp.offset))
        for start, end in offset_map.decode(tp.metadata, tp.offset) or []:
            covered.update((tp.partition, o) for o in range(start, end))
            above += end - start
    return covered, above


@pytest.mark.timeout(60)
def test_sigkill_then_restart_is_at_least_once_and_skips_mapped(
    kafka_bootstrap: str, make_topic, on_mock: bool, tmp_path
) -> None:
    topic = make_topic("crash")
    support.produce(kafka_bootstrap, topic, ((str(i % 100).encode(), b"x") for i in range(RECORDS)))
    group = support.unique("crash")
    session_ms = support.env_session_timeout_ms(on_mock)
    anchor = support.GroupAnchor(
        kafka_bootstrap, group, mock=on_mock, session_timeout_ms=session_ms
    )
    try:
        kill_and_restart(kafka_bootstrap, group, topic, tmp_path, str(session_ms))
    finally:
        anchor.close()


def kill_and_restart(
    kafka_bootstrap: str, group: str, topic: str, tmp_path, session_ms: str
) -> None:
    first_log, second_log = tmp_path / "first.log", tmp_path / "second.log"

    # First run: offset 5 of every partition stalls, with it the keys sharing its lane;
    # the other keys complete above it.
    first = support.Worker(
        ["log", kafka_bootstrap, group, topic, str(first_log), session_ms, "1"], first_log
    )
    try:
        assert support.wait_until(
            lambda: len(support.processed_lines(first_log)) >= RECORDS // 2, timeout_s=30
        ), first_log.with_suffix(".stderr").read_text()[-2000:]
        # Let a few commit intervals pass so the map of what completed is committed.
        assert support.wait_until(
            lambda: covered_by_commit(kafka_bootstrap, group, topic)[1] >= RECORDS * 2 // 5,
            timeout_s=10,
        )
    finally:
        first.kill()
    covered, above_watermark = covered_by_commit(kafka_bootstrap, group, topic)
    processed_before = set(support.processed_lines(first_log))
    assert covered <= processed_before  # a commit never claims an unprocessed record
    assert above_watermark >= RECORDS * 2 // 5  # the map carries most of the completed work

    second = support.Worker(
        ["log", kafka_bootstrap, group, topic, str(second_log), session_ms], second_log
    )
    try:
        everything = {
            (p, o)
            for p, end in support.end_offsets(kafka_bootstrap, topic).items()
            for o in range(end)
        }
        assert support.wait_until(
            lambda: processed_before | set(support.processed_lines(second_log)) >= everything,
            timeout_s=35,
        ), second_log.with_suffix(".stderr").read_text()[-2000:]
    finally:
        second.kill()
    reprocessed = set(support.processed_lines(second_log))
    assert not reprocessed & covered, "records covered by the commit ran again"
    # The stalled records (never completed before the kill) did run in the second life.
    assert {(p, 5) for p in range(support.PARTITIONS)} <= reprocessed
