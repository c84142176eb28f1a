"""Kafka client properties from a file: `--command-config`, as Kafka's tools take it.

    security.protocol=SASL_SSL
    sasl.mechanism=SCRAM-SHA-512
    sasl.username=alice
    sasl.password=alice-secret
    ssl.ca.location=/etc/kafka/ca.pem

The format is Java's `.properties` as far as client settings need it: `key=value` or
`key: value`, `#` and `!` comment lines, blank lines, a trailing backslash continues a
line. The names are librdkafka's (confluent-kafka), which match Java's for the
security settings. Values may hold secrets: `redacted()` is what may be shown or logged.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from onceflow.client.admin import ClientError

# A client properties file is a few dozen lines; a larger file is not one.
PROPERTIES_BYTES_MAX = 1024 * 1024
# Names whose values are never shown (Kafka's tools hide the same ones).
SECRET_MARKERS = ("password", "secret", "token", "key.pem", "keystore", "jaas")
REDACTED = "[hidden]"
# The console and the CLI set these themselves.
RESERVED = frozenset({"bootstrap.servers", "error_cb", "logger"})


def parse_properties(text: str) -> dict[str, str]:
    """`key=value` lines (see the module docstring) as a dict; ClientError when malformed."""
    found: dict[str, str] = {}
    pending = ""
    for number, raw in enumerate(text.splitlines(), start=1):
        line = pending + raw.strip()
        if not pending and (not line or line[0] in "#!"):
            continue
        if line.endswith("\\") and not line.endswith("\\\\"):
            pending = line[:-1]
            continue
        pending = ""
        cut = min((i for i in (line.find("="), line.find(":")) if i > 0), default=-1)
        if cut < 0:
            raise ClientError(f"line {number}: expected key=value, got {raw.strip()[:60]!r}")
        key, value = line[:cut].strip(), line[cut + 1:].strip()
        if key in RESERVED:
            raise ClientError(f"line {number}: {key} cannot be set in a client config file")
        found[key] = value
    return found


def read_properties(path: Path) -> dict[str, str]:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ClientError(f"cannot read {path}: {exc.strerror or exc}") from None
    if len(data) > PROPERTIES_BYTES_MAX:
        raise ClientError(f"{path} is over {PROPERTIES_BYTES_MAX} bytes: not a client config")
    try:
        return parse_properties(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise ClientError(f"{path} is not UTF-8 text") from None
    except ClientError as exc:
        raise ClientError(f"{path}, {exc}") from None


def is_secret(name: str) -> bool:
    lowered = name.lower()
    return any(marker in lowered for marker in SECRET_MARKERS)


def redacted(properties: Mapping[str, str]) -> dict[str, str]:
    """The properties with every secret value replaced: safe to show or log."""
    return {k: REDACTED if is_secret(k) else v for k, v in properties.items()}

