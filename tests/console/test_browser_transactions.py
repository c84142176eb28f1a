"""The console in real Chromium: an open transaction holds the LSO back and the pages show
it live; the records view draws the transaction structure; aborting from the page frees
the LSO and a waiting read_committed consumer."""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from selenium.webdriver.common.by import By

from tests.console.support import number_in, screenshot, text_of, wait_for
from tests.helpers import TIMEOUT_S, create_topic, unique

# The bound: the partition page shows LSO < HW this soon after the write.
LIVE_WITHIN_S = 2.0
RECORDS = 3


@pytest.fixture
def transactional(console_broker) -> Iterator:
    producers: list[Producer] = []

    def make() -> tuple[Producer, str]:
        transactional_id = f"console-{uuid.uuid4().hex[:8]}"
        producer = Producer({"bootstrap.servers": console_broker.bootstrap_servers,
                             "transactional.id": transactional_id, "linger.ms": 0})
        producer.init_transactions(TIMEOUT_S)
        producers.append(producer)
        return producer, transactional_id

    yield make
    for producer in producers:
        with contextlib.suppress(KafkaException):
            producer.abort_transaction(TIMEOUT_S)
    producers.clear()


def write(producer: Producer, topic: str, outcome: str) -> None:
    producer.begin_transaction()
    for i in range(RECORDS):
        producer.produce(topic, key=f"{outcome}-{i}".encode(),
                         value=f'{{"outcome": "{outcome}", "n": {i}}}'.encode(), partition=0)
    assert producer.flush(TIMEOUT_S) == 0
    if outcome == "commit":
        producer.commit_transaction(TIMEOUT_S)
    elif outcome == "abort":
        producer.abort_transaction(TIMEOUT_S)


def read_committed_offsets(bootstrap: str, topic: str) -> list[int]:
    """Offsets a real read_committed consumer receives from the start, up to its end."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("rc"),
                         "isolation.level": "read_committed", "enable.partition.eof": True,
                         "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, 0, 0)])
    offsets = []
    deadline = time.monotonic() + TIMEOUT_S
    try:
        while time.monotonic() < deadline:
            message = consumer.poll(0.2)
            if message is None:
                continue
            if message.error() is not None:
                if message.error().code() == KafkaError._PARTITION_EOF:
                    return offsets
                raise AssertionError(message.error())
            offsets.append(message.offset())
    finally:
        consumer.close()
    raise AssertionError("the read_committed consumer never reached the end")


def statuses(browser) -> list[tuple[int, str]]:
    rows = browser.find_elements(By.CSS_SELECTOR, "#records tr[data-offset]")
    return [(int(r.get_attribute("data-offset")), r.get_attribute("data-status")) for r in rows]


def test_open_transaction_is_shown_live_and_in_the_records(console, console_broker, browser,
                                                            transactional, tmp_path):
    bootstrap = console_broker.bootstrap_servers
    topic = create_topic(bootstrap, unique("console-txn"))
    partition_page = f"{console.url}/topics/{topic}/0"
    browser.get(partition_page)
    wait_for(browser, lambda d: number_in(d, "#hw") == 0, message="the empty partition")

    producer, transactional_id = transactional()
    write(producer, topic, "commit")   # offsets 0-2, COMMIT marker 3
    write(producer, topic, "abort")    # offsets 4-6, ABORT marker 7
    write(producer, topic, "open")     # offsets 8-10, left open
    written = time.monotonic()
    wait_for(browser, lambda d: number_in(d, "#lso") == 8 and number_in(d, "#hw") == 11,
             timeout_s=LIVE_WITHIN_S, message="LSO 8 < HW 11 on the live partition page")
    print(f"partition page showed LSO < HW {time.monotonic() - written:.2f} s after the write")
    wait_for(browser, lambda d: "producer" in text_of(d, "#holder"), message="who holds the LSO")
    assert number_in(browser, "#held-back") == 3
    screenshot(browser, "partition", tmp_path)

    browser.get(f"{console.url}/transactions")
    row = f'#transaction-table tr[data-transactional-id="{transactional_id}"]'
    wait_for(browser, lambda d: d.find_elements(By.CSS_SELECTOR, row), message="the open one")
    state = browser.execute_script(
        "return document.querySelector(arguments[0]).dataset.state;", row)
    assert state == "Ongoing"
    age = text_of(browser, f"{row} td[data-field=age]")
    assert age.endswith(" s"), age       # "1.3 s": how long it has been open
    assert f"{topic}-0 at 8" in text_of(browser, row)
    screenshot(browser, "transactions", tmp_path)

    records = f"{console.url}/topics/{topic}/0/records?offset=0"
    browser.get(records)
    assert statuses(browser) == [(0, "committed"), (1, "committed"), (2, "committed"),
                                 (3, "marker"), (4, "aborted"), (5, "aborted"), (6, "aborted"),
                                 (7, "marker"), (8, "open"), (9, "open"), (10, "open")]
    screenshot(browser, "records", tmp_path)

    # Pages left behind close their event streams (a browser allows six connections per
    # site: streams kept by left pages would block the next navigation).
    wait_for(browser, lambda _d: console.app.state.console.streams.open == 1,
             message="one event stream: the records page's")
    browser.find_element(By.ID, "show-committed").click()
    wait_for(browser, lambda d: "read_committed" in d.current_url)
    shown = [offset for offset, _status in statuses(browser)]
    assert shown == read_committed_offsets(bootstrap, topic) == [0, 1, 2]
    assert "3 aborted" in text_of(browser, "#hidden")
    screenshot(browser, "records-read-committed", tmp_path)


class Waiting:
    """A read_committed consumer polling on a thread; what it received."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.values: list[bytes] = []
        self._stop = threading.Event()
        self._consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("wait"),
                                   "isolation.level": "read_committed",
                                   "enable.auto.commit": False})
        self._consumer.assign([TopicPartition(topic, 0, 0)])
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            message = self._consumer.poll(0.1)
            if message is not None and message.error() is None:
                self.values.append(message.value())

    def close(self) -> None:
        self._stop.set()
        self._thread.join(TIMEOUT_S)
        self._consumer.close()


def test_abort_from_the_page_frees_the_lso_and_the_waiting_consumer(console, console_broker,
                                                                     browser, transactional,
                                                                     tmp_path):
    bootstrap = console_broker.bootstrap_servers
    topic = create_topic(bootstrap, unique("console-abort"))
    producer, transactional_id = transactional()
    write(producer, topic, "open")                       # offsets 0-2, open
    plain = Producer({"bootstrap.servers": bootstrap})
    for i in range(2):
        plain.produce(topic, value=f"after-{i}".encode(), partition=0)   # offsets 3-4
    assert plain.flush(TIMEOUT_S) == 0
    waiting = Waiting(bootstrap, topic)
    try:
        time.sleep(1.0)
        assert waiting.values == [], "the open transaction should hold the records after it"

        browser.get(f"{console.url}/transactions")
        row = f'#transaction-table tr[data-transactional-id="{transactional_id}"]'
        wait_for(browser, lambda d: d.find_elements(By.CSS_SELECTOR, f"{row} button"))
        browser.find_element(By.CSS_SELECTOR, f"{row} button").click()
        wait_for(browser, lambda d: d.find_elements(By.ID, "confirm-abort"),
                 message="the confirmation")
        screenshot(browser, "abort-confirm", tmp_path)
        browser.find_element(By.ID, "confirm-abort").click()
        wait_for(browser, lambda d: d.find_elements(By.ID, "abort-result"),
                 message="the abort's answer")

        browser.get(f"{console.url}/topics/{topic}/0")
        wait_for(browser, lambda d: number_in(d, "#hw") is not None
                 and number_in(d, "#lso") == number_in(d, "#hw"), message="LSO == HW")
        assert number_in(browser, "#hw") == 6            # 3 aborted, 2 after, the marker
        wait_for(browser, lambda _d: waiting.values == [b"after-0", b"after-1"],
                 message="the waiting read_committed consumer gets the records after it")
    finally:
        waiting.close()
    with pytest.raises(KafkaException):                 # the old instance was fenced
        producer.commit_transaction(TIMEOUT_S)
