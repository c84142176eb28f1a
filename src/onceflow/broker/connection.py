"""The connection pump: socket bytes in, frames to the request pipeline, answers out in order.

Theory of operation. A connection is an `asyncio.BufferedProtocol` around a sans-IO
`FrameReader`: the socket reads straight into the buffers the reader hands out (a large
request's body lands in its own pooled buffer, never copied again: protocol/framing.py),
and every complete frame goes to `RequestPipeline.start` (broker/pipeline.py) at once, in
arrival order; the work it returns runs at once up to its first wait (so the handlers'
synchronous parts - the appends - run in that order), and only work that does wait goes
on as a task (`_run_eagerly`: most small requests cost no task). Answers are written
strictly in request order, as Kafka guarantees: one answered at once with nothing before
it is written right away, the others by one writer coroutine per connection, which writes
all the answers already done in one `writelines` call; once a request is answered its
frame goes back to the shared `BufferPool`. At most
`CONNECTION_REQUESTS_IN_FLIGHT_MAX` requests of a connection are in the broker; past that
the connection stops reading until one is answered.

A peer that breaks the protocol (bad frame size, undecodable request, unknown API or
version other than ApiVersions) has its connection closed; other connections carry on.
A handler that raises is a bug of ours: it is logged with its traceback, counted, and
that connection is closed. A request whose answer fault injection loses (`LOST_ANSWER`,
broker/faults.py) stalls its connection: no answer is written any more, and later
frames are read (so the client's close is seen) but discarded unperformed.

`Connections` is what the connections of one broker share - the pipeline, the frame
pool, the fault injector's `refuses` hook - and the set of open ones, which fault
injection (a node going down) and shutdown close. It also applies the connection limits
at accept (`admit`, broker/connection_quotas.py): a connection over its IP's limit is
closed at once; one over max.connections waits, not read from, until another closes.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
import types
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from onceflow.broker.access import Access, Session
from onceflow.broker.config import CONNECTION_REQUESTS_IN_FLIGHT_MAX
from onceflow.broker.connection_quotas import (
    WAITING_CONNECTIONS_MAX,
    ConnectionLimits,
    ConnectionQuotas,
    normalized_address,
)
from onceflow.broker.faults import LOST_ANSWER
from onceflow.broker.metrics import BrokerMetrics
from onceflow.broker.pipeline import Answer, Peer, RequestPipeline
from onceflow.protocol.errors import ProtocolError, UnsupportedVersion
from onceflow.protocol.framing import BufferPool, FrameReader
from onceflow.security.listeners import Listener
from onceflow.security.sasl import SaslState, SaslStateError

log = logging.getLogger("onceflow.broker")

# A stalled connection (a lost answer) that its client never closes is closed after
# Kafka's default connections.max.idle.ms: it has been idle for that long.
STALLED_CLOSE_S = 600.0


class Connections:
    """The open connections of one broker process and what they share."""

    def __init__(self, pipeline: RequestPipeline, refuses: Callable[[int], bool],
                 frame_bytes_max: int, access: Access,
                 sasl_authentication_timeout_ms: int = 30_000,
                 limits: Callable[[], ConnectionLimits] = ConnectionLimits,
                 metrics: BrokerMetrics | None = None) -> None:
        self.pipeline = pipeline
        self.access = access
        self.sasl_authentication_timeout_ms = sasl_authentication_timeout_ms
        self.refuses = refuses  # FaultInjector.refuses: close a just-accepted connection?
        self.frame_bytes_max = frame_bytes_max
        self.frame_pool = BufferPool()  # large request frames, shared by all connections
        self.open: set[Connection] = set()
        # Connection limits: `limits()` is called at every accept (a dynamic config may
        # change what it returns); connections over max.connections wait here, FIFO.
        self.limits = limits
        self.quotas = ConnectionQuotas()
        self.waiting: collections.deque[Connection] = collections.deque()
        self.metrics = metrics
        # The connections' answer writers still running: a broker stopping waits for them,
        # so none is left pending when its event loop closes.
        self.writers: set[asyncio.Future] = set()
        self.handler_failures = 0

    def accept(self, node_id: int, listener: Listener) -> Connection:
        """The protocol of a connection just accepted by node `node_id`'s `listener`."""
        return Connection(self, node_id, listener)

    def admit(self, connection: Connection) -> None:
        """A connection just made: take it on, let it wait for a slot, or close it."""
        limits = self.limits()
        if not self.waiting and self.quotas.slot_available(limits):
            self._take_on(connection, limits)
        elif len(self.waiting) >= WAITING_CONNECTIONS_MAX:
            self._refuse(connection, "max.connections",
                         "max.connections reached and the wait queue is full")
        else:
            connection.wait()
            self.waiting.append(connection)
            self._count_waiting()

    def release(self, connection: Connection) -> None:
        """A connection closed: uncount it and take on those waiting for its slot."""
        if connection.address is None:    # never taken on
            if connection in self.waiting:
                self.waiting.remove(connection)
                self._count_waiting()
            return
        self.quotas.dec(connection.address)
        connection.address = None
        if self.metrics is not None:
            self.metrics.connection_closed(connection.listener_name)
        if self.waiting:
            limits = self.limits()
            while self.waiting and self.quotas.slot_available(limits):
                self._take_on(self.waiting.popleft(), limits)
            self._count_waiting()

    def _take_on(self, connection: Connection, limits: ConnectionLimits) -> None:
        address = connection.peer_address
        if not self.quotas.inc(address, limits):
            self._refuse(connection, "max.connections.per.ip",
                         f"address {address} already has the configured maximum of "
                         f"{limits.per_ip(address)} connections")
            return
        connection.address = address
        if self.metrics is not None:
            self.metrics.connection_opened(connection.listener_name)
        connection.serve()

    def _refuse(self, connection: Connection, limit: str, reason: str) -> None:
        """Kafka's acceptor closes it at once (TooManyConnectionsException, INFO)."""
        if self.metrics is not None:
            self.metrics.connection_refused(limit)
        connection.close(f"rejected: {reason}")

    def _count_waiting(self) -> None:
        if self.metrics is not None:
            self.metrics.connections_waiting(len(self.waiting))

    def close_node(self, node_id: int, reason: str) -> None:
        for connection in list(self.open):
            if connection.node_id == node_id:
                connection.close(reason)

    def close_all(self, reason: str) -> None:
        for connection in list(self.open):
            connection.close(reason)

    async def drain(self, timeout_s: float = 5.0) -> None:
        """After close_all: end the answer writers (their connections are closed, nobody
        reads the answers) and wait until they are done."""
        writers = list(self.writers)
        for writer in writers:
            writer.cancel()
        if writers:
            await asyncio.wait(writers, timeout=timeout_s)


class Connection(asyncio.BufferedProtocol):
    def __init__(self, shared: Connections, node_id: int, listener: Listener) -> None:
        self._shared = shared
        self._pipeline = shared.pipeline
        self._listener = listener
        self._peer = Peer(node_id)
        self._frames = FrameReader(shared.frame_bytes_max, shared.frame_pool)
        # (answer, frame) per request in the broker, oldest first.
        self._pending: collections.deque[
            tuple[asyncio.Future[Answer | bytes], bytes | memoryview]] = collections.deque()
        self._writer: asyncio.Task[None] | None = None
        # Made by the first pause_writing only: most connections never need one.
        self._can_write: asyncio.Event | None = None
        self._transport: asyncio.Transport | None = None
        self._reading_paused = False
        self._closed = False
        self._closing: str | None = None  # close once the admitted requests are answered
        self._login_deadline: asyncio.TimerHandle | None = None
        self._stalled: asyncio.TimerHandle | None = None  # set once an answer was lost
        self._muted: asyncio.TimerHandle | None = None   # a throttled client's quiet time
        # The peer's IP address while it is counted against the connection limits.
        self.address: str | None = None

    # -- asyncio.Protocol ----------------------------------------------------

    @property
    def node_id(self) -> int:
        return self._peer.node_id

    @property
    def listener_name(self) -> str:
        return self._listener.name

    @property
    def peer_address(self) -> str:
        """The peer's IP address (what max.connections.per.ip counts)."""
        return normalized_address(self._peer.client_host[1:])

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]  (uvloop's is not a subclass)
        if self._shared.refuses(self.node_id):
            self._drop("fault injection: connection refused")
            return
        self._peer.client_host = _client_host(transport)  # DescribeGroups shows it (issue 4)
        self._shared.admit(self)   # serve() now, later (max.connections), or close

    def wait(self) -> None:
        """Over max.connections: read nothing until `serve` (Kafka: left in the backlog)."""
        assert self._transport is not None
        self._shared.open.add(self)   # shutdown and fault injection close it too
        self._reading_paused = True
        self._transport.pause_reading()

    def serve(self) -> None:
        """Taken on (within the connection limits): the session starts."""
        transport = self._transport
        assert transport is not None
        if self._closed:   # closed while it waited (shutdown, fault injection)
            return
        self._peer.session = _session(self._shared.access, self._listener, transport)
        if self._peer.session is None:
            self._drop("no ssl.principal.mapping.rules rule applies to the client "
                       "certificate's subject")
            return
        self._shared.open.add(self)
        if self._peer.session.sasl is not None:
            # An unauthenticated peer may not hold a connection for ever.
            self._login_deadline = asyncio.get_running_loop().call_later(
                self._shared.sasl_authentication_timeout_ms / 1000, self._login_overdue)
        if self._reading_paused:   # it waited for its slot
            self._reading_paused = False
            transport.resume_reading()
            self._take_frames()   # any read before the pause took hold (uvloop)

    def _login_overdue(self) -> None:
        session = self._peer.session
        if not self._closed and session is not None and not session.authenticated:
            self._drop("SASL authentication not completed in time")

    def connection_lost(self, exc: Exception | None) -> None:
        if self._login_deadline is not None:
            self._login_deadline.cancel()
        if self._stalled is not None:
            self._stalled.cancel()
        if self._muted is not None:
            self._muted.cancel()
        self._closed = True
        self._shared.open.discard(self)
        self._shared.release(self)
        if self._can_write is not None:
            self._can_write.set()
        for task, _frame in self._pending:
            task.cancel()

    def pause_writing(self) -> None:
        if self._can_write is None:
            self._can_write = asyncio.Event()
        self._can_write.clear()

    def resume_writing(self) -> None:
        if self._can_write is not None:
            self._can_write.set()

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._frames.get_buffer()

    def buffer_updated(self, nbytes: int) -> None:
        if self._closed:
            return
        if self.address is None:
            # Waiting for a slot: uvloop starts reading after connection_made whatever it
            # did, so one read may come before the pause holds. Kept for serve().
            try:
                self._frames.buffer_updated(nbytes)
            except ProtocolError:
                pass   # remembered by the reader: raised again when the frames are taken
            if self._transport is not None:
                self._transport.pause_reading()
            return
        self._take_frames(nbytes)

    def _take_frames(self, nbytes: int = 0) -> None:
        """Pass `nbytes` more to the reader and start every complete frame."""
        try:
            if nbytes:
                self._frames.buffer_updated(nbytes)
            while (frame := self._frames.next_frame()) is not None:
                if self._stalled is not None:   # the path is broken: nothing arrives
                    self._shared.frame_pool.give(frame)
                    continue
                self._start(frame)
                if self._closed or self._closing is not None:
                    return
        except ProtocolError as exc:
            self._drop(f"protocol error: {exc}")

    # -- requests ---------------------------------------------------------

    def _start(self, frame: bytes | memoryview) -> None:
        try:
            work = self._pipeline.start(frame, self._peer, self._drop)
        except UnsupportedVersion as exc:
            self._drop(f"unsupported API {exc.header.api_key} v{exc.header.api_version}")
            return
        except SaslStateError as exc:   # a request before (or instead of) authentication
            self._close_when_answered(str(exc))
            return
        if isinstance(work, bytes):  # answered by the pipeline itself
            self._enqueue(_done(work), frame)
        else:
            self._enqueue(_run_eagerly(work), frame)

    def _enqueue(self, future: asyncio.Future[Answer | bytes], frame: bytes | memoryview) -> None:
        self._pending.append((future, frame))
        if self._stalled is not None:
            return  # performed, but its answer cannot be written
        if len(self._pending) >= CONNECTION_REQUESTS_IN_FLIGHT_MAX and not self._reading_paused:
            self._reading_paused = True
            assert self._transport is not None
            self._transport.pause_reading()
        if self._writer is None or self._writer.done():
            if (future.done() and len(self._pending) == 1
                    and (self._can_write is None or self._can_write.is_set())):
                # Answered at once and nothing before it: written now, without a task.
                out: list[bytes | memoryview] = []
                self._answer_head(out)
                self._flush_answers(out)
                return
            if len(self._pending) == 1:
                # The only request, still working (a long poll, a flush): its answer is
                # written from its done callback, without a writer task (issue 19).
                future.add_done_callback(self._write_when_answered)
                return
            self._start_writer()

    def _start_writer(self) -> None:
        self._writer = asyncio.ensure_future(self._write_responses())
        self._shared.writers.add(self._writer)
        self._writer.add_done_callback(self._shared.writers.discard)

    def _write_when_answered(self, future: asyncio.Future[Answer | bytes]) -> None:
        """The lone pending request is answered: write what is ready, as the writer would,
        unless a writer took over meanwhile (more requests came) or the connection closed."""
        if self._closed or (self._writer is not None and not self._writer.done()):
            return
        if not self._pending or self._pending[0][0] is not future:
            return
        if self._can_write is not None and not self._can_write.is_set():
            self._start_writer()   # it waits for the transport
            return
        out: list[bytes | memoryview] = []
        while self._pending and self._pending[0][0].done():
            if not self._answer_head(out):
                return
        self._flush_answers(out)
        if self._pending and not self._closed:
            self._start_writer()

    async def _write_responses(self) -> None:
        out: list[bytes | memoryview] = []   # answers ready, written in one syscall
        while self._pending and not self._closed:
            head = self._pending[0][0]
            if not head.done():
                self._flush_answers(out)
                await self._writable()
                await _settled(head)   # its outcome, error or not, is _answer_head's
            if not self._answer_head(out):
                return
            if not self._pending or not self._pending[0][0].done():
                # Nothing more ready: write what is, then wait for the transport before
                # looking again (requests may arrive meanwhile: the loop takes them).
                self._flush_answers(out)
                await self._writable()

    async def _writable(self) -> None:
        """Until the transport takes more (made by the first pause_writing only)."""
        if self._can_write is not None:
            await self._can_write.wait()

    def _flush_answers(self, out: list[bytes | memoryview]) -> None:
        # The client may have gone while the handler ran (its answer was already done,
        # so connection_lost could not cancel it): a closed uvloop transport raises on
        # write, and nobody is left to read the answer anyway.
        if out and self._transport is not None and not self._closed:
            self._transport.writelines(out)   # scatter-gather: records are not copied
        out.clear()

    def _answer_head(self, out: list[bytes | memoryview]) -> bool:
        """Take the answer of the oldest request (done) into `out`, and what follows from
        it (mute, close); False once nothing more is to be written."""
        future = self._pending[0][0]
        try:
            payload = future.result()
        except asyncio.CancelledError:
            return False
        except Exception:
            log.exception("handler failed; closing the connection")
            self._shared.handler_failures += 1
            self._flush_answers(out)
            self._drop("handler failure")
            return False
        # The handler is done with the request: its frame may serve another one
        # (the pool checks that no view of it is left).
        self._shared.frame_pool.give(self._pending.popleft()[1])
        if payload is LOST_ANSWER:
            self._flush_answers(out)
            self._stall()
            return False
        if payload is not None:
            if isinstance(payload, list):
                out += payload
            else:
                out.append(payload)
        if self._peer.muted_until:
            self._flush_answers(out)
            self._mute()
        if self._login_failed():
            # Kafka closes after the SASL_AUTHENTICATION_FAILED (or
            # UNSUPPORTED_SASL_MECHANISM) answer; close() flushes it first.
            log.info("closing connection to node %d: SASL authentication failed",
                     self.node_id)
            self._flush_answers(out)
            self._closed = True
            if self._transport is not None:
                self._transport.close()
            return False
        if self._closing is not None:
            if not self._pending and self._transport is not None:
                self._flush_answers(out)
                self._closed = True
                self._transport.close()   # flushes the answers written above
            return True
        if (self._reading_paused and self._muted is None
                and len(self._pending) < CONNECTION_REQUESTS_IN_FLIGHT_MAX):
            self._reading_paused = False
            if self._transport is not None and not self._closed:
                self._transport.resume_reading()
        return True

    def _mute(self) -> None:
        """A client over its quota: read nothing more until its throttle time has passed
        (the answer that says so is written; KIP-219)."""
        until, self._peer.muted_until = self._peer.muted_until, 0.0
        delay = until - time.monotonic()
        if delay <= 0 or self._closed or self._transport is None:
            return
        if self._muted is not None:
            if self._muted.when() >= asyncio.get_running_loop().time() + delay:
                return
            self._muted.cancel()
        if not self._reading_paused:
            self._reading_paused = True
            self._transport.pause_reading()
        self._muted = asyncio.get_running_loop().call_later(delay, self._unmute)

    def _unmute(self) -> None:
        self._muted = None
        if (self._reading_paused and not self._closed and self._transport is not None
                and self._closing is None and self._stalled is None
                and len(self._pending) < CONNECTION_REQUESTS_IN_FLIGHT_MAX):
            self._reading_paused = False
            self._transport.resume_reading()

    def _stall(self) -> None:
        """An answer was lost (fault injection): write nothing more on this connection,
        read on only to discard (module docstring of broker/faults.py)."""
        log.info("connection to node %d stalled: fault injection lost an answer",
                 self.node_id)
        self._stalled = asyncio.get_running_loop().call_later(
            STALLED_CLOSE_S, self._drop, "stalled connection idle too long")
        if self._reading_paused and self._transport is not None and not self._closed:
            self._reading_paused = False
            self._transport.resume_reading()

    def _close_when_answered(self, reason: str) -> None:
        """Answer what was admitted before the offending request, then close (Kafka
        handles SASL requests one at a time, so those answers would have gone out)."""
        if not self._pending:
            self._drop(reason)
            return
        log.info("closing connection to node %d after its answers: %s", self.node_id, reason)
        self._closing = reason
        if self._transport is not None and not self._reading_paused:
            self._reading_paused = True
            self._transport.pause_reading()

    def _login_failed(self) -> bool:
        session = self._peer.session
        return (session is not None and session.sasl is not None
                and session.sasl.state == SaslState.FAILED)

    def _drop(self, reason: str) -> None:
        log.info("closing connection to node %d: %s", self.node_id, reason)
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


def _session(access: Access, listener: Listener,
             transport: asyncio.BaseTransport) -> Session | None:
    """A new connection's session; with a verified client certificate (mTLS) its principal
    is `User:` + the name ssl.principal.mapping.rules give its subject in RFC 2253 form
    (DEFAULT: the subject itself). None when no rule applies: Kafka refuses the client."""
    peer = transport.get_extra_info("peername")
    session = access.session(listener, peer[0] if isinstance(peer, tuple) and peer else "")
    if listener.tls and not listener.sasl:
        ssl_object = transport.get_extra_info("ssl_object")
        cert = ssl_object.getpeercert() if ssl_object is not None else None
        if cert:
            name = access.principal_mapper.name(rfc2253(cert.get("subject", ())))
            if name is None:
                return None
            session.principal = f"User:{name}"
    return session


# Attribute names of ssl.getpeercert() -> the keywords of RFC 2253 (Java's X500Principal).
_RDN_KEYWORDS = {"commonName": "CN", "organizationName": "O",
                 "organizationalUnitName": "OU", "countryName": "C", "localityName": "L",
                 "stateOrProvinceName": "ST", "streetAddress": "STREET",
                 "domainComponent": "DC", "userId": "UID"}


def rfc2253(subject: tuple) -> str:
    """A certificate subject (ssl.getpeercert()'s form) as RFC 2253 text: most specific
    RDN first, ",+\"\\<>;" escaped, as Java's X500Principal.getName() writes it."""
    def escape(value: str) -> str:
        out = "".join("\\" + c if c in ',+"\\<>;' else c for c in value)
        if out.startswith((" ", "#")):
            out = "\\" + out
        return out[:-1] + "\\ " if out.endswith(" ") else out

    rdns = []
    for rdn in reversed(subject):
        rdns.append("+".join(f"{_RDN_KEYWORDS.get(k, k)}={escape(v)}" for k, v in rdn))
    return ",".join(rdns)


def _run_eagerly(work: Awaitable[Answer | bytes]) -> asyncio.Future[Answer | bytes]:
    """Run the request's work up to its first wait, here and now: a request answered
    without waiting (most small ones: acks=1 produce, metadata, heartbeats) costs no task
    (issue 19). Work that does wait goes on in a task from where it stopped."""
    if not isinstance(work, types.CoroutineType):
        return asyncio.ensure_future(work)
    try:
        waited_on = work.send(None)
    except StopIteration as stop:
        return _done(stop.value)
    except Exception as exc:  # noqa: BLE001 - reported by the writer, as a task's would be
        future: asyncio.Future[Answer | bytes] = asyncio.get_running_loop().create_future()
        future.set_exception(exc)
        return future
    return asyncio.ensure_future(_resume(work, waited_on))


async def _resume(work: Coroutine[Any, Any, Answer | bytes], waited_on: Any) -> Answer | bytes:
    """Drive `work` on from a wait its first step began outside any task, as a task
    would: resumed once what it waits on is done, cancelled into it where it waits."""
    while True:
        step: Callable[[Any], Any] = work.send
        value: Any = None
        try:
            if waited_on is None:   # a bare yield (asyncio.sleep(0)): one loop turn
                await asyncio.sleep(0)
            elif asyncio.isfuture(waited_on):
                waited_on._asyncio_future_blocking = False   # as Task.__step takes it
                try:
                    # Awaited directly (no go-between future: one loop turn less per
                    # long-poll wake, issue 19); its outcome is the work's to read below.
                    await waited_on
                except Exception:   # noqa: BLE001, S110 - raised in the work by its step
                    pass
            else:
                step, value = work.throw, RuntimeError(f"yield of a non-future {waited_on!r}")
        except asyncio.CancelledError as exc:
            if waited_on is not None:
                waited_on.cancel()
            step, value = work.throw, exc
        try:
            waited_on = step(value)
        except StopIteration as stop:
            return stop.value


def _settled(future: asyncio.Future[Any]) -> asyncio.Future[None]:
    """A future done when `future` is, whatever its outcome (its owner reads that)."""
    waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def wake(_: asyncio.Future[Any]) -> None:
        if not waiter.done():
            waiter.set_result(None)

    future.add_done_callback(wake)
    return waiter


def _done(payload: bytes) -> asyncio.Future[Answer | bytes]:
    future: asyncio.Future[Answer | bytes] = asyncio.get_running_loop().create_future()
    future.set_result(payload)
    return future
