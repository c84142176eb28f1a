"""Properties over random client behaviour.

Random sequences of InitProducerId (new instances and KIP-360 bumps), AddPartitions,
AddOffsets, EndTxn, requests from fenced zombies, failed appends, failed or delayed markers,
clock jumps and restarts must never take an illegal transition; after every step, replaying
the log gives exactly the live state; zombies are always fenced; and once markers flow and
time passes, no transaction is left undecided.
"""

import itertools
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode

from onceflow.txn import TopicPartition, TxnMetadata, TxnState
from onceflow.txn.records import decode_key, decode_value
from onceflow.txn.state import NEVER_WRITTEN, PREPARE_STATES, check_transition
from tests.txn.harness import FAST, FakeBroker, replayed_state

E = ErrorCode
S = TxnState
IDS = ("t1", "t2", "t3")
PARTITIONS = [("a", 0), ("a", 1), ("b", 0)]
CONFIG = replace(FAST, transactional_id_expiration_ms=30_000,
                 remove_expired_cleanup_interval_ms=5_000)

add = st.tuples(st.just("add"), st.sampled_from(IDS),
               st.lists(st.sampled_from(PARTITIONS), min_size=1, max_size=3))
end = st.tuples(st.just("end"), st.sampled_from(IDS), st.booleans())
op = st.one_of(
    add, end, add, end,  # (listed twice: transactions are what we want to exercise)
    st.tuples(st.just("init"), st.sampled_from(IDS), st.booleans()),
    st.tuples(st.just("offsets"), st.sampled_from(IDS), st.sampled_from(["g1", "g2"])),
    st.tuples(st.just("zombie"), st.sampled_from(IDS), st.sampled_from(["add", "end", "offsets"])),
    st.tuples(st.just("advance"), st.sampled_from([1, 100, 1_000, 7_000, 40_000])),
    st.tuples(st.just("fail-next"), st.sampled_from([E.not_leader_or_follower,
                                                     E.request_timed_out])),
    st.tuples(st.just("marker-fail"), st.sampled_from(PARTITIONS)),
    st.tuples(st.just("hold"),),
    st.tuples(st.just("release"),),
    st.tuples(st.just("restart"),),
)


class Clients:
    """What the producers of each id know: every (pid, epoch) ever handed out, newest last."""

    def __init__(self) -> None:
        self.handed: dict[str, list[tuple[int, int]]] = {t: [] for t in IDS}

    def current(self, txn_id: str) -> tuple[int, int] | None:
        return self.handed[txn_id][-1] if self.handed[txn_id] else None

    def zombie(self, txn_id: str, meta: TxnMetadata | None) -> tuple[int, int] | None:
        """An older instance with the current producer id and a smaller epoch, if any."""
        if meta is None:
            return None
        older = [(p, e) for p, e in self.handed[txn_id]
                 if p == meta.producer_id and e < meta.producer_epoch]
        return older[0] if older else None


def step(b: FakeBroker, clients: Clients, action: tuple) -> FakeBroker:
    kind = action[0]
    if kind == "init":
        txn_id, kip360 = action[1], action[2]
        cur = clients.current(txn_id) if kip360 else None
        answer = b.init(txn_id, pid=cur[0] if cur else -1, epoch=cur[1] if cur else -1)
        if answer.error is E.none:
            clients.handed[txn_id].append((answer.producer_id, answer.producer_epoch))
    elif kind in ("add", "offsets", "end") and clients.current(action[1]) is not None:
        pid, epoch = clients.current(action[1])
        if kind == "add":
            b.add(action[1], pid, epoch, *action[2])
        elif kind == "offsets":
            b.add_offsets(action[1], pid, epoch, action[2])
        else:
            b.end(action[1], pid, epoch, commit=action[2])
    elif kind == "zombie":
        zombie = clients.zombie(action[1], b.meta(action[1]))
        if zombie is not None:
            call = {"add": lambda: b.add(action[1], *zombie, ("a", 0)),
                    "offsets": lambda: b.add_offsets(action[1], *zombie, "g1"),
                    "end": lambda: b.end(action[1], *zombie)}[action[2]]
            assert call() is E.producer_fenced
    elif kind == "advance":
        b.advance(action[1])
    elif kind == "fail-next":
        b.fail_next.append(action[1])
    elif kind == "marker-fail":
        b.marker_errors[TopicPartition(*action[1])].append(E.not_leader_or_follower)
    elif kind == "hold":
        b.hold_markers = True
    elif kind == "release":
        b.release_markers()
    elif kind == "restart":
        b = b.restarted()
    return b


def check(b: FakeBroker, epochs: dict[int, int]) -> None:
    state = b.durable_state()
    assert replayed_state(b) == state
    for shard in state.values():
        for meta in shard.values():
            assert meta.state not in NEVER_WRITTEN
            assert meta.producer_epoch >= epochs.get(meta.producer_id, 0)
            epochs[meta.producer_id] = meta.producer_epoch


def check_log_edges(b: FakeBroker) -> None:
    """Independently of the coordinator: consecutive records of an id are legal edges."""
    for log in b.logs.values():
        last: dict[str, TxnState] = {}
        for entry in log:
            txn_id = decode_key(entry.key)
            new = S.DEAD if entry.value is None else S.from_id(
                decode_value(entry.value).transaction_status)
            if txn_id in last:
                check_transition(txn_id, last[txn_id], new)
            if new is S.DEAD:
                last.pop(txn_id, None)
            else:
                last[txn_id] = new


# every id starts with a producer, so most steps exercise a transaction
START = [("init", txn_id, False) for txn_id in IDS]


@settings(max_examples=150, deadline=None)
@given(st.lists(op, min_size=5, max_size=50))
def test_random_histories_keep_the_invariants(actions):
    b, clients, epochs = FakeBroker(CONFIG), Clients(), {}
    for action in START + actions:
        b = step(b, clients, action)
        check(b, epochs)
    check_log_edges(b)
    # let everything settle: markers flow, retries fire, timeouts abort
    b.fail_next.clear()
    b.marker_errors.clear()
    b.release_markers()
    for _ in itertools.repeat(None, 3):
        b.advance(FAST.transaction_max_timeout_ms)
    for shard in b.durable_state().values():
        assert not any(m.state in PREPARE_STATES | {S.ONGOING} for m in shard.values())
    check(b, epochs)
    check_log_edges(b)


def test_preparing_does_not_mutate():
    """A handler's Result changes nothing until `complete` replays its record."""
    b = FakeBroker()
    pid, _ = b.producer("t1")
    b.add("t1", pid, 0, ("a", 0))
    before = b.durable_state()
    calls = [
        lambda: b.coord.add_partitions_to_txn(transactional_id="t1", producer_id=pid,
                                              producer_epoch=0, partitions=[("b", 0)],
                                              now_ms=b.now_ms),
        lambda: b.coord.end_txn(transactional_id="t1", producer_id=pid, producer_epoch=0,
                                commit=True, now_ms=b.now_ms),
        lambda: b.coord.init_producer_id(transactional_id="t1", transaction_timeout_ms=1_000,
                                         now_ms=b.now_ms),
    ]
    for call in calls:
        result = call()
        assert result.appends and b.durable_state() == before
        b.fail_next.append(E.not_leader_or_follower)
        b.persist(result)  # the write fails: nothing to undo
        assert b.durable_state() == before
    b.persist(calls[0]())
    assert b.durable_state() != before
