"""OffsetCommit / OffsetFetch / OffsetDelete / DeleteGroups / ListGroups, recovery by
replay, and transactional offsets (KIP-447)."""

from kio.schema.errors import ErrorCode

from onceflow.groups import TopicPartitions
from tests.groups.harness import FAST, FakeBroker, errors_of, topics

E = ErrorCode
G = "payments"
T = "orders"


def fetch_offsets(b: FakeBroker, group: str = G, **kw) -> dict:
    return {tp: v[0] for tp, v in b.fetch(group, **kw).items()}


def test_commit_and_fetch_round_trip_metadata_and_leader_epoch():
    b = FakeBroker()
    j1, _ = b.form_group(G, 2)
    response = b.commit(G, {(T, 0): 10, (T, 1): 20, ("audit", 0): 5}, generation=1,
                        member_id=j1.member_id, metadata="host=a;v=2", leader_epoch=7)
    assert errors_of(response) == {E.none}
    everything = b.fetch(G)  # topics null: every partition with a committed offset
    meta = "host=a;v=2"
    assert everything == {(T, 0): (10, 7, meta, E.none), (T, 1): (20, 7, meta, E.none),
                          ("audit", 0): (5, 7, meta, E.none)}
    some = b.fetch(G, [TopicPartitions(T, (1, 2))])
    assert some == {(T, 1): (20, 7, "host=a;v=2", E.none), (T, 2): (-1, -1, "", E.none)}
    assert b.fetch("unknown-group", [TopicPartitions(T, (0,))]) == {(T, 0): (-1, -1, "", E.none)}
    assert b.fetch("unknown-group") == {}
    b.commit(G, {(T, 0): 11}, generation=1, member_id=j1.member_id, metadata=None)
    assert b.fetch(G)[(T, 0)] == (11, -1, "", E.none)  # null metadata is stored as ""


def test_commit_from_an_old_generation_is_rejected():
    b = FakeBroker()
    j1, j2 = b.form_group(G, 2)
    assert errors_of(b.commit(G, {(T, 0): 1}, generation=1, member_id=j2.member_id)) == {E.none}
    b.join(G, j1.member_id)  # rebalance: commits of generation 1 still pass while preparing
    assert errors_of(b.commit(G, {(T, 0): 2}, generation=1, member_id=j2.member_id)) == {E.none}
    rejoined = b.join(G, j2.member_id).value
    assert rejoined.generation_id == 2
    # CompletingRebalance: a current member must finish its SyncGroup first
    assert errors_of(b.commit(G, {(T, 0): 3}, generation=2, member_id=j2.member_id)) \
        == {E.rebalance_in_progress}
    b.sync(G, 2, j1.member_id, {j1.member_id: b"", j2.member_id: b""})
    assert errors_of(b.commit(G, {(T, 0): 4}, generation=1, member_id=j2.member_id)) \
        == {E.illegal_generation}  # the zombie of generation 1
    assert errors_of(b.commit(G, {(T, 0): 4}, generation=2, member_id="ghost")) \
        == {E.unknown_member_id}
    assert errors_of(b.commit(G, {(T, 0): 4}, generation=-1)) == {E.unknown_member_id}
    assert fetch_offsets(b) == {(T, 0): 2}


def test_standalone_commits_with_generation_minus_one():
    b = FakeBroker()
    assert errors_of(b.commit("simple", {(T, 0): 42})) == {E.none}
    assert fetch_offsets(b, "simple") == {(T, 0): 42}
    listed = {g.group_id: g for g in b.coord.list_groups().groups}
    assert listed["simple"].group_state == "Empty" and listed["simple"].protocol_type == ""
    # a generation of a group that does not exist: stale member (v9+: group not found)
    assert errors_of(b.commit("nope", {(T, 0): 1}, generation=3, member_id="m")) \
        == {E.illegal_generation}
    assert errors_of(b.commit("nope", {(T, 0): 1}, generation=3, member_id="m", api_version=9)) \
        == {E.group_id_not_found}


def test_metadata_too_large_and_append_failure():
    b = FakeBroker()
    big = "x" * (FAST.offset_metadata_max_bytes + 1)
    assert errors_of(b.commit(G, {(T, 0): 1}, metadata=big)) == {E.offset_metadata_too_large}
    b.fail_next.append(E.not_enough_replicas)
    assert errors_of(b.commit(G, {(T, 0): 1})) == {E.coordinator_not_available}
    assert fetch_offsets(b) == {}


def test_fetch_after_replay_equals_before():
    """Recovery by replay: a restarted coordinator (same log) answers the same."""
    b = FakeBroker()
    j1, j2, j3 = b.form_group(G, 3)
    for i in range(50):
        b.commit(G, {(T, i % 6): 100 + i}, generation=1, member_id=j1.member_id,
                 metadata=f"m{i}", leader_epoch=i % 3)
    b.commit("standalone", {("other", 0): 7})
    b.commit(G, {("gone", 0): 1}, generation=1, member_id=j1.member_id)
    b.persist(b.coord.offset_delete(group_id=G, topics=topics({("gone", 0): 0}), now_ms=b.now_ms))
    before = (b.fetch(G), b.fetch("standalone"), b.coord.describe_groups([G, "standalone"]))
    after_b = b.restarted()
    after = (after_b.fetch(G), after_b.fetch("standalone"),
             after_b.coord.describe_groups([G, "standalone"]))
    assert after == before
    assert after[2][0].group_state == "Stable" and len(after[2][0].members) == 3
    # the members' sessions continue on the restarted coordinator
    assert after_b.heartbeat(G, 1, j2.member_id) is E.none
    assert errors_of(after_b.commit(G, {(T, 0): 999}, generation=1, member_id=j3.member_id)) \
        == {E.none}


def test_transactional_offsets_are_pending_until_commit_marker():
    b = FakeBroker()
    j1, _ = b.form_group(G, 2)
    partition = b.coord.partition_for(G)
    b.commit(G, {(T, 0): 5}, generation=1, member_id=j1.member_id)
    response = b.txn_commit(G, 1000, {(T, 0): 9, (T, 1): 3}, generation=1, member_id=j1.member_id)
    assert errors_of(response) == {E.none}
    assert b.logs[partition][-1].producer_id == 1000  # appended as the producer's batch
    assert fetch_offsets(b) == {(T, 0): 5}  # invisible
    stable = b.fetch(G, [TopicPartitions(T, (0, 1, 2))], require_stable=True)
    assert stable[(T, 0)] == (-1, -1, "", E.unstable_offset_commit)
    assert stable[(T, 1)] == (-1, -1, "", E.unstable_offset_commit)
    assert stable[(T, 2)] == (-1, -1, "", E.none)
    # a restart while the transaction is open keeps the offsets pending
    assert fetch_offsets(b.restarted()) == {(T, 0): 5}
    b.write_marker(partition, 1000, commit=True)
    assert fetch_offsets(b) == {(T, 0): 9, (T, 1): 3}
    assert b.fetch(G, require_stable=True)[(T, 0)][3] is E.none
    assert fetch_offsets(b.restarted()) == {(T, 0): 9, (T, 1): 3}


def test_transactional_offsets_are_dropped_on_abort():
    b = FakeBroker()
    partition = b.coord.partition_for(G)
    b.commit(G, {(T, 0): 5})
    b.txn_commit(G, 7, {(T, 0): 9})
    b.write_marker(partition, 7, commit=False)
    assert fetch_offsets(b) == {(T, 0): 5}
    assert b.fetch(G, require_stable=True)[(T, 0)][3] is E.none
    assert fetch_offsets(b.restarted()) == {(T, 0): 5}


def test_newer_plain_commit_wins_over_older_transactional_record():
    """Kafka materializes a committed transactional offset only if its record is newer."""
    b = FakeBroker()
    partition = b.coord.partition_for(G)
    b.txn_commit(G, 7, {(T, 0): 9})
    b.commit(G, {(T, 0): 12})
    b.write_marker(partition, 7, commit=True)
    assert fetch_offsets(b) == {(T, 0): 12}
    assert fetch_offsets(b.restarted()) == {(T, 0): 12}


def test_txn_offset_commit_is_fenced_by_generation_kip_447():
    b = FakeBroker()
    j1, j2 = b.form_group(G, 2)
    b.join(G, j1.member_id)
    b.join(G, j2.member_id)
    b.sync(G, 2, j1.member_id, {})
    assert errors_of(b.txn_commit(G, 1, {(T, 0): 1}, generation=1, member_id=j1.member_id)) \
        == {E.illegal_generation}
    assert errors_of(b.txn_commit(G, 1, {(T, 0): 1}, generation=2, member_id="zombie")) \
        == {E.unknown_member_id}
    assert errors_of(b.txn_commit(G, 1, {(T, 0): 1}, generation=2, member_id=j1.member_id)) \
        == {E.none}
    assert errors_of(b.txn_commit("unknown", 1, {(T, 0): 1}, generation=2, member_id="m")) \
        == {E.illegal_generation}


def test_txn_offset_commit_fenced_instance():
    b = FakeBroker()
    a = b.join(G, instance="a")
    b.settle(a)
    b.sync(G, 1, a.value.member_id, {a.value.member_id: b""}, instance="a")
    new = b.join(G, instance="a").value  # the instance restarted elsewhere
    assert errors_of(b.txn_commit(G, 1, {(T, 0): 1}, generation=1, member_id=a.value.member_id,
                                  instance="a")) == {E.fenced_instance_id}
    assert errors_of(b.txn_commit(G, 1, {(T, 0): 1}, generation=1, member_id=new.member_id,
                                  instance="a")) == {E.none}


def test_offset_delete():
    b = FakeBroker()
    j1, _ = b.form_group(G, 2)  # "consumer" protocol with an unparseable subscription
    b.commit(G, {(T, 0): 1, ("old", 0): 2}, generation=1, member_id=j1.member_id)
    busy = b.delete_offsets(G, {("old", 0): 0})
    assert errors_of(busy) == {E.group_subscribed_to_topic}  # unknown subscription: all subscribed
    b.leave(G, *[m.member_id for m in b.coord.describe_groups([G])[0].members])
    assert b.state(G) == "Empty"
    done = b.delete_offsets(G, {("old", 0): 0})
    assert done.error is E.none and errors_of(done) == {E.none}
    assert fetch_offsets(b) == {(T, 0): 1}
    missing = b.persist(b.coord.offset_delete(group_id="nope", topics=topics({(T, 0): 0}),
                                              now_ms=b.now_ms))
    assert missing.error is E.group_id_not_found


def test_offset_delete_respects_parsed_subscriptions():
    import struct
    subscription = struct.pack(">hih", 1, 1, len(T)) + T.encode() + struct.pack(">i", -1)
    from onceflow.groups import JoinProtocol
    b = FakeBroker()
    j1, _ = b.form_group(G, 2, protocols=(JoinProtocol("range", subscription),))
    b.commit(G, {(T, 0): 1, ("old", 0): 2}, generation=1, member_id=j1.member_id)
    result = b.persist(b.coord.offset_delete(group_id=G, topics=topics({(T, 0): 0, ("old", 0): 0}),
                                             now_ms=b.now_ms))
    assert {t.name: t.partitions[0].error for t in result.topics} \
        == {T: E.group_subscribed_to_topic, "old": E.none}
    assert fetch_offsets(b) == {(T, 0): 1}


def test_delete_groups_and_list_groups():
    b = FakeBroker()
    b.form_group("busy", 1)
    b.commit("idle", {(T, 0): 3})
    listed = b.coord.list_groups()
    assert {(g.group_id, g.group_state) for g in listed.groups} \
        == {("busy", "Stable"), ("idle", "Empty")}
    assert [g.group_id for g in b.coord.list_groups(["STABLE"]).groups] == ["busy"]
    assert b.coord.list_groups(types_filter=["consumer"]).groups == ()
    response = b.persist(b.coord.delete_groups(["busy", "idle", "never"], b.now_ms))
    assert [(r.group_id, r.error) for r in response] == [
        ("busy", E.non_empty_group), ("idle", E.none), ("never", E.group_id_not_found)]
    assert fetch_offsets(b, "idle") == {}
    assert [g.group_id for g in b.coord.list_groups().groups] == ["busy"]
    assert b.restarted().coord.describe_groups(["idle"])[0].group_state == "Dead"
    assert fetch_offsets(b.restarted(), "idle") == {}


def test_delete_groups_append_failure_keeps_the_group():
    b = FakeBroker()
    b.commit("idle", {(T, 0): 3})
    b.fail_next.append(E.not_leader_or_follower)
    response = b.persist(b.coord.delete_groups(["idle"], b.now_ms))
    assert response[0].error is E.not_coordinator
    assert b.state("idle") == "Empty" and fetch_offsets(b, "idle") == {(T, 0): 3}


def test_offsets_expire_after_retention():
    config = FAST.__class__(group_initial_rebalance_delay_ms=100, group_min_session_timeout_ms=10,
                            offsets_retention_ms=60_000, offsets_retention_check_interval_ms=10_000)
    b = FakeBroker(config)
    b.commit("simple", {(T, 0): 3})
    b.advance(50_000)
    b.commit("simple", {(T, 1): 4})
    b.advance(20_000)  # (T, 0) is 70 s old, (T, 1) 20 s
    assert fetch_offsets(b, "simple") == {(T, 1): 4}
    b.advance(60_000)
    assert fetch_offsets(b, "simple") == {}
    assert b.state("simple") == "Dead"  # an Empty group without offsets is removed
    assert b.restarted().state("simple") == "Dead"
