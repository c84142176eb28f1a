"""What the first consumer group on a broker pays: FindCoordinator + JoinGroup + SyncGroup
for the first group, next to a second group's join in the same run (the reference).

    .venv/bin/python bench/first_join.py              # 5 runs per setting
    .venv/bin/python bench/first_join.py --runs 9

Theory of operation: for each setting of `internal_topics_at_start` (issue 15: the broker
creates `__consumer_offsets` and `__transaction_state` in the background a second after
start; False creates them on the first FindCoordinator, as Kafka does) a fresh embedded
broker with Kafka's 50 partitions per internal topic and group.initial.rebalance.delay.ms
0 is started, and a raw protocol client joins one group the way a consumer does
(FindCoordinator v4 retried every 5 ms while the coordinator is not available or loading,
JoinGroup v5 twice - the first answers MEMBER_ID_REQUIRED - and SyncGroup v3), once right
after start and once after the broker sat idle for two seconds; then a second group joins
(the reference: everything ready). It also reports how long the broker took to start
(until it accepts connections). Medians over the runs are printed.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kio.schema.errors import ErrorCode

from onceflow import Broker
from tests.kafka_raw import RawClient

FIND_COORDINATOR, JOIN_GROUP, SYNC_GROUP = 10, 11, 14
RETRY_S = 0.005
RETRIABLE = {ErrorCode.coordinator_not_available, ErrorCode.coordinator_load_in_progress}
IDLE_S = 2.0


def join_ms(client: RawClient, group: str) -> float:
    """FindCoordinator + JoinGroup (+ the MEMBER_ID_REQUIRED round) + SyncGroup, in ms."""
    started = time.perf_counter()
    while True:
        found = client.request(FIND_COORDINATOR, 4, {"key_type": 0, "coordinator_keys": [group]})
        error = found.coordinators[0].error_code
        if error == ErrorCode.none:
            break
        assert error in RETRIABLE, error
        time.sleep(RETRY_S)
    body = {"group_id": group, "session_timeout": 10_000, "rebalance_timeout": 10_000,
            "member_id": "", "group_instance_id": None, "protocol_type": "consumer",
            "protocols": [{"name": "range", "metadata": b""}]}
    joined = client.request(JOIN_GROUP, 5, body)
    if joined.error_code == ErrorCode.member_id_required:
        joined = client.request(JOIN_GROUP, 5, {**body, "member_id": joined.member_id})
    assert joined.error_code == ErrorCode.none, joined.error_code
    synced = client.request(SYNC_GROUP, 3, {
        "group_id": group, "generation_id": joined.generation_id,
        "member_id": joined.member_id, "group_instance_id": None,
        "assignments": [{"member_id": joined.member_id, "assignment": b""}]})
    assert synced.error_code == ErrorCode.none, synced.error_code
    return (time.perf_counter() - started) * 1000


def one_run(eager: bool, idle: bool) -> dict[str, float]:
    started = time.perf_counter()
    with Broker(internal_topics_at_start=eager, group_initial_rebalance_delay_ms=0) as broker:
        start_ms = (time.perf_counter() - started) * 1000
        if idle:
            time.sleep(IDLE_S)
        with RawClient(broker.bootstrap_servers) as client:
            first = join_ms(client, "first")
            second = join_ms(client, "second")
        return {"start": start_ms, "first": first, "second": second}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    print(f"{'internal topics':<16} {'first join':<18} {'start ms':>9} {'first ms':>9} "
          f"{'second ms':>10}   (medians of {args.runs} runs)")
    for eager in (True, False):
        for idle in (False, True):
            runs = [one_run(eager, idle) for _ in range(args.runs)]
            median = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
            print(f"{'at start' if eager else 'on first use':<16} "
                  f"{'after 2 s idle' if idle else 'right after start':<18} "
                  f"{median['start']:>9.1f} {median['first']:>9.1f} {median['second']:>10.1f}")


if __name__ == "__main__":
    main()
