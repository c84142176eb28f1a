"""storage.resource_configs: durable config maps of non-topic resources (dynamic broker,
group and client-metrics configs): a change is on disk before listeners hear of it, a
reload gives the same maps, damage is detected, and peer-chosen sizes are bounded."""

from __future__ import annotations

import pytest

from onceflow.storage.layout import CorruptFileError
from onceflow.storage.resource_configs import (
    KEYS_PER_RESOURCE_MAX,
    ResourceConfigs,
    TooManyConfigs,
)

BROKER, GROUP = 4, 32


def test_replace_persists_before_listeners_and_reloads(tmp_path):
    path = tmp_path / "configs.state"
    configs = ResourceConfigs.load(path, fsync=False)
    seen = []
    configs.subscribe(lambda kind, name: seen.append(
        (kind, name, ResourceConfigs.load(path).get(kind, name))))
    configs.replace(BROKER, "", {"log.retention.ms": "1000"})
    configs.replace(GROUP, "g", {"consumer.session.timeout.ms": "50000"})
    assert seen == [(BROKER, "", {"log.retention.ms": "1000"}),
                    (GROUP, "g", {"consumer.session.timeout.ms": "50000"})]
    configs.replace(GROUP, "g", {})  # the last key gone: the resource goes
    reloaded = ResourceConfigs.load(path)
    assert reloaded.names(GROUP) == [] and reloaded.names(BROKER) == [""]
    assert reloaded.get(BROKER, "") == {"log.retention.ms": "1000"}
    assert reloaded.get(BROKER, "0") == {}


def test_a_damaged_file_is_detected(tmp_path):
    path = tmp_path / "configs.state"
    ResourceConfigs.load(path, fsync=False).replace(BROKER, "0", {"a": "b"})
    data = bytearray(path.read_bytes())
    data[-2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptFileError):
        ResourceConfigs.load(path)


def test_too_many_keys_changes_nothing(tmp_path):
    configs = ResourceConfigs.load(tmp_path / "configs.state", fsync=False)
    with pytest.raises(TooManyConfigs):
        configs.replace(GROUP, "g", {f"k{i}": "v" for i in range(KEYS_PER_RESOURCE_MAX + 1)})
    assert configs.names(GROUP) == []
    assert not (tmp_path / "configs.state").exists()
