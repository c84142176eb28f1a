"""kcat, the command-line Kafka client, against the onceflow broker: metadata, keyed
produce with headers, and a read_committed consume to the end that exits on its own."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.helpers import create_topic, unique

RECORDS = 500


@pytest.fixture(scope="module")
def kcat() -> str:
    path = shutil.which("kcat")
    assert path, "kcat not found: scripts/setup.sh installs it (Debian package kcat)"
    return path


def test_kcat_metadata_produce_consume(kcat: str, onceflow_broker) -> None:
    bootstrap = onceflow_broker.bootstrap_servers
    topic = create_topic(bootstrap, unique("kcat"), partitions=2)

    metadata = subprocess.run([kcat, "-b", bootstrap, "-L", "-t", topic], capture_output=True,
                              text=True, timeout=60, check=True).stdout
    assert f'topic "{topic}" with 2 partitions' in metadata

    lines = "".join(f"k{i}:v{i}\n" for i in range(RECORDS))
    subprocess.run([kcat, "-b", bootstrap, "-P", "-t", topic, "-K:", "-H", "source=kcat",
                    "-X", "acks=all"], input=lines, text=True, timeout=60, check=True)

    consumed = subprocess.run(
        [kcat, "-b", bootstrap, "-C", "-t", topic, "-o", "beginning", "-e", "-q",
         "-X", "isolation.level=read_committed", "-f", "%k=%s;%h\n"],
        capture_output=True, text=True, timeout=60, check=True).stdout.splitlines()
    assert sorted(consumed) == sorted(f"k{i}=v{i};source=kcat" for i in range(RECORDS))
