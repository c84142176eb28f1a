"""Per-request metrics kept in plain dicts (issue 19) and exposed as the same Prometheus
families prometheus_client's children gave: names, labels, cumulative buckets, errors."""

from onceflow.broker.metrics import ERROR_WALK_DEPTH_MAX, BrokerMetrics, error_codes
from onceflow.protocol.apis import ApiKey


def _samples(metrics: BrokerMetrics) -> dict[tuple, float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in metrics.registry.collect() for s in family.samples}


def test_requests_versions_sizes_and_errors_are_exposed_as_prometheus_families():
    metrics = BrokerMetrics()
    for size in (100, 5000, 5000):
        metrics.observe_request(ApiKey.PRODUCE, 9, size)
    metrics.observe_request(ApiKey.FETCH, 12, 70_000)
    produce_answer = {"responses": [{"name": "t", "partition_responses": [
        {"index": 0, "error_code": 0, "record_errors": []},
        {"index": 1, "error_code": 6, "record_errors": [{"batch_index": 0}]}]}],
        "throttle_time": 0}
    metrics.observe_response(ApiKey.PRODUCE, produce_answer)
    metrics.observe_response(ApiKey.PRODUCE, None)   # acks=0: counted, no errors
    samples = _samples(metrics)
    assert samples[("onceflow_requests_total", (("request", "Produce"),))] == 2
    assert samples[("onceflow_request_versions_total",
                    (("request", "Produce"), ("version", "9")))] == 3
    assert samples[("onceflow_request_versions_total",
                    (("request", "Fetch"), ("version", "12")))] == 1
    bucket = "onceflow_request_bytes_bucket"
    assert samples[(bucket, (("le", "64.0"), ("request", "Produce")))] == 0
    assert samples[(bucket, (("le", "256.0"), ("request", "Produce")))] == 1
    assert samples[(bucket, (("le", "4096.0"), ("request", "Produce")))] == 1
    assert samples[(bucket, (("le", "16384.0"), ("request", "Produce")))] == 3
    assert samples[(bucket, (("le", "+Inf"), ("request", "Produce")))] == 3
    assert samples[(bucket, (("le", "65536.0"), ("request", "Fetch")))] == 0
    assert samples[(bucket, (("le", "262144.0"), ("request", "Fetch")))] == 1
    assert samples[("onceflow_request_bytes_count", (("request", "Produce"),))] == 3
    assert samples[("onceflow_request_bytes_sum", (("request", "Produce"),))] == 10_100
    assert samples[("onceflow_errors_total", (("error", "NONE"), ("request", "Produce")))] == 1
    assert samples[("onceflow_errors_total",
                    (("error", "NOT_LEADER_OR_FOLLOWER"), ("request", "Produce")))] == 1
    text = metrics.render().decode()
    assert 'onceflow_requests_total{request="Produce"} 2.0' in text
    assert "# TYPE onceflow_request_bytes histogram" in text


def test_error_codes_are_found_at_any_depth_up_to_the_limit():
    body = {"error_code": 1, "topics": [{"error_code": 2, "partitions": (
        {"error_code": 3}, {"index": 0})}], "other": "error_code"}
    assert sorted(error_codes(body)) == [1, 2, 3]
    deep: dict = {"error_code": 9}
    for _ in range(ERROR_WALK_DEPTH_MAX + 2):
        deep = {"nested": [deep]}
    assert error_codes(deep) == []
