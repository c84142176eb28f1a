"""`ConsoleSettings`: where the console listens, which cluster it reads, who may use it.

Binding: 127.0.0.1 by default, where the machine's own users are trusted and no login is
asked (as for Kafka's own tools on a broker host). Any other bind address exposes the
console to the network, so it requires a login: a token given by the operator
(`--token` / `ONCEFLOW_CONSOLE_TOKEN`); the console refuses to start beyond localhost
without one rather than inventing and printing a secret.
"""

from __future__ import annotations

import dataclasses
import ipaddress
from collections.abc import Mapping

from onceflow.client.admin import ClientError

TOKEN_ENV = "ONCEFLOW_CONSOLE_TOKEN"
# A token shorter than this is guessable by a patient attacker despite the login delay.
TOKEN_CHARS_MIN = 16
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1", "[::1]"})


def is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@dataclasses.dataclass(frozen=True)
class ConsoleSettings:
    bootstrap_servers: str
    properties: Mapping[str, str] = dataclasses.field(default_factory=dict)
    host: str = "127.0.0.1"
    port: int = 8080
    token: str | None = None
    # How often each open page refreshes its live parts.
    refresh_interval_s: float = 1.0

    def __post_init__(self) -> None:
        if not is_loopback(self.host) and not self.token:
            raise ClientError(f"the console binds to {self.host}, beyond localhost: give a login "
                              f"token with --token or {TOKEN_ENV} (at least {TOKEN_CHARS_MIN} "
                              "characters)")
        if self.token is not None and len(self.token) < TOKEN_CHARS_MIN:
            raise ClientError(f"the console token must have at least {TOKEN_CHARS_MIN} characters")

    @property
    def requires_login(self) -> bool:
        """Beyond localhost always; on localhost when a token was given anyway."""
        return self.token is not None or not is_loopback(self.host)

    def __repr__(self) -> str:  # never the token or a client secret
        return (f"ConsoleSettings(bootstrap_servers={self.bootstrap_servers!r}, host={self.host!r}, "
                f"port={self.port}, login={'token' if self.token else 'none'})")
