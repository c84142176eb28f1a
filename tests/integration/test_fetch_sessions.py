"""Incremental fetch sessions (KIP-227) over the raw protocol: a full fetch with epoch 0
creates a session, incremental fetches name only changes and are answered with only
changes, forgotten partitions leave the session, and the errors are Kafka's
(FETCH_SESSION_ID_NOT_FOUND, INVALID_FETCH_SESSION_EPOCH, FETCH_SESSION_TOPIC_ID_ERROR);
the cache holds at most max.incremental.fetch.session.cache.slots sessions."""

from __future__ import annotations

import uuid

from kio.schema.errors import ErrorCode

from onceflow.broker.embedded import Broker
from onceflow.broker.handlers.fetch import session_cache
from onceflow.protocol.records import SimpleRecord, build_batch
from tests.helpers import create_topic, unique, wait_for
from tests.integration.test_fetch_topic_ids import topic_id
from tests.java_support import run_java
from tests.kafka_raw import RawClient

PRODUCE, FETCH = 0, 1
PARTITIONS = 200


def _partition(index: int, offset: int) -> dict:
    return {"partition": index, "current_leader_epoch": -1, "fetch_offset": offset,
            "last_fetched_epoch": -1, "log_start_offset": -1, "partition_max_bytes": 1 << 20,
            "replica_directory_id": None}


def _fetch(client: RawClient, tid: uuid.UUID, session_id: int, epoch: int,
           partitions: dict[int, int], forget: list[int] = (), version: int = 17,
           topic: str | None = None):
    key = {"topic_id": tid} if version >= 13 else {"topic": topic}
    body = {"replica_id": -1, "replica_state": {"replica_id": -1, "replica_epoch": -1},
            "max_wait": 0, "min_bytes": 0, "max_bytes": 1 << 20, "isolation_level": 0,
            "session_id": session_id, "session_epoch": epoch, "cluster_id": None,
            "topics": [{**key, "partitions": [_partition(i, o) for i, o in partitions.items()]}]
            if partitions else [],
            "forgotten_topics_data": [{**key, "partitions": list(forget)}] if forget else [],
            "rack_id": ""}
    return client.request(FETCH, version, body)


def _answered(response) -> dict[int, int]:
    """partition -> bytes of records in the answer."""
    return {p.partition_index: len(p.records or b"")
            for topic in response.responses for p in topic.partitions}


def _produce(client: RawClient, topic: str, partition: int) -> None:
    response = client.request(PRODUCE, 9, {
        "transactional_id": None, "acks": -1, "timeout": 5000, "topic_data": [{
            "name": topic, "partition_data": [{"index": partition, "records": build_batch(
                [SimpleRecord(key=None, value=b"x")])}]}]})
    assert response.responses[0].partition_responses[0].error_code == ErrorCode.none


def test_incremental_fetch_session(onceflow_broker):
    bootstrap = onceflow_broker.bootstrap_servers
    topic = create_topic(bootstrap, unique("fetch-session"), partitions=3)
    tid = topic_id(bootstrap, topic)
    with RawClient(bootstrap) as client:
        full = _fetch(client, tid, 0, 0, {0: 0, 1: 0, 2: 0})
        assert full.error_code == ErrorCode.none and full.session_id != 0
        assert _answered(full) == {0: 0, 1: 0, 2: 0}
        session = full.session_id
        # Nothing changed: an empty answer.
        assert _answered(_fetch(client, tid, session, 1, {})) == {}
        # New data in partition 1 only: only partition 1 is answered.
        _produce(client, topic, 1)
        changed = _answered(_fetch(client, tid, session, 2, {}))
        assert list(changed) == [1] and changed[1] > 0
        # The client moves on in partition 1: nothing new to say.
        assert _answered(_fetch(client, tid, session, 3, {1: 1})) == {}
        # Partition 2 forgotten: its new data is not answered.
        assert _answered(_fetch(client, tid, session, 4, {}, forget=[2])) == {}
        _produce(client, topic, 2)
        assert _answered(_fetch(client, tid, session, 5, {})) == {}
        # Errors: a wrong epoch, an unknown session, a version naming topics by name.
        assert _fetch(client, tid, session, 9, {}).error_code == ErrorCode.invalid_fetch_session_epoch
        unknown = session % (2**31 - 1) + 1
        assert _fetch(client, tid, unknown, 1, {}).error_code == ErrorCode.fetch_session_id_not_found
        by_name = _fetch(client, tid, session, 6, {}, version=12, topic=topic)
        assert by_name.error_code == ErrorCode.fetch_session_topic_id_error
        # None of these errors uses up an epoch: 6 is still the next one.
        assert _fetch(client, tid, session, 6, {}).error_code == ErrorCode.none
        # Epoch -1 closes the session (a full, sessionless fetch).
        closing = _fetch(client, tid, session, -1, {0: 0})
        assert closing.session_id == 0 and _answered(closing) == {0: 0}
        assert _fetch(client, tid, session, 7, {}).error_code == ErrorCode.fetch_session_id_not_found


def test_session_cache_is_bounded(tmp_path):
    with Broker(data_dir=str(tmp_path), fetch_session_cache_slots=2) as broker:
        bootstrap = broker.bootstrap_servers
        topic = create_topic(bootstrap, unique("fetch-slots"), partitions=4)
        tid = topic_id(bootstrap, topic)
        with RawClient(bootstrap) as client:
            small = [_fetch(client, tid, 0, 0, {0: 0}).session_id for _ in range(2)]
            assert all(small)
            # Full cache, no smaller session to evict: no session (id 0), full fetches go on.
            assert _fetch(client, tid, 0, 0, {1: 0}).session_id == 0
            # A larger session takes the slot of a smaller one.
            large = _fetch(client, tid, 0, 0, {0: 0, 1: 0, 2: 0, 3: 0})
            assert large.session_id != 0
            alive = [_fetch(client, tid, s, 1, {}).error_code for s in small]
            assert sorted(alive) == sorted([ErrorCode.none, ErrorCode.fetch_session_id_not_found])


def _fetch_sizes(broker: Broker) -> dict[str, float]:
    """Cumulative histogram of Fetch request sizes: bucket bound -> count."""
    registry = broker.server.state.metrics.registry
    found = {}
    for metric in registry.collect():
        for sample in metric.samples:
            if (sample.name == "onceflow_request_bytes_bucket"
                    and sample.labels.get("request") == "Fetch"):
                found[sample.labels["le"]] = sample.value
    return found


def test_java_consumer_of_many_partitions_sends_small_incremental_fetches(tmp_path):
    with Broker(data_dir=str(tmp_path), fsync=False) as broker:
        bootstrap = broker.bootstrap_servers
        topic = create_topic(bootstrap, unique("fetch-many"), partitions=PARTITIONS)
        with RawClient(bootstrap) as client:
            for partition in (0, PARTITIONS // 2, PARTITIONS - 1):
                _produce(client, topic, partition)
        [result] = run_java("AssignAll", bootstrap, topic, "3", "10")
        assert result == {"partitions": PARTITIONS, "records": 3}
        sizes = _fetch_sizes(broker)
        total, small = sizes["+Inf"], sizes["1024.0"]
        # A full fetch names all partitions (33 bytes each at v17: 6.6 KB here); every
        # fetch after it in the session names only what changed (under 1 KiB). With 1,000
        # partitions the figures are the same (docs/protocol.md); 200 keep the test fast
        # (creating and closing 1,000 partitions takes half a minute). A loaded machine
        # may make the client start over once or twice: at most 3 large fetches.
        assert 1 <= total - small <= 3 and small >= 8, sizes
        assert sizes["+Inf"] - sizes["4096.0"] >= 1, sizes   # the full fetch
        # The consumer closed its session when it closed (a fetch with epoch -1).
        wait_for(lambda: broker.call(lambda: len(session_cache(broker.server.state))) == 0,
                 "the consumer's session is closed", 30)
