"""FetchSessionCache's slot rules and epoch arithmetic (pure logic, no broker)."""

from __future__ import annotations

from onceflow.broker.runtime.fetch_sessions import FetchSessionCache, next_epoch


def _parts(count: int) -> list:
    return [(("t", i), 0, 1024) for i in range(count)]


def test_epochs_wrap_to_one():
    assert next_epoch(1) == 2
    assert next_epoch(2**31 - 1) == 1


def test_zero_slots_means_no_sessions():
    assert FetchSessionCache(0).create(0, True, _parts(3)) is None


def test_stale_session_gives_its_slot_even_to_a_smaller_one():
    cache = FetchSessionCache(1, eviction_ms=-1)   # every session counts as idle
    big = cache.create(0, True, _parts(5))
    small = cache.create(0, True, _parts(1))
    assert big is not None and small is not None
    assert cache.get(big.session_id, 0) is None and cache.get(small.session_id, 0) is small
    assert cache.evictions == 1


def test_busy_sessions_yield_only_to_larger_ones():
    cache = FetchSessionCache(1)
    first = cache.create(0, False, _parts(2))
    assert cache.create(0, False, _parts(2)) is None          # not larger: no session
    larger = cache.create(0, False, _parts(3))
    assert larger is not None and cache.get(first.session_id, 0) is None


def test_sessions_belong_to_their_node():
    cache = FetchSessionCache(10)
    session = cache.create(1, True, _parts(1))
    assert cache.get(session.session_id, 2) is None
    assert cache.get(session.session_id, 1) is session


def test_incremental_answer_rules():
    cache = FetchSessionCache(10)
    session = cache.create(0, True, _parts(2))
    first, second = ("t", 0), ("t", 1)
    same = dict(error=False, has_records=False, high_watermark=5, last_stable_offset=5,
                log_start_offset=0)
    assert session.must_answer(first, **same)        # never answered: changed
    assert not session.must_answer(first, **same)    # nothing new
    assert session.must_answer(first, **{**same, "high_watermark": 6})
    assert session.must_answer(first, **{**same, "high_watermark": 6, "error": True})
    assert session.must_answer(second, **{**same, "has_records": True})
    assert list(session.partitions) == [first, second]
    session.must_answer(first, **{**same, "high_watermark": 6, "has_records": True})
    assert list(session.partitions) == [second, first]   # records: to the end
    session.update([(("t", 2), 7, 100)], forgotten=[second])
    assert list(session.partitions) == [first, ("t", 2)]
    assert session.partitions[("t", 2)].fetch_offset == 7
