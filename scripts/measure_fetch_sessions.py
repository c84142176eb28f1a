"""Fetch request sizes of a Java consumer of 1,000 partitions (docs/protocol.md).

Run from the repository: PYTHONPATH=src:. python scripts/measure_fetch_sessions.py
"""

from onceflow.broker.embedded import Broker
from tests.helpers import create_topic
from tests.integration.test_fetch_sessions import _produce
from tests.java_support import run_java
from tests.kafka_raw import RawClient

PARTITIONS = 1000

with Broker(fsync=False) as broker:
    create_topic(broker.bootstrap_servers, "many", partitions=PARTITIONS)
    with RawClient(broker.bootstrap_servers) as client:
        for partition in (0, PARTITIONS // 2, PARTITIONS - 1):
            _produce(client, "many", partition)
    print(run_java("AssignAll", broker.bootstrap_servers, "many", "3", "20"))
    for metric in broker.server.state.metrics.registry.collect():
        for sample in metric.samples:
            if sample.labels.get("request") == "Fetch" and not sample.name.endswith("_created"):
                print(sample.name, sample.labels, sample.value)
