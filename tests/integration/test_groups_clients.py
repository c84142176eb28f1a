"""Consumer groups with real clients: members leave, crash and join; nothing is lost.

For each of confluent-kafka, kafka-python and aiokafka: three consumers of one group share
a 6-partition topic and commit after processing. Then one leaves (LeaveGroup), another
crashes (SIGKILL: its session times out), a new one joins. Every record is processed at
least once, and once the survivors made their final commit the group's committed offsets
are the log end offsets.
"""

from __future__ import annotations

import pytest

from tests.helpers import create_topic, unique
from tests.integration.groups_support import (
    Records,
    Worker,
    all_processed,
    assignment_settled,
    committed,
    groups_broker,  # noqa: F401, F811 - a fixture
    wait_for,
)

PARTITIONS = 6
RECORDS_PER_PHASE = 300


@pytest.mark.parametrize("client", ["confluent", "kafka-python", "aiokafka"])
def test_members_leave_crash_and_join_without_losing_records(groups_broker, tmp_path, client):
    bootstrap = groups_broker.bootstrap_servers
    topic = create_topic(bootstrap, unique(f"groups-{client}"), PARTITIONS)
    group = unique("group")
    records = Records(bootstrap, topic, PARTITIONS)

    def worker(name: str) -> Worker:
        return Worker(client, bootstrap, group, topic, tmp_path / f"{name}.log").start()

    everyone = [worker("a"), worker("b"), worker("c")]
    a, b, c = everyone
    try:
        wait_for(assignment_settled([a, b, c], PARTITIONS), "three members sharing the topic")
        records.produce(RECORDS_PER_PHASE)
        wait_for(all_processed(everyone, records), "the first records")

        a.stop()  # leaves the group: its partitions move at once
        wait_for(assignment_settled([b, c], PARTITIONS), "b and c taking over a's partitions")
        records.produce(RECORDS_PER_PHASE)
        wait_for(all_processed(everyone, records), "records after a left")

        c.kill()  # crashes: its partitions move when its session times out
        records.produce(RECORDS_PER_PHASE)
        wait_for(assignment_settled([b], PARTITIONS), "b alone after c's session expired")
        wait_for(all_processed(everyone, records), "records after c crashed")

        d = worker("d")
        everyone.append(d)
        wait_for(assignment_settled([b, d], PARTITIONS), "d joining b")
        records.produce(RECORDS_PER_PHASE)
        wait_for(all_processed(everyone, records), "records after d joined")
        assert d.processed(), "the new member processed its share"

        wait_for(lambda: committed(bootstrap, group, topic, PARTITIONS) == records.end_offsets(),
                 "the last commits")
        b.stop()
        d.stop()
    finally:
        for w in everyone:
            w.kill()
    assert committed(bootstrap, group, topic, PARTITIONS) == records.end_offsets()
    processed = [value for w in everyone for value in w.processed()]
    assert set(processed) == set(range(records.count)), "every record, nothing else"
