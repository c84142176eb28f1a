"""Durable config overrides of non-topic resources: dynamic broker configs (per node and the
cluster-wide default), group configs and client-metrics subscriptions.

Theory of operation. Kafka keeps these as ConfigRecords in the cluster metadata log, keyed by
(resource type, resource name, key). onceflow is one process, so its "metadata log" for them
is one checked file (storage.layout: versioned, CRC, atomic replace) holding every resource's
current key -> value map. `replace` validates nothing (the caller has), writes the whole
file, then makes the new map visible and tells the listeners, so a listener never sees a
value that a crash would lose. Topic overrides stay in topics.meta (store.py).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping
from pathlib import Path

from onceflow.storage.layout import CorruptFileError, read_checked_file, write_checked_file

RESOURCE_CONFIGS_FILE = "resource-configs.state"
FILE_MAGIC = b"OFRC"
FILE_VERSION = 1
# A peer creates entries (group names, client-metrics names): bound them so the file stays
# small (write_checked_file has its own payload bound too).
RESOURCES_MAX = 10_000
KEYS_PER_RESOURCE_MAX = 200

Resource = tuple[int, str]  # (Kafka's ConfigResource type id, resource name)
Listener = Callable[[int, str], None]


class TooManyConfigs(ValueError):
    """A change would pass RESOURCES_MAX or KEYS_PER_RESOURCE_MAX."""


class ResourceConfigs:
    """Config maps of (resource type, name), persisted in one file; thread-safe."""

    def __init__(self, path: Path, values: dict[Resource, dict[str, str]],
                 fsync: bool = True) -> None:
        self._path = path
        self._values = values
        self._fsync = fsync
        self._lock = threading.Lock()
        self._listeners: list[Listener] = []

    @classmethod
    def load(cls, path: Path, fsync: bool = True) -> ResourceConfigs:
        """The configs in `path` (none if it does not exist); CorruptFileError if damaged."""
        try:
            _version, body = read_checked_file(path, FILE_MAGIC, (FILE_VERSION,))
        except FileNotFoundError:
            return cls(path, {}, fsync)
        try:
            values = {(int(row["type"]), str(row["name"])):
                      {str(k): str(v) for k, v in row["configs"].items()}
                      for row in json.loads(body)}
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise CorruptFileError(f"{path}: CRC ok but content invalid: {exc}") from exc
        return cls(path, values, fsync)

    def get(self, resource_type: int, name: str) -> dict[str, str]:
        with self._lock:
            return dict(self._values.get((resource_type, name), {}))

    def names(self, resource_type: int) -> list[str]:
        """The names of the resources of this type that have configs, sorted."""
        with self._lock:
            return sorted(n for t, n in self._values if t == resource_type)

    def subscribe(self, listener: Listener) -> None:
        """`listener(resource_type, name)` is called after each change is durable (on the
        thread that made it, the broker's event loop)."""
        self._listeners.append(listener)

    def replace(self, resource_type: int, name: str, configs: Mapping[str, str]) -> None:
        """`configs` become all of the resource's configs (none: the resource goes)."""
        key = (resource_type, name)
        if len(configs) > KEYS_PER_RESOURCE_MAX:
            raise TooManyConfigs(f"at most {KEYS_PER_RESOURCE_MAX} configs per resource")
        with self._lock:
            new = dict(self._values)
            if configs:
                new[key] = dict(configs)
            else:
                new.pop(key, None)
            if len(new) > RESOURCES_MAX:
                raise TooManyConfigs(f"at most {RESOURCES_MAX} config resources")
            body = json.dumps([{"type": t, "name": n, "configs": c}
                               for (t, n), c in sorted(new.items())]).encode()
            write_checked_file(self._path, FILE_MAGIC, FILE_VERSION, body, self._fsync)
            self._values = new
        for listener in list(self._listeners):
            listener(resource_type, name)
