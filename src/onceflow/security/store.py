"""Users (SCRAM credentials) and ACLs, kept durably in one small file of the data directory.

Theory of operation. The whole security state is small (users and ACLs number in the
hundreds), so every change rewrites one checked file (storage.layout.write_checked_file: temp file,
fsync, rename, fsync of the directory). A change is
prepared as a new value (`SecurityData`), persisted, and only then applied, so a crash
leaves either the old or the new state; loading at start is reading that value back.
A file that fails its checks stops the broker: guessing could open access.

File layout:

    magic "OFSE" | version u16 | length u32 | crc32c u32 of the body | body (UTF-8 JSON)

The body holds salted SCRAM keys (never a password) and ACL bindings.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from onceflow.security.acl import AclBinding
from onceflow.security.scram import ScramCredential
from onceflow.storage.layout import CorruptFileError, read_checked_file, write_checked_file

SECURITY_FILE = "security.state"
FILE_MAGIC = b"OFSE"
FILE_VERSION = 1


class SecurityFileCorrupt(Exception):
    """The security file failed its checks; refusing to guess who may do what."""


@dataclasses.dataclass(frozen=True, slots=True)
class SecurityData:
    # user -> mechanism -> credential
    users: dict[str, dict[str, ScramCredential]] = dataclasses.field(default_factory=dict)
    acls: frozenset[AclBinding] = frozenset()

    def encode(self) -> bytes:
        """The file's payload (storage.layout's checked file frames it)."""
        return json.dumps({
            "users": {user: {m: c.to_json() for m, c in creds.items()}
                      for user, creds in sorted(self.users.items())},
            "acls": [acl.to_json() for acl in sorted(self.acls)],
        }, sort_keys=True).encode()

    @classmethod
    def decode(cls, body: bytes) -> SecurityData:
        try:
            raw = json.loads(body)
            users = {user: {m: ScramCredential.from_json(c) for m, c in creds.items()}
                     for user, creds in raw["users"].items()}
            acls = frozenset(AclBinding.from_json(row) for row in raw["acls"])
        except (ValueError, KeyError, TypeError) as exc:
            raise SecurityFileCorrupt(f"bad body: {type(exc).__name__}") from None
        return cls(users, acls)

    def with_credential(self, user: str, credential: ScramCredential) -> SecurityData:
        users = {u: dict(c) for u, c in self.users.items()}
        users.setdefault(user, {})[credential.mechanism] = credential
        return dataclasses.replace(self, users=users)

    def without_credential(self, user: str, mechanism: str) -> SecurityData:
        users = {u: dict(c) for u, c in self.users.items()}
        users.get(user, {}).pop(mechanism, None)
        if user in users and not users[user]:
            del users[user]
        return dataclasses.replace(self, users=users)


class SecurityStore:
    """The durable security state of one broker (see the module docstring)."""

    def __init__(self, directory: Path, fsync: bool = True) -> None:
        self._path = directory / SECURITY_FILE
        self._fsync = fsync
        self.data = self._load()

    @property
    def path(self) -> Path:
        return self._path

    def _load(self) -> SecurityData:
        try:
            _version, body = read_checked_file(self._path, FILE_MAGIC, (FILE_VERSION,))
        except FileNotFoundError:
            return SecurityData()
        except CorruptFileError as exc:
            raise SecurityFileCorrupt(str(exc)) from None
        return SecurityData.decode(body)

    def credential(self, user: str, mechanism: str) -> ScramCredential | None:
        return self.data.users.get(user, {}).get(mechanism)

    def password_ok(self, user: str, password: str) -> bool:
        """PLAIN logins: any stored SCRAM credential of `user` verifies `password`."""
        credentials = self.data.users.get(user, {})
        return any(c.verifies(password) for c in credentials.values())

    def replace(self, data: SecurityData) -> None:
        """Persist `data`, then make it the current state."""
        self._write(data.encode())
        self.data = data

    def _write(self, encoded: bytes) -> None:
        self._path.parent.mkdir(parents=True, exist_ok=True)
        write_checked_file(self._path, FILE_MAGIC, FILE_VERSION, encoded, self._fsync)
