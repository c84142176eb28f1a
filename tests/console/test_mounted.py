"""The console on the broker's admin port: `Broker(console=True)` and `onceflow broker
--console`, with the admin endpoint's /metrics and /faults beside it and the segments
only the broker knows."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import httpx
from confluent_kafka import Producer
from selenium.webdriver.common.by import By

from onceflow import Broker
from onceflow.testing import free_port
from tests.console.support import screenshot, text_of, wait_for
from tests.helpers import TIMEOUT_S, create_topic, unique


def test_embedded_broker_serves_the_console_on_its_admin_port(browser, tmp_path, capsys):
    with Broker(console=True, offsets_topic_num_partitions=2,
                transaction_state_num_partitions=2) as broker:
        url = broker.console_url
        assert url and f"onceflow console at {url}" in capsys.readouterr().out
        topic = create_topic(broker.bootstrap_servers, unique("mounted"),
                             config={"segment.ms": "100"})
        producer = Producer({"bootstrap.servers": broker.bootstrap_servers})
        for _ in range(3):
            producer.produce(topic, value=b"x" * 200, partition=0)
            producer.flush(TIMEOUT_S)
            time.sleep(0.2)                    # past segment.ms: the next append rolls
        assert httpx.get(f"{url}/metrics", timeout=TIMEOUT_S).text.count("onceflow_requests")
        assert httpx.get(f"{url}/faults", timeout=TIMEOUT_S).json()["rules"] == []
        browser.get(f"{url}/topics/{topic}/0")
        wait_for(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#segment-table tr"),
                 message="the segments")
        rows = browser.execute_script("""return [...document.querySelectorAll(
            '#segment-table tr')].slice(1, -1).map(r => r.innerText.split('\\t'));""")
        assert len(rows) > 1 and "active" in rows[-1][-1]
        assert text_of(browser, "#segment-table").count("KiB") + \
            text_of(browser, "#segment-table").count(" B") >= len(rows)
        screenshot(browser, "segments", tmp_path)


def test_broker_command_serves_the_console(tmp_path):
    port, admin_port = free_port(), free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "onceflow", "broker", "--data-dir", str(tmp_path / "data"),
         "--port", str(port), "--console", "--admin-port", str(admin_port),
         "--offsets-topic-partitions", "2", "--transaction-state-partitions", "2"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert "listening on" in process.stdout.readline()
        line = process.stdout.readline()
        assert line.startswith("onceflow console") and f":{admin_port}" in line, line
        url = line.split(" at ")[-1].strip()
        assert httpx.get(f"{url}/topics", timeout=TIMEOUT_S).status_code == 200
        assert httpx.get(f"{url}/metrics", timeout=TIMEOUT_S).status_code == 200
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0
    finally:
        if process.poll() is None:
            process.kill()
    refused = subprocess.run(
        [sys.executable, "-m", "onceflow", "broker", "--data-dir", str(tmp_path / "other"),
         "--console", "--host", "0.0.0.0"], capture_output=True, text=True, timeout=60,
        check=False)
    assert refused.returncode == 1 and "give a login token" in refused.stderr
