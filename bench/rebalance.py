"""What a rebalance costs a partition: the consumer group protocol (KIP-848) next to the
classic protocol with cooperative-sticky, in one run.

    .venv/bin/python bench/rebalance.py                 # 60 s of chaos per protocol
    .venv/bin/python bench/rebalance.py --seconds 20

Theory of operation: for each protocol, on the same broker (`onceflow broker` in a child
process, fsync on) and with the same seeded schedule, exactly-once copiers
(onceflow.examples.copier, static members, tests/integration/rebalance_support.py) copy a
12-partition input that keeps arriving, in two scenarios: *scale in and out* - every
1-3 s a copier is SIGKILLed for good or a new one added (2 to 5 live) - and *crash and
restart* - a copier is SIGKILLed and restarted with the same instance id 0.2-1.5 s later,
or a new one added (up to 5). Each copier logs every partition it is given or loses; a kill
takes away all of the killed copier's partitions at once. A partition is *unowned* from
the moment its owner gave it up (or died) until another copier got it; the report gives
the number of such periods and their p50, p99 and maximum, and the partition-seconds
unowned in all. Both protocols detect a dead member after the same 4 s (the broker's
group.consumer.session.timeout.ms, the classic members' session.timeout.ms) with 300 ms
heartbeats, so what differs is what a rebalance costs the members that stay.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from onceflow.testing import BrokerProcess
from tests.helpers import create_topic, unique
from tests.integration.rebalance_support import (
    Chaos,
    percentile,
    unowned_intervals,
)
from tests.integration.test_consumer_protocol_copier import feed

PARTITIONS = 12
SEED = 848
SESSION_TIMEOUT_MS = 4_000
BROKER_ARGS = ("--group-initial-rebalance-delay-ms", "0", "--offsets-topic-partitions", "4",
               "--transaction-state-partitions", "4", "--group-min-session-timeout-ms", "1000",
               "--group-consumer-session-timeout-ms", str(SESSION_TIMEOUT_MS),
               "--group-consumer-heartbeat-interval-ms", "300")
SETTLE_S = 5.0  # before the measurement starts: the first members join


def run_one(bootstrap: str, log_dir: Path, protocol: str, seconds: float,
            restart: bool) -> dict:
    run = unique(protocol)
    source = create_topic(bootstrap, f"{run}-in", PARTITIONS)
    target = create_topic(bootstrap, f"{run}-out", PARTITIONS)
    strategy = "cooperative-sticky" if protocol == "classic" else None
    chaos = Chaos(bootstrap, source, target, f"{run}-copier", log_dir, protocol, strategy,
                  session_timeout_ms=SESSION_TIMEOUT_MS, restart_killed=restart)
    feeder: threading.Thread = feed(bootstrap, source, seconds + SETTLE_S)
    try:
        for _ in range(3):  # three members join and settle before the chaos starts
            chaos.add()
        time.sleep(SETTLE_S)
        started = time.time()
        chaos.run_actions(seconds, random.Random(SEED))
        ended = time.time()
    finally:
        chaos.stop()
        feeder.join(60)
    pauses = unowned_intervals(chaos, PARTITIONS, started, ended)
    return {"scenario": "crash and restart" if restart else "scale in and out",
            "protocol": protocol, "kills": len(chaos.kills), "copiers": chaos.next_instance,
            "periods": len(pauses), "p50": percentile(pauses, 0.5),
            "p99": percentile(pauses, 0.99), "max": max(pauses, default=0.0),
            "total": sum(pauses)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="onceflow-rebalance-") as tmp:
        broker = BrokerProcess(Path(tmp) / "broker", args=BROKER_ARGS).start()
        try:
            rows = [run_one(broker.bootstrap_servers, Path(tmp), protocol, args.seconds,
                            restart)
                    for restart in (False, True) for protocol in ("classic", "consumer")]
        finally:
            broker.kill()
    print("| scenario | protocol | kills | copiers | unowned periods | p50 s | p99 s | max s | "
          "partition-s unowned |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        name = "classic, cooperative-sticky" if r["protocol"] == "classic" \
            else "consumer (KIP-848), uniform"
        print(f"| {r['scenario']} | {name} | {r['kills']} | {r['copiers']} | {r['periods']} | {r['p50']:.2f} | "
              f"{r['p99']:.2f} | {r['max']:.2f} | {r['total']:.1f} |")


if __name__ == "__main__":
    main()
