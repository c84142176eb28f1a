from __future__ import annotations

import pytest

from onceflow.storage import LogConfig, PartitionLog

NOW_MS = 1_700_000_000_000


@pytest.fixture
def open_log(tmp_path):
    """open_log(config=None, name="t-0", now_ms=NOW_MS) -> PartitionLog; discarded at teardown."""
    opened: list[PartitionLog] = []

    def _open(
        config: LogConfig | None = None, name: str = "t-0", now_ms: int = NOW_MS
    ) -> PartitionLog:
        log = PartitionLog.open(tmp_path / name, config or LogConfig(), now_ms)
        opened.append(log)
        return log

    yield _open
    for log in opened:
        log.discard()
