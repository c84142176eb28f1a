"""The console in Chromium against a three-node cluster, and its login beyond localhost."""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import AdminClient
from selenium.webdriver.common.by import By

from tests.console.conftest import BROKER_SETTINGS
from tests.console.support import number_in, running_console, screenshot, text_of, wait_for
from tests.helpers import TIMEOUT_S, create_topic, unique

TOKEN = "browser-login-token-0123"


@pytest.fixture(scope="module")
def three_nodes() -> Iterator:
    from onceflow.broker.embedded import Broker

    with Broker(nodes=3, **BROKER_SETTINGS) as broker:
        yield broker


def test_console_works_against_three_nodes(three_nodes, browser, tmp_path):
    bootstrap = three_nodes.bootstrap_servers
    topic = create_topic(bootstrap, unique("console-nodes"), 3,
                         config={"retention.ms": "86400000"})
    leaders = {p.id: p.leader for p in AdminClient({"bootstrap.servers": bootstrap})
               .list_topics(topic, timeout=TIMEOUT_S).topics[topic].partitions.values()}
    assert len(set(leaders.values())) == 3          # one partition on each node
    partition = next(p for p, leader in leaders.items() if leader != 0)
    other = next(p for p in leaders if p != partition)    # for traffic on the charts
    producer = Producer({"bootstrap.servers": bootstrap,
                         "transactional.id": f"nodes-{uuid.uuid4().hex[:8]}"})
    producer.init_transactions(TIMEOUT_S)
    producer.begin_transaction()
    producer.produce(topic, value=b"open", partition=partition)
    assert producer.flush(TIMEOUT_S) == 0
    try:
        with running_console(bootstrap) as console:
            browser.get(console.url)
            wait_for(browser, lambda d: number_in(d, "#nodes-count") == 3, message="3 nodes")
            wait_for(browser, lambda d: number_in(d, "#held-total") == 1,
                     message="the open transaction in the overview's sample")
            series = console.app.state.console.series
            plain = Producer({"bootstrap.servers": bootstrap, "linger.ms": 50})

            def traffic_charted(_d) -> bool:   # records flow in while samples accumulate
                for _ in range(200):
                    plain.produce(topic, value=b"v", partition=other)
                plain.flush(TIMEOUT_S)
                points = series.points()
                return len(points) >= 3 and points[-1].in_per_s > 0

            wait_for(browser, traffic_charted, timeout_s=30, message="a few samples")
            wait_for(browser, lambda d: d.execute_script(
                "return document.querySelectorAll('#chart-rates canvas, #chart-held canvas')"
                ".length") == 2, message="both charts drawn")
            time.sleep(2 * console.app.state.console.settings.refresh_interval_s)
            screenshot(browser, "overview", tmp_path)
            browser.get(f"{console.url}/topics/{topic}")
            leader_cells = browser.execute_script("""
                return [...document.querySelectorAll('#partition-table tr[data-partition]')]
                    .map(r => [Number(r.dataset.partition), Number(r.cells[1].innerText)]);""")
            assert dict(leader_cells) == leaders
            wait_for(browser, lambda d: "retention.ms 86400000 topic" in text_of(d, "#configs")
                     .replace("\t", " "), message="configs with their sources")
            screenshot(browser, "topic", tmp_path)
            browser.get(f"{console.url}/topics/{topic}/{partition}")
            wait_for(browser, lambda d: number_in(d, "#lso") == 0 and number_in(d, "#hw") == 1,
                     message="LSO 0 < HW 1 on a partition led by another node")
            assert "producer" in text_of(browser, "#holder")
    finally:
        with contextlib.suppress(KafkaException):
            producer.abort_transaction(TIMEOUT_S)


def test_login_beyond_localhost(console_broker, browser, tmp_path):
    with running_console(console_broker.bootstrap_servers, host="0.0.0.0",
                         token=TOKEN) as console:
        browser.delete_all_cookies()
        browser.get(f"{console.url}/transactions")
        wait_for(browser, lambda d: "/login" in d.current_url, message="sent to the login")
        assert not browser.find_elements(By.ID, "transaction-table")
        browser.find_element(By.ID, "token").send_keys("wrong-token-wrong-token")
        browser.find_element(By.ID, "login").click()
        wait_for(browser, lambda d: "Wrong token" in text_of(d, "main"), message="refused")
        screenshot(browser, "login", tmp_path)
        browser.find_element(By.ID, "token").send_keys(TOKEN)
        browser.find_element(By.ID, "login").click()
        wait_for(browser, lambda d: d.find_elements(By.ID, "transaction-table"),
                 message="the page asked for, after the login")
        assert d_path(browser.current_url) == "/transactions"


def d_path(url: str) -> str:
    return "/" + url.split("/", 3)[3]
