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


def test_the_direct_reads_of_produce_and_fetch_error_codes_agree_with_the_walk():
    """The answers as the handlers and the fault injector shape them."""
    from onceflow.broker.faults import _fetch_error, _produce_error
    from onceflow.broker.metrics import answer_error_codes

    produce = {"throttle_time": 0, "responses": [
        {"name": "a", "topic_id": None, "partition_responses": [
            {"index": 0, "error_code": 0, "base_offset": 5, "record_errors": [
                {"batch_index": 0, "batch_index_error_message": "m"}], "error_message": None},
            {"index": 1, "error_code": 87, "record_errors": []}]},
        {"name": "b", "topic_id": None, "partition_responses": []}]}
    fetch = {"throttle_time": 0, "error_code": 0, "session_id": 9, "responses": [
        {"topic": "a", "partitions": [
            {"partition_index": 0, "error_code": 0, "high_watermark": 3,
             "aborted_transactions": [{"producer_id": 1, "first_offset": 0}],
             "records": b"xyz", "current_leader": {"leader_id": 0, "leader_epoch": 1}},
            {"partition_index": 1, "error_code": 1, "records": None}]}],
        "node_endpoints": [{"node_id": 0, "host": "h", "port": 1, "rack": None}]}
    session_error = {"throttle_time": 0, "error_code": 70, "session_id": 0, "responses": []}
    metadata = {"throttle_time": 0, "error_code": 0, "brokers": [
        {"node_id": 0, "host": "h", "port": 1, "rack": None}], "cluster_id": "c",
        "controller_id": 0, "topics": [
            {"error_code": 0, "name": "a", "topic_id": None, "is_internal": False,
             "partitions": [{"error_code": 0, "partition_index": 0, "leader_id": 0,
                             "replica_nodes": [0], "isr_nodes": [0], "offline_replicas": []},
                            {"error_code": 5, "partition_index": 1, "leader_id": -1}]},
            {"error_code": 3, "name": "b", "topic_id": None, "partitions": []}]}
    shapes = [(ApiKey.PRODUCE, produce), (ApiKey.FETCH, fetch), (ApiKey.FETCH, session_error),
              (ApiKey.METADATA, metadata)]

    class Partition:
        index = partition = 0

    class Topic:
        name = topic = "t"
        partition_data = partitions = (Partition(),)

    class Body:
        acks = 1
        topic_data = topics = (Topic(),)

    shapes += [(ApiKey.PRODUCE, _produce_error(Body(), 6)), (ApiKey.FETCH, _fetch_error(Body(), 6))]
    for api_key, body in shapes:
        assert sorted(answer_error_codes(api_key, body)) == sorted(error_codes(body)), body
    assert sorted(answer_error_codes(ApiKey.PRODUCE, produce)) == [0, 87]
    assert sorted(answer_error_codes(ApiKey.FETCH, fetch)) == [0, 0, 1]
    assert sorted(answer_error_codes(ApiKey.METADATA, metadata)) == [0, 0, 0, 3, 5]
    # Another shape falls back to the walk.
    assert answer_error_codes(ApiKey.FETCH, {"error_code": 3, "topics": []}) == [3]
