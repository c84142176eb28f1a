"""The console over HTTP on a real socket (httpx): who may use it, cross-site requests, bad
input answered with a sentence - never a stack trace, never a hung page."""

from __future__ import annotations

import re
import time
import uuid

import httpx
import pytest
from confluent_kafka import Producer

from onceflow.client.admin import ClientError
from onceflow.console.settings import ConsoleSettings
from onceflow.testing import free_port
from tests.console.support import running_console
from tests.helpers import TIMEOUT_S, create_topic, unique

TOKEN = "a-long-enough-console-token"
HTTP_TIMEOUT_S = 30.0
CSRF = re.compile(r'"X-CSRF-Token": "([^"]+)"')


def client(url: str) -> httpx.Client:
    return httpx.Client(base_url=url, timeout=HTTP_TIMEOUT_S, follow_redirects=False)


def csrf_of(http: httpx.Client) -> str:
    """A page's cross-site request token (the session cookie stays in `http`)."""
    found = CSRF.search(http.get("/topics").text)
    assert found, "no csrf token in the page"
    return found.group(1)


def assert_sentence(answer: httpx.Response, status: int, *fragments: str) -> None:
    assert answer.status_code == status, answer.text[:500]
    assert "Traceback" not in answer.text and 'File "' not in answer.text
    for fragment in fragments:
        assert fragment in answer.text, answer.text[-800:]


def test_beyond_localhost_needs_a_token_and_refuses_anonymous_visitors(console_broker):
    with pytest.raises(ClientError, match="token"):
        ConsoleSettings(console_broker.bootstrap_servers, host="0.0.0.0")
    with running_console(console_broker.bootstrap_servers, host="0.0.0.0",
                         token=TOKEN) as running, client(running.url) as http:
        page = http.get("/transactions?x=1")
        assert page.status_code == 303
        assert page.headers["location"] == "/login?next=%2Ftransactions%3Fx%3D1"
        assert http.get("/events/overview").status_code == 401
        assert http.get("/series.json").status_code == 401
        assert http.get("/topics", headers={"HX-Request": "true"}).status_code == 401
        assert http.post("/transactions/x/abort").status_code == 401
        started = time.monotonic()
        wrong = http.post("/login", data={"token": "not-the-token", "next": "/"})
        assert wrong.status_code == 401 and time.monotonic() - started >= 1.0
        assert http.get("/topics").status_code == 303
        right = http.post("/login", data={"token": TOKEN, "next": "//evil.example/"})
        assert right.status_code == 303 and right.headers["location"] == "/"
        assert http.get("/topics").status_code == 200
        assert http.get("/static/vendor/htmx.min.js").status_code == 200


def test_actions_need_the_csrf_token_and_a_same_site_origin(console):
    with client(console.url) as http:
        token = csrf_of(http)
        form = {"producer_id": "1", "producer_epoch": "0"}
        assert http.post("/transactions/x/abort", data=form).status_code == 403
        wrong = http.post("/transactions/x/abort", data=form, headers={"X-CSRF-Token": "nope"})
        assert wrong.status_code == 403
        foreign = http.post("/transactions/x/abort", data=form,
                            headers={"X-CSRF-Token": token, "Origin": "http://evil.example"})
        assert foreign.status_code == 403
        # With the token it reaches the route: an unknown id is a sentence, not a crash.
        answer = http.post("/transactions/x/abort", data=form, headers={"X-CSRF-Token": token})
        assert_sentence(answer, 502, "no coordinator knows")


def test_localhost_console_answers_only_to_localhost_names(console):
    with client(console.url) as http:
        assert http.get("/topics", headers={"Host": "rebound.example:80"}).status_code == 421
        assert http.get("/topics", headers={"Host": "localhost:1"}).status_code == 200


def test_malformed_urls_are_answered_with_a_sentence(console, console_broker):
    topic = create_topic(console_broker.bootstrap_servers, unique("console-bad"))
    base = f"/topics/{topic}/0/records"
    with client(console.url) as http:
        assert_sentence(http.get(f"{base}?offset=abc"), 400, "offset must be a whole number")
        assert_sentence(http.get(f"{base}?offset=-5"), 400, "offset must be between 0")
        assert_sentence(http.get(f"{base}?offset=99999999999999999999"), 400)
        assert_sentence(http.get(f"{base}?timestamp=yesterday"), 400, "ISO 8601")
        assert_sentence(http.get(f"{base}?isolation=dirty"), 400, "isolation must be")
        assert_sentence(http.get(f"{base}?offset=7"), 404, "outside", "empty")
        assert_sentence(http.get(f"/topics/{topic}/x/records"), 400, "partition must be")
        assert_sentence(http.get(f"/topics/{topic}/3"), 404, "has no partition 3")
        assert_sentence(http.get("/topics/no-such-topic"), 404, "unknown topic")
        assert_sentence(http.get("/groups/no-such-group"), 404, "unknown group")
        token = csrf_of(http)
        reset = http.post(f"/groups/{unique('g')}/reset", data={"strategy": "offset", "value": "x"},
                          headers={"X-CSRF-Token": token})
        assert_sentence(reset, 400, "value must be a whole number")


def test_binary_and_large_records_are_capped_with_show_more(console, console_broker):
    bootstrap = console_broker.bootstrap_servers
    topic = create_topic(bootstrap, unique("console-big"))
    producer = Producer({"bootstrap.servers": bootstrap})
    large = ("x" * 600_000).encode()
    producer.produce(topic, value=bytes(range(256)), key=b"\xff\x00", partition=0)
    producer.produce(topic, value=large, partition=0, headers=[("h", b"\x01\x02")])
    assert producer.flush(TIMEOUT_S) == 0
    with client(console.url) as http:
        page = http.get(f"/topics/{topic}/0/records?offset=0")
        assert page.status_code == 200
        assert "00000000  00 01 02 03" in page.text          # hex dump of the binary value
        assert "show more (585.9 KiB)" in page.text
        assert len(page.text) < 100_000                         # capped, not 600 KB
        more = http.get(f"/topics/{topic}/0/records/1", headers={"HX-Request": "true"})
        assert more.status_code == 200 and more.text.count("x") >= len(large)


def test_abort_of_a_transaction_that_has_just_completed_is_refused(console, console_broker):
    bootstrap = console_broker.bootstrap_servers
    topic = create_topic(bootstrap, unique("console-done"))
    transactional_id = f"done-{uuid.uuid4().hex[:8]}"
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": transactional_id})
    producer.init_transactions(TIMEOUT_S)
    producer.begin_transaction()
    producer.produce(topic, value=b"v", partition=0)
    producer.flush(TIMEOUT_S)
    with client(console.url) as http:
        token = csrf_of(http)
        confirm = http.get(f"/transactions/{transactional_id}/abort")
        ids = re.search(r'name="producer_id" value="(\d+)".*name="producer_epoch" value="(\d+)"',
                        confirm.text, re.DOTALL)
        assert ids, confirm.text
        producer.commit_transaction(TIMEOUT_S)       # it completes while the page asks
        answer = http.post(f"/transactions/{transactional_id}/abort",
                           data={"producer_id": ids.group(1), "producer_epoch": ids.group(2)},
                           headers={"X-CSRF-Token": token, "HX-Request": "true"})
        assert_sentence(answer, 502, "has no open transaction any more", "nothing was aborted")
    producer.begin_transaction()                      # not fenced: it goes on working
    producer.produce(topic, value=b"w", partition=0)
    producer.commit_transaction(TIMEOUT_S)


def test_an_unreachable_cluster_is_a_message_not_a_hang():
    with running_console(f"127.0.0.1:{free_port()}") as running, client(running.url) as http:
        for path in ("/", "/topics", "/transactions", "/groups", "/topics/t/0/records"):
            started = time.monotonic()
            answer = http.get(path)
            assert_sentence(answer, 502, "cannot reach a broker")
            assert time.monotonic() - started < HTTP_TIMEOUT_S


def test_event_stream_sends_fragments_and_stops_with_the_client(console_broker):
    bootstrap = console_broker.bootstrap_servers
    topic = create_topic(bootstrap, unique("console-sse"))
    producer = Producer({"bootstrap.servers": bootstrap})
    for _ in range(3):
        producer.produce(topic, value=b"v", partition=0)
    assert producer.flush(TIMEOUT_S) == 0
    with running_console(bootstrap) as console, client(console.url) as http:
        streams = console.app.state.console.streams   # this console's only visitor: us
        read_one_event(http, topic, streams)
        deadline = time.monotonic() + TIMEOUT_S
        while streams.open and time.monotonic() < deadline:   # the server saw the close
            time.sleep(0.1)
        assert streams.open == 0


def read_one_event(http: httpx.Client, topic: str, streams) -> None:
    with http.stream("GET", f"/events/topics/{topic}/0/ends?hw=1") as events:
        assert events.headers["content-type"].startswith("text/event-stream")
        lines = []
        # The generator is kept referenced until the end of the block: one abandoned by a
        # `break` is closed when collected, and closing it closes the HTTP connection, so
        # the server could count the stream closed before `streams.open == 1` below.
        reader = events.iter_lines()
        for line in reader:
            lines.append(line)
            if line == "" and any(x.startswith("data:") for x in lines):
                break
        assert "event: partitions" in lines
        data = " ".join(x.removeprefix("data: ") for x in lines if x.startswith("data:"))
        assert 'id="records-hw">3<' in data and "2 offsets written since" in data
        assert streams.open == 1
        reader.close()
