"""Producer id allocation: increasing, durable, never reused, also across SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from onceflow.storage.producer_ids import (
    PRODUCER_ID_BLOCK_SIZE,
    ProducerIdAllocator,
    ProducerIdFileCorrupt,
    decode_next_block_start,
    encode_next_block_start,
)


def test_ids_increase_from_zero_and_cross_blocks(tmp_path: Path) -> None:
    allocator = ProducerIdAllocator(tmp_path / "producer_ids", block_size=3)
    assert [allocator.next_id() for _ in range(7)] == list(range(7))
    assert decode_next_block_start((tmp_path / "producer_ids").read_bytes()) == 9


def test_the_block_is_recorded_before_its_first_id_is_handed_out(tmp_path: Path) -> None:
    path = tmp_path / "producer_ids"
    allocator = ProducerIdAllocator(path, block_size=10)
    assert not path.exists()
    assert allocator.next_id() == 0
    assert decode_next_block_start(path.read_bytes()) == 10


def test_a_restart_skips_the_rest_of_the_block(tmp_path: Path) -> None:
    path = tmp_path / "producer_ids"
    first = ProducerIdAllocator(path)
    handed_out = [first.next_id() for _ in range(5)]
    second = ProducerIdAllocator(path)
    assert second.next_id() == PRODUCER_ID_BLOCK_SIZE
    assert PRODUCER_ID_BLOCK_SIZE not in handed_out


def test_a_damaged_file_is_refused_rather_than_guessed(tmp_path: Path) -> None:
    path = tmp_path / "producer_ids"
    ProducerIdAllocator(path).next_id()
    raw = bytearray(path.read_bytes())
    raw[-1] ^= 0xFF
    path.write_bytes(bytes(raw))
    with pytest.raises(ProducerIdFileCorrupt):
        ProducerIdAllocator(path)


@given(st.integers(0, 2**63 - 1))
def test_file_round_trip(next_block_start: int) -> None:
    assert decode_next_block_start(encode_next_block_start(next_block_start)) == next_block_start


@given(st.binary(max_size=40))
def test_garbage_only_raises_corrupt(garbage: bytes) -> None:
    try:
        decode_next_block_start(garbage)
    except ProducerIdFileCorrupt:
        pass


CHILD_TIMEOUT_S = 60  # generous: two cores are shared with other work
ALLOCATING_CHILD = textwrap.dedent("""
    import sys
    from pathlib import Path
    from onceflow.storage.producer_ids import ProducerIdAllocator
    allocator = ProducerIdAllocator(Path(sys.argv[1]), block_size=int(sys.argv[2]))
    while True:
        print(allocator.next_id(), flush=True)
""")


def allocate_then_sigkill(path: Path, output: Path, count: int, block_size: int) -> list[int]:
    """Run a child that hands out ids as fast as it can, printing each to a file (so it never
    blocks on a pipe); SIGKILL it at whatever it is doing once it printed `count` ids.
    Returns every id it printed, i.e. every id it handed out."""
    with open(output, "w") as sink:
        child = subprocess.Popen(
            [sys.executable, "-c", ALLOCATING_CHILD, str(path), str(block_size)], stdout=sink)
    deadline = time.monotonic() + CHILD_TIMEOUT_S
    while output.read_text().count("\n") < count:
        assert time.monotonic() < deadline and child.poll() is None, "child did not allocate"
        time.sleep(0.001)
    os.kill(child.pid, signal.SIGKILL)
    assert child.wait() == -signal.SIGKILL
    return [int(line) for line in output.read_text().split()]


@pytest.mark.parametrize("block_size", [7, PRODUCER_ID_BLOCK_SIZE])
def test_no_id_repeats_after_sigkill_and_restart(tmp_path: Path, block_size: int) -> None:
    path = tmp_path / "producer_ids"
    seen: list[int] = []
    for run, count in enumerate((1, 25, 1_500, 3, 2_222)):
        ids = allocate_then_sigkill(path, tmp_path / f"run{run}.out", count, block_size)
        assert len(ids) >= count
        assert ids == sorted(ids)
        assert not seen or ids[0] > seen[-1]  # a restart never goes back
        seen.extend(ids)
    assert len(seen) == len(set(seen))
