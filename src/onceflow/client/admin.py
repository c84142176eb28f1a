"""What every Kafka client of ours shares: settings, reachability, errors for people.

Theory of operation: a tool (the CLI, the console) builds confluent-kafka clients from
bootstrap servers plus the user's client properties (`--command-config`: Kafka's
`security.protocol`, `sasl.*`, `ssl.*`, ...; see `client.config`), first asks the
cluster for its metadata - which proves a broker answers - and only then does its work.
Every failure a person can cause or fix (nothing listening, an unknown topic, a bad
argument, an authorization error) becomes a `ClientError` with one readable sentence;
librdkafka's own log lines go to a silent logger, and the errors that matter reach us
through `error_cb`, futures and delivery reports.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Mapping
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, ClusterMetadata

# How long the first metadata request may take before we call the cluster unreachable.
# librdkafka reports "connection refused" within milliseconds through error_cb, so this
# only bounds the silent cases (a firewall dropping packets, a broker that hangs).
METADATA_TIMEOUT_S = 10.0
# The first attempt's share of that budget; between attempts we serve error_cb to fail
# fast. Each attempt waits twice as long as the one before (up to what is left), because an
# attempt that gives up does not cancel its request: with a fixed slice shorter than the
# broker takes to answer (0.3-0.7 s for a full Metadata of 10,000 partitions, measured on
# onceflow) every attempt would give up and the requests would only pile up behind each
# other.
METADATA_ATTEMPT_S = 0.25
# librdkafka errors kept per client (error_cb): enough to explain a failure, bounded for
# a client that runs for days while a broker comes and goes.
CLIENT_ERRORS_KEPT = 100
CLIENT_ID_DEFAULT = "onceflow-cli"

_LIBRDKAFKA_LOGGER = logging.getLogger("onceflow.client.librdkafka")
_LIBRDKAFKA_LOGGER.addHandler(logging.NullHandler())
_LIBRDKAFKA_LOGGER.propagate = False


class ClientError(Exception):
    """A failure to report to a person as one sentence (the CLI exits 1, the console
    shows it on the page)."""


class NotFoundError(ClientError):
    """The topic, partition, group or transactional id named does not exist."""


def describe_kafka_error(error: Any, topic: str | None = None) -> str:
    """One human sentence for a KafkaError (or anything a future raised)."""
    if not isinstance(error, KafkaError):
        return str(error)
    code = error.code()
    if code == KafkaError.UNKNOWN_TOPIC_OR_PART and topic is not None:
        return f"unknown topic '{topic}'"
    if code == KafkaError.TOPIC_ALREADY_EXISTS and topic is not None:
        return f"topic '{topic}' already exists"
    if code in (KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN):
        return f"broker unreachable ({error.str()})"
    return f"{error.name()}: {error.str()}"


ClientErrors = deque[KafkaError]  # from error_cb, at most CLIENT_ERRORS_KEPT


def new_client_errors() -> ClientErrors:
    return deque(maxlen=CLIENT_ERRORS_KEPT)


def client_config(bootstrap_servers: str, errors: ClientErrors,
                  properties: Mapping[str, str] | None = None,
                  client_id: str = CLIENT_ID_DEFAULT) -> dict[str, Any]:
    """Settings every client shares: the user's properties, where, quiet logs, errors
    collected in `errors`. The bootstrap servers given win over a file's."""
    return {
        "client.id": client_id,
        **(properties or {}),
        "bootstrap.servers": bootstrap_servers,
        "logger": _LIBRDKAFKA_LOGGER,
        "error_cb": errors.append,
    }


def fetch_metadata(
    client: AdminClient | Producer | Consumer,
    bootstrap_servers: str,
    errors: ClientErrors,
    timeout_s: float = METADATA_TIMEOUT_S,
) -> ClusterMetadata:
    """Cluster metadata, or ClientError as soon as every broker is known to be down."""
    deadline = time.monotonic() + timeout_s
    attempt_s = METADATA_ATTEMPT_S
    while True:
        try:
            return client.list_topics(
                timeout=max(min(attempt_s, deadline - time.monotonic()), 0.01))
        except KafkaException as exc:
            last = exc.args[0]
        attempt_s *= 2
        client.poll(0)  # serves error_cb
        refused = any(e.code() in FATAL_CONNECT_ERRORS for e in errors)
        if refused or time.monotonic() >= deadline:
            raise ClientError(f"cannot reach a broker at {bootstrap_servers}: "
                              f"{unreachable_detail(errors, last)}")


# Errors after which waiting longer cannot help: every broker refused, or the cluster
# refused our credentials.
FATAL_CONNECT_ERRORS = frozenset({KafkaError._ALL_BROKERS_DOWN, KafkaError._AUTHENTICATION,
                                  KafkaError._SSL})


def unreachable_detail(errors: ClientErrors, last: KafkaError) -> str:
    """The most telling reason: an authentication or transport error if any."""
    for code in (KafkaError._AUTHENTICATION, KafkaError._SSL, KafkaError._TRANSPORT):
        for error in errors:
            if error.code() == code:
                return error.str()
    return errors[0].str() if errors else describe_kafka_error(last)


def connect_admin(bootstrap_servers: str, properties: Mapping[str, str] | None = None,
                  client_id: str = CLIENT_ID_DEFAULT) -> tuple[AdminClient, ClusterMetadata]:
    errors = new_client_errors()
    admin = AdminClient(client_config(bootstrap_servers, errors, properties, client_id))
    return admin, fetch_metadata(admin, bootstrap_servers, errors)


def require_topic(metadata: ClusterMetadata, topic: str) -> list[int]:
    """The topic's partition ids, or ClientError naming the unknown topic."""
    found = metadata.topics.get(topic)
    if found is None:
        raise NotFoundError(f"unknown topic '{topic}'")
    if found.error is not None:
        raise ClientError(describe_kafka_error(found.error, topic))
    return sorted(found.partitions)
