"""`Broker`: the broker in-process, on its own thread and event loop.

    from onceflow import Broker

    with Broker() as broker:                 # temporary data dir, free port
        producer = Producer({"bootstrap.servers": broker.bootstrap_servers})

The broker serves real sockets, so any Kafka client in the same process, another
process or another language can use it. `stop()` shuts it down cleanly (the next
start on the same data dir skips recovery).
"""

from __future__ import annotations

import asyncio
import dataclasses
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Any

from onceflow.broker.admin import AdminFrontendFactory
from onceflow.broker.config import BrokerConfig
from onceflow.broker.faults import FaultInjector
from onceflow.broker.server import BrokerServer

# How long start() and stop() wait for the broker thread before giving up loudly.
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 30.0


def new_event_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:  # uvloop is optional (not on Windows)
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


class Broker:
    def __init__(self, data_dir: str | Path | None = None, *, port: int = 0,
                 admin_frontend: AdminFrontendFactory | None = None, **settings: Any) -> None:
        # admin_frontend: what serves the admin port instead of the plain admin endpoint
        # (`onceflow.node.Broker(console=True)` passes the web console).
        self._admin_frontend = admin_frontend
        self._temporary = data_dir is None
        directory = Path(tempfile.mkdtemp(prefix="onceflow-")) if data_dir is None else Path(data_dir)
        self.config = BrokerConfig(data_dir=directory, port=port, **settings)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: BrokerServer | None = None
        self._failure: BaseException | None = None

    @property
    def data_dir(self) -> Path:
        return self.config.data_dir

    @property
    def bootstrap_servers(self) -> str:
        assert self._server is not None, "the broker is not running"
        return self._server.bootstrap_servers

    @property
    def server(self) -> BrokerServer:
        assert self._server is not None, "the broker is not running"
        return self._server

    @property
    def faults(self) -> FaultInjector:
        """Fault injection rules (docs/faults.md): `broker.faults.drop_responses("produce", 3)`."""
        return self.server.faults

    @property
    def admin_url(self) -> str | None:
        """The admin endpoint's URL when started with `admin_port=`, else None."""
        return self.server.admin_url

    def start(self) -> Broker:
        assert self._thread is None, "already started"
        ready = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(ready,), name="onceflow-broker", daemon=True)
        self._thread.start()
        if not ready.wait(START_TIMEOUT_S):
            raise RuntimeError("the broker did not start in time")
        if self._failure is not None:
            raise RuntimeError("the broker failed to start") from self._failure
        return self

    def _run(self, ready: threading.Event) -> None:
        loop = self._loop = new_event_loop()
        asyncio.set_event_loop(loop)
        server = BrokerServer(self.config, self._admin_frontend)
        try:
            loop.run_until_complete(server.start())
            self._server = server
        except BaseException as exc:  # reported to start()'s caller
            self._failure = exc
            ready.set()
            loop.close()
            return
        ready.set()
        loop.run_forever()
        loop.run_until_complete(server.stop())
        loop.close()

    def call(self, fn, *args) -> Any:
        """Run `fn(*args)` on the broker's loop thread and return its result."""
        assert self._loop is not None
        async def run():
            return fn(*args)
        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(STOP_TIMEOUT_S)

    def stop(self) -> None:
        if self._thread is None:
            return
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(STOP_TIMEOUT_S)
        if self._thread.is_alive():
            raise RuntimeError("the broker did not stop in time")
        self._thread = None
        self._server = None
        if self._temporary:
            shutil.rmtree(self.config.data_dir, ignore_errors=True)

    def __enter__(self) -> Broker:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def with_settings(self, **settings: Any) -> BrokerConfig:
        return dataclasses.replace(self.config, **settings)
