"""SASL authentication of one connection, sans-IO: a state table in front of the pipeline.

Theory of operation (Kafka's SaslServerAuthenticator, facts only). A connection on a
SASL listener starts in HANDSHAKE_OR_VERSIONS. The table `_ALLOWED` says which API keys
each state answers; any other request is a client breaking the SASL exchange: the broker
closes the connection (`SaslStateError`). The states:

- HANDSHAKE_OR_VERSIONS: ApiVersions is answered (clients learn the SASL versions);
  SaslHandshake names a mechanism: an enabled one moves to AUTHENTICATE, another is
  answered UNSUPPORTED_SASL_MECHANISM with the enabled list, then FAILED.
- AUTHENTICATE: each SaslAuthenticate token goes to the mechanism (PLAIN: one token;
  SCRAM: client-first then client-final, `scramp` checks the proof; OAUTHBEARER: one
  token carrying an unsecured JWS, for tests). Success moves to
  COMPLETE with the principal `User:<name>`; a wrong password, an unknown user or a
  malformed token moves to FAILED and is answered SASL_AUTHENTICATION_FAILED with
  Kafka's message, which never says which part was wrong.
- COMPLETE: every API the broker speaks. Without re-authentication
  (`connections.max.reauth.ms` 0, Kafka's default) SaslHandshake and SaslAuthenticate are
  answered ILLEGAL_SASL_STATE by their handlers. With it (KIP-368) the login's
  SaslAuthenticate (v1+) tells the client its session lifetime - that many ms, or less
  for an OAUTHBEARER token that expires sooner; a SaslHandshake for the same mechanism
  starts a re-authentication (back to AUTHENTICATE), which must end with the same
  principal; a request other than SaslHandshake after the session expired closes the
  connection, as Kafka closes it.
- FAILED: nothing; the connection closes after the failure answer is written.

SaslHandshake v0 (Kafka still accepts it; clients from before Kafka 1.0 send it): after
it the client sends its SASL tokens raw - a 4-byte size and the token, no request header
and no SaslAuthenticate - and the broker answers each with its own token framed the same
way (an empty one for PLAIN), as Kafka's SaslServerAuthenticator does when the handshake
did not enable "SaslAuthenticate headers". `check` learns it at admission
(`raw_tokens`), so the connection hands the next frames to `authenticate` unparsed until
the login completes. A failure has no answer in this framing: the connection closes
(after the failure delay). Same token bound, same login deadline, same mechanisms.

Passwords and tokens never reach an exception message or a log line here.
"""

from __future__ import annotations

import base64
import binascii
import enum
import json
import time
from collections.abc import Callable

import scramp

from onceflow.protocol.apis import ApiKey
from onceflow.security.scram import ScramCredential

# sasl.server.max.receive.size: the largest token an unauthenticated peer may send.
SASL_TOKEN_BYTES_MAX = 524_288

MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER")


def _b64url(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class SaslState(enum.Enum):
    HANDSHAKE_OR_VERSIONS = "handshake_or_versions"
    AUTHENTICATE = "authenticate"
    COMPLETE = "complete"
    FAILED = "failed"


# What each state answers; anything else closes the connection.
_ALLOWED: dict[SaslState, frozenset[int]] = {
    SaslState.HANDSHAKE_OR_VERSIONS: frozenset({ApiKey.API_VERSIONS, ApiKey.SASL_HANDSHAKE}),
    SaslState.AUTHENTICATE: frozenset({ApiKey.SASL_AUTHENTICATE}),
    SaslState.COMPLETE: frozenset(),   # see allows(): everything
    SaslState.FAILED: frozenset(),
}

# Legal moves; a move not listed is our bug (SaslStateError is the peer's).
_TRANSITIONS: dict[SaslState, frozenset[SaslState]] = {
    SaslState.HANDSHAKE_OR_VERSIONS: frozenset({SaslState.AUTHENTICATE, SaslState.FAILED}),
    SaslState.AUTHENTICATE: frozenset({SaslState.COMPLETE, SaslState.FAILED}),
    SaslState.COMPLETE: frozenset({SaslState.AUTHENTICATE, SaslState.FAILED}),  # re-auth
    SaslState.FAILED: frozenset(),
}


class SaslStateError(Exception):
    """The peer sent a request its SASL state does not allow: close the connection."""


class AuthenticationFailed(Exception):
    """A failed login; the message is Kafka's and safe to send and log."""


# (user name) -> that user's credential for the mechanism, or None.
CredentialLookup = Callable[[str, str], ScramCredential | None]
# (user name, password) -> whether some stored credential of the user verifies it.
PasswordCheck = Callable[[str, str], bool]


class SaslSession:
    """The SASL state of one connection."""

    def __init__(self, mechanisms: tuple[str, ...], credential: CredentialLookup,
                 password_ok: PasswordCheck, clock_s: Callable[[], float] = time.time,
                 reauth_ms: int = 0) -> None:
        self.mechanisms = mechanisms
        self.reauth_ms = reauth_ms  # connections.max.reauth.ms; 0: no re-authentication
        self.expires_at_s: float | None = None  # the session's end (re-authentication on)
        self._token_expiry_s: float | None = None  # an OAUTHBEARER token's exp claim
        self._reauthenticating = False
        self._clock_s = clock_s  # OAUTHBEARER token expiry
        self._credential = credential
        self._password_ok = password_ok
        self.state = SaslState.HANDSHAKE_OR_VERSIONS
        # The state the admitted requests lead to: the connection admits a request before
        # the handlers of the earlier ones ran, so a second SaslHandshake sent right
        # behind the first must already be refused (see check()).
        self._admitted = SaslState.HANDSHAKE_OR_VERSIONS
        # A SaslHandshake v0 was admitted: tokens come raw, not in SaslAuthenticate.
        self._raw_tokens = False
        self.mechanism: str | None = None
        self.principal: str | None = None
        self._scram: scramp.core.ScramServer | None = None
        self._scram_user = ""

    def allows(self, api_key: int) -> bool:
        if self._admitted == SaslState.COMPLETE or self.state == SaslState.FAILED:
            return self.state != SaslState.FAILED
        return api_key in _ALLOWED[self._admitted]

    def raw_tokens(self) -> bool:
        """Whether the next frame is a raw SASL token (after a SaslHandshake v0), not a
        Kafka request: true from that handshake's admission until the login completes."""
        return self._raw_tokens and self._admitted == SaslState.AUTHENTICATE \
            and self.state != SaslState.FAILED

    def check(self, api_key: int, api_version: int = 1) -> None:
        """Admit a request (the pipeline, in arrival order) or raise SaslStateError."""
        if not self.allows(api_key):
            name = ApiKey(api_key).name if api_key in ApiKey._value2member_map_ else api_key
            raise SaslStateError(f"Unexpected Kafka request of type {name} during SASL "
                                 f"{self._admitted.value}")
        if self._admitted == SaslState.COMPLETE:
            if api_key == ApiKey.SASL_HANDSHAKE and self.reauth_ms > 0:
                self._admitted = SaslState.AUTHENTICATE  # a re-authentication begins
            elif self.expires_at_s is not None and self._clock_s() >= self.expires_at_s:
                raise SaslStateError("SASL session expired without re-authentication "
                                     "(connections.max.reauth.ms)")
        elif api_key == ApiKey.SASL_HANDSHAKE:
            self._admitted = SaslState.AUTHENTICATE
            self._raw_tokens = api_version == 0

    @property
    def logged_in(self) -> bool:
        """Whether a login succeeded (also while a re-authentication is under way)."""
        return self.principal is not None and self.state != SaslState.FAILED

    def expects_handshake(self) -> bool:
        """Whether a SaslHandshake is legal now: first login, or a re-authentication."""
        return (self.state == SaslState.HANDSHAKE_OR_VERSIONS
                or (self.state == SaslState.COMPLETE and self.reauth_ms > 0))

    def session_lifetime_ms(self) -> int:
        """SaslAuthenticate v1+'s session_lifetime_ms after a login: 0 without
        re-authentication, else the ms until the session ends."""
        if self.state != SaslState.COMPLETE or self.expires_at_s is None:
            return 0
        return max(1, round((self.expires_at_s - self._clock_s()) * 1000))

    def _transition(self, new: SaslState) -> None:
        assert new in _TRANSITIONS[self.state], f"SASL {self.state} -> {new}"
        self.state = new

    def handshake(self, mechanism: str) -> bool:
        """SaslHandshake: True when `mechanism` is enabled (AUTHENTICATE follows). A
        re-authentication must keep the login's mechanism."""
        if not self.expects_handshake():
            return False
        reauthenticating = self.state == SaslState.COMPLETE
        if mechanism not in self.mechanisms or (reauthenticating and mechanism != self.mechanism):
            self._transition(SaslState.FAILED)
            return False
        self._reauthenticating = reauthenticating
        self._scram, self._scram_user = None, ""
        self.mechanism = mechanism
        self._transition(SaslState.AUTHENTICATE)
        return True

    def authenticate(self, token: bytes) -> bytes:
        """One SaslAuthenticate token; the server's token. Raises AuthenticationFailed."""
        assert self.state == SaslState.AUTHENTICATE and self.mechanism is not None
        try:
            if len(token) > SASL_TOKEN_BYTES_MAX:
                raise AuthenticationFailed(f"SASL token of {len(token)} bytes is larger "
                                           f"than {SASL_TOKEN_BYTES_MAX}")
            if self.mechanism == "PLAIN":
                return self._plain(token)
            if self.mechanism == "OAUTHBEARER":
                return self._oauthbearer(token)
            return self._scram_step(token)
        except AuthenticationFailed:
            self._transition(SaslState.FAILED)
            raise

    def _fail(self) -> AuthenticationFailed:
        return AuthenticationFailed("Authentication failed during authentication due to "
                                    f"invalid credentials with SASL mechanism {self.mechanism}")

    def _plain(self, token: bytes) -> bytes:
        parts = token.split(b"\x00")
        if len(parts) != 3:
            raise AuthenticationFailed("Invalid SASL/PLAIN response: expected 3 tokens, "
                                       f"got {len(parts)}")
        try:
            authzid, user, password = (p.decode() for p in parts)
        except UnicodeDecodeError:
            raise AuthenticationFailed("Invalid SASL/PLAIN response: not UTF-8") from None
        if not user or not password:
            raise AuthenticationFailed("Authentication failed: username or password is empty")
        if authzid and authzid != user:
            raise AuthenticationFailed("Authentication failed: Client requested an "
                                       "authorization id that is different from username")
        if not self._password_ok(user, password):
            raise AuthenticationFailed("Authentication failed: Invalid username or password")
        self._complete(user)
        return b""

    def _oauthbearer(self, token: bytes) -> bytes:
        """RFC 7628's client response with an unsecured JWS (`alg: none`), as Kafka's
        OAuthBearerUnsecuredValidatorCallbackHandler checks it: a `sub` claim (the
        principal) and an `exp` claim in the future. For tests and development only: the
        token is not signed, so anyone can claim any name."""
        try:
            gs2, *pairs = token.decode().split("\x01")
            fields = dict(p.split("=", 1) for p in pairs if p)
            scheme, _, jws = fields["auth"].partition(" ")
            header_b64, claims_b64, signature = jws.split(".")
            header, claims = (json.loads(_b64url(part)) for part in (header_b64, claims_b64))
        except (UnicodeDecodeError, ValueError, KeyError, binascii.Error):
            raise self._fail() from None
        if (not gs2.startswith("n,") or scheme.lower() != "bearer" or signature
                or not isinstance(header, dict) or header.get("alg") != "none"
                or not isinstance(claims, dict)):
            raise self._fail()
        subject, expiry = claims.get("sub"), claims.get("exp")
        if not isinstance(subject, str) or not subject \
                or not isinstance(expiry, (int, float)) or expiry <= self._clock_s():
            raise self._fail()
        self._token_expiry_s = float(expiry)
        self._complete(subject)
        return b""

    def _scram_step(self, token: bytes) -> bytes:
        assert self.mechanism is not None
        try:
            message = token.decode()
            if self._scram is None:
                server = scramp.ScramMechanism(self.mechanism).make_server(self._auth_info)
                server.set_client_first(message)
                self._scram = server
                return server.get_server_first().encode()
            self._scram.set_client_final(message)
            final = self._scram.get_server_final().encode()
        except (scramp.ScramException, UnicodeDecodeError, ValueError):
            raise self._fail() from None
        self._complete(self._scram_user)
        return final

    def _auth_info(self, sasl_name: str) -> tuple[bytes, bytes, bytes, int] | None:
        # RFC 5802 saslname: "," and "=" travel as "=2C" and "=3D".
        user = sasl_name.replace("=2C", ",").replace("=3D", "=")
        credential = self._credential(user, self.mechanism or "")
        self._scram_user = user
        return None if credential is None else credential.auth_info()

    def _complete(self, user: str) -> None:
        principal = f"User:{user}"
        if self._reauthenticating and principal != self.principal:
            raise AuthenticationFailed(f"Cannot change principals during re-authentication "
                                       f"from {self.principal}: {principal}")
        self.principal = principal
        if self.reauth_ms > 0:
            ends = [self._clock_s() + self.reauth_ms / 1000]
            if self._token_expiry_s is not None:
                ends.append(self._token_expiry_s)
            self.expires_at_s = min(ends)
        self._transition(SaslState.COMPLETE)
        self._admitted = SaslState.COMPLETE
