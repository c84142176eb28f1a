"""The Java Admin client (kafka-clients 3.9.1) against the broker: every config, log-dir,
election and reassignment call of issue 15 in one program (tests/java/AdminOps.java),
dynamic BROKER configs and CLIENT_METRICS subscriptions included (3.9.1 has no GROUP config
resource type: test_group_configs.py covers those over a raw socket)."""

from __future__ import annotations

from tests.helpers import create_topic, unique
from tests.java_support import run_java


def test_java_admin_calls(onceflow_broker):
    topic = create_topic(onceflow_broker.bootstrap_servers, unique("jadmin"), 1)
    results = {r["call"]: r for r in run_java("AdminOps", onceflow_broker.bootstrap_servers, topic)}
    described = results["describeConfigs"]
    assert described["configs"]["retention.ms"] == {
        "name": "retention.ms", "value": "604800000", "source": "DEFAULT_CONFIG", "type": "LONG",
        "read_only": False, "synonyms": 1}
    assert described["configs"]["cleanup.policy"]["type"] == "LIST"
    assert described["broker"]["log.cleaner.enable"]["type"] == "BOOLEAN"
    assert described["broker"]["log.cleaner.enable"]["read_only"] is True
    retention = results["incrementalAlterConfigs"]["configs"]["retention.ms"]
    assert (retention["value"], retention["source"]) == ("3600000", "DYNAMIC_TOPIC_CONFIG")
    legacy = results["alterConfigs"]["configs"]
    assert legacy["segment.ms"]["value"] == "7200000"
    assert legacy["retention.ms"]["source"] == "DEFAULT_CONFIG"  # replace-all
    invalid = results["alterConfigsInvalid"]
    assert invalid["error"] == "InvalidConfigurationException" and "retention.ms" in invalid["message"]
    assert results["describeTopics"] == {"call": "describeTopics", "partitions": 1, "leader": 0}
    dirs = results["describeLogDirs"]
    assert dirs["dirs"] == 1 and dirs["size"] >= 0 and dirs["total"] > 0 and dirs["usable"] > 0
    assert results["electLeaders"]["result"] == "ElectionNotNeededException"
    assert "error" not in results["alterPartitionReassignments"]
    assert results["alterPartitionReassignmentsUnknownNode"]["error"] == \
        "InvalidReplicaAssignmentException"
    assert results["listPartitionReassignments"]["ongoing"] == 0
    assert "error" not in results["describeFeatures"]
    dynamic = results["incrementalAlterConfigsBroker"]
    key = "producer.id.expiration.ms"
    assert (dynamic["after_default"][key]["value"], dynamic["after_default"][key]["source"]) == (
        "90000000", "DYNAMIC_DEFAULT_BROKER_CONFIG")
    assert (dynamic["after_node"][key]["value"], dynamic["after_node"][key]["source"]) == (
        "90000001", "DYNAMIC_BROKER_CONFIG")
    assert dynamic["after_node"][key]["read_only"] is False
    assert dynamic["after_node"][key]["synonyms"] == 3  # node, cluster default, default
    assert dynamic["default_resource"][key]["value"] == "90000000"
    assert dynamic["removed"][key]["source"] == "STATIC_BROKER_CONFIG" or \
        dynamic["removed"][key]["source"] == "DEFAULT_CONFIG"
    refused = results["incrementalAlterConfigsBrokerRefused"]
    assert refused["error"] == "InvalidRequestException"
    assert "Cannot update these configs dynamically" in refused["message"]
    metrics = results["clientMetrics"]
    assert metrics["listed"] is True
    assert (metrics["configs"]["interval.ms"]["value"],
            metrics["configs"]["interval.ms"]["source"]) == ("1000", "DYNAMIC_CLIENT_METRICS_CONFIG")
