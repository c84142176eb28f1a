"""INCONSISTENT_TOPIC_ID where Kafka answers it (issue 15): an incremental fetch of a
by-id fetch session (KIP-227, Fetch v13+) still names a topic's old id after the topic
was deleted and created again under the same name; Kafka's session remembers the name
the id resolved to and its read finds a log with another id."""

from __future__ import annotations

from confluent_kafka.admin import AdminClient
from kio.schema.errors import ErrorCode

from tests.helpers import create_topic, unique
from tests.integration.test_fetch_sessions import _fetch
from tests.integration.test_fetch_topic_ids import topic_id
from tests.kafka_raw import RawClient

TIMEOUT_S = 30


def _errors(response) -> dict[int, ErrorCode]:
    return {p.partition_index: p.error_code
            for topic in response.responses for p in topic.partitions}


def _delete(bootstrap: str, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.delete_topics([topic], request_timeout=TIMEOUT_S)[topic].result(TIMEOUT_S)


def test_session_naming_a_recreated_topic_by_its_old_id(onceflow_broker):
    bootstrap = onceflow_broker.bootstrap_servers
    topic = create_topic(bootstrap, unique("inconsistent-id"), partitions=2)
    old_id = topic_id(bootstrap, topic)
    with RawClient(bootstrap) as client:
        full = _fetch(client, old_id, 0, 0, {0: 0, 1: 0})
        assert full.error_code == ErrorCode.none and full.session_id != 0
        assert _errors(full) == {0: ErrorCode.none, 1: ErrorCode.none}
        session = full.session_id
        _delete(bootstrap, topic)
        # No topic of that name: Kafka's metadata check answers by name.
        gone = _fetch(client, old_id, session, 1, {})
        assert gone.error_code == ErrorCode.none
        assert _errors(gone) == {0: ErrorCode.unknown_topic_or_partition,
                                 1: ErrorCode.unknown_topic_or_partition}
        create_topic(bootstrap, topic, partitions=1)
        new_id = topic_id(bootstrap, topic)
        assert new_id != old_id
        # The same name again under a new id: partition 0's log has another id now;
        # partition 1 does not exist in the new topic.
        again = _fetch(client, old_id, session, 2, {})
        assert again.error_code == ErrorCode.none
        assert _errors(again) == {0: ErrorCode.inconsistent_topic_id,
                                  1: ErrorCode.unknown_topic_or_partition}
        # Outside the session the old id is simply unknown, the new one is served.
        assert _errors(_fetch(client, old_id, 0, -1, {0: 0})) == {0: ErrorCode.unknown_topic_id}
        assert _errors(_fetch(client, new_id, 0, -1, {0: 0})) == {0: ErrorCode.none}


def test_a_by_name_session_is_not_affected(onceflow_broker):
    """Fetch v12 names topics: no topic id to be inconsistent with (Kafka reads by name)."""
    bootstrap = onceflow_broker.bootstrap_servers
    topic = create_topic(bootstrap, unique("by-name-session"))
    tid = topic_id(bootstrap, topic)
    with RawClient(bootstrap) as client:
        full = _fetch(client, tid, 0, 0, {0: 0}, version=12, topic=topic)
        assert full.session_id != 0
        _delete(bootstrap, topic)
        create_topic(bootstrap, topic)
        again = _fetch(client, tid, full.session_id, 1, {}, version=12, topic=topic)
        assert set(_errors(again).values()) <= {ErrorCode.none}
