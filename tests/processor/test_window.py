"""OffsetWindow: whatever order completions arrive in, the watermark is the end of the
contiguous completed run, never beyond a pending offset, and the bound holds."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from onceflow.processor.window import BEHIND, FULL, OffsetWindow, WindowFull


@st.composite
def schedules(draw: st.DrawFn) -> tuple[int, list[int], list[tuple[str, int]]]:
    """A start offset, increasing offsets with gaps, and an interleaving of
    registrations and completions (each completion after its registration)."""
    start = draw(st.integers(0, 1000))
    gaps = draw(st.lists(st.integers(0, 3), min_size=1, max_size=60))
    offsets, position = [], start
    for gap in gaps:
        position += gap
        offsets.append(position)
        position += 1
    # Complete a random subset, in a random order, interleaved with registration.
    completed = draw(st.lists(st.sampled_from(offsets), unique=True))
    events: list[tuple[str, int]] = []
    pending_completions = list(completed)
    registered: set[int] = set()
    for offset in offsets:
        events.append(("register", offset))
        registered.add(offset)
        ready = [o for o in pending_completions if o in registered]
        for o in draw(st.lists(st.sampled_from(ready), unique=True)) if ready else []:
            events.append(("complete", o))
            pending_completions.remove(o)
    events.extend(("complete", o) for o in draw(st.permutations(pending_completions)))
    return start, offsets, events


def expected_watermark(start: int, registered: list[int], done: set[int]) -> int:
    incomplete = [o for o in registered if o not in done]
    if incomplete:
        return min(incomplete)
    return registered[-1] + 1 if registered else start


@settings(max_examples=300, deadline=None)
@given(schedules())
def test_watermark_is_end_of_contiguous_completed_run(schedule) -> None:
    start, offsets, events = schedule
    window = OffsetWindow(capacity=len(offsets), start_offset=start)
    registered: list[int] = []
    done: set[int] = set()
    previous = window.watermark
    for kind, offset in events:
        if kind == "register":
            window.register(offset)
            registered.append(offset)
        else:
            assert window.complete(offset)
            done.add(offset)
        watermark = window.watermark
        assert watermark == expected_watermark(start, registered, done)
        # Never beyond a pending offset; never moving backwards.
        assert all(watermark <= o for o in registered if o not in done)
        assert previous is not None and watermark >= previous
        previous = watermark
        assert window.size <= window.capacity
        assert window.incomplete_count == len(registered) - len(done)


@settings(max_examples=200, deadline=None)
@given(schedules())
def test_completed_ranges_cover_exactly_the_done_offsets_above_watermark(schedule) -> None:
    start, offsets, events = schedule
    window = OffsetWindow(capacity=len(offsets), start_offset=start)
    registered: list[int] = []
    done: set[int] = set()
    for kind, offset in events:
        if kind == "register":
            window.register(offset)
            registered.append(offset)
        else:
            window.complete(offset)
            done.add(offset)
        watermark = window.watermark
        ranges = window.completed_ranges()
        covered = {o for o in registered if any(a <= o < b for a, b in ranges)}
        assert covered == {o for o in done if o > watermark}
        # A range never spans an incomplete registered offset, and ranges are disjoint.
        assert all(not any(a <= o < b for a, b in ranges) for o in registered if o not in done)
        assert all(b1 < a2 for (_, b1), (a2, _) in itertools.pairwise(ranges))


@given(st.integers(1, 50), st.integers(0, 100))
def test_capacity_bounds_registered_offsets(capacity: int, extra: int) -> None:
    window = OffsetWindow(capacity)
    for offset in range(capacity):
        window.register(offset)
    assert not window.has_room
    with pytest.raises(WindowFull):
        window.register(capacity + extra)
    # Completing anything but the head frees nothing: the bound is on the span.
    if capacity > 1:
        window.complete(capacity - 1)
        assert not window.has_room
    window.complete(0)
    assert window.has_room


def test_head_completion_slides_over_completed_offsets() -> None:
    window = OffsetWindow(10, start_offset=12)
    assert window.watermark == 12
    for offset in (12, 13, 14, 16, 17, 18):  # 15 was a control record
        window.register(offset)
    for offset in (14, 16, 18):
        window.complete(offset)
    assert window.watermark == 12
    assert window.completed_ranges() == [(14, 17), (18, 19)]
    window.complete(12)
    assert window.watermark == 13
    window.complete(13)
    assert window.watermark == 17
    window.complete(17)
    assert window.watermark == 19
    assert window.size == 0


def test_rejects_going_backwards_and_double_completion() -> None:
    window = OffsetWindow(4)
    assert window.watermark is None
    window.register(7)
    with pytest.raises(ValueError):
        window.register(7)
    assert window.complete(7)
    assert not window.complete(7)
    assert not window.complete(99)
    assert window.watermark == 8


def test_offer_is_register_without_exceptions() -> None:
    window = OffsetWindow(2)
    assert window.offer(5) == 1
    assert window.offer(5) == BEHIND  # a re-delivery
    assert window.offer(9) == 2
    assert window.offer(10) == FULL
    assert window.watermark == 5
    assert window.complete(5)
    assert window.offer(10) == 2
