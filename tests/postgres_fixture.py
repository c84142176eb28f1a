"""The `postgres_url` fixture: a PostgreSQL server for the tests (`scripts/postgres.sh`).

Use it with `from tests.postgres_fixture import postgres_url  # noqa: F401`. The script
installs PostgreSQL when it is missing and starts one shared server outside the project
tree; when that fails the test fails with the script's output - a PostgreSQL test never
skips, so a broken setup cannot pass for a green run.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "postgres.sh"
# Installing the packages on a fresh machine dominates; a started server answers at once.
START_TIMEOUT_S = 600


@pytest.fixture(scope="session")
def postgres_url() -> str:
    try:
        done = subprocess.run(["bash", str(SCRIPT), "start"], check=False, capture_output=True,
                              text=True, timeout=START_TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{SCRIPT} start took over {START_TIMEOUT_S} s:\n{exc.stdout}\n{exc.stderr}")
    if done.returncode != 0:
        pytest.fail(f"{SCRIPT} start failed (exit {done.returncode}):\n"
                    f"{done.stdout}\n{done.stderr}")
    return done.stdout.strip().splitlines()[-1]
