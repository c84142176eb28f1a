"""The request pipeline: one request, from its frame to its encoded answer.

    frame -> decode -> authenticate -> authorize -> fault injection -> handler -> encode

Theory of operation. The connection (broker/connection.py) only moves bytes: it cuts
frames, hands each to `RequestPipeline.start` in arrival order and writes the answers
in request order. Every stage in between lives here, each small enough to test alone:

- decode (`decode`): the frame becomes a `Request` with its kio body. An ApiVersions
  request of a version the broker does not speak is answered right here with Kafka's v0
  fallback (bytes). Any other unsupported API raises `UnsupportedVersion`, a malformed
  frame `ProtocolError`: the connection closes, as Kafka does.
- authenticate (`authenticate`): on a SASL listener, until the login succeeds only what
  the connection's SASL state allows passes (security/sasl.py: ApiVersions, then
  SaslHandshake, then SaslAuthenticate); anything else raises `SaslStateError` and the
  connection closes, as Kafka's SaslServerAuthenticator does. After a SaslHandshake v0
  the frames until the login completes are raw SASL tokens (no request header): they go
  to handlers/sasl.py's `raw_token`, not to the decoder.
- authorize: the checks are per resource (a Produce may write one topic and be refused
  another), so each handler asks `RequestContext.authorized` for what Kafka's KafkaApis
  checks for that API (docs/security.md has the table); the stage itself passes.
- fault injection (`FaultInjector.intercept`, broker/faults.py): hands the work back
  untouched unless a rule fires (with no rule, one truthiness test).
- handler (`respond`): the API's handler (broker/handlers/) with a `RequestContext`;
  the answered request is counted in the metrics.
- quotas (`throttle`): a Produce request's size and a consumer Fetch answer's record
  bytes count against the client's byte-rate quota, and the handler's time on the event
  loop against its request_percentage quota (broker/quotas.py); over either, the answer
  carries the larger throttle time and the connection stops reading that long
  (KIP-219). With no quota set, one truthiness test.
- encode (`encode`): the response as buffers for `writelines` (records are not
  copied), or None when Kafka sends no answer (Produce with acks=0).

`start` decodes and admits a request synchronously; the connection schedules the work it
returns as a task, in arrival order, so the handlers' synchronous parts (the appends) run
in request order while fsync waits and long polls overlap.

Cost on the hot path, per request: one `RequestContext` and one coroutine (`respond`),
as before the stages had names; the two empty stages are plain calls.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Awaitable, Callable, Mapping

from onceflow.broker.access import Access, Session
from onceflow.broker.faults import FaultInjector
from onceflow.broker.handlers import HANDLERS, Handler, RequestContext
from onceflow.broker.handlers.sasl import raw_token
from onceflow.broker.quotas import (
    CONSUMER_BYTE_RATE,
    PRODUCER_BYTE_RATE,
    REQUEST_PERCENTAGE,
    LoopTimer,
    quota_user,
)
from onceflow.broker.runtime.groups import GroupRuntime
from onceflow.broker.runtime.txn import TxnRuntime
from onceflow.broker.state import BrokerState
from onceflow.protocol.apis import ApiKey
from onceflow.protocol.codec import (
    Request,
    RequestHeader,
    api_versions_fallback,
    build_response,
    decode_request,
    encode_response_chunks,
)
from onceflow.protocol.errors import UnsupportedVersion
from onceflow.protocol.fetch_response import encode_fetch_response
from onceflow.protocol.metadata_response import encode_metadata_response
from onceflow.protocol.produce_response import encode_produce_response

# An encoded answer: buffers for `writelines`, or None when nothing is sent.
Answer = list[bytes | memoryview] | None


@dataclasses.dataclass(slots=True)
class Peer:
    """What the pipeline knows of the connection a request came on; one per connection
    (authentication will keep the principal here)."""

    node_id: int           # the node this connection reached
    client_host: str = ""  # "/<peer ip>", as Kafka reports members (issue 4)
    session: Session | None = None  # listener, principal, SASL state (issue 13)
    muted_until: float = 0.0  # time.monotonic() until which a throttled client is not read


ANONYMOUS_USER = "ANONYMOUS"
# Answers without a throttle_time_ms field: a throttled client is muted all the same.
NO_THROTTLE_FIELD = frozenset({ApiKey.SASL_HANDSHAKE, ApiKey.SASL_AUTHENTICATE,
                               ApiKey.WRITE_TXN_MARKERS})


def decode(frame: bytes | memoryview) -> Request | bytes:
    """The request in `frame`, or the encoded answer to an ApiVersions request of a version
    the broker does not speak. Raises UnsupportedVersion (any other API) and
    ProtocolError (malformed frame): the connection is closed for both."""
    try:
        return decode_request(frame)
    except UnsupportedVersion as exc:
        if exc.header.api_key != ApiKey.API_VERSIONS:
            raise
        return api_versions_fallback(exc.header)


def authenticate(request: Request, peer: Peer) -> None:
    """Before a SASL login completes, only the requests of the SASL exchange pass;
    raises SaslStateError (the connection closes) for any other."""
    session = peer.session
    if session is not None and session.sasl is not None:
        session.sasl.check(request.header.api_key, request.header.api_version)


def authorize(request: Request, peer: Peer) -> None:
    """ACL checks happen in the handlers, per resource (`RequestContext.authorized`)."""


# Answers encoded straight from the handler's dict (the same bytes as kio's; None: a shape
# they do not cover, which takes the generic path): Produce, and Fetch, which a consumer
# reading along sends once per record, and Metadata, whose answer lists every partition.
_DIRECT_ENCODERS = {ApiKey.PRODUCE: encode_produce_response, ApiKey.FETCH: encode_fetch_response,
                    ApiKey.METADATA: encode_metadata_response}   # 10,000 partitions: issue 19


def encode(header: RequestHeader, body: dict | None) -> Answer:
    """A handler's plain-data answer as response frame buffers; None: no response."""
    if body is None:
        return None
    direct = _DIRECT_ENCODERS.get(header.api_key)
    if direct is not None:   # the hot paths of small requests (issue 19)
        answer = direct(header.correlation_id, header.api_version, body)
        if answer is not None:
            return answer
    return encode_response_chunks(header, build_response(header, **body))


class RequestPipeline:
    """The stages above, over one broker's state, coordinator runtimes and faults."""

    def __init__(self, state: BrokerState, groups: GroupRuntime, txns: TxnRuntime,
                 faults: FaultInjector, handlers: Mapping[int, Handler] = HANDLERS,
                 access: Access | None = None) -> None:
        self._state = state
        self._access = access
        self._groups = groups
        self._txns = txns
        self._faults = faults
        self._handlers = handlers
        self._metrics = state.metrics

    def start(self, frame: bytes | memoryview, peer: Peer,
              close: Callable[[str], None]) -> Awaitable[Answer | bytes] | bytes:
        """Decode and admit one request: the work that answers it (to run as a task), or
        an answer already encoded. `close(reason)` closes the connection (faults).
        After a SaslHandshake v0 the frame is a raw SASL token, not a request."""
        session = peer.session
        if session is not None and session.sasl is not None and session.sasl.raw_tokens():
            return raw_token(self._state, session, bytes(frame))
        request = decode(frame)
        if isinstance(request, bytes):
            return request
        self._metrics.observe_request(request.header.api_key, request.header.api_version,
                                      len(frame))
        authenticate(request, peer)
        authorize(request, peer)
        return self._faults.intercept(request, peer.node_id,
                                      self.respond(request, peer, len(frame)), close)

    async def respond(self, request: Request, peer: Peer, size: int = 0) -> Answer:
        """Run the request's handler; its encoded answer."""
        header = request.header
        handler = self._handlers.get(header.api_key)
        if handler is None:  # advertised in apis.SUPPORTED but not implemented: our bug
            raise RuntimeError(f"no handler for API key {header.api_key}")
        ctx = RequestContext(self._state, self._groups, self._txns, peer.node_id,
                             header.api_key, header.api_version, header.client_id,
                             peer.client_host, peer.session, self._access)
        if not self._state.quotas.active():
            body = await handler(ctx, request.body)
            self._metrics.observe_response(header.api_key, body)
            return encode(header, body)
        timer = LoopTimer(handler(ctx, request.body))
        body = await timer
        self._metrics.observe_response(header.api_key, body)
        if body is not None:
            throttle(self._state, request, peer, body, size, timer.busy_ns)
        return encode(header, body)


def throttle(state: BrokerState, request: Request, peer: Peer, body: dict, size: int,
             busy_ns: int = 0) -> None:
    """Count the request against the client's byte-rate and request-time quotas; over
    either, put the larger throttle time in the answer and mute the connection that long."""
    header = request.header
    user = quota_user(peer.session.principal if peer.session is not None
                      else f"User:{ANONYMOUS_USER}")
    client_id = header.client_id or ""
    if header.api_key == ApiKey.PRODUCE:
        key = PRODUCER_BYTE_RATE
        bytes_ms = state.quotas.record(key, user, client_id, size)
    elif header.api_key == ApiKey.FETCH:
        # A consumer's fetched bytes are counted by the handler (handlers/fetch.py), which
        # answers an over-quota fetch empty, as Kafka does, with its throttle time.
        key, bytes_ms = CONSUMER_BYTE_RATE, body.get("throttle_time", 0)
    else:
        key, bytes_ms = "", 0
    time_ms = (state.quotas.record_request_time(user, client_id, busy_ns)
               if request_time_counts(request, peer) else 0)
    throttle_ms = max(bytes_ms, time_ms)
    if throttle_ms > 0:
        if header.api_key not in NO_THROTTLE_FIELD:
            body["throttle_time"] = throttle_ms
        peer.muted_until = max(peer.muted_until, time.monotonic() + throttle_ms / 1000)
        state.metrics.throttled(key if bytes_ms >= time_ms else REQUEST_PERCENTAGE, throttle_ms)


def request_time_counts(request: Request, peer: Peer) -> bool:
    """Whether the request's time counts against request_percentage. Kafka exempts what
    brokers send each other (WriteTxnMarkers, a follower's Fetch; KafkaApis answers them
    with sendResponseExemptThrottle) and never sees the SASL exchange before a login (the
    authenticator answers it on the network thread)."""
    api_key = request.header.api_key
    if api_key == ApiKey.WRITE_TXN_MARKERS:
        return False
    if api_key == ApiKey.FETCH and getattr(request.body, "replica_id", -1) >= 0:
        return False
    return peer.session is None or peer.session.authenticated
