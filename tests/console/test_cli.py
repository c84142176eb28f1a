"""`onceflow console` as a person runs it: it says where it listens, serves, stops on
SIGTERM; wrong settings are one line on stderr."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import httpx

from tests.helpers import TIMEOUT_S

START_TIMEOUT_S = 30.0


def onceflow(*args: str, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "onceflow", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kwargs)


def test_console_command_serves_and_stops(console_broker, tmp_path):
    config = tmp_path / "client.properties"
    config.write_text("# the user's client settings\nclient.id=from-the-file\n")
    process = onceflow("console", "-b", console_broker.bootstrap_servers, "--port", "0",
                       "--command-config", str(config))
    try:
        line = process.stdout.readline()
        assert line.startswith("onceflow console at http://127.0.0.1:"), line
        url = line.split()[3]
        assert httpx.get(f"{url}/topics", timeout=TIMEOUT_S).status_code == 200
        started = time.monotonic()
        process.send_signal(signal.SIGTERM)
        assert process.wait(START_TIMEOUT_S) == 0
        assert time.monotonic() - started < 10
        assert "Traceback" not in process.stderr.read()
    finally:
        if process.poll() is None:
            process.kill()


def test_wrong_settings_are_one_line(tmp_path):
    cases = [(("--host", "0.0.0.0"), "give a login token"),
             (("--command-config", str(tmp_path / "missing")), "cannot read"),
             (("--host", "0.0.0.0", "--token", "short"), "at least 16 characters")]
    for args, fragment in cases:
        result = subprocess.run([sys.executable, "-m", "onceflow", "console", "-b",
                                 "127.0.0.1:1", *args], capture_output=True, text=True, check=False,
                                timeout=START_TIMEOUT_S, env={**os.environ, "COLUMNS": "300"})
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 1 and len(lines) == 1, result.stderr
        assert lines[0].startswith("error: ") and fragment in lines[0], lines[0]
