"""A full disk (a small tmpfs): producers hear KAFKA_STORAGE_ERROR at once, nothing
acknowledged is lost, the failed log still serves its durable records, other partitions
write again once there is space, and after a restart the failed log serves and accepts
writes.

Needs to mount a tmpfs (root, or CAP_SYS_ADMIN); skipped with the reason otherwise.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, Producer

from onceflow.broker.embedded import Broker
from tests.helpers import TIMEOUT_S, create_topic, read_partition, unique

TMPFS_BYTES = 12 * 1024 * 1024
SPARE_BYTES = 3 * 1024 * 1024  # a file taken away once the disk is full: space comes back
VALUE = b"v" * 20_000
ANSWER_S_MAX = 5.0  # the issue asks for 1 s; a loaded CI machine gets slack, the figure is printed


@pytest.fixture
def small_disk(tmp_path: Path):
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={TMPFS_BYTES}", "tmpfs",
                             str(mount_point)], capture_output=True, text=True)
    if result.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {result.stderr.strip() or result.returncode}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


def _produce(bootstrap: str, topic: str, count: int) -> tuple[dict[int, bytes], list]:
    """(acknowledged offset -> value, [(error, seconds to the answer)])."""
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "retries": 0,
                         "linger.ms": 0, "message.timeout.ms": 30_000})
    acked: dict[int, bytes] = {}
    errors: list = []

    def report(sent_at: float):
        def on_delivery(error, message) -> None:
            if error is None:
                acked[message.offset()] = message.value()
            else:
                errors.append((error, time.monotonic() - sent_at))
        return on_delivery

    for i in range(count):
        producer.produce(topic, VALUE + str(i).encode(), partition=0,
                         on_delivery=report(time.monotonic()))
        producer.flush(TIMEOUT_S * 2)  # one at a time: each answer's delay is its own
        if errors:
            break
    return acked, errors


def _read(bootstrap: str, topic: str) -> dict[int, bytes]:
    return {m.offset(): m.value() for m in read_partition(bootstrap, topic, 0, 30)}


def test_disk_full_answers_storage_error_and_loses_nothing(small_disk):
    data_dir = small_disk / "data"
    spare = small_disk / "spare"
    spare.write_bytes(os.urandom(SPARE_BYTES))
    settings = {"offsets_topic_num_partitions": 1, "transaction_state_num_partitions": 1}
    with Broker(data_dir, **settings) as broker:
        bootstrap = broker.bootstrap_servers
        full, other = unique("full"), unique("other")
        create_topic(bootstrap, full)
        create_topic(bootstrap, other)
        acked, errors = _produce(bootstrap, full, 10_000)
        assert errors, "the disk never filled"
        error, answer_s = errors[0]
        print(f"{len(acked)} acknowledged; KAFKA_STORAGE_ERROR after {answer_s:.3f} s")
        assert error.code() == KafkaError.KAFKA_STORAGE_ERROR, error
        assert answer_s < ANSWER_S_MAX
        # The failed log is offline for writes (at once again), its durable records readable.
        _, again = _produce(bootstrap, full, 1)
        assert again and again[0][0].code() == KafkaError.KAFKA_STORAGE_ERROR
        assert _read(bootstrap, full) == acked
        # Space comes back: another partition writes again; the failed one waits for a restart.
        spare.unlink()
        other_acked, other_errors = _produce(bootstrap, other, 5)
        assert not other_errors and len(other_acked) == 5
    with Broker(data_dir, **settings) as broker:
        bootstrap = broker.bootstrap_servers
        later, later_errors = _produce(bootstrap, full, 3)
        assert not later_errors and len(later) == 3
        assert _read(bootstrap, full) == acked | later, "acknowledged records all there"


def test_fsync_failure_answers_storage_error_and_acknowledges_nothing(tmp_path, monkeypatch):
    """EIO from fsync (the kernel's answer faked for one partition's files: a disk that
    accepts writes into the page cache and then fails to persist them)."""
    settings = {"offsets_topic_num_partitions": 1, "transaction_state_num_partitions": 1}
    with Broker(tmp_path / "data", **settings) as broker:
        bootstrap = broker.bootstrap_servers
        failing, other = unique("eio"), unique("fine")
        create_topic(bootstrap, failing)
        create_topic(bootstrap, other)
        before, _ = _produce(bootstrap, failing, 3)
        real_fsync = os.fsync

        def fsync(fd: int) -> None:
            if f"/{failing}-0" in os.readlink(f"/proc/self/fd/{fd}"):
                raise OSError(5, "Input/output error (injected)")
            real_fsync(fd)

        monkeypatch.setattr(os, "fsync", fsync)
        acked, errors = _produce(bootstrap, failing, 1)
        assert not acked and errors, "nothing that did not reach the disk is acknowledged"
        assert errors[0][0].code() == KafkaError.KAFKA_STORAGE_ERROR, errors[0][0]
        print(f"KAFKA_STORAGE_ERROR after {errors[0][1]:.3f} s")
        assert errors[0][1] < ANSWER_S_MAX
        other_acked, other_errors = _produce(bootstrap, other, 3)
        assert not other_errors and len(other_acked) == 3, "other partitions keep serving"
        monkeypatch.setattr(os, "fsync", real_fsync)
    with Broker(tmp_path / "data", **settings) as broker:
        later, later_errors = _produce(broker.bootstrap_servers, failing, 2)
        assert not later_errors and len(later) == 2
        records = _read(broker.bootstrap_servers, failing)
        assert before.items() <= records.items() and later.items() <= records.items()


def test_find_coordinator_on_a_full_disk_answers_and_keeps_the_connection(small_disk):
    """__consumer_offsets is created on the first FindCoordinator; when the disk is full
    that fails, and the broker answers COORDINATOR_NOT_AVAILABLE (the client retries) on a
    connection that stays open - before, the handler's OSError closed it, and with it the
    fetches it carried."""
    from kio.schema.errors import ErrorCode

    from tests.kafka_raw import RawClient

    with Broker(small_disk / "data", offsets_topic_num_partitions=1,
                internal_topics_at_start=False) as broker:
        filler = small_disk / "filler"
        fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
        with contextlib.suppress(OSError):   # until ENOSPC
            while True:
                os.write(fd, b"\0" * (1 << 16))
        os.close(fd)
        with RawClient(broker.bootstrap_servers) as client:
            answer = client.request(10, 4, {"key_type": 0, "coordinator_keys": ["g"]})
            assert answer.coordinators[0].error_code == ErrorCode.coordinator_not_available
            assert client.request(18, 3, {"client_software_name": "t",
                                          "client_software_version": "1"}).error_code == 0
            filler.unlink()   # space again: the next FindCoordinator creates the topic
            answer = client.request(10, 4, {"key_type": 0, "coordinator_keys": ["g"]})
            assert answer.coordinators[0].error_code == ErrorCode.none
