"""TLS and SASL for the raw client (`wire.Connection`), from librdkafka's property names.

The same properties file configures confluent-kafka and the raw connections, so a tool
given `security.protocol=SASL_SSL`, `ssl.ca.location`, `sasl.mechanism`,
`sasl.username` and `sasl.password` reaches a secured broker both ways:

- SSL / SASL_SSL: a TLS client context trusting `ssl.ca.location` (else the system's
  store), checking the broker's name unless `ssl.endpoint.identification.algorithm=none`,
  presenting `ssl.certificate.location` + `ssl.key.location` when given (mTLS).
- SASL_PLAINTEXT / SASL_SSL: SaslHandshake v1 then SaslAuthenticate (KIP-152) with PLAIN,
  SCRAM-SHA-256 or SCRAM-SHA-512 (`scramp` does the RFC 5802 client side).

A refused login is a `SecurityError` carrying the broker's message; a password never
appears in one.
"""

from __future__ import annotations

import ssl
from collections.abc import Callable, Mapping
from typing import Any

import scramp

from onceflow.protocol.apis import ApiKey

PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
SASL_HANDSHAKE_VERSION = 1
SASL_AUTHENTICATE_VERSIONS = (0, 2)

# one request to the broker: (api key, version range, fields) -> the decoded answer
Call = Callable[..., Any]


class SecurityError(Exception):
    """TLS or SASL settings that cannot work, or a login the broker refused."""


def protocol_of(properties: Mapping[str, str]) -> str:
    protocol = properties.get("security.protocol", "PLAINTEXT").upper()
    if protocol not in PROTOCOLS:
        raise SecurityError(f"security.protocol={protocol} is not one of {', '.join(PROTOCOLS)}")
    return protocol


def tls_context(properties: Mapping[str, str]) -> ssl.SSLContext | None:
    """The client's TLS context, or None when the protocol has no TLS."""
    if protocol_of(properties) not in ("SSL", "SASL_SSL"):
        return None
    try:
        context = ssl.create_default_context(cafile=properties.get("ssl.ca.location"))
        if properties.get("ssl.endpoint.identification.algorithm", "https").lower() == "none":
            context.check_hostname = False
        certificate = properties.get("ssl.certificate.location")
        if certificate:
            context.load_cert_chain(certificate, properties.get("ssl.key.location"),
                                    properties.get("ssl.key.password"))
    except (OSError, ssl.SSLError) as exc:
        raise SecurityError(f"the TLS settings (ssl.*) cannot be used: {exc}") from None
    return context


def authenticate(properties: Mapping[str, str], call: Call) -> None:
    """SASL login on a new connection when the protocol asks for it (else nothing)."""
    if not protocol_of(properties).startswith("SASL_"):
        return
    mechanism = properties.get("sasl.mechanism", properties.get("sasl.mechanisms", "GSSAPI"))
    mechanism = mechanism.upper()
    if mechanism not in MECHANISMS:
        raise SecurityError(f"sasl.mechanism={mechanism} is not supported here; use one of "
                            f"{', '.join(MECHANISMS)}")
    user, password = properties.get("sasl.username"), properties.get("sasl.password")
    if not user or password is None:
        raise SecurityError("SASL needs sasl.username and sasl.password")
    answer = call(ApiKey.SASL_HANDSHAKE, (SASL_HANDSHAKE_VERSION, SASL_HANDSHAKE_VERSION),
                  mechanism=mechanism)
    if answer.error_code != 0:
        raise SecurityError(f"the broker does not offer SASL mechanism {mechanism} (it "
                            f"offers {', '.join(answer.mechanisms) or 'none'})")

    def exchange(token: bytes) -> bytes:
        reply = call(ApiKey.SASL_AUTHENTICATE, SASL_AUTHENTICATE_VERSIONS, auth_bytes=token)
        if reply.error_code != 0:
            raise SecurityError(f"SASL authentication as {user} failed: "
                                f"{reply.error_message or 'refused'}")
        return reply.auth_bytes

    if mechanism == "PLAIN":
        exchange(b"\0" + user.encode() + b"\0" + password.encode())
        return
    client = scramp.ScramClient([mechanism], user, password)
    try:
        server_first = exchange(client.get_client_first().encode())
        client.set_server_first(server_first.decode())
        server_final = exchange(client.get_client_final().encode())
        client.set_server_final(server_final.decode())
    except (scramp.ScramException, UnicodeDecodeError) as exc:
        raise SecurityError(f"SASL {mechanism} exchange with the broker failed: {exc}") from None
