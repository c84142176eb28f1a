"""A Fetch long-polling a topic that is deleted meanwhile is answered with Kafka's error
(UNKNOWN_TOPIC_OR_PARTITION by name), the connection stays open and answers the next
request, and a broker stopping while fetches wait stops without a handler failure."""

from __future__ import annotations

import gc
import logging
import struct
import uuid

from confluent_kafka.admin import AdminClient
from kio.schema.errors import ErrorCode

from onceflow.broker.embedded import Broker
from tests.helpers import create_topic, unique, wait_for
from tests.kafka_raw import RawClient

FETCH, METADATA = 1, 3
TIMEOUT_S = 30
_ZERO = uuid.UUID(int=0)


def _fetch_body(topic: str, wait_ms: int) -> dict:
    return {"replica_id": -1, "max_wait": wait_ms, "min_bytes": 1, "max_bytes": 1 << 20,
            "isolation_level": 0, "session_id": 0, "session_epoch": -1,
            "topics": [{"topic": topic, "partitions": [
                {"partition": 0, "current_leader_epoch": -1, "fetch_offset": 0,
                 "log_start_offset": -1, "partition_max_bytes": 1 << 20}]}],
            "forgotten_topics_data": [], "rack_id": ""}


def _waiting_fetches(broker: Broker, topic: str) -> int:
    def count() -> int:
        partition = broker.server.state._partitions.get((topic, 0))
        return 0 if partition is None else len(partition.waiters)
    return broker.call(count)


def _delete(bootstrap: str, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.delete_topics([topic], request_timeout=TIMEOUT_S).values():
        future.result(TIMEOUT_S)


def test_waiting_fetch_on_deleted_topic_is_answered(onceflow_broker):
    bootstrap = onceflow_broker.bootstrap_servers
    topic = create_topic(bootstrap, unique("fetch-deleted"))
    failures = onceflow_broker.server.connections.handler_failures
    with RawClient(bootstrap) as client:
        client.send_frame(client.encode(FETCH, 12, _fetch_body(topic, 20_000)))
        wait_for(lambda: _waiting_fetches(onceflow_broker, topic) > 0, "the fetch waits", TIMEOUT_S)
        _delete(bootstrap, topic)
        response = client.decode_response(FETCH, 12, client.recv_frame())
        assert response.error_code == ErrorCode.none
        (partition,) = response.responses[0].partitions
        assert partition.error_code == ErrorCode.unknown_topic_or_partition
        assert partition.records in (None, b"")
        # The same connection answers the next request.
        metadata = client.request(METADATA, 12, {"topics": [{"topic_id": _ZERO, "name": topic}],
                                                 "allow_auto_topic_creation": False,
                                                 "include_topic_authorized_operations": False})
        assert metadata.topics[0].error_code == ErrorCode.unknown_topic_or_partition
        # A new fetch of the deleted topic: the same error, at once.
        again = client.request(FETCH, 12, _fetch_body(topic, 20_000))
        assert again.responses[0].partitions[0].error_code == ErrorCode.unknown_topic_or_partition
    assert onceflow_broker.server.connections.handler_failures == failures


def test_broker_stop_with_waiting_fetches_has_no_traceback(tmp_path, caplog):
    broker = Broker(data_dir=str(tmp_path / "data")).start()
    try:
        topic = create_topic(broker.bootstrap_servers, unique("fetch-stop"))
        clients = [RawClient(broker.bootstrap_servers) for _ in range(3)]
        for client in clients:
            client.send_frame(client.encode(FETCH, 12, _fetch_body(topic, 30_000)))
        wait_for(lambda: _waiting_fetches(broker, topic) >= 3, "the fetches wait", TIMEOUT_S)
        with caplog.at_level(logging.DEBUG):
            broker.stop()
            gc.collect()   # a pending task left behind is reported when collected
        for client in clients:   # dropped or answered, never left hanging
            try:
                frame = client.recv_frame()
                (correlation_id,) = struct.unpack_from(">i", frame, 0)
                assert correlation_id == client.correlation_id
            except (ConnectionError, OSError):
                pass
            client.close()
    finally:
        broker.stop()
    assert not [r for r in caplog.records if r.exc_info], [r.getMessage() for r in caplog.records if r.exc_info]
    assert "Task was destroyed" not in caplog.text
    assert "LogClosedError" not in caplog.text

