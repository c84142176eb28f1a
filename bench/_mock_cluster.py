"""librdkafka's built-in mock cluster, reachable over real sockets, with sized topics.

Theory of operation: `test.mock.num.brokers` gives each client its own private mock
cluster, and that mock auto-creates topics with its default partition count (4) and
does not answer CreateTopics usefully (no controller). To benchmark several partitions
we drive librdkafka's public mock API (rdkafka_mock.h) through ctypes instead, on the
very librdkafka that confluent-kafka ships: a bare handle owns the cluster,
`rd_kafka_mock_cluster_bootstraps` names its listeners, `rd_kafka_mock_topic_create`
sizes topics. Any client - confluent-kafka, kafka-python, aiokafka - can then connect
to those host:port pairs exactly as it would to a broker.

The cluster's brokers run on librdkafka's own C threads, outside the GIL.
"""

from __future__ import annotations

import ctypes
import glob
import os
from types import TracebackType

import confluent_kafka

RD_KAFKA_PRODUCER = 0  # rd_kafka_type_t: the owning handle never produces anything
ERRSTR_BYTES = 512
# Log level of the owning handle. It has no bootstrap.servers (it never connects), which
# librdkafka warns about at level 4; 3 (errors only) keeps that off stderr.
OWNER_LOG_LEVEL = b"3"


def _librdkafka() -> ctypes.CDLL:
    """The librdkafka shared library bundled with the confluent-kafka wheel."""
    package_dir = os.path.dirname(confluent_kafka.__file__)
    pattern = os.path.join(package_dir, os.pardir, "confluent_kafka.libs", "librdkafka*.so*")
    candidates = glob.glob(pattern) or ["librdkafka.so.1"]  # system library as fallback
    lib = ctypes.CDLL(candidates[0])
    lib.rd_kafka_conf_new.restype = ctypes.c_void_p
    lib.rd_kafka_conf_set.argtypes = [
        ctypes.c_void_p,
        ctypes.c_char_p,
        ctypes.c_char_p,
        ctypes.c_char_p,
        ctypes.c_size_t,
    ]
    lib.rd_kafka_new.restype = ctypes.c_void_p
    lib.rd_kafka_new.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t]
    lib.rd_kafka_destroy.argtypes = [ctypes.c_void_p]
    lib.rd_kafka_mock_cluster_new.restype = ctypes.c_void_p
    lib.rd_kafka_mock_cluster_new.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.rd_kafka_mock_cluster_destroy.argtypes = [ctypes.c_void_p]
    lib.rd_kafka_mock_cluster_bootstraps.restype = ctypes.c_char_p
    lib.rd_kafka_mock_cluster_bootstraps.argtypes = [ctypes.c_void_p]
    lib.rd_kafka_mock_topic_create.restype = ctypes.c_int
    lib.rd_kafka_mock_topic_create.argtypes = [
        ctypes.c_void_p,
        ctypes.c_char_p,
        ctypes.c_int,
        ctypes.c_int,
    ]
    return lib


class MockCluster:
    """A librdkafka mock cluster: `with MockCluster(1) as mock: mock.bootstrap_servers`."""

    def __init__(self, num_brokers: int = 1) -> None:
        self._lib = _librdkafka()
        self._num_brokers = num_brokers
        self._handle: int | None = None
        self._cluster: int | None = None
        self.bootstrap_servers = ""

    def __enter__(self) -> "MockCluster":
        errstr = ctypes.create_string_buffer(ERRSTR_BYTES)
        conf = self._lib.rd_kafka_conf_new()
        self._lib.rd_kafka_conf_set(conf, b"log_level", OWNER_LOG_LEVEL, errstr, ERRSTR_BYTES)
        self._handle = self._lib.rd_kafka_new(RD_KAFKA_PRODUCER, conf, errstr, ERRSTR_BYTES)
        if not self._handle:
            raise RuntimeError(f"rd_kafka_new failed: {errstr.value.decode()}")
        self._cluster = self._lib.rd_kafka_mock_cluster_new(self._handle, self._num_brokers)
        if not self._cluster:
            raise RuntimeError("rd_kafka_mock_cluster_new failed")
        self.bootstrap_servers = self._lib.rd_kafka_mock_cluster_bootstraps(self._cluster).decode()
        return self

    def create_topic(self, name: str, num_partitions: int, replication_factor: int = 1) -> None:
        assert self._cluster is not None, "MockCluster used outside its `with` block"
        code = self._lib.rd_kafka_mock_topic_create(
            self._cluster, name.encode(), num_partitions, replication_factor
        )
        if code != 0:
            raise RuntimeError(f"rd_kafka_mock_topic_create({name!r}) failed: error {code}")

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._cluster:
            self._lib.rd_kafka_mock_cluster_destroy(self._cluster)
            self._cluster = None
        if self._handle:
            self._lib.rd_kafka_destroy(self._handle)
            self._handle = None
