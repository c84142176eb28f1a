"""Leftovers of a driver killed while Spark wrote a checkpoint file.

Spark writes each checkpoint file to a hidden temporary name and renames it. A kill
between the two leaves the temporary file, and when that happens to the very first offsets
file, Spark refuses to start the query again. `remove_partial_writes` deletes exactly those
leftovers.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from onceflow.spark import checkpoint
from tests.spark.support import create_topic, produce, unique


def leave_partial_write(directory: Path, name: str) -> list[Path]:
    """What Hadoop's atomic write leaves when it dies before the rename."""
    directory.mkdir(parents=True, exist_ok=True)
    temporary = directory / f".{name}.{uuid.uuid4()}.tmp"
    temporary.write_text('v1\n{"batchWatermarkMs":0}\n')  # cut short
    checksum = directory / f".{temporary.name}.crc"
    checksum.write_bytes(b"crc\x00")
    return [temporary, checksum]


def test_remove_partial_writes_deletes_only_the_leftovers(tmp_path: Path) -> None:
    offsets, commits = tmp_path / "offsets", tmp_path / "commits"
    leftovers = (leave_partial_write(offsets, "3") + leave_partial_write(commits, "2")
                 + leave_partial_write(tmp_path, "metadata"))
    kept = [offsets / "2", offsets / ".2.crc", offsets / "3", commits / "2", tmp_path / "metadata",
            offsets / ".notes.tmp"]  # not Hadoop's pattern: not ours to delete
    for path in kept:
        path.write_text("x")

    assert sorted(checkpoint.remove_partial_writes(tmp_path)) == sorted(leftovers)
    assert not any(path.exists() for path in leftovers)
    assert all(path.exists() for path in kept)
    assert checkpoint.remove_partial_writes(tmp_path) == []
    assert checkpoint.remove_partial_writes(tmp_path / "missing") == []


def _start(spark, bootstrap: str, topic: str, location: Path):
    return (spark.readStream.format("onceflow-kafka")
            .option("kafka.bootstrap.servers", bootstrap).option("subscribe", topic)
            .option("startingOffsets", "earliest").load()
            .writeStream.format("noop").option("checkpointLocation", str(location))
            .trigger(availableNow=True).start())


def test_spark_refuses_a_half_written_first_batch_until_it_is_removed(
        spark, bootstrap: str, tmp_path: Path) -> None:
    topic = create_topic(bootstrap, unique("partial-write"), partitions=1)
    produce(bootstrap, topic, [(b"k", b"v")] * 10)
    location = tmp_path / "checkpoint"
    leave_partial_write(location / "offsets", "0")

    refused = _start(spark, bootstrap, topic, location)
    with pytest.raises(Exception, match="CHECKPOINT_LOCATION_NOT_EMPTY"):
        refused.awaitTermination(120)

    assert len(checkpoint.remove_partial_writes(location)) == 2
    query = _start(spark, bootstrap, topic, location)
    assert query.awaitTermination(120)
    assert query.exception() is None
    assert checkpoint.batches_committed(location) == {0}
