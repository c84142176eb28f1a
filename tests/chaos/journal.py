"""The journals: append-only JSON lines, one file per client incarnation.

Every line has `t` (wall clock, seconds) and `op`. A blocking client call is written
twice: `{"op": "call", "call": NAME, ...}` before and `{"op": "ret", "call": NAME,
"ok": ..., "error": ...}` after, so a call that never returned is visible as a `call`
line without its `ret` (the liveness check in checker.py).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from confluent_kafka import KafkaException

T = TypeVar("T")


class Journal:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        # Line-buffered and flushed by the OS on SIGKILL: a write() that returned is on
        # the page cache, which survives the death of the process.
        self._file = open(path, "a", buffering=1)  # noqa: SIM115 - lives as long as the process
        self.current: tuple[str, float] | None = None  # the call in progress: (name, monotonic start)

    def write(self, op: str, **fields: Any) -> None:
        self._file.write(json.dumps({"t": time.time(), "op": op, **fields}) + "\n")

    def call(self, name: str, fn: Callable[..., T], *args: Any, **fields: Any) -> T:
        """Run one client call between a `call` and a `ret` line; re-raise its error."""
        self.write("call", call=name, **fields)
        self.current = (name, time.monotonic())
        try:
            result = fn(*args)
        except KafkaException as exc:
            error = exc.args[0]
            self.write("ret", call=name, ok=False, error=error.name(), retriable=error.retriable(),
                       abortable=error.txn_requires_abort(), fatal=error.fatal())
            raise
        except Exception as exc:
            self.write("ret", call=name, ok=False, error=f"{type(exc).__name__}: {exc}")
            raise
        finally:
            self.current = None
        self.write("ret", call=name, ok=True)
        return result


def read(path: Path) -> Iterator[dict[str, Any]]:
    """The lines of one journal; a last line cut short by SIGKILL is skipped."""
    with open(path) as lines:
        for line in lines:
            if line.endswith("\n"):
                yield json.loads(line)


def journal_path(run_dir: Path, client: str, incarnation: int) -> Path:
    return run_dir / "journals" / f"{client}.{incarnation}.jsonl"


def incarnations(run_dir: Path) -> Iterator[tuple[str, int, Path]]:
    """(client, incarnation, path) of every journal in a run directory."""
    for name in sorted(os.listdir(run_dir / "journals")):
        client, incarnation, _ = name.rsplit(".", 2)
        yield client, int(incarnation), run_dir / "journals" / name
