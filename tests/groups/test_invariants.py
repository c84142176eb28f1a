"""Properties over random client behaviour, plus prepare-does-not-mutate checks.

Random sequences of joins (dynamic and static), rejoins, syncs, heartbeats, leaves,
commits, failed appends and clock jumps must never answer a request twice, must answer
every request once enough time has passed, and a restart must always give back exactly
the committed offsets.
"""

from hypothesis import given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode

from onceflow.groups import JoinProtocol
from onceflow.groups.state import GroupState
from onceflow.groups.timers import Timers
from tests.groups.harness import FAST, RANGE, SESSION_MS, FakeBroker

E = ErrorCode
GROUPS = ("g1", "g2")
ROUNDROBIN = JoinProtocol("roundrobin", b"rr")

op = st.one_of(
    st.tuples(st.just("join"), st.sampled_from(GROUPS), st.sampled_from([None, "i1", "i2"]),
              st.sampled_from([3, 9])),
    st.tuples(st.just("rejoin"), st.integers(0, 20), st.booleans()),
    st.tuples(st.just("sync"), st.integers(0, 20)),
    st.tuples(st.just("heartbeat"), st.integers(0, 20)),
    st.tuples(st.just("leave"), st.integers(0, 20)),
    st.tuples(st.just("commit"), st.integers(0, 20), st.integers(0, 100)),
    st.tuples(st.just("fail-next"), st.sampled_from([E.not_leader_or_follower,
                                                     E.not_enough_replicas])),
    st.tuples(st.just("advance"), st.sampled_from([1, 50, 100, 3_000, SESSION_MS])),
)


class Client:
    """What a client knows after its last JoinGroup answer."""

    def __init__(self, group: str, instance: str | None) -> None:
        self.group, self.instance = group, instance
        self.member_id, self.generation = "", -1

    def learn(self, answer) -> None:
        if answer.error is E.none:
            self.member_id, self.generation = answer.member_id, answer.generation_id
        elif answer.error is E.member_id_required:
            self.member_id = answer.member_id


def run(b: FakeBroker, ops, clients, boxes) -> None:
    for step in ops:
        kind = step[0]
        client = clients[step[1] % len(clients)] if clients and isinstance(step[1], int) else None
        if kind == "join":
            clients.append(Client(step[1], step[2]))
            box = b.join(step[1], instance=step[2], api_version=step[3])
            boxes.append((clients[-1], box))
        elif kind == "rejoin" and client is not None:
            protocols = (ROUNDROBIN, RANGE) if step[2] else (RANGE,)
            box = b.join(client.group, client.member_id, instance=client.instance,
                         protocols=protocols)
            boxes.append((client, box))
        elif kind == "sync" and client is not None:
            boxes.append((None, b.sync(client.group, client.generation, client.member_id,
                                       {client.member_id: b"x"}, instance=client.instance)))
        elif kind == "heartbeat" and client is not None:
            b.heartbeat(client.group, client.generation, client.member_id, client.instance)
        elif kind == "leave" and client is not None:
            b.leave(client.group, client.member_id)
        elif kind == "commit" and client is not None:
            b.commit(client.group, {("t", 0): step[2]}, generation=client.generation,
                     member_id=client.member_id, instance=client.instance)
        elif kind == "fail-next":
            b.fail_next.append(step[1])
        elif kind == "advance":
            b.advance(step[1])
        for owner, box in boxes:
            assert len(box.answers) <= 1, box.answers
            if owner is not None and box.answers and not getattr(box, "seen", False):
                owner.learn(box.answers[0])
                box.seen = True


@settings(max_examples=250, deadline=None)
@given(st.lists(op, max_size=40))
def test_every_request_is_answered_exactly_once(ops):
    b = FakeBroker()
    clients: list[Client] = []
    boxes: list = []
    run(b, ops, clients, boxes)
    b.fail_next.clear()
    for _ in range(4):  # long enough for every session, rebalance and join to time out
        b.advance(FAST.new_member_join_timeout_ms)
    assert all(len(box.answers) == 1 for _, box in boxes), [box.answers for _, box in boxes]
    for group_id in GROUPS:
        group = b.coord._group(group_id)
        assert group is None or group.state in (GroupState.EMPTY, GroupState.DEAD)
    before = {g: b.fetch(g) for g in GROUPS}
    assert {g: b.restarted().fetch(g) for g in GROUPS} == before


@settings(max_examples=100, deadline=None)
@given(st.lists(op, max_size=30))
def test_restart_at_any_point_gives_back_the_committed_offsets(ops):
    b = FakeBroker()
    run(b, ops, [], [])
    before = {g: b.fetch(g) for g in GROUPS}
    assert {g: b.restarted().fetch(g) for g in GROUPS} == before


def test_prepared_commit_is_invisible_until_complete():
    b = FakeBroker()
    b.commit("g", {("t", 0): 1})
    result = b.coord.offset_commit(group_id="g", generation_id=-1, member_id="",
                                   group_instance_id=None, topics=[], api_version=8,
                                   now_ms=b.now_ms)
    assert result.appends == ()
    from tests.groups.harness import topics
    result = b.coord.offset_commit(group_id="g", generation_id=-1, member_id="",
                                   group_instance_id=None, topics=topics({("t", 0): 2}),
                                   api_version=8, now_ms=b.now_ms)
    assert len(result.appends) == 1 and b.fetch("g")[("t", 0)][0] == 1  # not yet
    # the broker crashes before the append is durable: the restart does not know it
    assert b.restarted().fetch("g")[("t", 0)][0] == 1
    b.persist(result)
    assert b.fetch("g")[("t", 0)][0] == 2


def test_loaded_members_that_never_return_leave_an_empty_group():
    b = FakeBroker()
    b.form_group("g", 2)
    r = b.restarted()
    assert r.state("g") == "Stable"
    assert r.coord.next_deadline_ms() == r.now_ms + SESSION_MS
    r.advance(SESSION_MS)
    assert r.state("g") == "Empty"
    assert r.restarted().state("g") == "Empty"  # and that was written down


def test_static_member_admin_removal_and_unknown_instance():
    b = FakeBroker()
    a = b.join("g", instance="a")
    b.settle(a)
    assert b.join("g", "made-up", instance="zzz").value.error is E.unknown_member_id
    result = b.persist(b.coord.leave_group(
        group_id="g", members=[type("M", (), {"member_id": "", "group_instance_id": "a"})()],
        now_ms=b.now_ms))
    assert result.members[0].error is E.none
    assert b.state("g") == "Empty"


def test_timers():
    t = Timers()
    t.schedule("a", 10)
    t.schedule("b", 5)
    t.schedule("a", 20)  # replaces
    assert t.next_deadline_ms() == 5
    due = t.due(15)
    assert [k for k, _ in due] == ["b"] and all(t.claim(k, s) for k, s in due)
    t.cancel("a")
    assert t.due(100) == [] and t.next_deadline_ms() is None and len(t) == 0
    for i in range(10_000):  # stale entries are compacted away
        t.schedule("hot", i)
    assert len(t._heap) < 10_000
