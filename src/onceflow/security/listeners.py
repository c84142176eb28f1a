"""Kafka's listener syntax: `NAME://host:port,...`, the protocol map and advertised listeners.

A listener's name is its security protocol (PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL)
unless `listener.security.protocol.map` maps a custom name (`CLIENT:SASL_SSL,...`). An
empty host binds every interface, as in Kafka. Advertised listeners name the same
listeners with the address clients are told to use; a listener without one advertises
its own host (127.0.0.1 for a wildcard bind) and bound port.
"""

from __future__ import annotations

import dataclasses
import re

PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
_LISTENER = re.compile(r"^([A-Za-z0-9_.-]+)://(\[[0-9a-fA-F:]*\]|[^:\[\]]*):(\d{1,5})$")


class ListenerError(ValueError):
    """A listener setting that Kafka would refuse."""


@dataclasses.dataclass(frozen=True, slots=True)
class Listener:
    name: str
    protocol: str  # one of PROTOCOLS
    host: str      # bind address ("" = all interfaces)
    port: int      # 0 = any free port

    @property
    def tls(self) -> bool:
        return self.protocol in ("SSL", "SASL_SSL")

    @property
    def sasl(self) -> bool:
        return self.protocol in ("SASL_PLAINTEXT", "SASL_SSL")


def parse_protocol_map(spec: str | None) -> dict[str, str]:
    mapping = {p: p for p in PROTOCOLS}
    for item in filter(None, (s.strip() for s in (spec or "").split(","))):
        name, sep, protocol = item.partition(":")
        if not sep or protocol.upper() not in PROTOCOLS:
            raise ListenerError(f"bad listener.security.protocol.map entry {item!r}")
        mapping[name.upper()] = protocol.upper()
    return mapping


def _endpoints(spec: str) -> list[tuple[str, str, int]]:
    endpoints = []
    for item in filter(None, (s.strip() for s in spec.split(","))):
        match = _LISTENER.match(item)
        if match is None:
            raise ListenerError(f"bad listener {item!r}: expected NAME://host:port")
        name, host, port = match.group(1).upper(), match.group(2).strip("[]"), int(match.group(3))
        if port > 65535:
            raise ListenerError(f"bad port in listener {item!r}")
        endpoints.append((name, host, port))
    if not endpoints:
        raise ListenerError("no listener given")
    names = [name for name, _, _ in endpoints]
    if len(set(names)) != len(names):
        raise ListenerError(f"each listener name must appear once: {', '.join(names)}")
    return endpoints


def parse_listeners(spec: str, protocol_map: str | None = None) -> tuple[Listener, ...]:
    mapping = parse_protocol_map(protocol_map)
    listeners = []
    for name, host, port in _endpoints(spec):
        if name not in mapping:
            raise ListenerError(f"listener {name} has no security protocol: add it to "
                                "--listener-security-protocol-map")
        listeners.append(Listener(name, mapping[name], host, port))
    return tuple(listeners)


def parse_advertised(spec: str | None, listeners: tuple[Listener, ...]) -> dict[str, tuple[str, int]]:
    """Listener name -> advertised (host, port); listeners not named advertise themselves."""
    if not spec:
        return {}
    known = {listener.name for listener in listeners}
    advertised = {}
    for name, host, port in _endpoints(spec):
        if name not in known:
            raise ListenerError(f"advertised listener {name} is not a listener")
        advertised[name] = (host, port)
    return advertised
