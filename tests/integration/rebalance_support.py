"""Copiers killed and added at random while they copy, and what their rebalances cost.

Shared by tests/integration/test_consumer_protocol_copier.py (correctness) and
bench/rebalance.py (the measurement, both group protocols in one run).

- `python -m tests.integration.rebalance_support --bootstrap ... --events FILE ...` runs
  one copier (onceflow.examples.copier) that also writes every partition it is given or
  loses, with the wall-clock time, as a JSON line to FILE.
- `Chaos` starts such copiers and, at random moments (seeded), SIGKILLs a random one and
  restarts it with the same instance id a moment later (its supervisor: the instance's
  transactional id then aborts what the dead one left open at once), or adds a new one,
  up to MEMBERS_MAX live ones (`restart_killed=False`, for the benchmark's scale in and
  out: killed copiers stay dead, new ones are added). The test restarts them because a transaction left
  open by a copier that never comes back keeps its offsets unstable until the
  transaction times out, and librdkafka 2.16 then sometimes starts the partition's new
  owner from auto.offset.reset instead of the committed offset: when its OffsetFetch
  answer (UNSTABLE_OFFSET_COMMIT, offset -1, as Kafka answers) arrives after the
  assignment changed, rdkafka_assignment.c puts the partition back with that offset
  instead of retrying - a client race, against Kafka too.
- `unowned_intervals` turns the events and kill times into the periods during which a
  partition belonged to no live copier: from the moment its owner revoked it (or was
  killed) to the moment another copier got it. That is the pause a rebalance costs a
  partition; the failure detection of a killed member (its session timeout) is part of
  it, and the same for both protocols.
- `AssignmentWatcher` polls ConsumerGroupDescribe and records every snapshot in which two
  members hold the same partition (the consumer protocol's promise is that none does).
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka import Consumer, TopicPartition

from onceflow.examples.copier import Copier
from tests.kafka_raw import RawClient

MEMBERS_START = 3
MEMBERS_MIN, MEMBERS_MAX = 2, 5
# A random action every this many seconds: long enough for the group to settle at times.
ACTION_INTERVAL_S = (1.0, 3.0)
RESTART_AFTER_S = (0.2, 1.5)  # a killed copier's supervisor restarts it this much later
DESCRIBE_INTERVAL_S = 0.1
CONSUMER_GROUP_DESCRIBE = 69
CLASSIC_HEARTBEAT_INTERVAL_MS = 300  # as the consumer protocol's heartbeat interval here
SECOND = 1.0


class ObservedCopier(Copier):
    def __init__(self, events_path: Path, *args, **kwargs) -> None:
        self.events = open(events_path, "a", buffering=1)  # noqa: SIM115 - lives as long as we do
        super().__init__(*args, **kwargs)

    def _event(self, kind: str, partitions: list[TopicPartition]) -> None:
        self.events.write(json.dumps({"t": time.time(), "event": kind,
                                      "partitions": [p.partition for p in partitions]}) + "\n")

    def assigned(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._event("assign", partitions)
        super().assigned(consumer, partitions)

    def revoked(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._event("revoke", partitions)
        super().revoked(consumer, partitions)

    def copy(self, records, group_metadata) -> None:
        self._batch = records
        super().copy(records, group_metadata)

    def commit(self) -> None:
        super().commit()  # returns only once committed: log the input ranges it covered
        ranges: dict[int, list[int]] = {}
        for r in self._batch:
            first_last = ranges.setdefault(r.partition(), [r.offset(), r.offset()])
            first_last[1] = r.offset()
        self.events.write(json.dumps({"t": time.time(), "event": "committed",
                                      "ranges": ranges}) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser()
    for name in ("bootstrap", "input", "output", "group", "instance", "events",
                 "group-protocol", "assignment-strategy", "session-timeout-ms"):
        parser.add_argument(f"--{name}", default=None)
    args = parser.parse_args()
    config = {}
    if args.assignment_strategy:  # classic protocol only: client-side settings
        config["partition.assignment.strategy"] = args.assignment_strategy
        config["session.timeout.ms"] = int(args.session_timeout_ms)
        config["heartbeat.interval.ms"] = CLASSIC_HEARTBEAT_INTERVAL_MS
    ObservedCopier(Path(args.events), args.bootstrap, args.input, args.output, args.group,
                   args.instance, args.group_protocol, config).run()


@dataclass
class Chaos:
    """The copiers of one run: started, killed and added at random moments."""

    bootstrap: str
    input_topic: str
    output_topic: str
    group: str
    log_dir: Path
    group_protocol: str
    assignment_strategy: str | None = None
    session_timeout_ms: int = 4_000  # the classic protocol's (a client setting)
    # True: a killed copier is restarted with its instance id (crash and restart);
    # False: it is gone for good and new copiers are added instead (scale in and out)
    restart_killed: bool = True
    processes: dict[int, subprocess.Popen] = field(default_factory=dict)
    kills: list[tuple[int, float]] = field(default_factory=list)  # (instance, wall clock)
    next_instance: int = 0

    def events_path(self, instance: int) -> Path:
        return self.log_dir / f"{self.group}-{instance}.events"

    def add(self, instance: int | None = None) -> None:
        """Start a new copier, or restart `instance` with the same instance id."""
        if instance is None:
            instance, self.next_instance = self.next_instance, self.next_instance + 1
        command = [sys.executable, "-m", "tests.integration.rebalance_support",
                   "--bootstrap", self.bootstrap, "--input", self.input_topic,
                   "--output", self.output_topic, "--group", self.group,
                   "--instance", str(instance), "--events", str(self.events_path(instance)),
                   "--group-protocol", self.group_protocol]
        if self.assignment_strategy:
            command += ["--assignment-strategy", self.assignment_strategy,
                        "--session-timeout-ms", str(self.session_timeout_ms)]
        with open(self.log_dir / f"{self.group}-{instance}.log", "a") as log:
            self.processes[instance] = subprocess.Popen(command, stdout=log, stderr=log)

    def kill(self, instance: int) -> None:
        process = self.processes.pop(instance)
        process.kill()
        process.wait()
        self._note_kill(instance)

    def _note_kill(self, instance: int) -> None:
        """Kill times, also next to the events for reading a failed run afterwards."""
        self.kills.append((instance, time.time()))
        with open(self.log_dir / f"{self.group}.kills", "a") as kills:
            kills.write(json.dumps({"instance": instance, "t": self.kills[-1][1]}) + "\n")

    def run(self, duration_s: float, rng: random.Random) -> None:
        for _ in range(MEMBERS_START):
            self.add()
        self.run_actions(duration_s, rng)

    def run_actions(self, duration_s: float, rng: random.Random) -> None:
        """Kill or add copiers at random moments for `duration_s`."""
        deadline = time.monotonic() + duration_s
        while time.monotonic() < deadline:
            time.sleep(rng.uniform(*ACTION_INTERVAL_S))
            self.replace_exited()
            live = len(self.processes)
            if not self.restart_killed:
                if live <= MEMBERS_MIN or (live < MEMBERS_MAX and rng.random() < 0.5):
                    self.add()
                else:
                    self.kill(rng.choice(sorted(self.processes)))
            elif live < MEMBERS_MAX and rng.random() < 0.3:
                self.add()
            else:
                victim = rng.choice(sorted(self.processes))
                self.kill(victim)
                time.sleep(rng.uniform(*RESTART_AFTER_S))
                self.add(victim)

    def replace_exited(self) -> None:
        """A copier that exited on its own (fenced, fatal error) counts as killed and is
        restarted, as its supervisor would."""
        for instance, process in list(self.processes.items()):
            if process.poll() is not None:
                self.processes.pop(instance)
                self._note_kill(instance)
                self.add(instance if self.restart_killed else None)

    def stop(self) -> None:
        for instance in list(self.processes):
            self.kill(instance)


def load_events(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def unowned_intervals(chaos: Chaos, partitions: int, start: float,
                      end: float) -> list[float]:
    """Seconds each partition spent with no live owner, one entry per such period, within
    [start, end]: owners come from the copiers' assign/revoke events, a kill drops all of
    the killed copier's partitions at once."""
    changes: list[tuple[float, int, str, list[int]]] = []
    for instance in range(chaos.next_instance):
        for e in load_events(chaos.events_path(instance)):
            if e["event"] in ("assign", "revoke"):
                changes.append((e["t"], instance, e["event"], e["partitions"]))
    changes += [(t, instance, "killed", []) for instance, t in chaos.kills]
    changes.sort()
    owners: dict[int, set[int]] = {p: set() for p in range(partitions)}
    owned_by: dict[int, set[int]] = {}
    since: dict[int, float] = {p: start for p in range(partitions)}  # unowned since
    intervals: list[float] = []

    def update(partition: int, t: float) -> None:
        if owners[partition] and partition in since:
            intervals.append(max(0.0, min(t, end) - max(since.pop(partition), start)))
        elif not owners[partition] and partition not in since:
            since[partition] = t

    for t, instance, kind, changed in changes:
        if t > end:
            break
        held = owned_by.setdefault(instance, set())
        if kind == "killed":
            changed, kind = sorted(held), "revoke"
        for partition in changed:
            (held.add if kind == "assign" else held.discard)(partition)
            (owners[partition].add if kind == "assign" else owners[partition].discard)(instance)
            update(partition, t)
    intervals += [end - max(t, start) for t in since.values() if t < end]
    return [i for i in intervals if i > 0]


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class AssignmentWatcher(threading.Thread):
    """Polls ConsumerGroupDescribe; keeps every snapshot where members' assignments
    overlap, and how many snapshots it took."""

    def __init__(self, bootstrap: str, group: str) -> None:
        super().__init__(daemon=True)
        self.bootstrap, self.group = bootstrap, group
        self.snapshots = 0
        self.overlaps: list[dict] = []
        self.stopped = threading.Event()

    def run(self) -> None:
        client = RawClient(self.bootstrap)
        try:
            while not self.stopped.wait(DESCRIBE_INTERVAL_S):
                response = client.request(CONSUMER_GROUP_DESCRIBE, 1, {
                    "group_ids": [self.group], "include_authorized_operations": False})
                group = response.groups[0]
                if group.error_code != 0:
                    continue
                self.snapshots += 1
                seen: dict[tuple, str] = {}
                for member in group.members:
                    for topic in member.assignment.topic_partitions:
                        for partition in topic.partitions:
                            key = (topic.topic_name, partition)
                            if key in seen:
                                self.overlaps.append({"partition": key, "members": (
                                    seen[key], member.member_id), "epoch": group.group_epoch})
                            seen[key] = member.member_id
        finally:
            client.close()

    def stop(self) -> None:
        self.stopped.set()
        self.join(10)


if __name__ == "__main__":
    main()
