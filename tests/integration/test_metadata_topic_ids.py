"""Metadata by topic id: the Java admin client's describeTopics by id (it sends name ''
with the id) finds the topic, an unknown id answers UNKNOWN_TOPIC_ID, and v13 carries
a top-level error code."""

from __future__ import annotations

import uuid

from kio.schema.errors import ErrorCode

from tests.helpers import create_topic, unique
from tests.java_support import run_java
from tests.kafka_raw import RawClient

METADATA = 3


def test_java_admin_describes_topics_by_id(onceflow_broker):
    topic = create_topic(onceflow_broker.bootstrap_servers, unique("describe-id"), partitions=3)
    by_name, by_id, unknown = run_java("DescribeTopicsById", onceflow_broker.bootstrap_servers, topic)
    assert by_name["name"] == topic and by_name["partitions"] == 3
    assert by_name["id"] != "AAAAAAAAAAAAAAAAAAAAAA"
    assert by_id == {**by_name, "lookup": "id"}
    assert unknown["error"] == "UnknownTopicIdException"


def _request(bootstrap: str, version: int, name: str | None, topic_id: uuid.UUID):
    with RawClient(bootstrap) as client:
        return client.request(METADATA, version, {
            "topics": [{"topic_id": topic_id, "name": name}],
            "allow_auto_topic_creation": False, "include_topic_authorized_operations": False})


def test_metadata_v12_and_v13_by_id_with_any_name(onceflow_broker):
    bootstrap = onceflow_broker.bootstrap_servers
    topic = create_topic(onceflow_broker.bootstrap_servers, unique("meta-id"), partitions=2)
    named = _request(bootstrap, 12, topic, uuid.UUID(int=0)).topics[0]
    assert named.error_code == ErrorCode.none and named.topic_id != uuid.UUID(int=0)
    for version in (12, 13):
        for name in ("", None, "some-other-name"):
            found = _request(bootstrap, version, name, named.topic_id).topics[0]
            assert (found.error_code, found.name, len(found.partitions)) == (ErrorCode.none, topic, 2)
        missing = _request(bootstrap, version, "", uuid.uuid4()).topics[0]
        assert (missing.error_code, missing.name) == (ErrorCode.unknown_topic_id, None)
    assert _request(bootstrap, 13, topic, uuid.UUID(int=0)).error_code == ErrorCode.none
