"""Reading a Spark data source's options: Spark hands them over as text, keys lowercased by
the caller. Each data source raises its own error class (a ValueError) naming the option."""

from __future__ import annotations

from collections.abc import Mapping


def boolean_option(given: Mapping[str, str], key: str, name: str, default: bool,
                   error: type[ValueError]) -> bool:
    """`true` or `false` (any case); `default` when absent."""
    text = given.get(key)
    if text is None:
        return default
    if text.strip().lower() not in ("true", "false"):
        raise error(f"option {name} must be true or false, got {text!r}")
    return text.strip().lower() == "true"


def integer_option(given: Mapping[str, str], key: str, name: str, default: int | None,
                   minimum: int, error: type[ValueError], wanted: str | None = None) -> int | None:
    """An integer of at least `minimum`; `default` when absent. `wanted` words the
    requirement in the error (default: "an integer >= <minimum>")."""
    text = given.get(key)
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        value = minimum - 1
    if value < minimum:
        raise error(f"option {name} must be {wanted or f'an integer >= {minimum}'}, got {text!r}")
    return value
