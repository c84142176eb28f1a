"""Fetch v13-v17 names topics by id: the Java consumer fetches with v13+ (counted by the
broker's per-version request metric), an unknown or zero id answers UNKNOWN_TOPIC_ID,
a topic deleted while a by-id fetch waits answers UNKNOWN_TOPIC_ID, and a topic id is
new after delete and create and the same after a restart."""

from __future__ import annotations

import uuid

from confluent_kafka.admin import AdminClient
from kio.schema.errors import ErrorCode

from onceflow.broker.embedded import Broker
from onceflow.protocol.records import SimpleRecord, build_batch
from tests.helpers import create_topic, unique, wait_for
from tests.java_support import run_java
from tests.kafka_raw import RawClient

PRODUCE, FETCH, METADATA = 0, 1, 3
TIMEOUT_S = 30


def fetch_versions(broker: Broker) -> dict[int, float]:
    registry = broker.server.state.metrics.registry
    found = {}
    for version in range(4, 18):
        value = registry.get_sample_value("onceflow_request_versions_total",
                                          {"request": "Fetch", "version": str(version)})
        if value:
            found[version] = value
    return found


def topic_id(bootstrap: str, topic: str) -> uuid.UUID:
    with RawClient(bootstrap) as client:
        metadata = client.request(METADATA, 12, {"topics": [{"topic_id": None, "name": topic}],
                                                 "allow_auto_topic_creation": False,
                                                 "include_topic_authorized_operations": False})
    return metadata.topics[0].topic_id


def fetch_body(topic_id: uuid.UUID, wait_ms: int = 0, offset: int = 0) -> dict:
    return {"replica_id": -1, "replica_state": {"replica_id": -1, "replica_epoch": -1},
            "max_wait": wait_ms, "min_bytes": 1, "max_bytes": 1 << 20, "isolation_level": 0,
            "session_id": 0, "session_epoch": -1, "cluster_id": None,
            "topics": [{"topic_id": topic_id, "partitions": [
                {"partition": 0, "current_leader_epoch": -1, "fetch_offset": offset,
                 "last_fetched_epoch": -1, "log_start_offset": -1,
                 "partition_max_bytes": 1 << 20, "replica_directory_id": None}]}],
            "forgotten_topics_data": [], "rack_id": ""}


def test_java_consumer_fetches_with_topic_ids(onceflow_broker):
    bootstrap = onceflow_broker.bootstrap_servers
    topic = create_topic(bootstrap, unique("java-fetch-id"))
    before = fetch_versions(onceflow_broker)
    [result] = run_java("RoundTrip", bootstrap, topic, "5")
    assert result["consumed"] == [f"v{i}" for i in range(5)]
    after = fetch_versions(onceflow_broker)
    used = {v for v in after if after[v] > before.get(v, 0)}
    assert used and min(used) >= 13, used


def test_fetch_by_id_at_each_version(onceflow_broker):
    bootstrap = onceflow_broker.bootstrap_servers
    topic = create_topic(bootstrap, unique("fetch-id"))
    tid = topic_id(bootstrap, topic)
    with RawClient(bootstrap) as client:
        produced = client.request(PRODUCE, 9, {
            "transactional_id": None, "acks": -1, "timeout": 5000, "topic_data": [{
                "name": topic, "partition_data": [{"index": 0, "records": build_batch(
                    [SimpleRecord(key=None, value=b"x")])}]}]})
        assert produced.responses[0].partition_responses[0].error_code == ErrorCode.none
        for version in range(13, 18):
            found = client.request(FETCH, version, fetch_body(tid))
            (answer,) = found.responses
            assert answer.topic_id == tid
            (partition,) = answer.partitions
            assert (partition.error_code, partition.high_watermark) == (ErrorCode.none, 1)
            assert partition.records
            for unknown in (uuid.uuid4(), uuid.UUID(int=0)):
                missing = client.request(FETCH, version, fetch_body(unknown))
                # kio reads the zero id as None
                assert (missing.responses[0].topic_id or uuid.UUID(int=0)) == unknown
                assert missing.responses[0].partitions[0].error_code == ErrorCode.unknown_topic_id


def test_waiting_fetch_by_id_on_deleted_topic(onceflow_broker):
    bootstrap = onceflow_broker.bootstrap_servers
    topic = create_topic(bootstrap, unique("fetch-id-deleted"))
    tid = topic_id(bootstrap, topic)

    def waiting() -> bool:
        partition = onceflow_broker.server.state._partitions.get((topic, 0))
        return partition is not None and len(partition.waiters) > 0

    with RawClient(bootstrap) as client:
        client.send_frame(client.encode(FETCH, 17, fetch_body(tid, wait_ms=20_000)))
        wait_for(lambda: onceflow_broker.call(waiting), "the fetch waits", TIMEOUT_S)
        admin = AdminClient({"bootstrap.servers": bootstrap})
        admin.delete_topics([topic])[topic].result(TIMEOUT_S)
        answer = client.decode_response(FETCH, 17, client.recv_frame())
        assert answer.responses[0].partitions[0].error_code == ErrorCode.unknown_topic_id
        # Created again under the same name: a new id; the old one stays unknown.
        create_topic(bootstrap, topic)
        assert topic_id(bootstrap, topic) not in (tid, uuid.UUID(int=0))
        old = client.request(FETCH, 17, fetch_body(tid))
        assert old.responses[0].partitions[0].error_code == ErrorCode.unknown_topic_id


def test_topic_id_survives_a_restart(tmp_path):
    with Broker(data_dir=str(tmp_path)) as broker:
        topic = create_topic(broker.bootstrap_servers, unique("id-restart"))
        before = topic_id(broker.bootstrap_servers, topic)
    with Broker(data_dir=str(tmp_path)) as broker:
        assert topic_id(broker.bootstrap_servers, topic) == before


def test_not_leader_answer_names_the_leader_and_its_endpoint():
    with Broker(nodes=3) as broker:
        first = broker.bootstrap_servers.split(",")[0]
        topic = create_topic(broker.bootstrap_servers, unique("fetch-leader"), partitions=12)
        tid = topic_id(first, topic)
        body = fetch_body(tid)
        body["topics"][0]["partitions"] = [
            {**body["topics"][0]["partitions"][0], "partition": i} for i in range(12)]
        with RawClient(first) as client:
            answer = client.request(FETCH, 16, body)
        endpoints = {e.node_id: (e.host, e.port) for e in answer.node_endpoints}
        moved = [p for p in answer.responses[0].partitions
                 if p.error_code == ErrorCode.not_leader_or_follower]
        assert moved, "some of 12 partitions of a 3-node cluster are led elsewhere"
        for partition in moved:
            leader = partition.current_leader.leader_id
            assert leader >= 0 and f"{endpoints[leader][0]}:{endpoints[leader][1]}" in broker.bootstrap_servers
        served = [p for p in answer.responses[0].partitions if p.error_code == ErrorCode.none]
        assert len(served) + len(moved) == 12
        assert all(p.current_leader.leader_id == -1 for p in served)


def test_produce_v13_by_topic_id(onceflow_broker):
    bootstrap = onceflow_broker.bootstrap_servers
    topic = create_topic(bootstrap, unique("produce-id"))
    tid = topic_id(bootstrap, topic)
    batch = build_batch([SimpleRecord(key=None, value=b"y")])
    with RawClient(bootstrap) as client:
        for key, error in ((tid, ErrorCode.none), (uuid.uuid4(), ErrorCode.unknown_topic_id)):
            answer = client.request(PRODUCE, 13, {
                "transactional_id": None, "acks": -1, "timeout": 5000, "topic_data": [{
                    "topic_id": key, "partition_data": [{"index": 0, "records": batch}]}]})
            (topic_answer,) = answer.responses
            assert topic_answer.topic_id == key
            assert topic_answer.partition_responses[0].error_code == error
        fetched = client.request(FETCH, 17, fetch_body(tid)).responses[0].partitions[0]
        assert fetched.high_watermark == 1
