"""`onceflow acl` and `onceflow user` against a secured broker, with --command-config."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(180)


def _run(*args: str, env_extra: dict | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, COLUMNS="200", **(env_extra or {}))
    return subprocess.run([sys.executable, "-m", "onceflow", *args], capture_output=True,
                          text=True, timeout=120, env=env)


def test_acl_and_user_commands(onceflow_secure_broker, tmp_path):
    secure = onceflow_secure_broker
    config = tmp_path / "admin.properties"
    config.write_text("\n".join(f"{k}={v}" for k, v in secure.client_config("admin").items()
                                if k != "bootstrap.servers") + "\n")
    common = ["--bootstrap-servers", secure.bootstrap_servers, "--command-config", str(config)]

    added = _run("user", "add", "carol", "--mechanism", "SCRAM-SHA-256", *common,
                 env_extra={"ONCEFLOW_USER_PASSWORD": "carol-secret"})
    assert added.returncode == 0, added.stderr
    listed = _run("user", "list", *common)
    assert listed.returncode == 0 and "carol" in listed.stdout and "SCRAM-SHA-256" in listed.stdout
    assert "carol-secret" not in listed.stdout + listed.stderr

    added = _run("acl", "add", "--principal", "User:carol", "--operation", "Write",
                 "--operation", "Describe", "--topic", "carol-", "--prefixed", *common)
    assert added.returncode == 0, added.stderr
    listed = _run("acl", "list", "--topic", "carol-orders", *common)   # prefix matches
    assert listed.returncode == 0 and "User:carol" in listed.stdout and "PREFIXED" in listed.stdout
    assert "WRITE" in listed.stdout and "DESCRIBE" in listed.stdout
    removed = _run("acl", "remove", "--principal", "User:carol", "--operation", "Write",
                   "--topic", "carol-", "--prefixed", *common)
    assert removed.returncode == 0 and "removed 1 ACL" in removed.stdout, removed.stderr
    listed = _run("acl", "list", "--principal", "User:carol", *common)
    assert "WRITE" not in listed.stdout and "DESCRIBE" in listed.stdout

    # Without the admin's login the commands fail in one line.
    refused = _run("acl", "list", "--bootstrap-servers", secure.bootstrap_servers)
    assert refused.returncode != 0 and "Traceback" not in refused.stderr
    removed = _run("user", "remove", "carol", "--mechanism", "SCRAM-SHA-256", *common)
    assert removed.returncode == 0, removed.stderr
    assert "carol" not in _run("user", "list", *common).stdout
