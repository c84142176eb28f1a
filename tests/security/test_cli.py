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


def _properties_file(path, secure, user: str):
    path.write_text("\n".join(f"{k}={v}" for k, v in secure.client_config(user).items()
                              if k != "bootstrap.servers") + "\n")
    return path


def test_outbox_relay_takes_command_config(onceflow_secure_broker, tmp_path):
    """The relay as `app`, with the ACLs docs/security.md lists for it, over SASL_SSL."""
    from confluent_kafka.admin import (
        AclBinding,
        AclOperation,
        AclPermissionType,
        AdminClient,
        NewTopic,
        ResourcePatternType,
        ResourceType,
    )

    from onceflow import db, outbox

    secure = onceflow_secure_broker
    app_config = _properties_file(tmp_path / "app.properties", secure, "app")
    topic, progress, name = "relay-orders", "relay-progress", "shop"
    admin = AdminClient(secure.client_config("admin"))
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(timeout=60)

    def allow(rtype, resource, operation, pattern=ResourcePatternType.LITERAL):
        return AclBinding(rtype, resource, pattern, "User:app", "*", operation,
                          AclPermissionType.ALLOW)
    acls = [allow(ResourceType.TOPIC, topic, AclOperation.WRITE),
            allow(ResourceType.TOPIC, progress, AclOperation.CREATE),
            allow(ResourceType.TOPIC, progress, AclOperation.WRITE),
            allow(ResourceType.TOPIC, progress, AclOperation.READ),
            allow(ResourceType.TRANSACTIONAL_ID, f"onceflow-outbox-{name}", AclOperation.WRITE),
            allow(ResourceType.GROUP, "onceflow-outbox-reader-", AclOperation.READ,
                  ResourcePatternType.PREFIXED)]
    for future in admin.create_acls(acls).values():
        future.result(timeout=60)
    url = f"sqlite:///{tmp_path / 'app.db'}"
    assert _run("outbox", "init", "--db", url).returncode == 0
    with db.connect(url) as database:
        for i in range(5):
            with database.transaction():
                outbox.publish(database, topic, value=str(i))
    common = ["--db", url, "--bootstrap-servers", secure.bootstrap_servers, "--name", name,
              "--progress-topic", progress, "--command-config", str(app_config)]
    relayed = _run("outbox", "relay", *common, "--once")
    assert relayed.returncode == 0, relayed.stdout + relayed.stderr
    assert "published 5 rows" in relayed.stdout, relayed.stdout
    status = _run("outbox", "status", *common)
    assert status.returncode == 0, status.stderr
    assert "next seq" in status.stdout and "│ 6" in status.stdout, status.stdout
    # Without Write on the transactional id: a clear authorization error, nothing published.
    other = _run("outbox", "relay", *common[:-4], "--name", "other", "--progress-topic",
                 progress, "--command-config", str(app_config), "--once")
    assert other.returncode == 1
    # librdkafka's text for TRANSACTIONAL_ID_AUTHORIZATION_FAILED (53)
    assert "Transactional Id authorization failed" in other.stderr, other.stdout + other.stderr


def test_pipeline_run_takes_command_config(tmp_path):
    """The file's properties reach the Kafka source and the sinks on the pipeline's
    cluster as kafka.* options (the Spark run itself: tests/spark/test_secure.py)."""
    from onceflow.spark.pipeline import KafkaSink, KafkaSource, Pipeline, SparkSink

    pipeline = Pipeline(name="p", source=KafkaSource(topics=["in"], options={
                            "kafka.security.protocol": "PLAINTEXT", "maxOffsetsPerTrigger": "5"}),
                        sinks=[KafkaSink(topic="out"),
                               KafkaSink(topic="far", bootstrap_servers="other:9092"),
                               SparkSink(format="noop")], checkpoint="ck")
    secured = pipeline.with_kafka_properties({"security.protocol": "SASL_SSL",
                                              "sasl.mechanism": "SCRAM-SHA-512"})
    assert secured.source.options == {"kafka.security.protocol": "SASL_SSL",
                                      "maxOffsetsPerTrigger": "5",
                                      "kafka.sasl.mechanism": "SCRAM-SHA-512"}
    near, far, noop = secured.sinks
    assert near.writer_options("b:9092")["kafka.security.protocol"] == "SASL_SSL"
    assert "kafka.security.protocol" not in far.writer_options("b:9092")
    assert noop.options == {}
    assert pipeline.with_kafka_properties({}) is pipeline
    file = tmp_path / "p.py"
    file.write_text("from onceflow.spark.pipeline import KafkaSink, KafkaSource, Pipeline\n"
                    "pipeline = Pipeline(name='p', source=KafkaSource(topics=['in']),\n"
                    "                    sinks=[KafkaSink(topic='out')], checkpoint='ck',\n"
                    "                    bootstrap_servers='127.0.0.1:9')\n")
    # A bad file is one error line before Spark starts.
    missing = _run("pipeline", "run", str(file), "--command-config",
                   str(tmp_path / "nope.properties"))
    assert missing.returncode == 1 and "nope.properties" in missing.stderr, missing.stderr
