"""JoinGroup / SyncGroup / Heartbeat / LeaveGroup against the fake broker and clock."""

from kio.schema.errors import ErrorCode

from onceflow.groups import JoinProtocol, MemberIdentity
from tests.groups.harness import FAST, RANGE, REBALANCE_MS, SESSION_MS, FakeBroker

E = ErrorCode
G = "orders-processor"


def test_full_round_with_three_members():
    b = FakeBroker()
    boxes = [b.join_dynamic(G, client_id=f"c{i}") for i in range(3)]
    assert b.state(G) == "PreparingRebalance"
    assert not any(box.done for box in boxes)  # held during the initial delay
    b.advance(FAST.group_initial_rebalance_delay_ms)
    # members arrived during the delay: Kafka waits one more delay for stragglers
    assert not any(box.done for box in boxes)
    b.advance(FAST.group_initial_rebalance_delay_ms - 1)
    assert not any(box.done for box in boxes)
    b.advance(1)
    joins = [box.value for box in boxes]
    assert {j.error for j in joins} == {E.none}
    assert {j.generation_id for j in joins} == {1}
    assert {j.protocol_name for j in joins} == {"range"}
    assert {j.protocol_type for j in joins} == {"consumer"}
    leaders = {j.leader for j in joins}
    assert len(leaders) == 1
    leader = next(j for j in joins if j.member_id in leaders)
    assert [m.member_id for m in leader.members] == [j.member_id for j in joins]
    assert all(not j.members for j in joins if j is not leader)
    assert [j.member_id for j in joins] == ["c0-uuid1", "c1-uuid2", "c2-uuid3"]
    assert b.state(G) == "CompletingRebalance"

    followers = [b.sync(G, 1, j.member_id) for j in joins if j is not leader]
    assert not any(f.done for f in followers)  # followers wait for the leader
    assert b.heartbeat(G, 1, joins[1].member_id) is E.none
    assignment = {j.member_id: j.member_id.encode() for j in joins}
    lead = b.sync(G, 1, leader.member_id, assignment)
    others = [j for j in joins if j is not leader]
    for box, j in zip([lead, *followers], [leader, *others], strict=True):
        assert box.value.error is E.none
        assert box.value.assignment == j.member_id.encode()
        assert box.value.protocol_name == "range"
    assert b.state(G) == "Stable"
    described = b.coord.describe_groups([G])[0]
    assert described.protocol_data == "range"
    assert [m.member_assignment for m in described.members] == list(assignment.values())
    assert described.members[0].member_metadata == b"range-meta"
    # a follower's SyncGroup in Stable returns its assignment again
    again = b.sync(G, 1, joins[2].member_id)
    assert again.value.assignment == joins[2].member_id.encode()


def test_member_id_required_round_trip_and_pending_expiry():
    b = FakeBroker()
    first = b.join(G).value
    assert first.error is E.member_id_required
    assert first.member_id == "client-uuid1" and first.generation_id == -1 and first.leader == ""
    assert b.state(G) == "Empty"
    # the handed-out id expires after the session timeout if the client never returns
    b.advance(SESSION_MS)
    late = b.join(G, first.member_id).value
    assert late.error is E.unknown_member_id
    # a v3 client joins at once without the round trip
    box = b.join(G, api_version=3)
    b.advance(FAST.group_initial_rebalance_delay_ms)
    assert box.value.error is E.none and box.value.member_id == "client-uuid2"


def test_protocol_selection_by_votes_and_inconsistent_protocols():
    b = FakeBroker()
    rr = JoinProtocol("roundrobin", b"rr")
    sticky = JoinProtocol("sticky", b"st")
    boxes = [b.join_dynamic(G, protocols=(RANGE, rr)),
             b.join_dynamic(G, protocols=(rr, RANGE, sticky)),
             b.join_dynamic(G, protocols=(rr, sticky, RANGE))]
    bad = b.join(G, protocols=(sticky,))  # not supported by everyone
    assert bad.value.error is E.inconsistent_group_protocol
    other_type = b.join(G, protocol_type="connect")
    assert other_type.value.error is E.inconsistent_group_protocol
    b.settle(*boxes)
    assert {box.value.protocol_name for box in boxes} == {"roundrobin"}  # 2 votes to 1


def test_heartbeat_errors():
    b = FakeBroker()
    j1, j2 = b.form_group(G, 2)
    assert b.heartbeat(G, 1, j1.member_id) is E.none
    assert b.heartbeat(G, 0, j1.member_id) is E.illegal_generation
    assert b.heartbeat(G, 1, "nobody") is E.unknown_member_id
    assert b.heartbeat("no-such-group", 1, "x") is E.unknown_member_id
    assert b.heartbeat("", 1, "x") is E.invalid_group_id
    b.join(G, j1.member_id)  # a known member rejoins: rebalance
    assert b.state(G) == "PreparingRebalance"
    assert b.heartbeat(G, 1, j2.member_id) is E.rebalance_in_progress
    assert b.heartbeat(G, 2, j2.member_id) is E.illegal_generation


def test_session_expiry_with_fake_clock():
    b = FakeBroker()
    j1, j2, j3 = b.form_group(G, 3)
    for _ in range(2):  # j1 and j2 keep heartbeating, j3 went silent
        b.advance(SESSION_MS // 3)
        assert b.heartbeat(G, 1, j1.member_id) is E.none
        assert b.heartbeat(G, 1, j2.member_id) is E.none
    assert b.state(G) == "Stable"
    b.advance(SESSION_MS - 2 * (SESSION_MS // 3) - 1)
    assert b.state(G) == "Stable"  # one ms before j3's session ends
    b.advance(1)
    assert b.state(G) == "PreparingRebalance"  # j3 expired
    assert b.heartbeat(G, 1, j3.member_id) is E.unknown_member_id
    assert b.heartbeat(G, 1, j1.member_id) is E.rebalance_in_progress
    r1, r2 = b.join(G, j1.member_id), b.join(G, j2.member_id)
    # everyone left has rejoined: the join phase completes without waiting
    assert r1.value.generation_id == 2 and r2.value.generation_id == 2
    assert len(r1.value.members or r2.value.members) == 2


def test_rebalance_timeout_drops_dynamic_members_that_do_not_rejoin():
    b = FakeBroker()
    j1, j2 = b.form_group(G, 2, rebalance_ms=5_000)
    box = b.join(G, j1.member_id, rebalance_ms=5_000)
    assert not box.done
    b.advance(2_500)
    assert b.heartbeat(G, 1, j2.member_id) is E.rebalance_in_progress  # alive but not rejoining
    b.advance(2_500)
    assert box.value.generation_id == 2 and len(box.value.members) == 1
    assert b.heartbeat(G, 1, j2.member_id) is E.unknown_member_id


def test_member_that_does_not_sync_is_removed_after_the_rebalance_timeout():
    b = FakeBroker()
    boxes = [b.join_dynamic(G, rebalance_ms=5_000) for _ in range(2)]
    b.settle(*boxes)
    leader = next(x.value for x in boxes if x.value.members)
    follower = next(x.value for x in boxes if not x.value.members)
    lead = b.sync(G, 1, leader.member_id, {leader.member_id: b"a", follower.member_id: b"b"})
    assert lead.value.assignment == b"a"
    b.advance(5_000)  # the follower never sent SyncGroup
    assert b.state(G) in ("PreparingRebalance", "CompletingRebalance")
    assert b.heartbeat(G, 1, follower.member_id) is E.unknown_member_id


def test_leave_group_batch():
    b = FakeBroker()
    j1, j2, j3 = b.form_group(G, 3)
    result = b.persist(b.coord.leave_group(group_id=G, members=[
        MemberIdentity(j1.member_id), MemberIdentity(j2.member_id), MemberIdentity("ghost"),
    ], now_ms=b.now_ms))
    assert result.error is E.none
    assert [m.error for m in result.members] == [E.none, E.none, E.unknown_member_id]
    assert b.state(G) == "PreparingRebalance"
    box = b.join(G, j3.member_id)
    assert box.value.generation_id == 2
    assert [m.member_id for m in box.value.members] == [j3.member_id]
    # the last member leaves: the group becomes Empty (and that is written down)
    b.leave(G, j3.member_id)
    assert b.state(G) == "Empty"
    unknown = b.persist(b.coord.leave_group(group_id="nope", members=[MemberIdentity("x")],
                                            now_ms=b.now_ms))
    assert unknown.error is E.none and unknown.members[0].error is E.unknown_member_id


def test_initial_delay_is_extended_by_new_members_up_to_the_rebalance_timeout():
    config = FAST.__class__(group_initial_rebalance_delay_ms=1_000, group_min_session_timeout_ms=10)
    b = FakeBroker(config)
    start_ms = b.now_ms
    first = b.join_dynamic(G, rebalance_ms=2_500)
    while not first.done:  # a new member every 900 ms keeps extending the delay...
        b.advance(100)
        if (b.now_ms - start_ms) % 900 == 0:
            b.join_dynamic(G, rebalance_ms=2_500)
    # ...but not past the rebalance timeout: delays of 1000, 1000, then the last 500 ms
    assert b.now_ms - start_ms == 2_500
    assert first.value.generation_id == 1 and len(first.value.members) == 3


def test_static_member_restart_keeps_its_assignment_without_rebalance():
    b = FakeBroker()
    a = b.join(G, instance="a", client_id="ca")
    c = b.join(G, instance="c", client_id="cc")
    b.settle(a, c)
    ja, jc = a.value, c.value
    assert ja.member_id == "a-uuid1"  # static members skip MEMBER_ID_REQUIRED
    leader, follower = (ja, jc) if ja.members else (jc, ja)
    b.sync(G, 1, leader.member_id, {ja.member_id: b"A", jc.member_id: b"C"},
           instance="a" if leader is ja else "c")
    b.sync(G, 1, follower.member_id, instance="a" if follower is ja else "c")
    assert b.state(G) == "Stable"

    # "a" restarts within its session: unknown member id, same instance id
    restarted = b.join(G, instance="a", client_id="ca").value
    assert restarted.error is E.none
    assert restarted.member_id == "a-uuid3" and restarted.generation_id == 1
    assert b.state(G) == "Stable"  # no rebalance
    assert restarted.skip_assignment is (leader is ja)  # v9: the leader skips the assignor
    assert b.sync(G, 1, restarted.member_id, instance="a").value.assignment == b"A"
    assert b.heartbeat(G, 1, jc.member_id, "c") is E.none  # the others did not notice
    # the old incarnation is fenced
    assert b.heartbeat(G, 1, ja.member_id, "a") is E.fenced_instance_id
    assert b.join(G, ja.member_id, instance="a").value.error is E.fenced_instance_id
    assert b.sync(G, 1, ja.member_id, instance="a").value.error is E.fenced_instance_id
    # and the new member id is durable: a restarted broker knows it
    b2 = b.restarted()
    assert b2.heartbeat(G, 1, restarted.member_id, "a") is E.none
    assert b2.heartbeat(G, 1, ja.member_id, "a") is E.fenced_instance_id


def test_static_member_with_changed_protocols_triggers_rebalance():
    b = FakeBroker()
    a = b.join(G, instance="a")
    b.advance(FAST.group_initial_rebalance_delay_ms)
    b.sync(G, 1, a.value.member_id, {a.value.member_id: b"x"}, instance="a")
    rr = JoinProtocol("roundrobin", b"rr")
    # Kafka checks the new protocols against the current members first, so a lone member
    # must still list the old protocol; preferring another one changes the selection
    assert b.join(G, instance="a", protocols=(rr,)).value.error is E.inconsistent_group_protocol
    box = b.join(G, instance="a", protocols=(rr, RANGE))
    assert box.value.generation_id == 2 and box.value.protocol_name == "roundrobin"


def test_static_rejoin_append_failure_reverts():
    b = FakeBroker()
    a = b.join(G, instance="a")
    b.advance(FAST.group_initial_rebalance_delay_ms)
    b.sync(G, 1, a.value.member_id, {a.value.member_id: b"x"}, instance="a")
    b.fail_next.append(E.not_leader_or_follower)
    failed = b.join(G, instance="a").value
    assert failed.error is E.not_coordinator and failed.member_id == ""
    assert b.heartbeat(G, 1, a.value.member_id, "a") is E.none  # old id still valid


def test_leader_sync_append_failure_fails_the_generation():
    b = FakeBroker()
    boxes = [b.join_dynamic(G) for _ in range(2)]
    b.settle(*boxes)
    leader = next(x.value for x in boxes if x.value.members)
    follower = next(x.value for x in boxes if not x.value.members)
    waiting = b.sync(G, 1, follower.member_id)
    b.fail_next.append(E.kafka_storage_error)
    lead = b.sync(G, 1, leader.member_id, {})
    assert lead.value.error is E.not_coordinator and waiting.value.error is E.not_coordinator
    assert b.state(G) == "PreparingRebalance"


def test_sync_group_errors():
    b = FakeBroker()
    j1, _ = b.form_group(G, 2)
    assert b.sync(G, 0, j1.member_id).value.error is E.illegal_generation
    assert b.sync(G, 1, "ghost").value.error is E.unknown_member_id
    assert b.sync("nope", 1, "ghost").value.error is E.unknown_member_id
    b.join(G, j1.member_id)
    assert b.sync(G, 1, j1.member_id).value.error is E.rebalance_in_progress


def test_group_max_size():
    b = FakeBroker(FAST.__class__(group_initial_rebalance_delay_ms=100,
                                  group_min_session_timeout_ms=10, group_max_size=2))
    b.form_group(G, 2)
    third = b.join(G).value
    assert third.error is E.group_max_size_reached


def test_unload_answers_waiters_and_later_requests():
    b = FakeBroker()
    box = b.join_dynamic(G)
    partition = b.coord.partition_for(G)
    b.coord.unload_partition(partition, b.now_ms)
    assert box.value.error is E.not_coordinator
    assert b.join(G).value.error is E.not_coordinator
    b.coord.begin_loading(partition)
    assert b.heartbeat(G, 1, "m") is E.none  # Kafka answers blindly while loading
    assert b.sync(G, 1, "m").value.error is E.rebalance_in_progress
    assert b.join(G).value.error is E.coordinator_load_in_progress


def test_invalid_session_timeout():
    b = FakeBroker()
    assert b.join(G, session_ms=1).value.error is E.invalid_session_timeout
    assert b.join(G, session_ms=FAST.group_max_session_timeout_ms + 1).value.error \
        is E.invalid_session_timeout


def test_new_member_join_request_expires():
    b = FakeBroker()
    j1, j2 = b.form_group(G, 2, rebalance_ms=REBALANCE_MS * 100)
    newcomer = b.join_dynamic(G, rebalance_ms=REBALANCE_MS * 100)
    assert not newcomer.done
    # j1 and j2 stay alive but never rejoin, which keeps the rebalance open for long;
    # the newcomer's own JoinGroup is bounded by the new-member join timeout
    waited = 0
    while not newcomer.done:
        b.advance(SESSION_MS // 2)
        waited += SESSION_MS // 2
        assert b.heartbeat(G, 1, j1.member_id) is E.rebalance_in_progress
        assert b.heartbeat(G, 1, j2.member_id) is E.rebalance_in_progress
    assert newcomer.value.error is E.unknown_member_id
    assert waited == FAST.new_member_join_timeout_ms
