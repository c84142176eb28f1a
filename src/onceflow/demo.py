"""`make run`: what onceflow is for - exactly-once results through crashes.

The demo itself is `onceflow.demo_exactly_once` (an in-process broker on ./data, two
transactional copiers killed again and again, a live read_committed check); this module
is the stable entry point the Makefile runs.
"""

from __future__ import annotations

from onceflow.demo_exactly_once import main

if __name__ == "__main__":
    main()
