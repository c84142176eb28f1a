"""`Store`: the data directory - topics, their partitions' logs, durable topic metadata.

Theory of operation
-------------------
`topics.meta` (a checked file, see layout.py) is the single source of truth: a JSON list of
topics with name, topic id, partition count, config overrides and a `deleting` flag. Every
change writes the whole file atomically (temp + fsync + rename + fsync of the directory)
*before* the change becomes visible, so after a crash the directory is always described by
the last completed change:

* create_topic / create_partitions: metadata first, then the partition directories
  (`<topic>-<partition>`) are created by opening their logs; a crash in between leaves missing
  directories, which the next open creates empty.
* delete_topic: the topic is first marked `deleting` (so it is gone for every reader), then
  its directories are removed, then the entry is dropped. The next open finishes any deletion
  a crash interrupted, so a deleted topic never comes back and its files never linger.

Logs are opened on first use (`partition`). The recovery checkpoint (checkpoint.py) gives
each log's open its state after a clean `close` (nothing read or scanned) and a newer
recovery point after a crash; `checkpoint_recovery_points` refreshes it while running.

All methods take one lock; the broker calls them from its event loop.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import json
import logging
import re
import shutil
import threading
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from onceflow.storage.checkpoint import (
    CheckpointEntry,
    read_recovery_checkpoint,
    write_recovery_checkpoint,
)
from onceflow.storage.config import LogConfig, validate_topic_configs
from onceflow.storage.layout import (
    CorruptFileError,
    InvalidPartitionsError,
    InvalidTopicError,
    LogFailedError,
    PartitionState,
    StorageError,
    TopicExistsError,
    UnknownTopicError,
    fsync_dir,
    read_checked_file,
    write_checked_file,
)
from onceflow.storage.log import PartitionLog

logger = logging.getLogger(__name__)

TOPICS_META_FILE = "topics.meta"
TOPICS_META_MAGIC = b"OFTM"
TOPICS_META_VERSION = 1
TOPIC_NAME_CHARS_MAX = 249  # Kafka's limit: leaves room for "-<partition>" in a file name
PARTITIONS_PER_TOPIC_MAX = 10_000  # each partition holds open files; a peer picks the count
_LEGAL_TOPIC_NAME = re.compile(r"[a-zA-Z0-9._-]+")


@dataclass(frozen=True)
class TopicInfo:
    name: str
    topic_id: uuid.UUID
    num_partitions: int
    configs: dict[str, str] = field(default_factory=dict)  # overrides only, as given
    replication_factor: int = 1  # recorded for Metadata/Describe; storage keeps one copy


def _new_topic_id() -> uuid.UUID:
    """A random UUID that, like Kafka's, never prints (URL-safe base64) with a leading '-'."""
    while True:
        topic_id = uuid.uuid4()
        if not base64.urlsafe_b64encode(topic_id.bytes).startswith(b"-"):
            return topic_id


def validate_topic_name(name: str) -> None:
    """Raises InvalidTopicError unless `name` is a legal Kafka topic name."""
    if not name or name in (".", ".."):
        raise InvalidTopicError(f"Topic name {name!r} is illegal")
    if len(name) > TOPIC_NAME_CHARS_MAX:
        raise InvalidTopicError(f"Topic name is longer than {TOPIC_NAME_CHARS_MAX} characters")
    if not _LEGAL_TOPIC_NAME.fullmatch(name):
        raise InvalidTopicError(
            f"Topic name {name!r} contains characters other than [a-zA-Z0-9._-]"
        )


def _collision_key(name: str) -> str:
    return name.replace(".", "_")  # Kafka: '.' and '_' collide in metric names


class Store:
    """The data directory (see the module docstring)."""

    def __init__(
        self, data_dir: Path, now_ms: int, *, log_defaults: Mapping[str, str] | None = None
    ):
        self.data_dir = Path(data_dir)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._now_ms = now_ms
        self._log_defaults = validate_topic_configs(log_defaults or {})
        self._lock = threading.RLock()
        self._topics: dict[str, TopicInfo] = {}
        self._deleting: dict[str, TopicInfo] = {}
        self._logs: dict[tuple[str, int], PartitionLog] = {}
        self._batch: list[str] | None = None  # topics created inside `batch()`, not yet saved
        self._closed = False
        self._configs: dict[tuple[tuple[str, str], ...], LogConfig] = {}  # by overrides
        self._hints: dict[tuple[str, int], PartitionState] = {}
        self._load_meta()
        for info in list(self._deleting.values()):
            self._finish_delete(info)
        # Each log's entry of the recovery checkpoint, until the log is opened (checkpoint.py)
        self._hints: dict[tuple[str, int], PartitionState] = self._load_checkpoint()
        # Logs are opened (and so recovered) on first use, by `partition`: a restart reads
        # only topics.meta, and the broker recovers its partitions in the background.
        self._warn_unknown_dirs()

    # -- queries --------------------------------------------------------------------------------

    def topics(self) -> dict[str, TopicInfo]:
        with self._lock:
            return dict(self._topics)

    def partition(self, topic: str, index: int) -> PartitionLog:
        """The partition's log, opened (and recovered) now if this is its first use since the
        store was opened. Raises UnknownTopicError, or what opening raises (OSError,
        StorageError)."""
        log = self._logs.get((topic, index))
        if log is not None:
            return log
        with self._lock:
            log = self._logs.get((topic, index))
            if log is not None:
                return log
            info = self._topics.get(topic)
            if info is None or not 0 <= index < info.num_partitions:
                raise UnknownTopicError(f"unknown topic partition {topic}-{index}")
            if self._closed:
                raise LogFailedError(f"{topic}-{index}: the store is closed")
            self._open_partitions(info, range(index, index + 1))
            return self._logs[(topic, index)]

    def is_open(self, topic: str, index: int) -> bool:
        """Whether the partition's log has been opened (recovered) since the store was."""
        return (topic, index) in self._logs

    def log_config(self, topic: str) -> LogConfig:
        with self._lock:
            return self._config_of(self._topic(topic).configs)

    # -- changes --------------------------------------------------------------------------------

    def create_topic(
        self,
        name: str,
        num_partitions: int,
        configs: Mapping[str, str],
        *,
        replication_factor: int = 1,
    ) -> TopicInfo:
        """Raises InvalidTopicError, TopicExistsError, InvalidPartitionsError or
        InvalidConfigError; on success the topic is durable and its logs are open."""
        validate_topic_name(name)
        _check_partition_count(num_partitions)
        overrides = validate_topic_configs(configs)
        self._config_of(overrides)  # the layered result must be valid too
        with self._lock:
            if name in self._topics:
                raise TopicExistsError(f"Topic '{name}' already exists.")
            clash = [t for t in self._topics if _collision_key(t) == _collision_key(name)]
            if clash:
                raise InvalidTopicError(f"Topic '{name}' collides with existing topic: {clash[0]}")
            if name in self._deleting:
                self._finish_delete(self._deleting[name])
            info = TopicInfo(
                name, _new_topic_id(), num_partitions, dict(overrides), replication_factor
            )
            self._topics[name] = info
            if self._batch is None:
                self._save_meta_or_undo(lambda: self._topics.pop(name))
            try:
                self._open_partitions(info, range(num_partitions), new=True)
            except (OSError, LogFailedError):
                # Out of descriptors or disk: drop the half-made topic so that its open
                # logs do not keep the broker out of descriptors, then report the error.
                del self._topics[name]
                self._deleting[name] = info
                for index in range(num_partitions):  # first, to give the descriptors back
                    log = self._logs.pop((name, index), None)
                    if log is not None:
                        log.discard()
                try:
                    self._save_meta()
                    self._finish_delete(info)
                except (OSError, LogFailedError):
                    pass  # left marked deleting: finished at the next open or create
                raise
            if self._batch is not None:
                self._batch.append(name)
            return info

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """Topics created inside share one metadata write and one data-dir fsync, made when
        the block exits (one CreateTopics request); none is durable before. If that write
        fails, every topic created inside is removed again and the error raised."""
        with self._lock:
            if self._batch is not None:  # nested: the outer block saves
                yield
                return
            self._batch = []
            try:
                yield
            finally:
                created, self._batch = self._batch, None
            if created:
                self._save_batch(created)

    def _save_batch(self, created: list[str]) -> None:
        try:
            fsync_dir(self.data_dir)
            self._save_meta()
        except BaseException:
            for name in created:
                info = self._topics.pop(name)
                self._deleting[name] = info
                try:
                    self._finish_delete(info)
                except (OSError, LogFailedError):
                    logger.error("could not remove the logs of '%s' after a failed create", name)
            raise

    def delete_topic(self, name: str) -> None:
        with self._lock:
            info = self._topic(name)
            del self._topics[name]
            self._deleting[name] = info
            self._save_meta()
            self._finish_delete(info)

    def create_partitions(self, name: str, total_count: int) -> None:
        """Grows a topic to `total_count` partitions (InvalidPartitionsError if not larger)."""
        _check_partition_count(total_count)
        with self._lock:
            info = self._topic(name)
            if total_count <= info.num_partitions:
                raise InvalidPartitionsError(
                    f"Topic currently has {info.num_partitions} partitions, which is higher than "
                    f"or equal to the requested {total_count}."
                )
            self._topics[name] = dataclasses.replace(info, num_partitions=total_count)
            self._save_meta_or_undo(lambda: self._topics.__setitem__(name, info))
            self._open_partitions(self._topics[name], range(info.num_partitions, total_count),
                                  new=True)

    def alter_topic_configs(self, name: str, configs: Mapping[str, str]) -> None:
        """Replaces the topic's config overrides with `configs` (InvalidConfigError)."""
        overrides = validate_topic_configs(configs)
        config = self._config_of(overrides)
        with self._lock:
            info = self._topic(name)
            self._topics[name] = dataclasses.replace(info, configs=dict(overrides))
            self._save_meta_or_undo(lambda: self._topics.__setitem__(name, info))
            for index in range(info.num_partitions):
                log = self._logs.get((name, index))
                if log is not None:  # one not opened yet reads the new overrides when it is
                    log.update_config(config)

    def set_log_defaults(self, log_defaults: Mapping[str, str]) -> None:
        """New broker log.* defaults (topic config names; InvalidConfigError): every log
        without its own override of a key follows them from its next append or retention
        pass, as Kafka's dynamic log config does."""
        defaults = validate_topic_configs(log_defaults)
        with self._lock:
            self._log_defaults = defaults
            self._configs.clear()   # parsed under the old defaults: logs opened later use these
            configs = {name: self._config_of(info.configs) for name, info in self._topics.items()}
            for (name, _index), log in self._logs.items():
                if name in configs:
                    log.update_config(configs[name])

    def close(self) -> None:
        """Closes every log cleanly (flush; the per-log state file is not rewritten), then
        writes the recovery checkpoint with the clean-shutdown flag and every log's state, so
        the next start scans nothing: one checked-file write for the directory instead of a
        state file (and its two fsyncs) per log."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            logs = dict(self._logs)
        errors = []
        for log in logs.values():
            try:
                log.close(state_file=False)  # the clean checkpoint below carries the state
            except Exception as exc:  # noqa: BLE001 - close the others, then report
                logger.error("closing %s failed: %s", log.directory, exc)
                errors.append(exc)
        with self._lock:
            self._logs = {}
            try:
                self._write_checkpoint(logs, clean=True)
            except OSError as exc:  # the next start re-validates each log's tail
                logger.error("writing the recovery checkpoint at close failed: %s; writing "
                             "each log's state file instead", exc)
                errors.append(exc)
                self._write_state_files(logs.values())
        if errors:
            raise errors[0]

    @staticmethod
    def _write_state_files(logs) -> None:
        """Each cleanly closed log's state file (with its recovery point at the log end), as
        close wrote them before the checkpoint carried them: the fallback of a failed
        checkpoint write, so the next start scans only each log's last segment."""
        for log in logs:
            try:
                log.write_closed_state()
            except StorageError as exc:
                logger.error("%s: %s", log.directory, exc)

    def checkpoint_recovery_points(self, fsync: bool = True) -> None:
        """Writes every log's recovery point to the checkpoint (the broker calls this every
        RECOVERY_CHECKPOINT_INTERVAL_MS, from a worker thread): after a crash each log
        re-validates only what lies past it."""
        with self._lock:
            if self._closed:
                return
            self._write_checkpoint(dict(self._logs), clean=False, fsync=fsync)

    # -- internals ------------------------------------------------------------------------------

    def _topic(self, name: str) -> TopicInfo:
        info = self._topics.get(name)
        if info is None:
            raise UnknownTopicError(f"unknown topic {name}")
        return info

    def _config_of(self, overrides: Mapping[str, str]) -> LogConfig:
        return LogConfig.from_topic_configs(overrides, self._log_defaults)

    def _partition_dir(self, topic: str, index: int) -> Path:
        return self.data_dir / f"{topic}-{index}"

    def _open_partitions(self, info: TopicInfo, indexes: range, new: bool = False) -> None:
        """Opens (recovers) the logs; `new`: the partitions were just created, so their
        directories are made without per-log fsyncs and the data dir is fsync'd once."""
        key = tuple(sorted(info.configs.items()))
        config = self._configs.get(key)
        if config is None:  # parsed once per distinct overrides, not once per partition
            config = self._configs[key] = self._config_of(info.configs)
        for index in indexes:
            path = self._partition_dir(info.name, index)
            if new and not path.exists():
                log = PartitionLog.create(path, config)
            else:
                hint = self._hints.pop((info.name, index), None)
                log = PartitionLog.open(path, config, self._now_ms, hint, trust_state_clean=False)
            self._logs[(info.name, index)] = log
        if new and self._batch is None:
            fsync_dir(self.data_dir)

    def _load_checkpoint(self) -> dict[tuple[str, int], PartitionState]:
        """The checkpoint's entries of live topics; a clean one is rewritten unclean first,
        before any log can change (Kafka deletes its clean-shutdown marker the same way)."""
        try:
            checkpoint = read_recovery_checkpoint(self.data_dir)
        except CorruptFileError as exc:
            logger.error("%s; every log re-validates its tail", exc)
            return {}
        if checkpoint is None:
            return {}
        names = {info.topic_id: info for info in self._topics.values()}
        hints = {}
        for entry in checkpoint.entries:
            info = names.get(entry.topic_id)
            if info is not None and entry.partition < info.num_partitions:
                state = entry.state
                if not checkpoint.clean and state.clean_shutdown:
                    state = state._replace(clean_shutdown=False)
                hints[(info.name, entry.partition)] = state
        if checkpoint.clean:  # the entries keep their flags; the file's flag is what counts
            self._hints = hints
            self._write_checkpoint({}, clean=False)
        return hints

    def _write_checkpoint(self, logs: Mapping[tuple[str, int], PartitionLog], clean: bool,
                          fsync: bool = True) -> None:
        """(holding _lock) Entries of `logs` as they are now, and of the logs not opened
        since the start as the last checkpoint had them."""
        entries = []
        for (name, index), state in self._hints.items():
            info = self._topics.get(name)
            if info is not None and (name, index) not in logs and index < info.num_partitions:
                entries.append(CheckpointEntry(info.topic_id, index, state))
        for (name, index), log in logs.items():
            info = self._topics.get(name)
            if info is not None:
                entries.append(CheckpointEntry(info.topic_id, index, log.checkpoint_state()))
        write_recovery_checkpoint(self.data_dir, clean, entries, fsync)

    def _finish_delete(self, info: TopicInfo) -> None:
        """Removes the directories of a topic marked deleting, then its metadata entry."""
        for index in range(info.num_partitions):
            self._hints.pop((info.name, index), None)  # not for a new topic of that name
            log = self._logs.pop((info.name, index), None)
            if log is not None:
                log.discard()
            path = self._partition_dir(info.name, index)
            if path.exists():
                shutil.rmtree(path)
        fsync_dir(self.data_dir)
        del self._deleting[info.name]
        self._save_meta()

    def _warn_unknown_dirs(self) -> None:
        known = {self._partition_dir(info.name, i).name
                 for info in self._topics.values() for i in range(info.num_partitions)}
        for path in self.data_dir.iterdir():
            if path.is_dir() and path.name not in known:
                logger.warning(
                    "%s: directory not described by %s; left alone", path, TOPICS_META_FILE
                )

    def _load_meta(self) -> None:
        path = self.data_dir / TOPICS_META_FILE
        try:
            _, payload = read_checked_file(path, TOPICS_META_MAGIC, (TOPICS_META_VERSION,))
        except FileNotFoundError:
            self._save_meta()  # a first start: from now on the file always exists
            return
        try:
            entries = json.loads(payload)["topics"]
            for entry in entries:
                info = TopicInfo(
                    entry["name"],
                    uuid.UUID(entry["topic_id"]),
                    int(entry["num_partitions"]),
                    dict(entry["configs"]),
                    int(entry["replication_factor"]),
                )
                (self._deleting if entry["deleting"] else self._topics)[info.name] = info
        except (ValueError, KeyError, TypeError) as exc:
            raise CorruptFileError(f"{path}: CRC ok but content invalid: {exc}") from exc

    def _save_meta(self) -> None:
        entries = [
            {
                "name": info.name,
                "topic_id": str(info.topic_id),
                "num_partitions": info.num_partitions,
                "configs": info.configs,
                "replication_factor": info.replication_factor,
                "deleting": deleting,
            }
            for deleting, table in ((False, self._topics), (True, self._deleting))
            for info in table.values()
        ]
        payload = json.dumps({"topics": entries}, sort_keys=True, indent=1).encode()
        write_checked_file(
            self.data_dir / TOPICS_META_FILE, TOPICS_META_MAGIC, TOPICS_META_VERSION, payload
        )

    def _save_meta_or_undo(self, undo) -> None:
        try:
            self._save_meta()
        except BaseException:
            undo()
            raise


def _check_partition_count(count: int) -> None:
    if not 1 <= count <= PARTITIONS_PER_TOPIC_MAX:
        raise InvalidPartitionsError(
            f"Number of partitions must be in [1, {PARTITIONS_PER_TOPIC_MAX}]: {count}"
        )
