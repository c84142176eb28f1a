"""A consumer group on the console: the lag matches `onceflow groups describe` (to the high
watermark and to the LSO), and offsets are reset from the page after a dry run."""

from __future__ import annotations

import contextlib
import uuid

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select
from typer.testing import CliRunner

from onceflow.cli.app import app
from tests.cli.helpers import table_rows
from tests.console.support import number_in, screenshot, text_of, wait_for
from tests.helpers import TIMEOUT_S, create_topic, unique

WIDE = {"COLUMNS": "300"}


def cli(*args: str):
    return CliRunner().invoke(app, list(args), env=WIDE)


def cli_lags(bootstrap: str, group: str, isolation: str) -> tuple[dict[tuple[str, int], str], str]:
    result = cli("groups", "describe", group, "-b", bootstrap, "--isolation", isolation)
    assert result.exit_code == 0, result.output
    rows = [row for row in table_rows(result.stdout) if len(row) == 7]
    total = next(line for line in result.stdout.splitlines() if "total lag" in line)
    return {(row[0], int(row[1])): row[5] for row in rows}, total.split("total lag")[1].strip()


def page_lags(browser) -> dict[tuple[str, int], str]:
    rows = browser.execute_script("""
        return [...document.querySelectorAll('#offsets-table tr[data-topic]')].map(r =>
            [r.dataset.topic, Number(r.dataset.partition),
             r.querySelector('[data-field=lag]').innerText.trim()]);""")
    return {(topic, partition): lag.replace(",", "") for topic, partition, lag in rows}


def test_group_lag_matches_the_cli_and_offsets_reset_after_a_dry_run(console, console_broker,
                                                                     browser, tmp_path):
    bootstrap = console_broker.bootstrap_servers
    topic = create_topic(bootstrap, unique("console-lag"), 2)
    plain = Producer({"bootstrap.servers": bootstrap})
    for i in range(10):
        plain.produce(topic, value=f"v{i}".encode(), partition=i % 2)   # 5 per partition
    assert plain.flush(TIMEOUT_S) == 0
    # An open transaction on partition 1: its LSO stays at 5 while its HW becomes 7.
    transactional = Producer({"bootstrap.servers": bootstrap,
                              "transactional.id": f"lag-{uuid.uuid4().hex[:8]}"})
    transactional.init_transactions(TIMEOUT_S)
    transactional.begin_transaction()
    transactional.produce(topic, value=b"open-1", partition=1)
    transactional.produce(topic, value=b"open-2", partition=1)
    assert transactional.flush(TIMEOUT_S) == 0

    group = unique("console-group")
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                         "client.id": "console-test", "enable.auto.commit": False,
                         "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    try:
        wait_for(browser, lambda _d: consumer.poll(0.2) is not None or consumer.assignment(),
                 message="the group's assignment")
        consumer.commit(offsets=[TopicPartition(topic, 0, 2), TopicPartition(topic, 1, 1)],
                        asynchronous=False)
        for isolation, expected in (("read_uncommitted", {0: "3", 1: "6"}),
                                    ("read_committed", {0: "3", 1: "4"})):
            browser.get(f"{console.url}/groups/{group}?isolation={isolation}")
            wait_for(browser, lambda d: page_lags(d), message="the offsets table")
            lags, total = cli_lags(bootstrap, group, isolation)
            assert page_lags(browser) == lags == {(topic, p): lag for p, lag in expected.items()}
            assert str(number_in(browser, "#total-lag")) == total
        screenshot(browser, "group", tmp_path)
    finally:
        consumer.close()
        with contextlib.suppress(KafkaException):
            transactional.abort_transaction(TIMEOUT_S)

    # Without members the offsets may be reset: a dry run first, then apply.
    browser.get(f"{console.url}/groups/{group}")
    wait_for(browser, lambda d: "empty" in text_of(d, "#group").lower(), message="an empty group")
    Select(browser.find_element(By.ID, "reset-strategy")).select_by_value("earliest")
    browser.find_element(By.ID, "reset-dry-run").click()
    wait_for(browser, lambda d: d.find_elements(By.ID, "reset-plan"), message="the dry run")
    # nothing changed yet: 3 + 7 (the abort's marker took offset 7 of partition 1)
    assert cli_lags(bootstrap, group, "read_uncommitted")[1] == "10"
    screenshot(browser, "group-reset", tmp_path)
    browser.find_element(By.ID, "reset-execute").click()
    wait_for(browser, lambda d: d.switch_to.alert, message="the confirmation")
    browser.switch_to.alert.accept()
    wait_for(browser, lambda d: d.find_elements(By.ID, "reset-done"), message="the reset")
    lags, total = cli_lags(bootstrap, group, "read_uncommitted")
    assert lags == {(topic, 0): "5", (topic, 1): "8"} and total == "13"
