"""ConnectionQuotas and the parsing of max.connections.per.ip.overrides (issue 19)."""

from __future__ import annotations

import pytest

from onceflow.broker.config_file import ConfigFileError, config_from_properties
from onceflow.broker.connection_quotas import (
    CONNECTIONS_UNLIMITED,
    ConnectionLimits,
    ConnectionQuotas,
    connection_limits,
    normalized_address,
    parse_overrides,
)


def test_overrides_in_kafkas_syntax_resolve_to_addresses() -> None:
    assert parse_overrides("") == {}
    assert parse_overrides("127.0.0.1:200, localhost:5,[::1]:7") == {
        "127.0.0.1": 5, "::1": 7}   # localhost resolves to 127.0.0.1; the later entry wins
    for bad in ("127.0.0.1", "127.0.0.1:x", ":3", "127.0.0.1:-1"):
        with pytest.raises(ValueError):
            parse_overrides(bad)


def test_the_per_ip_limit_counts_each_address_and_frees_on_close() -> None:
    limits = ConnectionLimits(max_connections_per_ip=2, per_ip_overrides={"10.0.0.9": 0})
    quotas = ConnectionQuotas()
    assert quotas.inc("10.0.0.1", limits) and quotas.inc("10.0.0.1", limits)
    assert not quotas.inc("10.0.0.1", limits)   # the third from that address
    assert quotas.count("10.0.0.1") == 2 and quotas.total == 2
    assert not quotas.inc("10.0.0.9", limits)   # its override: none at all
    assert quotas.inc("10.0.0.2", limits)
    quotas.dec("10.0.0.1")
    assert quotas.inc("10.0.0.1", limits)
    assert quotas.total == 3


def test_the_broker_wide_limit_is_a_slot_check() -> None:
    limits = ConnectionLimits(max_connections=1)
    quotas = ConnectionQuotas()
    assert quotas.slot_available(limits)
    quotas.inc("10.0.0.1", limits)
    assert not quotas.slot_available(limits)
    quotas.dec("10.0.0.1")
    assert quotas.slot_available(limits)


def test_config_keys_and_kafkas_defaults(tmp_path) -> None:
    default = config_from_properties({}, {"data_dir": tmp_path})
    assert connection_limits(default) == ConnectionLimits()
    assert default.max_connections == default.max_connections_per_ip == CONNECTIONS_UNLIMITED
    config = config_from_properties({"max.connections": "100", "max.connections.per.ip": "0",
                                     "max.connections.per.ip.overrides": "127.0.0.1:3"},
                                    {"data_dir": tmp_path})
    assert connection_limits(config) == ConnectionLimits(100, 0, {"127.0.0.1": 3})
    with pytest.raises(ConfigFileError):
        config_from_properties({"max.connections": "-1"}, {"data_dir": tmp_path})
    zero = config_from_properties({"max.connections.per.ip": "0"}, {"data_dir": tmp_path})
    with pytest.raises(ValueError, match="max.connections.per.ip.overrides"):
        connection_limits(zero)


def test_ipv4_mapped_peers_count_as_their_ipv4_address() -> None:
    assert normalized_address("::ffff:127.0.0.1") == "127.0.0.1"
    assert normalized_address("::1") == "::1"
