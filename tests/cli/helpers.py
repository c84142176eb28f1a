"""Helpers shared by the CLI tests."""

from __future__ import annotations

import uuid

from typer.testing import Result


def new_topic_name(prefix: str = "cli") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def assert_one_line_error(result: Result, *fragments: str) -> None:
    """Exit code 1, exactly one `error: ...` line on stderr naming `fragments`, no traceback."""
    assert result.exit_code == 1, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    assert "Traceback" not in result.output


def table_rows(output: str) -> list[list[str]]:
    """Cells of each body row of the rich tables in `output`."""
    return [[cell.strip() for cell in line.strip().strip("│").split("│")]
            for line in output.splitlines() if line.startswith("│")]
