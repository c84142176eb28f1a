"""The checker: the clients' journals judged against a final full read of both topics.

    python -m tests.chaos.checker RUN_DIR

Inputs (written by run.py): RUN_DIR/journals/*.jsonl (one per client incarnation),
RUN_DIR/nemesis.jsonl (faults, client starts/kills/exits, the end of the run) and
RUN_DIR/final.json (every record of the input and output topics, read_committed and
read_uncommitted from offset 0, and both groups' committed offsets, read after every
client was stopped and every transactional id fenced, so nothing is left open).

A writer's transaction is `committed` when commit_transaction returned, `aborted` when
abort_transaction returned, and `unknown` when its process died or gave up in between
(then it may have gone either way, but all or nothing). The anomalies, by kind:

- lost-write: a value of a committed transaction that the final read_committed read lacks;
- torn-transaction: a transaction of which some values are readable and others are not;
- duplicate: a value more than once in the final read (input or output);
- aborted-read: a read_committed client (or the final read) saw a value of an aborted
  transaction; phantom-read: saw one that is not in the final read at all;
- read-before-commit: a reader saw a value before its transaction's commit was asked for;
- read-mismatch: a reader saw at an offset something else than the final read has there;
- offset-skip / offset-repeat: a reader's offsets in one partition passed over a committed
  record, or went back;
- group-offset-skip / group-offset-repeat: a group member (reader or copier) started
  after a committed group offset, or before it over records already committed past, or
  the group's final offsets do not match what its members read;
- copy-lost / copy-duplicate / copy-extra: the copiers' committed output is not exactly
  the committed input, each value once (transformed);
- liveness: a client call blocked longer than STUCK_S (client-hang when the call had a
  timeout of its own that it overran: the client did not keep its deadline).

A call that the client's own watchdog gave up on (clients.WATCHDOG_S, well below
STUCK_S: the process ends and is restarted) is not an anomaly but a known client-side
hang (librdkafka's, docs/reliability.md); the summary lists those apart.
"""

from __future__ import annotations

import argparse
import bisect
import json
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.chaos.journal import incarnations, read

STUCK_S = 100.0
EXAMPLES_MAX = 5
TAIL_LINES = 8
# Calls made with a timeout argument (clients.CALL_TIMEOUT_S): overrunning it far is the client's.
CALLS_WITH_TIMEOUT = {"flush", "init_transactions", "commit_transaction", "abort_transaction",
                      "send_offsets_to_transaction"}


def transform(value: str) -> str:
    return value.upper()  # as onceflow.examples.copier.transform


@dataclass
class Txn:
    client: str
    txn: str
    values: list[str]
    outcome: str = "unknown"
    commit_asked_t: float | None = None  # when commit_transaction was first called
    done_t: float | None = None
    inputs: list[list] = field(default_factory=list)  # copiers: [partition, offset, value]


@dataclass
class Report:
    counts: Counter = field(default_factory=Counter)
    faults: Counter = field(default_factory=Counter)
    anomalies: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    # Calls the client's watchdog gave up on (a client-side hang, not a broker anomaly).
    client_hangs: list[str] = field(default_factory=list)

    def flag(self, kind: str, example: str) -> None:
        self.anomalies[kind].append(example)

    def summary(self) -> str:
        lines = ["chaos summary", "  counts:"]
        lines += [f"    {k}: {v}" for k, v in sorted(self.counts.items())]
        lines.append(f"  faults injected: {sum(self.faults.values())}")
        lines += [f"    {k}: {v}" for k, v in sorted(self.faults.items())]
        lines.append(f"  client-side hangs ended by the client's watchdog: {len(self.client_hangs)}")
        lines += [f"      e.g. {e}" for e in self.client_hangs[:EXAMPLES_MAX]]
        total = sum(len(v) for v in self.anomalies.values())
        lines.append(f"  anomalies: {total}")
        for kind, examples in sorted(self.anomalies.items()):
            lines.append(f"    {kind}: {len(examples)}")
            lines += [f"      e.g. {e}" for e in examples[:EXAMPLES_MAX]]
        return "\n".join(lines)


@dataclass
class Partition:
    """The final read_committed records of one partition, by offset."""

    offsets: list[int] = field(default_factory=list)
    values: dict[int, str] = field(default_factory=dict)

    def between(self, low: int, high: int) -> list[int]:
        """Committed offsets in [low, high)."""
        return self.offsets[bisect.bisect_left(self.offsets, low):bisect.bisect_left(self.offsets, high)]


def partitions_of(records: list[list]) -> dict[int, Partition]:
    parts: dict[int, Partition] = defaultdict(Partition)
    for partition, offset, value in sorted(records):
        parts[partition].offsets.append(offset)
        parts[partition].values[offset] = value
    return parts


# --- loading ---


def load_txns(lines: list[dict], client: str) -> dict[str, Txn]:
    txns: dict[str, Txn] = {}
    for line in lines:
        op = line["op"]
        if op == "txn":
            values = [v for v, _ in line.get("values", [])]
            txns[line["txn"]] = Txn(client, line["txn"], values, inputs=line.get("inputs", []))
        elif op in ("committed", "aborted"):
            txns[line["txn"]].outcome, txns[line["txn"]].done_t = op, line["t"]
        elif op == "call" and line["call"] == "commit_transaction" and txns:
            last = list(txns.values())[-1]
            if last.commit_asked_t is None:
                last.commit_asked_t = line["t"]
    return txns


def check(run_dir: Path, stuck_s: float = STUCK_S) -> Report:
    report = Report()
    final = json.loads((run_dir / "final.json").read_text())
    nemesis = list(read(run_dir / "nemesis.jsonl"))
    journals = {(client, inc): list(read(path)) for client, inc, path in incarnations(run_dir)}
    for line in nemesis:
        if line["op"] == "fault":
            report.faults[line["kind"]] += 1
            if "api" in line:
                report.faults[f"{line['kind']}:{line['api']}"] += 1
    writer_txns, copier_txns = {}, {}
    for (client, inc), lines in journals.items():
        if "writer" in client:
            writer_txns.update({(client, k): t for k, t in load_txns(lines, client).items()})
        elif "copier" in client:
            copier_txns.update({(client, k): t for k, t in load_txns(lines, client).items()})
    for txn in writer_txns.values():
        report.counts[f"writer transactions {txn.outcome}"] += 1
    for txn in copier_txns.values():
        report.counts[f"copier transactions {txn.outcome}"] += 1
    value_txn = {v: t for t in writer_txns.values() for v in t.values}
    input_parts = partitions_of(final["input_committed"])
    check_writes(report, final, writer_txns, value_txn)
    check_readers(report, journals, value_txn, input_parts)
    check_group_readers(report, journals, input_parts, final["reader_offsets"])
    check_copies(report, final, copier_txns, input_parts, nemesis)
    check_liveness(report, journals, nemesis, stuck_s)
    return report


# --- the checks ---


def check_writes(report: Report, final: dict, txns: dict, value_txn: dict[str, Txn]) -> None:
    seen = Counter(v for _, _, v in final["input_committed"])
    report.counts["input records (read_committed)"] = len(final["input_committed"])
    report.counts["input records (read_uncommitted)"] = len(final["input_uncommitted"])
    for value, n in seen.items():
        if n > 1:
            report.flag("duplicate", f"input value {value} {n} times")
        if value not in value_txn:
            report.flag("phantom-read", f"input value {value} was written by no journaled transaction")
    uncommitted = Counter(v for _, _, v in final["input_uncommitted"])
    for value, n in uncommitted.items():
        if n > 1:
            report.flag("duplicate", f"input value {value} {n} times (read_uncommitted)")
    for txn in txns.values():
        present = [v for v in txn.values if v in seen]
        if txn.outcome == "aborted" and present:
            report.flag("aborted-read", f"final read has {present} of aborted {txn.client} {txn.txn}")
        elif present and len(present) < len(txn.values):
            missing = sorted(set(txn.values) - set(present))
            report.flag("torn-transaction", f"{txn.client} {txn.txn} ({txn.outcome}): "
                                            f"{present} readable, {missing} not")
        elif txn.outcome == "committed" and not present:
            report.flag("lost-write", f"{txn.client} {txn.txn} committed {txn.values}, none readable")


def check_read(report: Report, who: str, line: dict, value_txn: dict[str, Txn],
               parts: dict[int, Partition]) -> None:
    """One record seen by a read_committed client: of a committed transaction, after its
    commit was asked for, at the offset the final read has it."""
    value, partition, offset = line["value"], line["partition"], line["offset"]
    txn = value_txn.get(value)
    if txn is not None and txn.outcome == "aborted":
        report.flag("aborted-read", f"{who} read {value} (aborted {txn.client} {txn.txn}) at {partition}/{offset}")
        return
    if parts[partition].values.get(offset) != value:
        kind = "read-mismatch" if offset in parts[partition].values else "phantom-read"
        report.flag(kind, f"{who} read {value} at {partition}/{offset}; final read: "
                          f"{parts[partition].values.get(offset)}")
        return
    if txn is not None and txn.commit_asked_t is not None and line["t"] < txn.commit_asked_t:
        report.flag("read-before-commit", f"{who} read {value} at {line['t']:.3f}, its commit was "
                                          f"asked at {txn.commit_asked_t:.3f}")


def check_sequence(report: Report, who: str, partition: int, previous: int, offset: int,
                   parts: dict[int, Partition]) -> None:
    """A reader went from `previous` (-1: start of the log) to `offset` in `partition`."""
    if offset <= previous:
        report.flag("offset-repeat", f"{who} read {partition}/{offset} after {partition}/{previous}")
    elif skipped := parts[partition].between(previous + 1, offset):
        report.flag("offset-skip", f"{who} went {partition}/{previous} -> {offset}, past committed {skipped[:5]}")


def check_readers(report: Report, journals: dict, value_txn: dict[str, Txn],
                  parts: dict[int, Partition]) -> None:
    for (client, inc), lines in journals.items():
        if "copier" in client or "writer" in client:
            continue
        who = f"{client}.{inc}"
        previous: dict[int, int | None] = {}
        for line in lines:
            if line["op"] == "assigned":
                for p in line["partitions"]:
                    previous[p] = -1 if "group" not in client else None  # None: from the group
            elif line["op"] == "read":
                report.counts["reads"] += 1
                check_read(report, who, line, value_txn, parts)
                p = line["partition"]
                if previous.get(p) is not None:
                    check_sequence(report, who, p, previous[p], line["offset"], parts)
                previous[p] = line["offset"]


def group_commits(journals: dict) -> tuple[list, list]:
    """The readers' group commits as (time, {partition: offset}): those acknowledged (at
    the time they returned) and those attempted (at the time they were called). A commit
    whose answer was lost may have been performed: it counts as attempted only."""
    acknowledged, attempted = [], []
    for (client, _), lines in journals.items():
        if "group-reader" not in client:
            continue
        pending = None
        for line in lines:
            if line["op"] == "call" and line["call"] == "commit":
                pending = {int(p): o for p, o in line["offsets"].items()}
                attempted.append((line["t"], pending))
            elif line["op"] == "ret" and line["call"] == "commit" and pending is not None:
                if line["ok"]:
                    acknowledged.append((line["t"], pending))
                pending = None
    return acknowledged, attempted


def committed_at(commits: list, partition: int, t: float) -> int:
    offsets = [o[partition] for when, o in commits if when < t and partition in o]
    return max(offsets, default=0)


def check_group_readers(report: Report, journals: dict, parts: dict[int, Partition],
                        final_offsets: dict[str, int]) -> None:
    acknowledged, attempted = group_commits(journals)
    read_offsets: dict[int, set[int]] = defaultdict(set)
    for (client, inc), lines in journals.items():
        if "group-reader" not in client:
            continue
        assigned_t: dict[int, float] = {}
        for line in lines:
            if line["op"] == "assigned":
                assigned_t.update({p: line["t"] for p in line["partitions"]})
            elif line["op"] == "read":
                p, offset = line["partition"], line["offset"]
                read_offsets[p].add(offset)
                if p not in assigned_t:
                    continue
                # The first read since the assignment: not before what was surely committed
                # when the assignment came, not past anything that was ever asked to be.
                before = committed_at(acknowledged, p, assigned_t.pop(p))
                latest = committed_at(attempted, p, line["t"])
                who = f"{client}.{inc}"
                if offset < before and parts[p].between(offset, before):
                    report.flag("group-offset-repeat", f"{who} started {p} at {offset}, committed {before}")
                elif offset > latest and (skipped := parts[p].between(latest, offset)):
                    report.flag("group-offset-skip", f"{who} started {p} at {offset}, committed "
                                                     f"{latest}: skipped {skipped[:5]}")
    for p, end in final_offsets.items():
        unread = [o for o in parts[int(p)].between(0, end) if o not in read_offsets[int(p)]]
        if unread:
            report.flag("group-offset-skip", f"readers' group committed {p}/{end} but never read {unread[:5]}")


def check_copies(report: Report, final: dict, txns: dict, parts: dict[int, Partition],
                 nemesis: list[dict]) -> None:
    expected = Counter(transform(v) for _, _, v in final["input_committed"])
    output = Counter(v for _, _, v in final["output_committed"])
    report.counts["output records (read_committed)"] = sum(output.values())
    drained = not any(line["op"] == "copiers_not_drained" for line in nemesis)
    missing = [v for v in expected if output[v] == 0]
    if not drained:
        # The copiers stopped making progress (see the liveness anomalies for why): what
        # they did not copy is not lost, it was never asked to be copied in time.
        report.flag("liveness", f"the copiers did not catch up at the end: {len(missing)} committed "
                                f"input values not copied, e.g. {sorted(missing)[:3]}")
    else:
        for value in missing:
            report.flag("copy-lost", f"input {value.lower()} never copied")
    for value, n in output.items():
        if n > 1:
            report.flag("copy-duplicate", f"{value} {n} times in the output")
        if value not in expected:
            report.flag("copy-extra", f"{value} in the output, not committed input")
    for p, part in parts.items():
        end = part.offsets[-1] + 1 if part.offsets else 0
        offset = final["copier_offsets"].get(str(p), 0)
        if offset > end:
            report.flag("group-offset-skip", f"copiers' group offset {p}/{offset} beyond the input ({end})")
        elif offset < end and drained:
            report.flag("copy-lost", f"copiers' group offset {p}/{offset}, input ends at {end}")
    check_copier_offsets(report, txns, parts)


def check_copier_offsets(report: Report, txns: dict, parts: dict[int, Partition]) -> None:
    """Each committed copier transaction starts on each partition where the one committed
    before it ended (its group offset): no committed input between, none again. A
    transaction of unknown outcome (its client died in commit_transaction: it may have
    committed) takes its place in that order when its commit was asked, so no judgement
    is made across it."""
    def order(t: Txn) -> float:
        if t.done_t is not None:
            return t.done_t
        return t.commit_asked_t if t.commit_asked_t is not None else float("inf")
    done = sorted((t for t in txns.values() if t.outcome != "aborted" and t.inputs), key=order)
    end: dict[int, int | None] = defaultdict(int)
    for txn in done:
        first: dict[int, int] = {}
        last: dict[int, int] = {}
        for p, offset, _ in txn.inputs:
            first.setdefault(p, offset)
            last[p] = offset
        for p in first:
            if txn.outcome == "unknown":
                end[p] = None  # it may or may not have committed: no judgement across it
                continue
            if end[p] is not None:
                if first[p] < end[p]:
                    report.flag("group-offset-repeat", f"{txn.client} {txn.txn} copied {p}/{first[p]} again "
                                                       f"(group offset was {end[p]})")
                elif skipped := parts[p].between(end[p], first[p]):
                    report.flag("group-offset-skip", f"{txn.client} {txn.txn} started {p} at {first[p]}, "
                                                     f"group offset {end[p]}: skipped {skipped[:5]}")
            end[p] = last[p] + 1


def check_liveness(report: Report, journals: dict, nemesis: list[dict], stuck_s: float) -> None:
    ended = {(line["client"], line["incarnation"]): line["t"] for line in nemesis
             if line["op"] in ("client_kill", "client_exit")}
    run_end = max((line["t"] for line in nemesis), default=0.0)
    for (client, inc), lines in journals.items():
        open_call: dict[str, Any] | None = None
        for i, line in enumerate(lines):
            if line["op"] == "watchdog":
                tail = " | ".join(json.dumps(x) for x in lines[max(0, i - TAIL_LINES):i + 1])
                report.client_hangs.append(f"{client}.{inc} {line['call']} blocked {line['blocked_s']} s; "
                                           f"journal tail: {tail}")
                open_call = None
            elif line["op"] == "call":
                open_call = (i, line)
            elif line["op"] == "ret" and open_call is not None:
                blocked(report, client, inc, lines, open_call, line["t"], stuck_s)
                open_call = None
        if open_call is not None:
            blocked(report, client, inc, lines, open_call, ended.get((client, inc), run_end), stuck_s)


def blocked(report: Report, client: str, inc: int, lines: list[dict], open_call: tuple,
            until: float, stuck_s: float) -> None:
    i, call = open_call
    if until - call["t"] <= stuck_s:
        return
    kind = "client-hang" if call["call"] in CALLS_WITH_TIMEOUT else "liveness"
    tail = " | ".join(json.dumps(line) for line in lines[max(0, i - TAIL_LINES):i + 2])
    report.flag(kind, f"{client}.{inc} blocked {until - call['t']:.0f} s in {call['call']}; journal tail: {tail}")


def main() -> None:
    parser = argparse.ArgumentParser(description="check a chaos run directory")
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--stuck-s", type=float, default=STUCK_S)
    args = parser.parse_args()
    report = check(args.run_dir, args.stuck_s)
    print(report.summary())
    sys.exit(1 if report.anomalies else 0)


if __name__ == "__main__":
    main()
