"""Test helpers for onceflow users and for our own suite (a pytest plugin).

Fixtures (available in any project that installs onceflow):

- `onceflow_broker`: one in-process broker for the whole test session, on a real
  socket; use `onceflow_broker.bootstrap_servers`. Give each test its own topics.
- `onceflow_fresh_broker`: a new broker (and data dir) for one test.
- `onceflow_broker_process`: a factory for brokers in a child process
  (`BrokerProcess`), for tests that SIGKILL and restart the broker.
- `onceflow_secure_broker`: a broker with one SASL_SSL listener, a throw-away CA
  (needs `trustme`), SCRAM users `admin` (super user) and `app` (no ACLs) and the
  authorizer on; `client_config(user)` gives confluent-kafka settings (docs/security.md).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

# How long a child broker may take to print its ready line.
PROCESS_START_TIMEOUT_S = 30.0


def free_port(count: int = 1) -> int:
    """A port p such that p .. p+count-1 were free a moment ago (best effort)."""
    for _ in range(100):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            base = probe.getsockname()[1]
        if base + count < 65535 and all(_is_free(base + i) for i in range(count)):
            return base
    raise RuntimeError("no free port range found")


def _is_free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


class BrokerProcess:
    """`onceflow broker` in a child process, restartable on the same dir and port."""

    def __init__(self, data_dir: Path, *, nodes: int = 1, port: int | None = None, args: tuple[str, ...] = (),
                 preexec_fn=None) -> None:
        self.data_dir = Path(data_dir)
        self.preexec_fn = preexec_fn  # runs in the child before exec (e.g. resource limits)
        self.nodes = nodes
        self.port = port or free_port(nodes)
        self.args = args
        self.process: subprocess.Popen[str] | None = None
        self.log_path = self.data_dir.parent / f"{self.data_dir.name}-broker.log"

    @property
    def bootstrap_servers(self) -> str:
        return ",".join(f"127.0.0.1:{self.port + i}" for i in range(self.nodes))

    def start(self) -> BrokerProcess:
        assert self.process is None or self.process.poll() is not None, "already running"
        command = [sys.executable, "-m", "onceflow", "broker", "--data-dir", str(self.data_dir),
                   "--port", str(self.port), "--nodes", str(self.nodes), *self.args]
        log = open(self.log_path, "a")
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log, text=True,
                                        preexec_fn=self.preexec_fn)
        log.close()
        self._wait_ready()
        return self

    def _wait_ready(self) -> None:
        assert self.process is not None and self.process.stdout is not None
        deadline = time.monotonic() + PROCESS_START_TIMEOUT_S
        while time.monotonic() < deadline:
            line = self.process.stdout.readline()
            if "listening on" in line:
                return
            if not line and self.process.poll() is not None:
                break
        raise RuntimeError(f"broker process did not start; see {self.log_path}:\n{self.log_path.read_text()[-3000:]}")

    def kill(self) -> None:
        """SIGKILL: no clean shutdown, the next start recovers."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()

    def stop(self) -> int:
        """SIGTERM and wait: a clean shutdown. Returns the exit code."""
        if self.process is None:
            return 0
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=30)

    def restart(self, *, kill: bool = True) -> BrokerProcess:
        self.kill() if kill else self.stop()
        return self.start()


@pytest.fixture(scope="session")
def onceflow_broker() -> Iterator:
    # Imported here: this plugin loads in every pytest run of a project that has
    # onceflow installed, and must stay cheap and harmless there.
    from onceflow.broker.embedded import Broker

    with Broker() as broker:
        yield broker


@pytest.fixture
def onceflow_fresh_broker() -> Iterator:
    from onceflow.broker.embedded import Broker

    with Broker() as broker:
        yield broker


@pytest.fixture
def onceflow_broker_process(tmp_path: Path) -> Iterator:
    started: list[BrokerProcess] = []

    def factory(name: str = "broker", **kwargs) -> BrokerProcess:
        process = BrokerProcess(tmp_path / name, **kwargs).start()
        started.append(process)
        return process

    yield factory
    for process in started:
        process.kill()


class SecureBroker:
    """What `onceflow_secure_broker` yields: the broker and client settings for it."""

    PASSWORDS = {"admin": "admin-secret", "app": "app-secret"}

    def __init__(self, broker, ca_file: Path) -> None:
        self.broker = broker          # onceflow.broker.embedded.Broker
        self.ca_file = ca_file        # the CA that signed the broker's certificate (PEM)

    @property
    def bootstrap_servers(self) -> str:
        return self.broker.bootstrap_servers

    def client_config(self, user: str = "app", mechanism: str = "SCRAM-SHA-512") -> dict:
        """confluent-kafka settings for `user` (admin: super user; app: ACLs only)."""
        return {"bootstrap.servers": self.bootstrap_servers, "security.protocol": "SASL_SSL",
                "ssl.ca.location": str(self.ca_file), "sasl.mechanism": mechanism,
                "sasl.username": user, "sasl.password": self.PASSWORDS[user]}


@pytest.fixture
def onceflow_secure_broker(tmp_path: Path) -> Iterator[SecureBroker]:
    from onceflow.broker.embedded import Broker

    try:
        import trustme
    except ImportError:  # environmental: the fixture's certificates come from trustme
        pytest.skip("onceflow_secure_broker needs the trustme package (pip install trustme)")
    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    ca_file, cert_file, key_file = (tmp_path / n for n in ("ca.pem", "server.pem", "server.key"))
    ca.cert_pem.write_to_path(str(ca_file))
    server.private_key_pem.write_to_path(str(key_file))
    cert_file.write_bytes(b"".join(blob.bytes() for blob in server.cert_chain_pems))
    users = tuple(f"{m}=[name={user},password={password}]"
                  for user, password in SecureBroker.PASSWORDS.items()
                  for m in ("SCRAM-SHA-512", "SCRAM-SHA-256"))
    with Broker(tmp_path / "data", listeners="SASL_SSL://127.0.0.1:0", ssl_certfile=cert_file,
                ssl_keyfile=key_file, add_scram=users, authorizer=True,
                super_users=("User:admin",)) as broker:
        yield SecureBroker(broker, ca_file)


def env_flag(name: str) -> bool:
    return os.environ.get(name, "").lower() in ("1", "true", "yes")
