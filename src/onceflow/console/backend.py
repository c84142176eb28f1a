"""`Backend`: the console's one connection to the cluster, shared by every page.

Theory of operation: the console is a Kafka client. It holds one `Cluster` (an
AdminClient, the metadata, one raw connection per broker; `onceflow.client.cluster`),
connected on first use so that a console started before its cluster - or one whose
cluster went away - answers with a clear message and connects when it can. The metadata
is re-read in the background when a page finds it older than `METADATA_MAX_AGE_S` (the
page goes on with the one it has), so pages show new topics and moved leaders without
any page waiting for a Metadata request, whose cost grows with the partition count; a
topic not in the metadata is looked up again before it is called unknown. Every call
here blocks: the web layer runs them on worker threads, never on the event loop.

`Extras` are what a cluster offers beyond the Kafka protocol. The console served by an
onceflow broker (`onceflow broker --console`) gets the broker's (segments of each
partition); against any other cluster there are none and those parts of the pages say so.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import ClusterMetadata

from onceflow.client.admin import (
    ClientError,
    NotFoundError,
    client_config,
    new_client_errors,
    require_topic,
)
from onceflow.client.cluster import Cluster

CLIENT_ID = "onceflow-console"
# How stale the topic list and leaders may be before a page asks for a refresh: a burst of
# page loads shares one Metadata request. A cluster whose full metadata takes long to
# build (measured: 0.5 s for 4,000 partitions on onceflow) is asked at most once per
# METADATA_DUTY_DIVISOR times that, so the console never keeps a broker busy with it.
METADATA_MAX_AGE_S = 2.0
METADATA_DUTY_DIVISOR = 20
# A page waits at most this long for the cluster's metadata before saying it is unreachable.
METADATA_TIMEOUT_S = 5.0
# Group id for the console's partition reads (librdkafka insists on one; the console
# never joins the group nor commits).
READER_GROUP_ID = "onceflow-console-reader"


@dataclasses.dataclass(frozen=True, slots=True)
class Segment:
    base_offset: int
    next_offset: int                 # exclusive end of its records
    size_bytes: int
    max_timestamp_ms: int | None     # the newest record's time; None when empty
    active: bool                     # the segment appends go to


class SegmentLike(Protocol):
    """A segment as the page shows it: `Segment`, or the broker's own value of that shape."""

    base_offset: int
    next_offset: int
    size_bytes: int
    max_timestamp_ms: int | None
    active: bool


class Extras(Protocol):
    """What an onceflow broker serving the console offers beyond the Kafka protocol."""

    # The partition's segments, oldest first; None when the broker has no such partition.
    segments: Callable[[str, int], Sequence[SegmentLike] | None]


class Backend:
    def __init__(self, bootstrap_servers: str, properties: Mapping[str, str] | None = None,
                 extras: Extras | None = None) -> None:
        self.bootstrap_servers = bootstrap_servers
        self.properties = dict(properties or {})
        self.extras = extras
        self._cluster: Cluster | None = None
        self._read_at = 0.0
        self._max_age_s = METADATA_MAX_AGE_S
        self._refreshing = False
        self._lock = threading.Lock()

    def cluster(self) -> Cluster:
        """The connected cluster; its metadata is refreshed in the background when stale."""
        with self._lock:
            if self._cluster is None:
                self._cluster = Cluster.connect(self.bootstrap_servers, self.properties,
                                                CLIENT_ID)
                self._read_at = time.monotonic()
            elif time.monotonic() - self._read_at > self._max_age_s and not self._refreshing:
                self._refreshing = True
                threading.Thread(target=self._refresh, args=(self._cluster,),
                                 name="console-metadata", daemon=True).start()
            return self._cluster

    def _refresh(self, cluster: Cluster) -> None:
        started = time.monotonic()
        try:
            cluster.refresh(METADATA_TIMEOUT_S)
        except ClientError:
            pass  # the next page that needs the cluster says what is wrong
        finally:
            with self._lock:
                self._read_at = time.monotonic()
                self._max_age_s = max(METADATA_MAX_AGE_S,
                                      METADATA_DUTY_DIVISOR * (self._read_at - started))
                self._refreshing = False

    def metadata(self) -> ClusterMetadata:
        return self.cluster().metadata

    def partitions_of(self, topic: str) -> list[int]:
        """The topic's partition ids; metadata read again before calling it unknown (it
        may be newer than the cached metadata)."""
        try:
            return require_topic(self.metadata(), topic)
        except NotFoundError:
            with self._lock:
                cluster = self._cluster
                if cluster is not None:
                    cluster.refresh(METADATA_TIMEOUT_S)
                    self._read_at = time.monotonic()
            return require_topic(self.metadata(), topic)

    def config(self, **settings: Any) -> dict[str, Any]:
        """Settings for a new confluent-kafka client of the console."""
        return {**client_config(self.bootstrap_servers, new_client_errors(), self.properties,
                                CLIENT_ID), **settings}

    def reader(self, isolation_level: str, **settings: Any) -> Consumer:
        """A consumer for reading partitions by assignment (no group membership)."""
        return Consumer(self.config(**{"group.id": READER_GROUP_ID, "enable.auto.commit": False,
                                       "enable.partition.eof": True,
                                       "isolation.level": isolation_level, **settings}))

    def producer(self, **settings: Any) -> Producer:
        return Producer(self.config(**settings))

    def close(self) -> None:
        with self._lock:
            if self._cluster is not None:
                self._cluster.close()
                self._cluster = None


def require(condition: bool, message: str) -> None:
    """ClientError(message) unless `condition`: a person's mistake, shown on the page."""
    if not condition:
        raise ClientError(message)
