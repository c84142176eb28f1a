"""Consumer groups of the consumer group protocol (KIP-848) with real clients and raw bytes.

- a regex subscription picks up a topic created after the member joined, with no
  client-side metadata refresh: the broker resolves the regex (RE2) at a heartbeat;
- a group converts classic -> consumer -> classic while empty, its offsets kept;
- mixed-protocol joins into a live group get Kafka's errors;
- bad heartbeats and stale offset commits get Kafka's errors, and the group is rebuilt
  from its records after a restart (SIGKILL).
"""

from __future__ import annotations

import time

from confluent_kafka import Consumer, Producer, TopicPartition
from kio.schema.errors import ErrorCode

from tests.helpers import TIMEOUT_S, create_topic, unique, wait_for
from tests.kafka_raw import RawClient

E = ErrorCode
HEARTBEAT, DESCRIBE, OFFSET_COMMIT, LIST_GROUPS, JOIN_GROUP = 68, 69, 8, 16, 11
FAST = {"offsets_topic_num_partitions": 2, "group_initial_rebalance_delay_ms": 0,
        "consumer_group_heartbeat_interval_ms": 300, "consumer_group_session_timeout_ms": 4000,
        "consumer_group_regex_refresh_interval_ms": 500, "group_min_session_timeout_ms": 1000}


def consumer(bootstrap: str, group: str, protocol: str, **extra) -> Consumer:
    config = {"bootstrap.servers": bootstrap, "group.id": group, "group.protocol": protocol,
              "auto.offset.reset": "earliest", "enable.auto.commit": False, **extra}
    if protocol == "classic":
        config.setdefault("session.timeout.ms", 6000)
    return Consumer(config)


def poll_values(c: Consumer, seconds: float, until: int | None = None) -> list[bytes]:
    values, deadline = [], time.monotonic() + seconds
    while time.monotonic() < deadline and (until is None or len(values) < until):
        message = c.poll(0.2)
        if message is not None and message.error() is None:
            values.append(message.value())
    return values


def produce(bootstrap: str, topic: str, values: list[bytes]) -> None:
    p = Producer({"bootstrap.servers": bootstrap})
    for v in values:
        p.produce(topic, v)
    assert p.flush(TIMEOUT_S) == 0


def heartbeat(client: RawClient, **fields):
    body = {"group_id": "g", "member_id": "m", "member_epoch": 0, "instance_id": None,
            "rack_id": None, "rebalance_timeout": 30_000, "subscribed_topic_names": None,
            "subscribed_topic_regex": None, "server_assignor": None, "topic_partitions": [],
            **fields}
    return client.request(HEARTBEAT, 1, body)


def test_regex_subscription_picks_up_a_topic_created_later():
    from onceflow.broker.embedded import Broker

    with Broker(**FAST) as broker:
        bootstrap = broker.bootstrap_servers
        prefix = unique("regex")
        create_topic(bootstrap, f"{prefix}-a", 2)
        c = consumer(bootstrap, unique("regex-group"), "consumer")
        c.subscribe([f"^{prefix}-.*"])
        wait_for(lambda: (poll_values(c, 0.3), len(c.assignment()) == 2)[1],
                 "the first topic's partitions", TIMEOUT_S)
        create_topic(bootstrap, f"{prefix}-b", 3)  # after the member joined
        produce(bootstrap, f"{prefix}-b", [b"late"])
        assert poll_values(c, TIMEOUT_S, until=1) == [b"late"]
        assert {tp.topic for tp in c.assignment()} == {f"{prefix}-a", f"{prefix}-b"}
        c.close()


def test_group_converts_classic_consumer_classic_when_empty_keeping_offsets():
    from onceflow.broker.embedded import Broker

    with Broker(**FAST) as broker:
        bootstrap, group = broker.bootstrap_servers, unique("convert")
        topic = create_topic(bootstrap, unique("convert-in"), 1)
        produce(bootstrap, topic, [b"1", b"2", b"3", b"4", b"5", b"6"])
        for protocol, expected in (("classic", [b"1", b"2"]), ("consumer", [b"3", b"4"]),
                                   ("classic", [b"5", b"6"])):
            c = consumer(bootstrap, group, protocol)
            c.subscribe([topic])
            got = poll_values(c, TIMEOUT_S, until=2)[:2]
            assert got == expected, (protocol, got)
            c.commit(offsets=[TopicPartition(topic, 0, int(got[-1]))], asynchronous=False)
            with RawClient(bootstrap) as raw:
                listed = raw.request(LIST_GROUPS, 5, {"states_filter": [], "types_filter": []})
            assert [(g.group_id, g.group_type) for g in listed.groups
                    if g.group_id == group] == [(group, protocol)]
            c.close()  # leaves: the group is empty again


def test_mixed_protocol_joins_into_a_live_group_are_refused():
    from onceflow.broker.embedded import Broker

    with Broker(**FAST) as broker:
        bootstrap = broker.bootstrap_servers
        topic = create_topic(bootstrap, unique("mixed"), 1)
        classic_group, consumer_group = unique("live-classic"), unique("live-consumer")
        live = [consumer(bootstrap, classic_group, "classic"),
                consumer(bootstrap, consumer_group, "consumer")]
        for c in live:
            c.subscribe([topic])
        wait_for(lambda: all((c.poll(0.2), c.assignment())[1] for c in live),
                 "both groups to assign", TIMEOUT_S)
        with RawClient(bootstrap) as raw:
            answer = heartbeat(raw, group_id=classic_group, member_id=unique("m"),
                               subscribed_topic_names=[topic])
            assert answer.error_code == E.group_id_not_found
            join = raw.request(JOIN_GROUP, 5, {
                "group_id": consumer_group, "session_timeout": 6000, "rebalance_timeout": 6000,
                "member_id": "", "group_instance_id": None, "protocol_type": "consumer",
                "protocols": [{"name": "range", "metadata": b""}]})
            assert join.error_code == E.inconsistent_group_protocol
        for c in live:
            c.close()


def test_bad_heartbeats_and_commits_get_kafkas_errors(onceflow_broker_process):
    broker = onceflow_broker_process(args=(
        "--offsets-topic-partitions", "2", "--group-consumer-session-timeout-ms", "30000",
        "--group-consumer-heartbeat-interval-ms", "1000"))
    bootstrap = broker.bootstrap_servers
    topic = create_topic(bootstrap, unique("bad"), 4)
    with RawClient(bootstrap) as raw:
        raw.request(10, 1, {"key": "g", "key_type": 0})  # creates __consumer_offsets
        wait_for(lambda: heartbeat(raw, member_epoch=-1).error_code
                 != E.coordinator_not_available, "the coordinator", TIMEOUT_S)
        joined = heartbeat(raw, subscribed_topic_names=[topic])
        assert (joined.error_code, joined.member_id) == (E.none, "m")
        epoch = joined.member_epoch
        assert len(joined.assignment.topic_partitions[0].partitions) == 4
        owned = [{"topic_id": t.topic_id, "partitions": t.partitions}
                 for t in joined.assignment.topic_partitions]
        checks = [
            ({"member_epoch": epoch + 5, "topic_partitions": owned}, E.fenced_member_epoch),
            ({"member_id": "nobody", "member_epoch": 1}, E.unknown_member_id),
            ({"member_id": "r", "subscribed_topic_regex": "a(b"}, E.invalid_regular_expression),
            ({"member_id": "s", "subscribed_topic_names": [topic],
              "server_assignor": "sticky"}, E.unsupported_assignor),
            ({"member_id": "t", "subscribed_topic_names": [topic],
              "topic_partitions": owned}, E.invalid_request),   # a joiner claims partitions
            ({"member_id": "", "subscribed_topic_names": [topic]}, E.invalid_request),
            ({"member_epoch": -7}, E.invalid_request),
            ({"group_id": ""}, E.invalid_request),
        ]
        for fields, error in checks:
            assert heartbeat(raw, **fields).error_code == error, fields
        stale = raw.request(OFFSET_COMMIT, 9, {
            "group_id": "g", "generation_id_or_member_epoch": epoch - 1, "member_id": "m",
            "group_instance_id": None, "topics": [{"name": topic, "partitions": [
                {"partition_index": 0, "committed_offset": 1, "committed_leader_epoch": -1,
                 "committed_metadata": ""}]}]})
        assert stale.topics[0].partitions[0].error_code == E.stale_member_epoch
        before = raw.request(DESCRIBE, 1, {"group_ids": ["g"],
                                           "include_authorized_operations": False}).groups[0]
    broker.kill()
    broker.start()
    with RawClient(bootstrap) as raw:
        def described():
            return raw.request(DESCRIBE, 1, {"group_ids": ["g"],
                                             "include_authorized_operations": False}).groups[0]
        wait_for(lambda: described().error_code == E.none, "the group to load", TIMEOUT_S)
        after = described()
        assert (after.group_epoch, after.assignment_epoch, after.group_state) == (
            before.group_epoch, before.assignment_epoch, before.group_state)
        assert [(m.member_id, m.member_epoch, m.assignment) for m in after.members] == [
            (m.member_id, m.member_epoch, m.assignment) for m in before.members]
        # the member heartbeats on after the restart, keeping its epoch and partitions
        again = heartbeat(raw, member_epoch=epoch, topic_partitions=owned)
        assert (again.error_code, again.member_epoch) == (E.none, epoch)
