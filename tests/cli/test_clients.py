"""`onceflow produce` and `onceflow consume` against a real broker."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from onceflow.cli.clients import METADATA_TIMEOUT_S
from onceflow.protocol.apis import SUPPORTED, ApiKey
from tests.cli.helpers import assert_one_line_error, new_topic_name

SUBPROCESS_TIMEOUT_S = 60.0
# Every consume below also gets --timeout-ms: a broken broker fails the test, not hangs it.
IDLE_TIMEOUT_MS = "10000"
FILE_RECORDS = 5_000


def json_records(stdout: str) -> list[dict]:
    return [json.loads(line) for line in stdout.splitlines() if line.strip()]


def closed_port() -> int:
    """A port nothing listens on (bound and released a moment ago)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_produce_stdin_then_consume_json(onceflow, bootstrap, make_topic):
    topic = make_topic(partitions=3)
    lines = "user-1:login\nuser-2:click\nuser-1:logout\n"
    produced = onceflow("produce", topic, "--key-separator", ":", "-b", bootstrap, input=lines)
    assert produced.exit_code == 0, produced.output
    assert f"produced 3 records to {topic}" in produced.stdout

    consumed = onceflow("consume", topic, "--from-beginning", "--max-messages", "3",
                        "--format", "json", "--timeout-ms", IDLE_TIMEOUT_MS, "-b", bootstrap)
    assert consumed.exit_code == 0, consumed.output
    records = json_records(consumed.stdout)
    assert sorted((r["key"], r["value"]) for r in records) == [
        ("user-1", "login"), ("user-1", "logout"), ("user-2", "click")]
    user_1 = [r for r in records if r["key"] == "user-1"]
    assert user_1[0]["partition"] == user_1[1]["partition"]  # one key, one partition
    assert [r["value"] for r in user_1] == ["login", "logout"]  # in order
    assert user_1[1]["offset"] == user_1[0]["offset"] + 1
    assert "consumed 3 records" in consumed.stderr


def test_produce_file_then_consume_plain(onceflow, bootstrap, make_topic, tmp_path):
    topic = make_topic()
    source = tmp_path / "lines.txt"
    source.write_text("".join(f"value-{i}\n" for i in range(FILE_RECORDS)))
    produced = onceflow("produce", topic, "--file", str(source), "-b", bootstrap)
    assert produced.exit_code == 0, produced.output
    assert f"produced {FILE_RECORDS} records" in produced.stdout

    consumed = onceflow("consume", topic, "--from-beginning", "--max-messages", str(FILE_RECORDS),
                        "--format", "plain", "--timeout-ms", IDLE_TIMEOUT_MS, "-b", bootstrap)
    assert consumed.exit_code == 0, consumed.output
    rows = [line.split("\t") for line in consumed.stdout.splitlines()]
    assert rows == [["0", str(i), "", f"value-{i}"] for i in range(FILE_RECORDS)]


def test_consume_table_is_default(onceflow, bootstrap, make_topic):
    topic = make_topic()
    onceflow("produce", topic, "--key-separator", "=", "-b", bootstrap, input="k=hello\n")
    consumed = onceflow("consume", topic, "--from-beginning", "--max-messages", "1",
                        "--timeout-ms", IDLE_TIMEOUT_MS, "-b", bootstrap)
    assert consumed.exit_code == 0, consumed.output
    assert f"{topic}: 1 records" in consumed.stdout
    assert "hello" in consumed.stdout and "│" in consumed.stdout


def test_consume_stops_after_idle_timeout(onceflow, bootstrap, make_topic):
    topic = make_topic()
    onceflow("produce", topic, "-b", bootstrap, input="old\n")
    started = time.monotonic()
    # Without --from-beginning reading starts at the end: the old record is not shown.
    consumed = onceflow("consume", topic, "--timeout-ms", "1000", "--format", "plain",
                        "-b", bootstrap)
    assert consumed.exit_code == 0, consumed.output
    assert consumed.stdout == ""
    assert "consumed 0 records" in consumed.stderr
    assert time.monotonic() - started < 10


def test_consume_isolation_levels(onceflow, bootstrap, make_topic):
    topic = make_topic()
    onceflow("produce", topic, "-b", bootstrap, input="a\nb\n")
    for isolation in ("read_committed", "read_uncommitted"):
        consumed = onceflow("consume", topic, "--from-beginning", "--max-messages", "2",
                            "--isolation", isolation, "--format", "plain",
                            "--timeout-ms", IDLE_TIMEOUT_MS, "-b", bootstrap)
        assert consumed.exit_code == 0, consumed.output
        assert [line.split("\t")[3] for line in consumed.stdout.splitlines()] == ["a", "b"]


@pytest.mark.skipif(ApiKey.JOIN_GROUP not in SUPPORTED,
                    reason="consumer groups: the broker does not advertise JoinGroup yet")
def test_consume_with_group_commits_offsets(onceflow, bootstrap, make_topic):
    topic = make_topic()
    group = new_topic_name("group")
    onceflow("produce", topic, "-b", bootstrap, input="a\nb\nc\n")
    first = onceflow("consume", topic, "--group", group, "--from-beginning", "--max-messages",
                     "2", "--format", "plain", "--timeout-ms", IDLE_TIMEOUT_MS, "-b", bootstrap)
    assert [line.split("\t")[3] for line in first.stdout.splitlines()] == ["a", "b"]
    # Resumes from the committed offset: the next record is "c", not "a" again.
    rest = onceflow("consume", topic, "--group", group, "--max-messages", "1",
                    "--timeout-ms", IDLE_TIMEOUT_MS, "--format", "plain", "-b", bootstrap)
    assert [line.split("\t")[3] for line in rest.stdout.splitlines()] == ["c"]


def test_unknown_topic_is_one_line_error(onceflow, bootstrap):
    missing = new_topic_name("missing")
    produced = onceflow("produce", missing, "-b", bootstrap, input="x\n")
    assert_one_line_error(produced, f"unknown topic '{missing}'")
    consumed = onceflow("consume", missing, "--timeout-ms", "100", "-b", bootstrap)
    assert_one_line_error(consumed, f"unknown topic '{missing}'")


def test_missing_key_separator_names_the_line(onceflow, bootstrap, make_topic):
    topic = make_topic()
    result = onceflow("produce", topic, "--key-separator", ":", "-b", bootstrap,
                      input="a:1\nno separator here\nc:3\n")
    assert_one_line_error(result, "line 2 has no key separator ':'",
                          "the 1 records before it were produced")


@pytest.mark.parametrize("command", [("topics", "list"), ("produce", "t"), ("consume", "t")])
def test_unreachable_broker_fails_fast_in_one_line(onceflow, command):
    started = time.monotonic()
    result = onceflow(*command, "-b", f"127.0.0.1:{closed_port()}", input="x\n")
    assert_one_line_error(result, "cannot reach a broker at 127.0.0.1:")
    assert time.monotonic() - started < METADATA_TIMEOUT_S  # refused: no need to wait


def test_console_script_and_bootstrap_env(bootstrap, make_topic):
    """The installed entry point, in a child process, configured by ONCEFLOW_BOOTSTRAP."""
    topic = make_topic()
    env = {**os.environ, "ONCEFLOW_BOOTSTRAP": bootstrap}
    command = [sys.executable, "-m", "onceflow"]
    produced = subprocess.run([*command, "produce", topic], input="via-env\n", env=env,
                              capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT_S)
    assert produced.returncode == 0, produced.stderr
    consumed = subprocess.run([*command, "consume", topic, "--from-beginning",
                               "--max-messages", "1", "--format", "plain",
                               "--timeout-ms", IDLE_TIMEOUT_MS], env=env,
                              capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT_S)
    assert consumed.returncode == 0, consumed.stderr
    assert consumed.stdout == "0\t0\t\tvia-env\n"
