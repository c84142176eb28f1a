"""`BrokerServer`: the composition root - builds one broker process's parts and wires them.

Theory of operation. Everything below this module knows only what it is handed:

    BrokerState (partitions, logs, producer state)     broker/state.py
      <- GroupRuntime, TxnRuntime (coordinators)        broker/runtime/
      <- RequestPipeline (decode .. handler .. encode)  broker/pipeline.py, handlers/
      <- Connections (the socket pump)                  broker/connection.py
    FaultInjector (rules; cluster, metrics, close_node) broker/faults.py
    AdminServer (faults, metrics over HTTP)             broker/admin.py

`start` binds one listener per node of the cluster view (not yet accepting), builds the
state from the bound ports, the runtimes (groups first: transactions use their
partitioning), the pipeline and the connections, attaches fault injection, starts the
runtimes (loading `__consumer_offsets` and `__transaction_state` in the background), and
only then accepts connections. Periodic work runs in one task per job: retention and
producer-id expiry. The admin HTTP endpoint starts only when `admin_port` is configured.
`stop` undoes it in reverse: no new connections, the open ones closed, the runtimes
closed (they append through the partitions), then the state.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import ssl
from collections.abc import Callable
from typing import Any

from onceflow.broker.access import Access
from onceflow.broker.admin import (
    AdminContext,
    AdminFrontend,
    AdminFrontendFactory,
    AdminServer,
    SegmentView,
    route,
)
from onceflow.broker.cluster import Cluster, Node
from onceflow.broker.config import BrokerConfig
from onceflow.broker.connection import Connections
from onceflow.broker.connection_quotas import connection_limits
from onceflow.broker.faults import FaultInjector
from onceflow.broker.handlers import load_all
from onceflow.broker.pipeline import RequestPipeline
from onceflow.broker.runtime.compaction import LogCleaner
from onceflow.broker.runtime.groups import GroupRuntime
from onceflow.broker.runtime.txn import TxnRuntime
from onceflow.broker.state import BrokerState
from onceflow.security.listeners import Listener

log = logging.getLogger("onceflow.broker")


# How long a frontend's thread waits for the loop to read a partition's segments.
ADMIN_CALL_TIMEOUT_S = 10.0


async def _every(interval_ms: int, job) -> None:
    """Run `job()` (a function or a coroutine function) every `interval_ms`, for ever
    (cancelled at stop)."""
    while True:
        await asyncio.sleep(interval_ms / 1000)
        result = job()
        if inspect.isawaitable(result):
            await result


class BrokerServer:
    """All listeners of one broker process and the parts they share."""

    def __init__(self, config: BrokerConfig,
                 admin_frontend: AdminFrontendFactory | None = None) -> None:
        self.config = config
        # What serves the admin port: the composition root's (the web console), else ours.
        self._admin_frontend = admin_frontend
        self.faults = FaultInjector()
        # Built by start():
        self.state: BrokerState | None = None
        self.groups: GroupRuntime | None = None  # consumer groups (issue 4)
        self.txns: TxnRuntime | None = None  # transactions (issue 5)
        self.cleaner: LogCleaner | None = None  # compacted user topics (issue 14)
        self.connections: Connections | None = None
        self.access: Access | None = None  # users, ACLs, authorizer (issue 13)
        self.admin: AdminFrontend | None = None
        self._servers: list[asyncio.base_events.Server] = []
        self._housekeeping: list[asyncio.Future[None]] = []
        load_all()

    @property
    def bootstrap_servers(self) -> str:
        assert self.state is not None, "start() first"
        return ",".join(f"{n.host}:{n.port}" for n in self.state.cluster.nodes)

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        connection_limits(self.config)  # bad limits refuse to start, as Kafka's config check
        listeners = self.config.listener_list()
        tls = tls_context(self.config) if any(lsn.tls for lsn in listeners) else None
        self.access = Access(self.config)
        nodes = []
        for node_id in range(self.config.nodes):
            endpoints: dict[str, tuple[str, int]] = {}
            for listener in listeners:
                port = listener.port + node_id if listener.port else 0
                server = await loop.create_server(
                    lambda node_id=node_id, listener=listener: self._accept(node_id, listener),
                    listener.host or None,
                    port,
                    reuse_address=True,
                    ssl=tls if listener.tls else None,
                    start_serving=False,  # not before everything below is wired
                )
                self._servers.append(server)
                bound_port = server.sockets[0].getsockname()[1]
                endpoints[listener.name] = self.config.advertised_endpoint(listener, node_id,
                                                                           bound_port)
            host, advertised_port = endpoints[listeners[0].name]
            nodes.append(Node(node_id, host, advertised_port, endpoints=endpoints))
        state = self.state = BrokerState(self.config, Cluster(nodes))
        state.start_recovery()  # in the background: each partition answers once it is ready
        groups = self.groups = GroupRuntime(state)
        txns = self.txns = TxnRuntime(state, groups)
        txns.crash_points = self.faults  # crash_after rules (tests)
        pipeline = RequestPipeline(state, groups, txns, self.faults, access=self.access)
        connections = self.connections = Connections(
            pipeline, self.faults.refuses, self.config.frame_bytes_max, self.access,
            self.config.sasl_authentication_timeout_ms,
            # max.connections, max.connections.per.ip(.overrides), read at every accept
            limits=lambda: connection_limits(self.config, _node_zero(state)), metrics=state.metrics)
        self.faults.attach(loop, state.cluster, state.metrics, connections.close_node)
        groups.start()  # load __consumer_offsets, timers
        txns.start()  # load __transaction_state, timers
        self._housekeeping = [
            # log.retention.check.interval.ms
            asyncio.ensure_future(_every(self.config.retention_check_interval_ms,
                                         state.enforce_retention)),
            # producer.id.expiration.check.interval.ms
            asyncio.ensure_future(_every(self.config.producer_id_expiration_check_interval_ms,
                                         state.expire_producers)),
        ]
        if self.config.log_cleaner_enable:
            self.cleaner = LogCleaner(state, self.config.log_cleaner_backoff_ms,
                                      self.config.log_cleaner_dedupe_buffer_size,
                                      self.config.log_cleaner_io_max_bytes_per_second)
            self._housekeeping.append(asyncio.ensure_future(self.cleaner.run()))
        for server in self._servers:
            await server.start_serving()
        if self.config.admin_port is not None:
            if self._admin_frontend is None:
                self.admin = AdminServer(
                    self.faults, state.metrics,
                    self.config.advertised(0, self.config.admin_port)[0],
                    token=self.config.admin_token,
                    tls=tls_context(self.config) if self.config.admin_tls else None)
            else:
                self.admin = self._admin_frontend(self._admin_context(loop, state))
            await self.admin.start(self.config.host, self.config.admin_port)
            log.info("%s on %s", self.admin.title, self.admin.url)
        log.info("onceflow broker up: %s (data dir %s)", self.bootstrap_servers, self.config.data_dir)

    def _admin_context(self, loop: asyncio.AbstractEventLoop, state: BrokerState) -> AdminContext:
        async def on_loop(topic: str, index: int) -> list[SegmentView] | None:
            partition = state.partition(topic, index)
            if partition is None:
                return None
            infos = partition.log.segment_infos()
            return [SegmentView(*info, active=n == len(infos) - 1) for n, info in enumerate(infos)]

        def segments(topic: str, index: int) -> list[SegmentView] | None:
            # The partition's log belongs to the loop: read it there.
            return asyncio.run_coroutine_threadsafe(on_loop(topic, index), loop).result(
                ADMIN_CALL_TIMEOUT_S)

        return AdminContext(functools.partial(route, self.faults, state.metrics),
                            self.bootstrap_servers, self.config.host, segments)

    def _accept(self, node_id: int, listener: Listener):
        assert self.connections is not None  # listeners accept only once it exists
        return self.connections.accept(node_id, listener)

    def endpoints(self, listener: str) -> str:
        """host:port,... of every node on `listener` (a bootstrap list for its clients)."""
        assert self.state is not None, "start() first"
        return ",".join("%s:%d" % n.endpoints[listener] for n in self.state.cluster.nodes)

    @property
    def admin_url(self) -> str | None:
        """http://host:port of the admin endpoint, None when it is off."""
        return None if self.admin is None else self.admin.url

    async def stop(self) -> None:
        if self.cleaner is not None:
            self.cleaner.close()
        for task in self._housekeeping:
            task.cancel()
        if self.admin is not None:
            await self.admin.stop()
        for server in self._servers:
            server.close()
        if self.connections is not None:
            self.connections.close_all("broker shutting down")
            await self.connections.drain()
        for server in self._servers:
            await server.wait_closed()
        if self.txns is not None:
            self.txns.close()  # timers, marker writes
        if self.groups is not None:
            self.groups.close()  # timers and background tasks
        if self.state is not None:
            self.state.close()
        log.info("onceflow broker stopped cleanly")


def tls_context(config: BrokerConfig) -> ssl.SSLContext:
    """The server TLS context of SSL and SASL_SSL listeners (ssl.client.auth: none,
    requested, required; the CA file names the client certificates' issuers)."""
    if config.ssl_certfile is None:
        raise ValueError("an SSL or SASL_SSL listener needs --ssl-certfile (and --ssl-keyfile)")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(config.ssl_certfile, config.ssl_keyfile)
    if config.ssl_cafile is not None:
        context.load_verify_locations(cafile=config.ssl_cafile)
    context.verify_mode = {"none": ssl.CERT_NONE, "requested": ssl.CERT_OPTIONAL,
                           "required": ssl.CERT_REQUIRED}[config.ssl_client_auth]
    context.sslobject_class = DirectSSLObject
    return context


class DirectSSLObject(ssl.SSLObject):
    """An `ssl.SSLObject` whose read, write and pending are the C methods they wrap.

    uvloop's TLS transport calls read and pending once per TLS record it decrypts, and
    the stdlib's methods are Python functions that only pass their arguments on. librdkafka
    sends produce requests in TLS records of 1-2 KiB on average (measured: 46,000 reads
    for 100 MB), so those calls cost the broker about 0.5 us per record (issue 13,
    docs/benchmarks.md). Same arguments, same results, same exceptions: only the Python
    frame between is gone. Falls back to the stdlib's methods if a Python version lays
    SSLObject out differently.
    """

    @classmethod
    def _create(cls, *args: Any, **kwargs: Any) -> ssl.SSLObject:
        obj = super()._create(*args, **kwargs)  # type: ignore[misc]
        inner = getattr(obj, "_sslobj", None)
        if inner is not None and all(hasattr(inner, name) for name in ("read", "write", "pending")):
            obj.read, obj.write, obj.pending = inner.read, inner.write, inner.pending
        return obj


def _node_zero(state: BrokerState) -> Callable[[str], str | None]:
    """Dynamic broker configs as the connection limits read them: one process holds every
    node's listeners, so node 0's own value over the cluster default applies to all."""
    return lambda key: state.broker_config(key, 0)
