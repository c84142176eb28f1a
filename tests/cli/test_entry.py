"""The `onceflow` executable's start: what it imports decides how soon a restarted broker
can recover and listen."""

from __future__ import annotations

import subprocess
import sys


def test_the_command_process_does_not_import_hypothesis():
    # kio imports hypothesis (a test extra, installed here) whenever it can; the entry point
    # keeps it out of command processes. -X importtime names every module imported.
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "onceflow", "--help"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    imported = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines()
                if line.startswith("import time:")}
    assert "kio.static._phantom" in imported  # the importer of hypothesis did run
    assert "hypothesis" not in imported and "pytest" not in imported
    assert "Usage" in done.stdout
