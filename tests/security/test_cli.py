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


def test_client_commands_take_command_config(onceflow_secure_broker, tmp_path):
    secure = onceflow_secure_broker
    admin_config, app_config = tmp_path / "admin.properties", tmp_path / "app.properties"
    for path, user in ((admin_config, "admin"), (app_config, "app")):
        path.write_text("\n".join(f"{k}={v}" for k, v in secure.client_config(user).items()
                                  if k != "bootstrap.servers") + "\n")
    bootstrap = ["--bootstrap-servers", secure.bootstrap_servers]
    created = _run("topics", "create", "cli-orders", *bootstrap, "--command-config", str(admin_config))
    assert created.returncode == 0, created.stderr
    # The app sees nothing before its ACLs: Metadata hides the topic.
    assert "cli-orders" not in _run("topics", "list", *bootstrap, "--command-config",
                                    str(app_config)).stdout
    for operation in ("Write", "Read"):
        assert _run("acl", "add", "--principal", "User:app", "--operation", operation,
                    "--topic", "cli-orders", *bootstrap,
                    "--command-config", str(admin_config)).returncode == 0
    # `consume` without --group reads in a throw-away group named onceflow-cli-*, whose
    # coordinator librdkafka looks up: Describe on that prefix is needed.
    assert _run("acl", "add", "--principal", "User:app", "--operation", "Describe",
                "--group", "onceflow-cli-", "--prefixed", *bootstrap,
                "--command-config", str(admin_config)).returncode == 0
    env = {"ONCEFLOW_COMMAND_CONFIG": str(app_config)}   # the option's environment variable
    produced = subprocess.run(
        [sys.executable, "-m", "onceflow", "produce", "cli-orders", *bootstrap],
        input="hello\nworld\n", capture_output=True, text=True, timeout=120,
        env=dict(os.environ, **env))
    assert produced.returncode == 0, produced.stderr
    consumed = _run("consume", "cli-orders", *bootstrap, "--from-beginning", "--max-messages",
                    "2", "--format", "plain", env_extra=env)
    assert consumed.returncode == 0, consumed.stderr
    assert "hello" in consumed.stdout and "world" in consumed.stdout
