"""The issue's "done when" on a Spark standalone cluster: a master and two workers started
from pip's pyspark (`spark-class`), a streaming Kafka -> Kafka query with atomicity=batch
whose driver runs against that master, and one worker SIGKILLed - the Worker JVM, its
executor JVM and the executor's Python workers - while a micro-batch runs. Spark re-runs
the lost tasks on the surviving worker; every input id must be in the output exactly once
for a read_committed reader. The executors run an environment archive made by
`onceflow spark pack` (`session(archive=...)`): one driver start covers both, as a driver
start costs about a minute on a loaded 2-core machine.

One cluster for the module; every process of it is killed in the fixture's teardown, also
when a test fails, and the teardown checks that none is left.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import urllib.request
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pyspark
import pytest

from onceflow.demo.processes import descendants, kill_tree
from tests.spark.support import (
    DriverProcess,
    batches_committed,
    batches_started,
    create_topic,
    produce,
    read_committed,
    unique,
    wait_for,
)

DRIVER = Path(__file__).parent / "drivers" / "cluster_to_kafka.py"
SPARK_HOME = Path(pyspark.__file__).parent
WORKERS = 2
INPUT_PARTITIONS, RECORDS_PER_PARTITION = 2, 100  # 200 records, 50 per micro-batch
TASK_ID = re.compile(r"\(TID (\d+)\)")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@dataclass
class Cluster:
    """A standalone master and its workers, each a `spark-class` JVM in its own session."""

    root: Path
    env: dict[str, str]
    master_port: int = field(default_factory=free_port)
    master_ui: int = field(default_factory=free_port)
    master: subprocess.Popen | None = None
    workers: list[subprocess.Popen] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.master_port}"

    def spawn(self, name: str, *args: str) -> subprocess.Popen:
        with open(self.root / f"{name}.log", "ab") as log:
            # spark-class execs java: the child's pid is the JVM's.
            return subprocess.Popen([str(SPARK_HOME / "bin" / "spark-class"), *args],
                                    stdout=log, stderr=subprocess.STDOUT, env=self.env,
                                    start_new_session=True, cwd=self.root)

    def start(self) -> Cluster:
        self.master = self.spawn("master", "org.apache.spark.deploy.master.Master",
                                 "--host", "127.0.0.1", "--port", str(self.master_port),
                                 "--webui-port", str(self.master_ui))
        wait_for(lambda: self.state() is not None, "the standalone master's web UI", 60, 0.5)
        for index in range(WORKERS):
            work_dir = self.root / f"work-{index}"
            work_dir.mkdir()
            self.workers.append(self.spawn(
                f"worker-{index}", "org.apache.spark.deploy.worker.Worker", self.url,
                "--host", "127.0.0.1", "--cores", "1", "--memory", "1g",
                "--webui-port", str(free_port()), "--work-dir", str(work_dir)))
        wait_for(lambda: self.alive_workers() == WORKERS, f"{WORKERS} workers registered",
                 60, 0.5)
        return self

    def state(self) -> dict | None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.master_ui}/json/", timeout=5) as answer:
                return json.load(answer)
        except OSError:
            return None

    def alive_workers(self) -> int:
        state = self.state() or {}
        return sum(1 for worker in state.get("workers", []) if worker.get("state") == "ALIVE")

    def processes(self) -> list[int]:
        """Every live process of the cluster: JVMs, executors, Python workers."""
        roots = [p.pid for p in (self.master, *self.workers) if p is not None and p.poll() is None]
        return roots + [child for pid in roots for child in descendants(pid)]

    def stop(self) -> None:
        for process in (*self.workers, self.master):
            if process is not None:
                kill_tree(process.pid)
                process.wait(30)
        leftovers = self.processes()
        assert not leftovers, f"cluster processes still running: {leftovers}"

    def log(self, name: str, chars: int = 3000) -> str:
        return (self.root / f"{name}.log").read_text(errors="replace")[-chars:]


def running(pid: int) -> bool:
    """A process exists and is not a zombie waiting to be reaped."""
    try:
        return b"(zombie)" not in Path(f"/proc/{pid}/status").read_bytes()
    except OSError:
        return False


def running_tasks(work_dir: Path) -> set[str]:
    """Task ids the executors of a worker have started and not finished, from their logs
    (`<work dir>/<app>/<executor>/stderr`, Spark's INFO lines `Running task 1.0 in stage
    3.0 (TID 5)` and `Finished task 1.0 in stage 3.0 (TID 5)`)."""
    started, finished = set(), set()
    for log in work_dir.glob("*/*/stderr"):
        text = log.read_text(errors="replace")
        started.update(TASK_ID.findall("\n".join(line for line in text.splitlines()
                                                  if "Running task" in line)))
        finished.update(TASK_ID.findall("\n".join(line for line in text.splitlines()
                                                   if "Finished task" in line)))
    return started - finished


@pytest.fixture(scope="module")
def standalone(tmp_path_factory) -> Iterator[Cluster]:
    env = {**os.environ, "SPARK_HOME": str(SPARK_HOME), "PYSPARK_PYTHON": sys.executable,
           "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_NO_DAEMONIZE": "1"}
    cluster = Cluster(tmp_path_factory.mktemp("standalone"), env)
    try:
        yield cluster.start()
    finally:
        cluster.stop()


# Not linked into the test environment: pyspark comes with Spark's own PYTHONPATH (and is
# half a gigabyte); the editable-install hooks point at a source tree.
NOT_LINKED = ("pyspark", "__editable__", "_distutils_hack", "__pycache__")


def linked_venv(root: Path) -> Path:
    """A small virtual environment for the archive test: made by `python -m venv` from the
    test's base interpreter, its site-packages holding links to the test venv's packages
    and to this tree's onceflow, so packing it takes a second (the real venv with pyspark
    is over a gigabyte). Relocatable only on this machine, as the links are absolute."""
    venv = root / "env"
    subprocess.run([sys._base_executable, "-m", "venv", "--without-pip", str(venv)],
                   check=True, timeout=60)
    site = next(venv.glob("lib/python*/site-packages"))
    source = Path(pyspark.__file__).parents[1]
    for entry in source.iterdir():
        if not entry.name.startswith(NOT_LINKED) and entry.suffix != ".pth":
            (site / entry.name).symlink_to(entry)
    (site / "onceflow").symlink_to(Path(__file__).parents[2] / "src" / "onceflow")
    return venv


def pack(venv: Path, archive: Path) -> Path:
    """`onceflow spark pack -p VENV -o ARCHIVE`, as a user runs it."""
    from typer.testing import CliRunner

    from onceflow.cli.app import app

    packed = CliRunner().invoke(app, ["spark", "pack", "-p", str(venv), "-o", str(archive)])
    assert packed.exit_code == 0 and archive.exists(), packed.output
    assert f"--archive {archive}" in packed.output
    return archive


def executables(log: Path) -> list[str]:
    """The executors' sys.executable the driver printed before its query."""
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith('{"executables"'):
            return json.loads(line)["executables"]
    raise AssertionError(f"the driver printed no executables:\n{log.read_text()[-3000:]}")


@pytest.mark.slow
def test_batch_atomicity_survives_a_worker_sigkill_on_a_packed_environment(
        standalone, bootstrap, tmp_path):
    """One driver start for both items of the cluster story (a driver start on a loaded
    2-core machine costs about a minute): the executors run `onceflow spark pack`'s
    archive (`session(archive=...)`), and one worker is SIGKILLed mid-batch."""
    archive = pack(linked_venv(tmp_path), tmp_path / "env.tar.gz")
    source = create_topic(bootstrap, unique("cluster-in"), partitions=INPUT_PARTITIONS)
    output = create_topic(bootstrap, unique("cluster-out"), partitions=2)
    ids = [f"{p}:{i:05d}" for p in range(INPUT_PARTITIONS) for i in range(RECORDS_PER_PARTITION)]
    for p in range(INPUT_PARTITIONS):
        produce(bootstrap, source, [(None, i.encode()) for i in ids if i.startswith(f"{p}:")],
                partition=p)
    checkpoint = tmp_path / "ck"
    command = DriverProcess.python(DRIVER, standalone.url, bootstrap, source, output,
                                   str(checkpoint), str(archive), str(tmp_path), str(WORKERS))
    with DriverProcess(command, tmp_path / "driver.log", env=standalone.env) as driver:
        driver.start()
        # session() ran its probe, and the driver its executables job, on both executors
        # before the query started.
        batch = driver.wait_mid_batch(checkpoint, after_batch=-1, timeout_s=120)
        # The probe's tasks are done: a task running now is one of this batch.
        busy: list[subprocess.Popen] = []

        def a_worker_is_busy() -> bool:
            busy[:] = [w for i, w in enumerate(standalone.workers)
                       if running_tasks(standalone.root / f"work-{i}")]
            return bool(busy)

        wait_for(a_worker_is_busy, f"a task of batch {batch} running", 60, 0.05)
        victim = busy[0]
        doomed = [victim.pid, *descendants(victim.pid)]
        in_flight = batches_started(checkpoint) - batches_committed(checkpoint)
        kill_tree(victim.pid)
        victim.wait(30)
        assert in_flight, "no micro-batch was running at the kill"
        assert driver.wait(timeout_s=120) == 0, driver.tail()
    assert not [pid for pid in doomed if running(pid)], "killed processes still running"
    assert "Lost executor" in driver.log_path.read_text(errors="replace"), driver.tail()
    # Each executor ran the unpacked archive, not the workers' PYSPARK_PYTHON; the
    # driver's data-source Python ran its own venv through the ./environment link.
    pythons = executables(driver.log_path)
    assert len(pythons) == WORKERS, pythons
    assert all(python.endswith("/environment/bin/python")
               and python.startswith(str(standalone.root)) for python in pythons), pythons
    assert (tmp_path / "environment").resolve() == Path(sys.prefix).resolve()
    seen = Counter(r.value().decode().split("|")[0] for r in read_committed(bootstrap, output))
    assert set(seen) == set(ids), f"missing {len(set(ids) - set(seen))} ids"
    assert not [i for i, n in seen.items() if n > 1], "ids written twice"


