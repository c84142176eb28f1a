"""The source's option checks on their own (no Spark): unknown options are refused with the
list of known ones, groupIdPrefix reaches the consumers' group id."""

import pytest

from onceflow.spark.source import GROUP_ID_DEFAULT, SourceOptionError, parse_options

BASE = {"kafka.bootstrap.servers": "127.0.0.1:9092", "subscribe": "t"}


@pytest.mark.parametrize("misspelt", ["maxOffsetPerTrigger", "startingOffset", "includeHeader",
                                      "fetchOffset.numRetries"])
def test_unknown_options_are_refused_with_the_known_ones(misspelt):
    with pytest.raises(SourceOptionError) as refused:
        parse_options({**BASE, misspelt: "1"})
    message = str(refused.value)
    assert f"unknown option(s) {misspelt.lower()}" in message
    assert "known: subscribe, startingOffsets" in message and "maxOffsetsPerTrigger" in message


def test_known_options_in_any_case_are_accepted():
    options = parse_options({**BASE, "MaxOffsetsPerTrigger": "5", "INCLUDEHEADERS": "true",
                             "failondataloss": "false", "path": "ignored"})
    assert (options.max_offsets_per_trigger, options.include_headers,
            options.fail_on_data_loss) == (5, True, False)


def test_group_id_prefix_is_the_consumers_group_id_prefix():
    assert parse_options(BASE).consumer_config()["group.id"] == GROUP_ID_DEFAULT
    prefixed = parse_options({**BASE, "groupIdPrefix": "team-a"}).consumer_config()
    assert prefixed["group.id"].startswith("team-a-")
    explicit = parse_options({**BASE, "groupIdPrefix": "team-a", "kafka.group.id": "exact"})
    assert explicit.consumer_config()["group.id"] == "exact"
