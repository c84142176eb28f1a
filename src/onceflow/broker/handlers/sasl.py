"""SaslHandshake and SaslAuthenticate: the SASL exchange of one connection (KIP-152).

The state machine is security/sasl.py's; these handlers feed it and answer as Kafka's
SaslServerAuthenticator does: an unknown mechanism is UNSUPPORTED_SASL_MECHANISM with
the enabled list, a failed login SASL_AUTHENTICATION_FAILED with Kafka's message, both
answered after `connection.failed.authentication.delay.ms` and followed by the close
(broker/connection.py). On a connection that is not in the matching state - a PLAINTEXT
or SSL listener, or a SASL one already authenticated and without re-authentication
(KIP-368, `connections.max.reauth.ms`) - both answer ILLEGAL_SASL_STATE.
No token or password is ever logged.
"""

from __future__ import annotations

import asyncio
import logging

from kio.schema.errors import ErrorCode

from onceflow.broker.handlers import ApiKey, RequestContext, handles
from onceflow.security.sasl import AuthenticationFailed, SaslState

log = logging.getLogger("onceflow.broker")


async def _failure_delay(ctx: RequestContext) -> None:
    assert ctx.access is not None
    await asyncio.sleep(ctx.broker.config.connection_failed_authentication_delay_ms / 1000)


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
    if sasl.state == SaslState.COMPLETE:
        session.principal = sasl.principal or session.principal
        log.info("SASL %s authentication of %s from %s", sasl.mechanism, session.principal,
                 session.host)
    # KIP-368: with connections.max.reauth.ms the client re-authenticates before this ends.
    return {"error_code": ErrorCode.none, "error_message": None, "auth_bytes": token,
            "session_lifetime": sasl.session_lifetime_ms()}
