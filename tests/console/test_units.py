"""The console's pure parts: transaction structure, value decoding, URL parameters,
sessions, the overview's rates, client config files, processor windows."""

from __future__ import annotations

import pytest

from onceflow.client.admin import ClientError
from onceflow.client.config import parse_properties, redacted
from onceflow.client.groups import PartitionOffsets
from onceflow.console.decode import decode
from onceflow.console.guard import Sessions, safe_next
from onceflow.console.model.groups import processor_window
from onceflow.console.model.overview import Sample, Series
from onceflow.console.model.records import Batch, Status, classify
from onceflow.console.params import integer, isolation, timestamp_ms
from onceflow.console.settings import ConsoleSettings, is_loopback
from onceflow.console.web import BadInput
from onceflow.processor import offset_map

A, B = 7, 9   # producer ids


def data(offset: int, pid: int = A, count: int = 1, transactional: bool = True) -> Batch:
    return Batch(offset, offset + count - 1, pid if transactional else -1, 0, transactional,
                 None, count, 100, 0)


def marker(offset: int, pid: int, commit: bool) -> Batch:
    return Batch(offset, offset, pid, 0, True, commit, 1, 78, 0)


def test_markers_in_the_window_decide_their_producers_batches():
    batches = [data(0), data(1, B), marker(2, A, True), data(3, B), marker(4, B, False),
               data(5, transactional=False)]
    assert classify(batches, [], last_stable=6, open_starts={}) == {
        0: Status.committed, 1: Status.aborted, 3: Status.aborted, 5: Status.plain}


def test_below_the_lso_without_a_marker_the_aborted_list_decides():
    # The window ends before the markers: A's transaction from offset 0 aborted, B committed.
    batches = [data(0), data(1, B), data(2)]
    assert classify(batches, [(A, 0)], last_stable=10, open_starts={}) == {
        0: Status.aborted, 1: Status.committed, 2: Status.aborted}
    # An aborted transaction of A that starts later leaves the earlier batch committed.
    assert classify([data(0), marker(1, A, True), data(2)], [(A, 2)], 10, {})[2] is Status.aborted
    assert classify([data(0)], [(A, 5)], 10, {})[0] is Status.committed


def test_above_the_lso_open_or_pending():
    batches = [data(4), data(5, B)]
    assert classify(batches, [], last_stable=4, open_starts={A: 4}) == {
        4: Status.open, 5: Status.pending}


def test_decode_json_text_binary_null_and_caps():
    assert decode(b'{"a":[1,2]}').kind == "json"
    assert decode(b'{"a":[1,2]}').text == '{\n  "a": [\n    1,\n    2\n  ]\n}'
    assert decode(b"42").kind == "text"                       # numbers read better as text
    assert decode("héllo\n".encode()).text == "héllo\n"
    binary = decode(b"\x00\x01ab")
    assert binary.kind == "hex" and binary.text.startswith("00000000  00 01 61 62")
    assert decode(None).kind == "null"
    capped = decode(b"x" * 2000, cap_bytes=100)
    assert capped.truncated and len(capped.text) == 100 and capped.size_bytes == 2000
    assert decode(b"\xff" * 300, cap_bytes=16).truncated


def test_parameters():
    assert integer({"offset": " 12 "}, "offset") == 12
    assert integer({}, "offset", default=3) == 3
    for bad in ("x", "-1", "1e3", str(2**63)):
        with pytest.raises(BadInput):
            integer({"offset": bad}, "offset")
    assert timestamp_ms({"t": "1700000000000"}, "t") == 1700000000000
    assert timestamp_ms({"t": "2023-11-14T22:13:20Z"}, "t") == 1700000000000
    assert timestamp_ms({"t": "2023-11-14T22:13:20"}, "t") == 1700000000000   # UTC
    assert timestamp_ms({"t": "2023-11-15T00:13:20+02:00"}, "t") == 1700000000000
    for bad in ("yesterday", "1969-01-01T00:00:00Z"):
        with pytest.raises(BadInput):
            timestamp_ms({"t": bad}, "t")
    assert isolation({}) == "read_uncommitted"
    with pytest.raises(BadInput):
        isolation({"isolation": "dirty"})


def test_sessions_are_signed_and_expire():
    sessions = Sessions()
    cookie = sessions.encode(sessions.new(True, now_s=1000))
    assert sessions.decode(cookie, now_s=1001)["auth"] is True
    payload, signature = cookie.rsplit(".", 1)
    assert sessions.decode(f"{payload}.{'0' * len(signature)}", 1001) is None
    assert sessions.decode(cookie, now_s=10**9) is None              # expired
    assert Sessions().decode(cookie, 1001) is None                    # another process's key
    assert sessions.decode("garbage", 1001) is None


def test_login_target_stays_on_this_site():
    assert safe_next("/groups/g?isolation=read_committed") == "/groups/g?isolation=read_committed"
    for outside in ("//evil.example/", "https://evil.example/", "/\\evil.example", "", None):
        assert safe_next(outside) == "/"


def test_binding_rules():
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.1.2.3")
    assert not ConsoleSettings("b:9092").requires_login
    with pytest.raises(ClientError, match="token"):
        ConsoleSettings("b:9092", host="0.0.0.0")
    with pytest.raises(ClientError, match="16 characters"):
        ConsoleSettings("b:9092", host="0.0.0.0", token="short")
    secret = "a-token-of-24-characters"
    settings = ConsoleSettings("b:9092", host="0.0.0.0", token=secret)
    assert settings.requires_login and secret not in repr(settings)


def test_series_rates_never_negative():
    series = Series(samples_max=3)
    for at_ms, end, committed in ((0, 100, 0), (2000, 300, 50), (4000, 200, 150), (6000, 400, 150)):
        series.add(Sample(at_ms, 1, 1, end, 5, committed, (), 0))
    points = series.points()                         # the oldest sample fell out
    assert [(p.in_per_s, p.out_per_s) for p in points] == [(0.0, 50.0), (100.0, 0.0)]


def test_client_properties_files():
    parsed = parse_properties("# a comment\n! another\n\nsecurity.protocol=SASL_SSL\n"
                              "sasl.password: s3cret\nsasl.jaas.config=a \\\n  b\n")
    assert parsed == {"security.protocol": "SASL_SSL", "sasl.password": "s3cret",
                      "sasl.jaas.config": "a b"}
    assert redacted(parsed)["sasl.password"] == "[hidden]"
    for bad in ("novalue\n", "bootstrap.servers=x\n"):
        with pytest.raises(ClientError):
            parse_properties(bad)


def test_processor_window_from_the_offset_map():
    metadata, _kept = offset_map.encode(10, [(12, 14), (17, 18)])
    rows = [PartitionOffsets("t", 0, 10, metadata, 30, 30, None),
            PartitionOffsets("t", 1, 5, "not a map", 30, 30, None)]
    (window,) = processor_window(rows)
    assert window.completed == ((12, 14), (17, 18))
    assert (window.completed_count, window.pending_count, window.window_end) == (3, 5, 18)
