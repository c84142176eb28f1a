"""Connection limits: `max.connections` and `max.connections.per.ip` (Kafka's ConnectionQuotas).

Theory of operation. `ConnectionQuotas` counts the open connections of one broker process,
in total and per client IP address; it does no I/O (the pump in broker/connection.py asks
it and acts). The limits are read at accept time through one function,
`connection_limits(config)`, so that a dynamic broker config can replace what it returns.
What a client sees is what Kafka 4.x does:

- A connection that would be its IP's (`max.connections.per.ip`, or its entry in
  `max.connections.per.ip.overrides`) count + 1st over the limit is closed as soon as it is
  accepted (Kafka: `TooManyConnectionsException`, logged at INFO); no byte is answered.
- At `max.connections` (broker-wide), Kafka's acceptor stops accepting until a connection
  closes: new connections wait in the listen backlog, their TCP handshake done by the
  kernel and their first request unanswered. Here the pump accepts them but reads nothing
  from them (`waiting`) and admits them in arrival order as slots free up; the per-IP
  check comes after the wait, as in Kafka. At most `WAITING_CONNECTIONS_MAX` wait (Kafka's
  backlog, `socket.listen.backlog.size`, is 50); beyond that a connection is closed, as a
  full backlog refuses it.

One difference a client cannot easily tell: on SSL and SASL_SSL listeners the TLS
handshake runs before the connection is counted (asyncio hands the connection over only
after it), where Kafka counts first and shakes hands after.
"""

from __future__ import annotations

import dataclasses
import functools
import ipaddress
import socket
from collections.abc import Callable, Mapping

from onceflow.broker.config import BrokerConfig

__all__ = ("CONNECTIONS_UNLIMITED", "WAITING_CONNECTIONS_MAX", "ConnectionLimits",
           "ConnectionQuotas", "connection_limits", "normalized_address",
           "parse_overrides")

# Kafka's default for both limits: Integer.MAX_VALUE, no limit.
CONNECTIONS_UNLIMITED = 2**31 - 1
# Connections accepted at max.connections and left waiting for a slot; Kafka's are in a
# listen backlog of socket.listen.backlog.size (default 50). Each costs a file descriptor.
WAITING_CONNECTIONS_MAX = 50


@dataclasses.dataclass(frozen=True, slots=True)
class ConnectionLimits:
    max_connections: int = CONNECTIONS_UNLIMITED                  # max.connections
    max_connections_per_ip: int = CONNECTIONS_UNLIMITED           # max.connections.per.ip
    # max.connections.per.ip.overrides, resolved: IP address -> its own limit
    per_ip_overrides: Mapping[str, int] = dataclasses.field(default_factory=dict)

    def per_ip(self, address: str) -> int:
        return self.per_ip_overrides.get(address, self.max_connections_per_ip)


def connection_limits(config: BrokerConfig,
                      dynamic: Callable[[str], str | None] = lambda _key: None
                      ) -> ConnectionLimits:
    """The limits in force (called at every accept): a dynamic broker config
    (`dynamic(key)`, IncrementalAlterConfigs on the BROKER resource) over the static one."""
    def value(key: str, static: int) -> int:
        text = dynamic(key)
        return static if text is None else int(text)
    return _limits(value("max.connections", config.max_connections),
                   value("max.connections.per.ip", config.max_connections_per_ip),
                   config.max_connections_per_ip_overrides)


@functools.lru_cache(maxsize=8)
def _limits(max_connections: int, max_connections_per_ip: int,
            overrides: str) -> ConnectionLimits:
    """Parsed (and host names resolved) once per distinct config, not per accept."""
    per_ip = parse_overrides(overrides)
    if max_connections_per_ip == 0 and not per_ip:
        raise ValueError("max.connections.per.ip can be set to zero only if "
                         "max.connections.per.ip.overrides is set")
    return ConnectionLimits(max_connections, max_connections_per_ip, per_ip)


def parse_overrides(text: str) -> dict[str, int]:
    """`host:count,host:count` (Kafka's syntax; a host is an IP address or a name, which is
    resolved now, as Kafka resolves it when the config is read) -> {IP address: count}."""
    overrides: dict[str, int] = {}
    for item in (part.strip() for part in text.split(",") if part.strip()):
        host, separator, count = item.rpartition(":")
        if not separator or not host.strip() or not count.strip().isdigit():
            raise ValueError(f"max.connections.per.ip.overrides: {item!r} is not host:count")
        overrides[_address(host.strip().strip("[]"))] = int(count)
    return overrides


def _address(host: str) -> str:
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        pass
    try:
        return socket.gethostbyname(host)
    except OSError as exc:
        raise ValueError(f"max.connections.per.ip.overrides: cannot resolve {host!r}") from exc


def normalized_address(address: str) -> str:
    """A peer address as the overrides spell it (IPv4-mapped IPv6 as IPv4)."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    return str(ip)


class ConnectionQuotas:
    """Open connections, in total and per IP address."""

    __slots__ = ("_counts", "total")

    def __init__(self) -> None:
        self._counts: dict[str, int] = {}
        self.total = 0

    def count(self, address: str) -> int:
        return self._counts.get(address, 0)

    def slot_available(self, limits: ConnectionLimits) -> bool:
        """May one more connection be taken on (else it waits, broker-wide limit)?"""
        return self.total < limits.max_connections

    def inc(self, address: str, limits: ConnectionLimits) -> bool:
        """Count a new connection from `address`; False (and not counted) when its IP
        already has its limit of connections: the caller closes it."""
        count = self._counts.get(address, 0)
        if count >= limits.per_ip(address):
            return False
        self._counts[address] = count + 1
        self.total += 1
        return True

    def dec(self, address: str) -> None:
        count = self._counts[address]  # KeyError: a connection released twice, our bug
        if count == 1:
            del self._counts[address]
        else:
            self._counts[address] = count - 1
        self.total -= 1
        assert self.total >= 0
