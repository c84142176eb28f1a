"""SaslHandshake and SaslAuthenticate: the SASL exchange of one connection (KIP-152).

The state machine is security/sasl.py's; these handlers feed it and answer as Kafka's
SaslServerAuthenticator does: an unknown mechanism is UNSUPPORTED_SASL_MECHANISM with
the enabled list, a failed login SASL_AUTHENTICATION_FAILED with Kafka's message, both
answered after `connection.failed.authentication.delay.ms` and followed by the close
(broker/connection.py). On a connection that is not in the matching state - a PLAINTEXT
or SSL listener, or a SASL one already authenticated and without re-authentication
(KIP-368, `connections.max.reauth.ms`) - both answer ILLEGAL_SASL_STATE.
After a SaslHandshake v0 the tokens come raw (security/sasl.py): `raw_token` answers
each with the server's token, size-prefixed, and a failure with no answer - the
connection closes after the same delay. No token or password is ever logged.
"""

from __future__ import annotations

import asyncio
import logging
import struct

from kio.schema.errors import ErrorCode

from onceflow.broker.access import Session
from onceflow.broker.handlers import ApiKey, RequestContext, handles
from onceflow.broker.state import BrokerState
from onceflow.security.sasl import AuthenticationFailed, SaslState

log = logging.getLogger("onceflow.broker")


async def _failure_delay(ctx: RequestContext) -> None:
    assert ctx.access is not None
    await _delay(ctx.broker)


async def _delay(state: BrokerState) -> None:
    """connection.failed.authentication.delay.ms: a failed peer waits before its answer
    and the close, so guessing passwords is slow."""
    await asyncio.sleep(state.config.connection_failed_authentication_delay_ms / 1000)


@handles(ApiKey.SASL_HANDSHAKE)
async def sasl_handshake(ctx: RequestContext, body) -> dict:
    session = ctx.session
    sasl = None if session is None else session.sasl
    if sasl is None or not sasl.expects_handshake():
        return {"error_code": ErrorCode.illegal_sasl_state, "mechanisms": []}
    mechanisms = list(sasl.mechanisms)
    if not sasl.handshake(body.mechanism):
        log.info("SASL handshake from %s refused: mechanism %r not enabled",
                 session.host, body.mechanism[:64])
        await _failure_delay(ctx)
        return {"error_code": ErrorCode.unsupported_sasl_mechanism, "mechanisms": mechanisms}
    return {"error_code": ErrorCode.none, "mechanisms": mechanisms}


@handles(ApiKey.SASL_AUTHENTICATE)
async def sasl_authenticate(ctx: RequestContext, body) -> dict:
    session = ctx.session
    sasl = None if session is None else session.sasl
    if sasl is None or sasl.state != SaslState.AUTHENTICATE:
        return {"error_code": ErrorCode.illegal_sasl_state,
                "error_message": "Unexpected SaslAuthenticate request", "auth_bytes": b"",
                "session_lifetime": 0}
    try:
        token = sasl.authenticate(bytes(body.auth_bytes))
    except AuthenticationFailed as exc:
        log.info("SASL %s authentication from %s failed: %s", sasl.mechanism, session.host, exc)
        await _failure_delay(ctx)
        return {"error_code": ErrorCode.sasl_authentication_failed, "error_message": str(exc),
                "auth_bytes": b"", "session_lifetime": 0}
    _logged_in(session)
    # KIP-368: with connections.max.reauth.ms the client re-authenticates before this ends.
    return {"error_code": ErrorCode.none, "error_message": None, "auth_bytes": token,
            "session_lifetime": sasl.session_lifetime_ms()}


def _logged_in(session: Session) -> None:
    sasl = session.sasl
    assert sasl is not None
    if sasl.state == SaslState.COMPLETE:
        session.principal = sasl.principal or session.principal
        log.info("SASL %s authentication of %s from %s", sasl.mechanism, session.principal,
                 session.host)


async def raw_token(state: BrokerState, session: Session, token: bytes) -> list[bytes] | None:
    """One raw SASL token after a SaslHandshake v0: the server's token as a size-prefixed
    frame, or None (nothing to send; the connection closes) after a failure."""
    sasl = session.sasl
    assert sasl is not None
    if sasl.state != SaslState.AUTHENTICATE:   # the handshake failed: the close follows
        return None
    try:
        answer = sasl.authenticate(token)
    except AuthenticationFailed as exc:
        log.info("SASL %s authentication (raw tokens) from %s failed: %s", sasl.mechanism,
                 session.host, exc)
        await _delay(state)
        return None
    _logged_in(session)
    return [struct.pack(">i", len(answer)), answer]
