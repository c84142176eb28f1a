"""The `onceflow-kafka` sink's options and input columns, checked on the driver.

`parse_options` turns Spark's case-insensitive option map into `SinkOptions` (picklable,
shipped to the executors with the writer) and refuses what would break the guarantee:
a `kafka.transactional.id` of the user's (the sink derives it so that a retried task fences
its predecessor), idempotence off or acks below all with `exactlyOnce=true`. `row_layout`
finds Spark's Kafka sink columns (value, key, topic, partition, headers) in the input
schema, with their types checked. Errors name the option or column (SinkOptionError).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from pyspark.sql.types import StructType

from onceflow.spark import progress
from onceflow.spark.options import boolean_option, integer_option

__all__ = ["RowLayout", "SinkOptionError", "SinkOptions", "parse_options", "row_layout"]

DEFAULT_TRANSACTIONAL_ID_PREFIX = "onceflow-spark"
DEFAULT_TRANSACTION_TIMEOUT_MS = 60_000
# atomicity=batch: a task's transaction stays open until the driver commits the whole batch,
# and (without KIP-939) until a restarted driver completes a recorded decision, so it gets
# Kafka's default transaction.max.timeout.ms (15 minutes).
DEFAULT_BATCH_TRANSACTION_TIMEOUT_MS = 900_000
ATOMICITY_VALUES = ("partition", "batch")
TWO_PHASE_COMMIT_VALUES = ("auto", "true", "false")
# Producer settings the user may override with kafka.* options.
PRODUCER_DEFAULTS: dict[str, object] = {
    # Rows arrive faster than one request's round trip: let batches fill. The commit (or the
    # flush) sends what is left at once, so this adds no latency at the end of a task.
    "linger.ms": 20,
    "batch.size": 1_000_000,
    # A task produces its whole partition without waiting; room for ~1 s of rows.
    "queue.buffering.max.messages": 1_000_000,
    "queue.buffering.max.kbytes": 262_144,
    # Measured: with sparse connections a new producer waits ~0.5 s before it connects to
    # the broker it learnt from the bootstrap metadata; eager connections take ~3 ms.
    "enable.sparse.connections": False,
    # Java's default partitioner, so keyed rows land where Spark's own Kafka sink puts them.
    "partitioner": "murmur2_random",
}
# kafka.* settings the sink refuses, with the reason given to the user.
REFUSED_KAFKA_SETTINGS = {
    "transactional.id": "the sink derives it from transactionalIdPrefix, the query id and the "
                        "partition id, so that a retried task fences its predecessor",
    "key.serializer": "keys and values are written as they are: cast them to string or binary",
    "value.serializer": "keys and values are written as they are: cast them to string or binary",
}
# Settings also given to the progress topic's consumers and admin client: how to reach and
# authenticate to the cluster, not how to produce.
SHARED_CLIENT_PREFIXES = ("security.", "sasl.", "ssl.", "client.", "socket.", "broker.",
                          "enable.ssl.", "metadata.", "api.version.", "reconnect.")
KNOWN_OPTIONS = ("kafka.bootstrap.servers", "topic", "exactlyonce", "progresstopic",
                 "progresstopicpartitions", "progresstopicreplicationfactor",
                 "transactionalidprefix", "atomicity", "twophasecommit")
# Spark adds these to a writer's options; they are not ours to check.
SPARK_OPTIONS = ("path", "checkpointlocation", "queryname")


class SinkOptionError(ValueError):
    """A bad option or input column; the message names it."""


@dataclasses.dataclass(frozen=True)
class SinkOptions:
    """The parsed options; picklable, shipped to the executors with the writer."""

    bootstrap: str
    topic: str | None
    exactly_once: bool
    progress_topic: str
    progress_partitions: int
    progress_replication_factor: int
    transactional_id_prefix: str
    transaction_timeout_ms: int
    kafka: dict[str, str]  # the user's producer settings without the "kafka." prefix
    atomicity: str = "partition"  # or "batch" (batch_commit.py)
    two_phase_commit: str = "auto"  # batch mode: KIP-939 when the broker allows (auto)

    def producer_config(self, transactional_id: str | None) -> dict[str, object]:
        config = {**PRODUCER_DEFAULTS, "enable.idempotence": True, **self.kafka,
                  "bootstrap.servers": self.bootstrap, "delivery.report.only.error": True}
        if transactional_id is not None:
            config["transactional.id"] = transactional_id
            config["transaction.timeout.ms"] = self.transaction_timeout_ms
        return config

    def client_config(self) -> dict[str, str]:
        return {k: v for k, v in self.kafka.items() if k.startswith(SHARED_CLIENT_PREFIXES)}


def parse_options(options: Mapping[str, str]) -> SinkOptions:
    """Check Spark's (case-insensitive) option map; SinkOptionError names the bad option."""
    given = {str(key).lower(): str(value) for key, value in options.items()}
    unknown = [k for k in given if not k.startswith("kafka.") and k not in KNOWN_OPTIONS
               and k not in SPARK_OPTIONS]
    if unknown:
        raise SinkOptionError(f"unknown option(s) {', '.join(sorted(unknown))} for the "
                              f"onceflow-kafka sink; known: topic, exactlyOnce, atomicity, "
                              "twoPhaseCommit, progressTopic, progressTopicPartitions, "
                              "progressTopicReplicationFactor, transactionalIdPrefix and kafka.*")
    bootstrap = given.pop("kafka.bootstrap.servers", "").strip()
    if not bootstrap:
        raise SinkOptionError("option kafka.bootstrap.servers is required")
    exactly_once = boolean_option(given, "exactlyonce", "exactlyOnce", True, SinkOptionError)
    kafka = {k[len("kafka."):]: v for k, v in given.items() if k.startswith("kafka.")}
    kafka.pop("transaction.timeout.ms", None)  # ours: see transaction_timeout_ms
    _check_kafka_settings(kafka, exactly_once)
    atomicity = _choice(given, "atomicity", "atomicity", ATOMICITY_VALUES)
    if atomicity == "batch" and not exactly_once:
        raise SinkOptionError("option atomicity=batch needs exactlyOnce=true: at least once "
                              "has no transactions to commit together")
    two_phase_commit = _choice(given, "twophasecommit", "twoPhaseCommit", TWO_PHASE_COMMIT_VALUES)
    prefix = given.get("transactionalidprefix", DEFAULT_TRANSACTIONAL_ID_PREFIX).strip()
    if not prefix:
        raise SinkOptionError("option transactionalIdPrefix must not be empty")
    return SinkOptions(
        bootstrap=bootstrap, topic=(given.get("topic") or "").strip() or None,
        exactly_once=exactly_once,
        progress_topic=given.get("progresstopic", progress.DEFAULT_TOPIC).strip()
        or progress.DEFAULT_TOPIC,
        progress_partitions=_int(given, "progresstopicpartitions", "progressTopicPartitions",
                                 progress.DEFAULT_PARTITIONS, minimum=1),
        progress_replication_factor=_int(given, "progresstopicreplicationfactor",
                                         "progressTopicReplicationFactor",
                                         progress.DEFAULT_REPLICATION_FACTOR, minimum=-1),
        transactional_id_prefix=prefix,
        transaction_timeout_ms=_int(given, "kafka.transaction.timeout.ms",
                                    "kafka.transaction.timeout.ms",
                                    DEFAULT_BATCH_TRANSACTION_TIMEOUT_MS if atomicity == "batch"
                                    else DEFAULT_TRANSACTION_TIMEOUT_MS, minimum=1_000),
        kafka=kafka, atomicity=atomicity, two_phase_commit=two_phase_commit)


def _choice(given: Mapping[str, str], key: str, name: str, values: tuple[str, ...]) -> str:
    value = given.get(key, values[0]).strip().lower()
    if value not in values:
        raise SinkOptionError(f"option {name}={given[key]!r} is not one of {', '.join(values)}")
    return value


def _int(given: Mapping[str, str], key: str, name: str, default: int, minimum: int) -> int:
    value = integer_option(given, key, name, default, minimum, SinkOptionError)
    assert value is not None  # a default was given
    return value


def _check_kafka_settings(kafka: dict[str, str], exactly_once: bool) -> None:
    for key, reason in REFUSED_KAFKA_SETTINGS.items():
        if key in kafka:
            raise SinkOptionError(f"option kafka.{key} is not allowed: {reason}")
    if not exactly_once:
        return
    if kafka.get("enable.idempotence", "true").strip().lower() != "true":
        raise SinkOptionError("option kafka.enable.idempotence=false is not allowed with "
                              "exactlyOnce=true: transactions need the idempotent producer")
    acks = kafka.get("acks", kafka.get("request.required.acks", "all")).strip().lower()
    if acks not in ("all", "-1"):
        raise SinkOptionError(f"option kafka.acks={acks} is not allowed with exactlyOnce=true: "
                              "a transaction's rows must be on every in-sync replica (acks=all)")


@dataclasses.dataclass(frozen=True)
class RowLayout:
    """Where Spark's Kafka sink columns are in the input (indices into the Arrow batches)."""

    value: int
    key: int | None = None
    topic: int | None = None
    partition: int | None = None
    headers: int | None = None

    @property
    def plain(self) -> bool:
        """Only key and value vary per row: the fast produce loop applies."""
        return self.topic is None and self.partition is None and self.headers is None


# Spark's Kafka sink columns and their allowed types (simpleString ignores nullability).
COLUMN_TYPES = {
    "value": ("string", "binary"),
    "key": ("string", "binary"),
    "topic": ("string",),
    "partition": ("int",),
    "headers": ("array<struct<key:string,value:binary>>",),
}


def row_layout(schema: StructType, topic_option: str | None) -> RowLayout:
    """Find and check the input columns, like Spark's Kafka sink (other columns are ignored)."""
    index = {field.name.lower(): i for i, field in enumerate(schema.fields)}
    found: dict[str, int] = {}
    for name, types in COLUMN_TYPES.items():
        if name not in index:
            continue
        field = schema.fields[index[name]]
        if field.dataType.simpleString() not in types:
            raise SinkOptionError(f"column {field.name} must be {' or '.join(types)}, got "
                                  f"{field.dataType.simpleString()} (cast it)")
        found[name] = index[name]
    if "value" not in found:
        raise SinkOptionError("the onceflow-kafka sink needs a 'value' column (string or "
                              f"binary); the input has {schema.simpleString()}")
    if topic_option is None and "topic" not in found:
        raise SinkOptionError("no topic to write to: set the 'topic' option or give the input a "
                              "'topic' column")
    return RowLayout(**found)
