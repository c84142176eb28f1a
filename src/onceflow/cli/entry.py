"""The `onceflow` executable (`python -m onceflow` and the installed script).

kio imports `hypothesis` whenever it is installed, only to offer strategies to property
tests. No command uses them, and in an environment that has the test extra the import
costs a third of a second on every start (it pulls pytest and trio in too), which a
broker restarting after a crash pays before it can recover or listen. So the command
process marks `hypothesis` as absent before anything imports kio; kio then skips it, as
it does where hypothesis is not installed. A process that already imported it (a test
run calling `main` in-process) keeps it.
"""

from __future__ import annotations

import sys


def main() -> None:
    sys.modules.setdefault("hypothesis", None)  # type: ignore[arg-type]
    from onceflow.cli.app import main as app_main

    app_main()
