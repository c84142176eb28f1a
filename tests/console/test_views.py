"""The processor and pipeline views over HTTP, from real commits and real progress records."""

from __future__ import annotations

import re
import uuid

import httpx
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from onceflow.processor import offset_map
from onceflow.spark.progress import ProgressRecord
from tests.helpers import TIMEOUT_S, create_topic, unique


def test_processor_window_from_the_commit_metadata(console, console_broker):
    bootstrap = console_broker.bootstrap_servers
    topic = create_topic(bootstrap, unique("console-proc"))
    producer = Producer({"bootstrap.servers": bootstrap})
    for i in range(30):
        producer.produce(topic, value=b"v", partition=0)
    assert producer.flush(TIMEOUT_S) == 0
    group = unique("processor")
    metadata, _kept = offset_map.encode(10, [(12, 14), (17, 18)])
    committer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    committer.commit(offsets=[TopicPartition(topic, 0, 10, metadata=metadata)],
                     asynchronous=False)
    committer.close()
    page = httpx.get(f"{console.url}/groups/{group}", timeout=30)
    assert page.status_code == 200, page.text
    window = page.text[page.text.index('id="window"'):]
    cells = [re.sub(r"<[^>]+>", "", c).strip() for c in re.findall(r"<td[^>]*>(.*?)</td>",
                                                                    window.split("</table>")[0])]
    assert cells == [f"{topic}-0", "10", "[12, 14) [17, 18)", "3", "5", "18"]


def test_pipeline_progress_from_the_progress_topic(console, console_broker):
    bootstrap = console_broker.bootstrap_servers
    topic = "_onceflow_spark_progress"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    if topic not in admin.list_topics(timeout=TIMEOUT_S).topics:
        admin.create_topics([NewTopic(topic, 4, 1, config={"cleanup.policy": "compact"})])[
            topic].result(TIMEOUT_S)
    query = str(uuid.uuid4())
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"p-{query}"})
    producer.init_transactions(TIMEOUT_S)
    times = {0: 1_000_000, 1: 1_004_000, 2: 1_010_500}          # batch -> commit time
    for batch, time_ms in times.items():
        producer.begin_transaction()
        for partition in (0, 1):
            record = ProgressRecord(query, partition, batch, 5 + partition, time_ms - partition,
                                    f"onceflow-spark-{query}-{partition}")
            producer.produce(topic, key=record.key(), value=record.encode())
        producer.commit_transaction(TIMEOUT_S)
    page = httpx.get(f"{console.url}/pipelines", timeout=30)
    assert page.status_code == 200, page.text
    assert f"Query {query}" in page.text, page.text[-3000:]
    section = page.text[page.text.index(f"Query {query}"):]
    assert "last batch <b>2</b> (11 rows" in section
    assert "batch duration 6.5 s" in section                  # 1,010,500 - 1,004,000 ms
    assert "transactional ids <code>onceflow-spark-" in section
