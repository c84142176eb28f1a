"""The asyncio pump: sockets in, frames to handlers, responses out in order.

Theory of operation. Each node of the cluster view has one listener. A connection
is an `asyncio.BufferedProtocol` around a sans-IO `FrameReader`: the socket reads
straight into the buffers the reader hands out (a large request's body lands in
its own pooled buffer, never copied again: protocol/framing.py), every complete
frame is decoded and its handler started as a task, in arrival order (so the
handlers' synchronous parts — the appends — run in that order). Responses are
written strictly in request order by one writer coroutine per connection, as Kafka
guarantees; once a request is answered its frame goes back to the server's
`BufferPool`. At most `CONNECTION_REQUESTS_IN_FLIGHT_MAX` requests of a connection
are in the broker; past that the connection stops reading until one is answered.

A peer that breaks the protocol (bad frame size, undecodable request, unknown API
or version other than ApiVersions) has its connection closed; other connections
carry on. A handler that raises is a bug of ours: it is logged with its traceback,
counted, and that connection is closed.

Hooks. Fault injection (broker/faults.py) sees each accepted connection once
(`refuses`) and each request once (`intercept`, which hands back the handler's
coroutine untouched unless a rule fires). Every answered request is counted in the
metrics (broker/metrics.py). Periodic work runs in one task per job: retention and
producer-id expiry. The admin HTTP endpoint (broker/admin.py) starts only when
`admin_port` is configured.
"""

from __future__ import annotations

import asyncio
import collections
import logging

from onceflow.broker.admin import AdminServer
from onceflow.broker.cluster import Cluster, Node
from onceflow.broker.config import CONNECTION_REQUESTS_IN_FLIGHT_MAX, BrokerConfig
from onceflow.broker.faults import FaultInjector
from onceflow.broker.handlers import HANDLERS, ApiKey, RequestContext, load_all
from onceflow.broker.state import BrokerState
from onceflow.protocol.codec import (
    Request,
    api_versions_fallback,
    build_response,
    decode_request,
    encode_response_chunks,
)
from onceflow.protocol.errors import ProtocolError, UnsupportedVersion
from onceflow.protocol.framing import BufferPool, FrameReader

log = logging.getLogger("onceflow.broker")


class _Connection(asyncio.BufferedProtocol):
    def __init__(self, server: BrokerServer, node_id: int) -> None:
        self._server = server
        self._node_id = node_id
        self._frames = FrameReader(server.config.frame_bytes_max, server.frame_pool)
        # (answer, frame) per request in the broker, oldest first.
        self._pending: collections.deque[
            tuple[asyncio.Future[bytes | None], bytes | memoryview]] = collections.deque()
        self._writer: asyncio.Task[None] | None = None
        self._can_write = asyncio.Event()
        self._can_write.set()
        self._transport: asyncio.Transport | None = None
        self._reading_paused = False
        self._closed = False

    # -- asyncio.Protocol ----------------------------------------------------

    @property
    def node_id(self) -> int:
        return self._node_id

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]  (uvloop's is not a subclass)
        if self._server.faults.refuses(self._node_id):
            self._drop("fault injection: connection refused")
            return
        self._client_host = _client_host(transport)  # DescribeGroups shows it (issue 4)
        self._server.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        self._server.connections.discard(self)
        self._can_write.set()
        for task, _frame in self._pending:
            task.cancel()

    def pause_writing(self) -> None:
        self._can_write.clear()

    def resume_writing(self) -> None:
        self._can_write.set()

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._frames.get_buffer()

    def buffer_updated(self, nbytes: int) -> None:
        if self._closed:
            return
        try:
            self._frames.buffer_updated(nbytes)
            while (frame := self._frames.next_frame()) is not None:
                self._start(frame)
                if self._closed:
                    return
        except ProtocolError as exc:
            self._drop(f"protocol error: {exc}")

    # -- requests ---------------------------------------------------------

    def _start(self, frame: bytes | memoryview) -> None:
        try:
            request = decode_request(frame)
        except UnsupportedVersion as exc:
            if exc.header.api_key != ApiKey.API_VERSIONS:
                self._drop(f"unsupported API {exc.header.api_key} v{exc.header.api_version}")
                return
            self._enqueue(_done(api_versions_fallback(exc.header)), frame)
            return
        work = self._server.faults.intercept(request, self._node_id, self._handle(request),
                                             self._drop)
        self._enqueue(asyncio.ensure_future(work), frame)

    def _enqueue(self, future: asyncio.Future[bytes | None], frame: bytes | memoryview) -> None:
        self._pending.append((future, frame))
        if len(self._pending) >= CONNECTION_REQUESTS_IN_FLIGHT_MAX and not self._reading_paused:
            self._reading_paused = True
            assert self._transport is not None
            self._transport.pause_reading()
        if self._writer is None or self._writer.done():
            self._writer = asyncio.ensure_future(self._write_responses())

    async def _handle(self, request: Request) -> list[bytes | memoryview] | None:
        header = request.header
        handler = HANDLERS.get(header.api_key)
        if handler is None:  # advertised in apis.SUPPORTED but not implemented: our bug
            raise RuntimeError(f"no handler for API key {header.api_key}")
        ctx = RequestContext(
            self._server.state, self._node_id, header.api_key, header.api_version, header.client_id,
            self._client_host,
        )
        body = await handler(ctx, request.body)
        self._server.state.metrics.observe_response(header.api_key, body)
        if body is None:
            return None
        return encode_response_chunks(header, build_response(header, **body))

    async def _write_responses(self) -> None:
        while self._pending and not self._closed:
            try:
                payload = await self._pending[0][0]
            except asyncio.CancelledError:
                return
            except Exception:
                log.exception("handler failed; closing the connection")
                self._server.handler_failures += 1
                self._drop("handler failure")
                return
            # The handler is done with the request: its frame may serve another one
            # (the pool checks that no view of it is left).
            self._server.frame_pool.give(self._pending.popleft()[1])
            # The client may have gone while the handler ran (its answer was already done,
            # so connection_lost could not cancel it): a closed uvloop transport raises on
            # write, and nobody is left to read the answer anyway.
            if payload is not None and self._transport is not None and not self._closed:
                if isinstance(payload, list):   # scatter-gather: records are not copied
                    self._transport.writelines(payload)
                else:
                    self._transport.write(payload)
                await self._can_write.wait()
            if self._reading_paused and len(self._pending) < CONNECTION_REQUESTS_IN_FLIGHT_MAX:
                self._reading_paused = False
                if self._transport is not None and not self._closed:
                    self._transport.resume_reading()

    def _drop(self, reason: str) -> None:
        log.info("closing connection to node %d: %s", self._node_id, reason)
        self._closed = True
        for task, _frame in self._pending:   # nobody will read their answers
            task.cancel()
        if self._transport is not None:
            self._transport.abort()

    def close(self, reason: str = "broker shutting down") -> None:
        self._drop(reason)


def _client_host(transport: asyncio.BaseTransport) -> str:
    """Kafka's client host: "/" + the peer's IP address (issue 4: DescribeGroups)."""
    peer = transport.get_extra_info("peername")
    return f"/{peer[0]}" if isinstance(peer, tuple) and peer else ""


async def _every(interval_ms: int, job) -> None:
    """Run `job()` every `interval_ms`, for ever (cancelled at stop)."""
    while True:
        await asyncio.sleep(interval_ms / 1000)
        job()


def _done(payload: bytes) -> asyncio.Future[bytes | None]:
    future: asyncio.Future[bytes | None] = asyncio.get_running_loop().create_future()
    future.set_result(payload)
    return future


class BrokerServer:
    """All listeners of one broker process and the state they share."""

    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        self.state: BrokerState | None = None
        self.connections: set[_Connection] = set()
        self.handler_failures = 0
        self.frame_pool = BufferPool()  # large request frames, shared by all connections
        self.faults = FaultInjector(self)
        self.admin: AdminServer | None = None
        self._servers: list[asyncio.base_events.Server] = []
        self._housekeeping: list[asyncio.Future[None]] = []
        load_all()

    @property
    def bootstrap_servers(self) -> str:
        assert self.state is not None, "start() first"
        return ",".join(f"{n.host}:{n.port}" for n in self.state.cluster.nodes)

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        nodes = []
        for node_id in range(self.config.nodes):
            port = self.config.port + node_id if self.config.port else 0
            server = await loop.create_server(
                lambda node_id=node_id: _Connection(self, node_id),
                self.config.host,
                port,
                reuse_address=True,
            )
            self._servers.append(server)
            bound_port = server.sockets[0].getsockname()[1]
            host, advertised_port = self.config.advertised(node_id, bound_port)
            nodes.append(Node(node_id, host, advertised_port))
        self.state = BrokerState(self.config, Cluster(nodes))
        self.state.groups.start()  # consumer groups (issue 4): load __consumer_offsets, timers
        self.state.txns.crash_points = self.faults  # crash_after rules (tests)
        self.state.txns.start()  # transactions (issue 5): load __transaction_state, timers
        self.faults.attach(loop)
        self._housekeeping = [
            # log.retention.check.interval.ms
            asyncio.ensure_future(_every(self.config.retention_check_interval_ms,
                                         self.state.enforce_retention)),
            # producer.id.expiration.check.interval.ms
            asyncio.ensure_future(_every(self.config.producer_id_expiration_check_interval_ms,
                                         self.state.expire_producers)),
        ]
        if self.config.admin_port is not None:
            self.admin = AdminServer(self)
            await self.admin.start(self.config.host, self.config.admin_port)
            log.info("admin endpoint (faults, metrics) on %s", self.admin.url)
        log.info("onceflow broker up: %s (data dir %s)", self.bootstrap_servers, self.config.data_dir)

    @property
    def admin_url(self) -> str | None:
        """http://host:port of the admin endpoint, None when it is off."""
        return None if self.admin is None else self.admin.url

    async def stop(self) -> None:
        for task in self._housekeeping:
            task.cancel()
        if self.admin is not None:
            await self.admin.stop()
        for server in self._servers:
            server.close()
        for connection in list(self.connections):
            connection.close()
        for server in self._servers:
            await server.wait_closed()
        if self.state is not None:
            self.state.close()
        log.info("onceflow broker stopped cleanly")

