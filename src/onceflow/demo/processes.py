"""Killing a whole process tree, the way a machine failure takes it.

A Spark driver started as a child in its own session (`start_new_session=True`) is not one
process group: PySpark's worker daemons call `setpgid(0, 0)` to corral their own workers, so
`killpg` of the driver's group leaves them running until they notice the JVM is gone (up to
a second, more on a loaded machine), still holding database connections and Kafka
transactions. `kill_tree` finds every descendant first, from /proc, and kills them all.
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

PROC = Path("/proc")


def descendants(pid: int) -> list[int]:
    """Every process below `pid`: children, their children, and so on (Linux /proc)."""
    children: dict[int, list[int]] = {}
    for stat in PROC.glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            # "pid (comm) state ppid ...": comm may itself hold spaces and parentheses.
            fields = stat.read_text().rpartition(")")[2].split()
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, pending = [], [pid]
    while pending:
        for child in children.get(pending.pop(), []):
            found.append(child)
            pending.append(child)
    return found


def kill_tree(pid: int, sig: int = signal.SIGKILL) -> None:
    """Send `sig` to `pid`'s process group (the leader's, when it leads one) and to every
    descendant, wherever its group. Processes already gone are skipped."""
    doomed = descendants(pid)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if os.getpgid(pid) == pid:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)
    for child in doomed:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, sig)
