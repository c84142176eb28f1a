"""The completed-offsets map in the commit metadata: round trips, cap, robustness."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from onceflow.processor import offset_map


@st.composite
def maps(draw: st.DrawFn) -> tuple[int, list[tuple[int, int]]]:
    watermark = draw(st.integers(0, 2**40))
    ranges, position = [], watermark + 1
    for _ in range(draw(st.integers(0, 40))):
        position += draw(st.integers(0, 1000))
        length = draw(st.integers(1, 1000))
        ranges.append((position, position + length))
        position += length + 1
    return watermark, ranges


@settings(max_examples=300)
@given(maps())
def test_round_trip_when_it_fits(case) -> None:
    watermark, ranges = case
    text, kept = offset_map.encode(watermark, ranges, bytes_max=10_000)
    assert kept == ranges
    assert offset_map.decode(text, watermark) == (ranges or None)
    assert offset_map.decode(text, watermark + 1) is None  # someone moved the offset


@settings(max_examples=300)
@given(maps(), st.integers(8, 200))
def test_cap_drops_highest_ranges_only(case, bytes_max: int) -> None:
    watermark, ranges = case
    text, kept = offset_map.encode(watermark, ranges, bytes_max=bytes_max)
    assert len(text) <= bytes_max
    assert kept == ranges[: len(kept)]  # a prefix: lower offsets are kept first
    assert (offset_map.decode(text, watermark) or []) == kept


@settings(max_examples=200)
@given(maps(), st.integers(8, 120))
def test_required_ranges_are_never_dropped(case, bytes_max: int) -> None:
    watermark, ranges = case
    split = len(ranges) // 2
    optional, required = ranges[:split], ranges[split:]
    text, kept = offset_map.encode(watermark, optional, bytes_max=bytes_max, required=required)
    decoded = offset_map.decode(text, watermark) or []
    assert decoded == kept
    assert all(r in kept for r in required)


def test_adjacent_and_overlapping_ranges_merge_and_low_ones_clip() -> None:
    text, kept = offset_map.encode(10, [(5, 12), (12, 15), (14, 20), (30, 31)])
    assert kept == [(11, 20), (30, 31)]
    assert offset_map.decode(text, 10) == kept


def test_empty_map_is_empty_string() -> None:
    assert offset_map.encode(10, []) == ("", [])
    assert offset_map.decode("", 10) is None
    assert offset_map.decode(None, 10) is None


@given(st.text(max_size=200))
def test_garbage_never_raises(text: str) -> None:
    assert offset_map.decode(text, 0) is None or text.startswith(offset_map.PREFIX)
    offset_map.decode(offset_map.PREFIX + text, 0)  # must not raise


@given(st.binary(max_size=100))
def test_garbage_bytes_never_raise(raw: bytes) -> None:
    import base64

    text = offset_map.PREFIX + base64.urlsafe_b64encode(raw).decode().rstrip("=")
    result = offset_map.decode(text, 0)
    assert result is None or all(0 < a < b for a, b in result)
