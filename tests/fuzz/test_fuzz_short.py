"""A short atheris run of every fuzz harness (fuzz/): a crash fails the test.

Each harness runs a bounded number of inputs in a subprocess (`python -m fuzz <harness>
--runs N`), with a fixed libFuzzer seed so that a failure reproduces. libFuzzer exits non-zero
on a crash (an exception other than the harness' protocol errors, a broken invariant) or a
timeout and writes the input to a crash file in the artifact directory, whose path and
traceback the failure message shows. The long runs (1,000,000 inputs each) are `make fuzz`;
their results are in docs/reliability.md, "Fuzzing".
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from fuzz import HARNESSES

REPOSITORY = Path(__file__).resolve().parents[2]
# Inputs per harness: a few seconds each on a loaded machine (the producer-state harness runs
# sequences of batches per input, so fewer of them).
RUNS = {"request_decoder": 20_000, "record_batch": 20_000, "producer_state": 4_000}
# Generous: the bound is the run count; this only catches a hung subprocess.
SUBPROCESS_TIMEOUT_S = 300

@pytest.mark.parametrize("harness", sorted(HARNESSES))
def test_short_fuzz_run_finds_no_crash(harness: str, tmp_path: Path) -> None:
    runs = RUNS[harness]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(REPOSITORY / "src"), str(REPOSITORY), env.get("PYTHONPATH", "")])
    result = subprocess.run(
        [sys.executable, "-m", "fuzz", harness, f"--runs={runs}", "--seed=1",
         f"--artifacts={tmp_path}"],
        cwd=REPOSITORY, env=env, capture_output=True, text=True,
        timeout=SUBPROCESS_TIMEOUT_S, check=False,
    )
    crashes = sorted(path.name for path in tmp_path.iterdir()
                     if path.name.startswith(("crash-", "timeout-", "oom-")))
    assert result.returncode == 0 and not crashes, (
        f"{harness}: libFuzzer exited {result.returncode}, artifacts {crashes}\n"
        f"{result.stderr[-4000:]}")
    assert f"Done {runs} runs" in result.stderr, result.stderr[-2000:]
