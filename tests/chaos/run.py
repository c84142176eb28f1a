"""One chaos run: a broker process, clients in their own processes, a nemesis, a checker.

    python -m tests.chaos --seconds 90 [--seed S] [--nodes 3] [--read-uncommitted] [--run-dir D]

Theory of operation. The runner starts `onceflow broker` (with its admin port, for the
fault API), creates an input and an output topic, commits offset 0 of every input
partition for both groups (so that a client that falls back to auto.offset.reset has
nothing to skip), and starts the clients (clients.py) under a supervisor that restarts
any that exits or is killed, each restart a new incarnation with its own journal. For
`--seconds` the nemesis injects one fault at a time at random moments from a seeded RNG.
Then the faults stop, the writers are killed and fenced (a producer with each
transactional id calls init_transactions, which aborts what was left open), the copiers
are given time to copy everything, and the readers and copiers are killed and fenced
too. A final read of both topics, read_committed and read_uncommitted from the log
start, goes into final.json, and checker.py judges the journals against it.

Everything the runner did (client starts, exits and kills, faults) is journaled in
RUN_DIR/nemesis.jsonl, with wall-clock times like the clients' journals.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from onceflow.testing import BrokerProcess, free_port
from tests.chaos import checker
from tests.chaos.journal import Journal
from tests.helpers import create_topic

INPUT, OUTPUT = "chaos-input", "chaos-output"
READER_GROUP, COPIER_GROUP = "chaos-readers", "chaos-copiers"
PARTITIONS = 4
CLIENTS = {"writer": 3, "reader": 1, "group-reader": 2, "copier": 2}
FAULT_INTERVAL_S = (1.0, 4.0)     # between two faults
BROKER_DOWN_S = (0.0, 2.0)        # a killed broker is restarted this much later
PAUSE_S = (0.5, 4.0)              # SIGSTOP .. SIGCONT
NODE_DOWN_S = (1.0, 5.0)
CLIENT_RESTART_S = (0.1, 1.5)     # a killed client's supervisor restarts it this much later
DRAIN_TIMEOUT_S = 120.0           # for the copiers to catch up at the end
FINAL_READ_TIMEOUT_S = 120.0
# APIs whose answers the nemesis loses or whose connections it closes after performing.
FAULT_APIS = ("produce", "end_txn", "add_partitions_to_txn", "add_offsets_to_txn",
              "txn_offset_commit", "offset_commit", "init_producer_id", "fetch", "find_coordinator")
# Relative weights of the nemesis' faults.
FAULT_WEIGHTS = {"broker_kill": 2, "broker_pause": 2, "client_kill": 3, "close_after_perform": 3,
                 "drop_response": 2, "node_down": 2}


@dataclass
class Settings:
    seconds: float
    seed: int
    nodes: int
    run_dir: Path
    isolation: str
    debug: str = ""
    rebootstrap: bool = False
    watchdog: bool = True
    stuck_s: float = checker.STUCK_S


@dataclass
class Client:
    name: str
    kind: str
    incarnation: int = 0
    process: subprocess.Popen | None = None
    restart_at: float | None = None  # monotonic; None: not waiting for a restart


@dataclass
class Run:
    settings: Settings
    broker: BrokerProcess
    admin_port: int
    log: Journal
    rng: random.Random
    clients: dict[str, Client] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    stopping: threading.Event = field(default_factory=threading.Event)

    # --- clients ---

    def start_client(self, client: Client) -> None:
        s = self.settings
        client.incarnation += 1
        command = [sys.executable, "-m", "tests.chaos.clients", client.kind, "--name", client.name,
                   "--incarnation", str(client.incarnation), "--bootstrap", self.broker.bootstrap_servers,
                   "--run-dir", str(s.run_dir), "--input", INPUT, "--output", OUTPUT,
                   "--partitions", str(PARTITIONS), "--seed", str(s.seed),
                   "--group", READER_GROUP if client.kind == "group-reader" else COPIER_GROUP,
                   "--isolation", s.isolation if "reader" in client.kind else "read_committed"]
        if s.debug and client.kind == "copier":
            command += ["--debug", s.debug]
        if s.rebootstrap:
            command.append("--rebootstrap")
        if not s.watchdog:
            command.append("--no-watchdog")
        logs = s.run_dir / "logs"
        logs.mkdir(exist_ok=True)
        with open(logs / f"{client.name}.{client.incarnation}.log", "a") as log:
            client.process = subprocess.Popen(command, stdout=log, stderr=log)
        client.restart_at = None
        self.log.write("client_start", client=client.name, incarnation=client.incarnation,
                       pid=client.process.pid)

    def kill_client(self, client: Client, why: str) -> None:
        if client.process is not None and client.process.poll() is None:
            client.process.kill()
            client.process.wait()
            self.log.write("client_kill", client=client.name, incarnation=client.incarnation, why=why)
        client.process = None

    def supervise(self) -> None:
        """Restart clients that exited or were killed (until the run stops them)."""
        while not self.stopping.wait(0.2):
            with self.lock:
                for client in self.clients.values():
                    if client.process is not None and client.process.poll() is not None:
                        self.log.write("client_exit", client=client.name, incarnation=client.incarnation,
                                       code=client.process.returncode)
                        client.process = None
                        # A copier at once, as after a kill (nemesis_client_kill says why).
                        client.restart_at = time.monotonic() + (0.0 if client.kind == "copier" else 1.0)
                    if client.process is None and client.restart_at is not None \
                            and time.monotonic() >= client.restart_at:
                        self.start_client(client)

    # --- faults ---

    def fault(self, kind: str, **fields) -> None:
        self.log.write("fault", kind=kind, **fields)

    def admin(self, method: str, path: str, body: dict | None = None) -> dict:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(f"http://127.0.0.1:{self.admin_port}{path}", data=data,
                                         method=method, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=10) as answer:
            text = answer.read()
            return json.loads(text) if text else {}

    def nemesis(self, deadline: float) -> None:
        kinds = [k for k in FAULT_WEIGHTS if k != "node_down" or self.settings.nodes > 1]
        weights = [FAULT_WEIGHTS[k] for k in kinds]
        # Every kind once first, in a random order, so that even a short run meets each.
        first = self.rng.sample(kinds, len(kinds))
        while time.monotonic() < deadline:
            time.sleep(self.rng.uniform(*FAULT_INTERVAL_S))
            kind = first.pop() if first else self.rng.choices(kinds, weights)[0]
            getattr(self, f"nemesis_{kind}")()

    def nemesis_broker_kill(self) -> None:
        down_s = self.rng.uniform(*BROKER_DOWN_S)
        self.fault("broker_kill", down_s=round(down_s, 2))
        self.broker.kill()
        time.sleep(down_s)
        self.broker.start()
        self.log.write("broker_started")

    def nemesis_broker_pause(self) -> None:
        pause_s = self.rng.uniform(*PAUSE_S)
        self.fault("broker_pause", pause_s=round(pause_s, 2))
        self.broker.process.send_signal(signal.SIGSTOP)
        time.sleep(pause_s)
        self.broker.process.send_signal(signal.SIGCONT)

    def nemesis_client_kill(self) -> None:
        with self.lock:
            client = self.clients[self.rng.choice(sorted(self.clients))]
            self.fault("client_kill", client=client.name, incarnation=client.incarnation)
            self.kill_client(client, "nemesis")
            # A copier comes back at once with the same transactional id: its
            # init_transactions aborts what the dead one left open, so its offsets become
            # stable (a librdkafka race otherwise resets a partition: docs/reliability.md).
            delay_s = 0.0 if client.kind == "copier" else self.rng.uniform(*CLIENT_RESTART_S)
            client.restart_at = time.monotonic() + delay_s

    def nemesis_close_after_perform(self) -> None:
        api = self.rng.choice(FAULT_APIS)
        self.fault("close_after_perform", api=api)
        self.admin("POST", "/faults", {"kind": "close_connections", "api": api, "count": 1, "perform": True})

    def nemesis_drop_response(self) -> None:
        api = self.rng.choice(FAULT_APIS)
        self.fault("drop_response", api=api)
        self.admin("POST", "/faults", {"kind": "drop_responses", "api": api, "count": 1})

    def nemesis_node_down(self) -> None:
        node, down_s = self.rng.randrange(self.settings.nodes), self.rng.uniform(*NODE_DOWN_S)
        self.fault("node_down", node_id=node, down_s=round(down_s, 2))
        self.admin("POST", "/faults", {"kind": "node_down", "node_id": node})
        time.sleep(down_s)
        self.admin("POST", "/faults", {"kind": "node_up", "node_id": node})


def start_broker(settings: Settings) -> tuple[BrokerProcess, int]:
    admin_port = free_port()
    broker = BrokerProcess(settings.run_dir / "data", nodes=settings.nodes, args=(
        "--admin-port", str(admin_port), "--transaction-abort-interval-ms", "1000",
        "--group-initial-rebalance-delay-ms", "0", "--offsets-topic-partitions", "4",
        "--transaction-state-partitions", "4"))
    return broker.start(), admin_port


def prepare_topics(bootstrap: str, nodes: int) -> None:
    for topic in (INPUT, OUTPUT):
        create_topic(bootstrap, topic, PARTITIONS, replication_factor=min(nodes, 3))
    for group in (READER_GROUP, COPIER_GROUP):
        committer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
        committer.commit(offsets=[TopicPartition(INPUT, p, 0) for p in range(PARTITIONS)],
                         asynchronous=False)
        committer.close()


def fence(bootstrap: str, transactional_id: str) -> None:
    """Abort whatever `transactional_id` left open (and fence its holder)."""
    for _attempt in range(10):
        producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": transactional_id})
        try:
            producer.init_transactions(30)
            return
        except Exception as exc:  # noqa: BLE001 - retried, then raised
            error = exc
            time.sleep(1)
    raise RuntimeError(f"could not fence {transactional_id}: {error}")


def read_all(bootstrap: str, topic: str, isolation: str) -> list[list]:
    """Every record of `topic` from the log start: [partition, offset, value]."""
    reader = Consumer({"bootstrap.servers": bootstrap, "group.id": "chaos-final-unused",
                       "isolation.level": isolation, "enable.partition.eof": True,
                       "enable.auto.commit": False})
    reader.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    records, at_end = [], set()
    deadline = time.monotonic() + FINAL_READ_TIMEOUT_S
    while len(at_end) < PARTITIONS:
        if time.monotonic() > deadline:
            raise RuntimeError(f"final read of {topic} ({isolation}) did not reach the end")
        for m in reader.consume(1000, 1.0):
            if m.error() is None:
                records.append([m.partition(), m.offset(), m.value().decode()])
                at_end.discard(m.partition())
            elif m.error().code() == KafkaError._PARTITION_EOF:
                at_end.add(m.partition())
    reader.close()
    return records


def committed_offsets(bootstrap: str, group: str) -> dict[int, int]:
    reader = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    offsets = reader.committed([TopicPartition(INPUT, p) for p in range(PARTITIONS)], timeout=30)
    reader.close()
    return {tp.partition: tp.offset for tp in offsets}


def wait_for_copiers(run: Run, committed_input: list[list]) -> None:
    """Until the copiers' group offsets cover every committed input record."""
    ends = {}
    for partition, offset, _ in committed_input:
        ends[partition] = max(ends.get(partition, 0), offset + 1)
    deadline = time.monotonic() + DRAIN_TIMEOUT_S
    while time.monotonic() < deadline:
        offsets = committed_offsets(run.broker.bootstrap_servers, COPIER_GROUP)
        if all(offsets.get(p, -1) >= end for p, end in ends.items()):
            run.log.write("copiers_drained", offsets=offsets)
            return
        time.sleep(1)
    run.log.write("copiers_not_drained", ends=ends)


def finish(run: Run) -> dict:
    """Stop everything in order and read both topics in full."""
    bootstrap = run.broker.bootstrap_servers
    run.admin("DELETE", "/faults")
    with run.lock:
        for client in run.clients.values():
            if client.kind == "writer":
                client.restart_at = None
                run.kill_client(client, "end of run")
    for client in run.clients.values():
        if client.kind == "writer":
            fence(bootstrap, client.name)
    committed_input = read_all(bootstrap, INPUT, "read_committed")
    wait_for_copiers(run, committed_input)
    run.stopping.set()
    with run.lock:
        for client in run.clients.values():
            client.restart_at = None
            run.kill_client(client, "end of run")
    for client in run.clients.values():
        if client.kind == "copier":
            fence(bootstrap, client.name)
    run.log.write("end")
    return {
        "input_committed": read_all(bootstrap, INPUT, "read_committed"),
        "input_uncommitted": read_all(bootstrap, INPUT, "read_uncommitted"),
        "output_committed": read_all(bootstrap, OUTPUT, "read_committed"),
        "output_uncommitted": read_all(bootstrap, OUTPUT, "read_uncommitted"),
        "copier_offsets": committed_offsets(bootstrap, COPIER_GROUP),
        "reader_offsets": committed_offsets(bootstrap, READER_GROUP),
    }


def run_chaos(settings: Settings) -> checker.Report:
    settings.run_dir.mkdir(parents=True, exist_ok=True)
    print(f"chaos: seed {settings.seed}, {settings.seconds:.0f} s, nodes {settings.nodes}, "
          f"readers {settings.isolation}, run dir {settings.run_dir}", flush=True)
    (settings.run_dir / "settings.json").write_text(json.dumps(
        {**vars(settings), "run_dir": str(settings.run_dir)}))
    broker, admin_port = start_broker(settings)
    run = Run(settings, broker, admin_port, Journal(settings.run_dir / "nemesis.jsonl"),
              random.Random(settings.seed))
    try:
        prepare_topics(broker.bootstrap_servers, settings.nodes)
        with run.lock:
            for kind, count in CLIENTS.items():
                for i in range(count):
                    client = run.clients[f"chaos-{kind}-{i}"] = Client(f"chaos-{kind}-{i}", kind)
                    run.start_client(client)
        supervisor = threading.Thread(target=run.supervise, daemon=True)
        supervisor.start()
        run.nemesis(time.monotonic() + settings.seconds)
        final = finish(run)
        supervisor.join()
    finally:
        run.stopping.set()
        for client in run.clients.values():
            if client.process is not None:
                client.process.kill()
        if broker.process is not None and broker.process.poll() is None:
            broker.process.send_signal(signal.SIGCONT)
        broker.kill()
    (settings.run_dir / "final.json").write_text(json.dumps(final))
    return checker.check(settings.run_dir, stuck_s=settings.stuck_s)


def main() -> None:
    parser = argparse.ArgumentParser(description="onceflow chaos run (docs/reliability.md)")
    parser.add_argument("--seconds", type=float, default=90)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--nodes", type=int, default=1)
    parser.add_argument("--run-dir", type=Path, default=None)
    parser.add_argument("--read-uncommitted", action="store_true",
                        help="readers read_uncommitted: the checker must then flag aborted reads")
    parser.add_argument("--debug", default="",
                        help="librdkafka debug contexts for the copiers, e.g. eos,broker,protocol")
    parser.add_argument("--rebootstrap", action="store_true",
                        help="clients keep librdkafka's re-bootstrap (it hangs copiers: docs/reliability.md)")
    parser.add_argument("--no-watchdog", action="store_true",
                        help="clients never end themselves when a call overruns its timeout")
    parser.add_argument("--stuck-s", type=float, default=checker.STUCK_S,
                        help="a client call blocked this long is a liveness anomaly")
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**31)
    run_dir = args.run_dir or Path(tempfile.mkdtemp(prefix=f"chaos-{seed}-"))
    settings = Settings(args.seconds, seed, args.nodes, run_dir,
                        "read_uncommitted" if args.read_uncommitted else "read_committed",
                        args.debug, args.rebootstrap, not args.no_watchdog, args.stuck_s)
    report = run_chaos(settings)
    print(report.summary(), flush=True)
    sys.exit(1 if report.anomalies else 0)


if __name__ == "__main__":
    main()
