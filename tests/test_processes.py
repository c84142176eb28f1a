"""kill_tree: a process tree with a grandchild in a process group of its own (what PySpark's
worker daemons do) is killed whole, not just the leader's group."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from onceflow.demo.processes import descendants, kill_tree
from tests.helpers import wait_for

# A parent that starts a child which moves to its own process group and starts a grandchild;
# the parent prints the two pids and waits.
TREE = """
import os, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", '''
import os, subprocess, sys, time
os.setpgid(0, 0)
grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
print(os.getpid(), grandchild.pid, flush=True)
time.sleep(600)
'''], stdout=subprocess.PIPE, text=True)
print(child.stdout.readline().strip(), flush=True)
time.sleep(600)
"""


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0] != "Z"  # a zombie is dead
    except FileNotFoundError:
        return False


def test_kill_tree_reaches_descendants_in_other_process_groups():
    parent = subprocess.Popen([sys.executable, "-c", TREE], stdout=subprocess.PIPE, text=True,
                              start_new_session=True)
    try:
        child, grandchild = (int(pid) for pid in parent.stdout.readline().split())
        assert os.getpgid(child) == child != os.getpgid(parent.pid)
        assert {child, grandchild} <= set(descendants(parent.pid))

        kill_tree(parent.pid)
        assert parent.wait(10) == -9
        wait_for(lambda: not alive(child) and not alive(grandchild),
                 "the child and grandchild to die", 10)
    finally:
        kill_tree(parent.pid)
        if parent.poll() is None:
            parent.kill()


def test_kill_tree_of_a_finished_process_is_harmless():
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    time.sleep(0.05)
    kill_tree(process.pid)  # gone already: nothing raised
    assert descendants(process.pid) == []
