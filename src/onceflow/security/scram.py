"""SCRAM credentials (RFC 5802 / RFC 7677) as Kafka keeps them: salted keys, never a password.

A credential is (salt, stored key, server key, iterations) for one user and one mechanism;
`from_password` derives it (the broker's `--add-scram`), `from_salted_password` from
what AlterUserScramCredentials carries (the client salts and hashes, the password never
travels). Verification of a login is `scramp`'s (sasl.py). `parse_add_scram` reads
kafka-storage's syntax: `SCRAM-SHA-512=[name=admin,password=admin-secret]`, with the
optional `iterations=` and `salt=` keys.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import hmac
import os
import re

# Kafka's ScramMechanism codes (DescribeUserScramCredentials, AlterUserScramCredentials).
MECHANISM_CODES = {"SCRAM-SHA-256": 1, "SCRAM-SHA-512": 2}
MECHANISM_NAMES = {code: name for name, code in MECHANISM_CODES.items()}
_HASHES = {"SCRAM-SHA-256": hashlib.sha256, "SCRAM-SHA-512": hashlib.sha512}

# Kafka's bounds on iterations (ScramMechanism.minIterations / AlterUserScramCredentials).
ITERATIONS_MIN = 4096
ITERATIONS_MAX = 16384
ITERATIONS_DEFAULT = 4096
SALT_BYTES = 32  # random salt of a credential made from a password


class CredentialError(ValueError):
    """A credential request that Kafka would refuse (bad mechanism, iterations, syntax)."""


@dataclasses.dataclass(frozen=True, slots=True)
class ScramCredential:
    mechanism: str     # "SCRAM-SHA-256" or "SCRAM-SHA-512"
    salt: bytes
    stored_key: bytes
    server_key: bytes
    iterations: int

    @classmethod
    def from_salted_password(cls, mechanism: str, salt: bytes, salted_password: bytes,
                             iterations: int) -> ScramCredential:
        check_mechanism(mechanism)
        check_iterations(iterations)
        digest = _HASHES[mechanism]
        client_key = hmac.new(salted_password, b"Client Key", digest).digest()
        server_key = hmac.new(salted_password, b"Server Key", digest).digest()
        return cls(mechanism, salt, digest(client_key).digest(), server_key, iterations)

    @classmethod
    def from_password(cls, mechanism: str, password: str, iterations: int = ITERATIONS_DEFAULT,
                      salt: bytes | None = None) -> ScramCredential:
        check_mechanism(mechanism)
        check_iterations(iterations)
        salt = os.urandom(SALT_BYTES) if salt is None else salt
        salted = hashlib.pbkdf2_hmac(_HASHES[mechanism]().name, password.encode(), salt,
                                     iterations)
        return cls.from_salted_password(mechanism, salt, salted, iterations)

    def verifies(self, password: str) -> bool:
        """Whether `password` is this credential's (PLAIN logins check the SCRAM store)."""
        other = ScramCredential.from_password(self.mechanism, password, self.iterations,
                                              self.salt)
        return hmac.compare_digest(other.stored_key, self.stored_key)

    def auth_info(self) -> tuple[bytes, bytes, bytes, int]:
        """What scramp's server asks for a user."""
        return self.salt, self.stored_key, self.server_key, self.iterations

    def to_json(self) -> dict:
        b64 = base64.b64encode
        return {"mechanism": self.mechanism, "salt": b64(self.salt).decode(),
                "stored_key": b64(self.stored_key).decode(),
                "server_key": b64(self.server_key).decode(), "iterations": self.iterations}

    @classmethod
    def from_json(cls, data: dict) -> ScramCredential:
        b64 = base64.b64decode
        return cls(data["mechanism"], b64(data["salt"]), b64(data["stored_key"]),
                   b64(data["server_key"]), int(data["iterations"]))


def check_mechanism(mechanism: str) -> None:
    if mechanism not in _HASHES:
        raise CredentialError(f"Unknown SCRAM mechanism {mechanism!r}")


def check_iterations(iterations: int) -> None:
    if not ITERATIONS_MIN <= iterations <= ITERATIONS_MAX:
        raise CredentialError(f"Iterations {iterations} not between {ITERATIONS_MIN} "
                              f"and {ITERATIONS_MAX}")


_ADD_SCRAM = re.compile(r"^(SCRAM-SHA-(?:256|512))=\[(.*)\]$")


def parse_add_scram(spec: str) -> tuple[str, ScramCredential]:
    """(user, credential) of one `--add-scram` value in kafka-storage's syntax."""
    match = _ADD_SCRAM.match(spec.strip())
    if match is None:
        raise CredentialError("expected SCRAM-SHA-256=[name=...,password=...] "
                              "or SCRAM-SHA-512=[...]")
    mechanism, body = match.groups()
    fields: dict[str, str] = {}
    for item in body.split(","):
        key, sep, value = item.partition("=")
        if not sep:
            raise CredentialError(f"expected key=value in --add-scram, got {key!r}")
        fields[key.strip()] = value.strip().strip('"')
    unknown = set(fields) - {"name", "password", "iterations", "salt"}
    if unknown or "name" not in fields or "password" not in fields:
        raise CredentialError("--add-scram needs name= and password= (and optionally "
                              "iterations=, salt=)")
    salt = base64.b64decode(fields["salt"]) if "salt" in fields else None
    iterations = int(fields.get("iterations", ITERATIONS_DEFAULT))
    return fields["name"], ScramCredential.from_password(mechanism, fields["password"],
                                                         iterations, salt)
