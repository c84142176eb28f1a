"""`make run`: what onceflow is for - exactly-once results through crashes.

Two demos, one after the other, each with its own directory under ./data:

1. `onceflow.demo.exactly_once` (./data/exactly-once): an in-process broker, two
   transactional copiers killed again and again, a live read_committed check;
2. `onceflow.demo.pipeline` (./data/pizza): the pizza pipeline on Spark, its driver
   SIGKILLed mid-batch and restarted from its checkpoint, then the totals verified.

This module (`python -m onceflow.demo`) is the stable entry point the Makefile runs; it stops at the first demo
that fails and exits with its code.
"""

from __future__ import annotations

from collections.abc import Callable

from onceflow.demo import exactly_once, pipeline


def _exit_code(demo: Callable[[], object]) -> int:
    try:
        demo()
    except SystemExit as exit_:
        return exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
    return 0


def main() -> None:
    code = _exit_code(exactly_once.main)
    if code != 0:
        raise SystemExit(code)
    print()
    raise SystemExit(pipeline.run_supervised())


if __name__ == "__main__":
    main()
