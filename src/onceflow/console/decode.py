"""Keys, values and headers for people: JSON pretty-printed, UTF-8 text, hex otherwise.

Every rendering is capped (`cap_bytes` of the input): a huge record shows its first part
and says how large it is; the page offers "show more" up to `FULL_BYTES_MAX`.
"""

from __future__ import annotations

import dataclasses
import json

# What a records table shows of each key and value before "show more".
PREVIEW_BYTES = 512
# What "show more" shows of one value; larger records say so.
FULL_BYTES_MAX = 1024 * 1024
# Bytes per line of a hex dump.
HEX_LINE_BYTES = 16
# Control characters allowed in text (anything else makes the bytes binary).
_TEXT_CONTROLS = frozenset("\n\r\t")


@dataclasses.dataclass(frozen=True, slots=True)
class Decoded:
    kind: str          # "null" | "json" | "text" | "hex"
    text: str          # what to show
    size_bytes: int    # the whole value's size
    truncated: bool    # `text` shows only the first part


def decode(data: bytes | None, cap_bytes: int = PREVIEW_BYTES) -> Decoded:
    if data is None:
        return Decoded("null", "null", 0, False)
    size = len(data)
    text = _as_text(data)
    if text is not None:
        pretty = _as_json(text) if size <= FULL_BYTES_MAX else None
        if pretty is not None:
            return _capped("json", pretty, size, cap_bytes)
        return _capped("text", text, size, cap_bytes)
    return Decoded("hex", hex_dump(data[:cap_bytes]), size, size > cap_bytes)


def _capped(kind: str, text: str, size: int, cap_bytes: int) -> Decoded:
    if len(text) <= cap_bytes:
        return Decoded(kind, text, size, False)
    return Decoded(kind, text[:cap_bytes], size, True)


def _as_text(data: bytes) -> str | None:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    if any(ch < " " and ch not in _TEXT_CONTROLS or ch == "\x7f" for ch in text):
        return None
    return text


def _as_json(text: str) -> str | None:
    stripped = text.lstrip()
    if not stripped or stripped[0] not in "{[":
        return None  # plain numbers and strings read better as text
    try:
        return json.dumps(json.loads(text), indent=2, ensure_ascii=False)
    except (ValueError, RecursionError):
        return None


def hex_dump(data: bytes) -> str:
    """`0000  de ad be ef ...  ....` lines, like `hexdump -C`."""
    lines = []
    for start in range(0, len(data), HEX_LINE_BYTES):
        chunk = data[start:start + HEX_LINE_BYTES]
        printable = "".join(chr(b) if 0x20 <= b < 0x7F else "." for b in chunk)
        lines.append(f"{start:08x}  {chunk.hex(' '):<{HEX_LINE_BYTES * 3}} {printable}")
    return "\n".join(lines)
