"""The internal topics are ready right after start (issue 15): a broker creates
`__consumer_offsets` and `__transaction_state` in the background, without a group or a
transaction asking, so the first FindCoordinator does not wait for their partitions
(bench/first_join.py measures what the first join costs)."""

from __future__ import annotations

import time

from confluent_kafka.admin import AdminClient
from kio.schema.errors import ErrorCode

from onceflow import Broker
from tests.kafka_raw import RawClient

INTERNAL = {"__consumer_offsets", "__transaction_state"}
WAIT_S = 30
FIND_COORDINATOR = 10


def listed_topics(bootstrap: str) -> set[str]:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    return set(admin.list_topics(timeout=WAIT_S).topics)


def test_internal_topics_exist_right_after_start_without_a_group_asking():
    with Broker(offsets_topic_num_partitions=5, transaction_state_num_partitions=4) as broker:
        deadline = time.monotonic() + WAIT_S
        while not INTERNAL <= (topics := listed_topics(broker.bootstrap_servers)):
            assert time.monotonic() < deadline, f"internal topics never appeared: {topics}"
            time.sleep(0.05)
        admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
        metadata = admin.list_topics(timeout=WAIT_S).topics
        assert len(metadata["__consumer_offsets"].partitions) == 5
        assert len(metadata["__transaction_state"].partitions) == 4
        with RawClient(broker.bootstrap_servers) as client:
            # The first group's and transactional id's coordinators answer at once.
            for key_type, key in ((0, "first-group"), (1, "first-txn")):
                answer = client.request(FIND_COORDINATOR, 4, {"key_type": key_type,
                                                              "coordinator_keys": [key]})
                assert answer.coordinators[0].error_code == ErrorCode.none


def test_internal_topics_wait_for_first_use_when_asked_to():
    """internal_topics_at_start=False keeps Kafka's way: created by the first FindCoordinator."""
    with Broker(offsets_topic_num_partitions=2, internal_topics_at_start=False) as broker:
        assert not INTERNAL & listed_topics(broker.bootstrap_servers)
        with RawClient(broker.bootstrap_servers) as client:
            answer = client.request(FIND_COORDINATOR, 4, {"key_type": 0,
                                                          "coordinator_keys": ["g"]})
            assert answer.coordinators[0].error_code == ErrorCode.none
        assert "__consumer_offsets" in listed_topics(broker.bootstrap_servers)
