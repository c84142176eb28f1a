"""The raw client (`onceflow.client.wire`, used by the console and `onceflow txn` /
`producers` for the APIs confluent-kafka lacks) over TLS and SASL, from the same librdkafka
properties as confluent-kafka."""

from __future__ import annotations

import pytest

from onceflow.client.wire import Connection, WireError
from onceflow.protocol.apis import ApiKey

METADATA_VERSIONS = (1, 12)


def _address(secure) -> tuple[str, int]:
    host, port = secure.bootstrap_servers.split(",")[0].rsplit(":", 1)
    return host, int(port)


def _properties(config: dict, **changes: str) -> dict:
    return {**{k: v for k, v in config.items() if k != "bootstrap.servers"}, **changes}


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-512", "SCRAM-SHA-256"])
def test_raw_connection_logs_in_over_sasl_ssl(onceflow_secure_broker, mechanism):
    host, port = _address(onceflow_secure_broker)
    properties = _properties(onceflow_secure_broker.client_config("admin", mechanism))
    with Connection(host, port, properties=properties) as connection:
        answer = connection.call(ApiKey.METADATA, METADATA_VERSIONS, topics=None,
                                 allow_auto_topic_creation=False,
                                 include_cluster_authorized_operations=False,
                                 include_topic_authorized_operations=False)
        assert answer.brokers, answer


def test_wrong_password_and_wrong_trust_fail_clearly(onceflow_secure_broker, tmp_path):
    host, port = _address(onceflow_secure_broker)
    config = onceflow_secure_broker.client_config("app")
    with pytest.raises(WireError) as refused:
        Connection(host, port, properties=_properties(config, **{"sasl.password": "nope-x1"}))
    assert "SASL authentication as app failed" in str(refused.value)
    assert "nope-x1" not in str(refused.value)
    with pytest.raises(WireError, match="certificate verify failed"):
        Connection(host, port, properties=_properties(config, **{"ssl.ca.location": ""}))
    with pytest.raises(WireError, match="not supported here"):
        Connection(host, port, properties=_properties(config, **{"sasl.mechanism": "GSSAPI"}))
    plain_text = _properties(config, **{"security.protocol": "SASL_PLAINTEXT"})
    with pytest.raises(WireError):   # TLS listener, no TLS: the broker closes, no hang
        Connection(host, port, timeout_s=10, properties=plain_text)
