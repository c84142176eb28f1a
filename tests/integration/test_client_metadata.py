"""The CLI's and the console's first Metadata request (`client.admin.connect_admin`).

A broker whose full Metadata answer takes longer than the client's first attempt (a large
cluster: 10,000 partitions take onceflow 0.3-0.7 s) must still be reached: attempts that
give up leave their requests queued at the broker, so only longer attempts get an answer.
"""

from __future__ import annotations

import pytest

from onceflow import Broker
from onceflow.client.admin import METADATA_ATTEMPT_S, ClientError, connect_admin
from onceflow.testing import free_port

SLOW_METADATA_MS = int(METADATA_ATTEMPT_S * 1000 * 3)


def test_slow_metadata_answer_is_waited_for():
    with Broker() as broker:
        broker.faults.delay_responses("metadata", ms=SLOW_METADATA_MS, count=None)
        admin, metadata = connect_admin(broker.bootstrap_servers)
        assert metadata.brokers, "the cluster's nodes are in the answer"
        del admin


def test_refused_connection_is_a_clear_error():
    with pytest.raises(ClientError, match="cannot reach a broker at 127.0.0.1"):
        connect_admin(f"127.0.0.1:{free_port()}")
