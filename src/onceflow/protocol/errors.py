"""Errors of the protocol layer.

Theory of operation: onceflow keeps three kinds of error apart (see STYLE.md).

- A peer that breaks the wire protocol (bad frame size, truncated or trailing
  bytes, a body kio cannot parse) gets `ProtocolError`; the connection pump
  closes the connection, as Kafka does.
- A request whose (api key, version) the broker does not advertise raises
  `UnsupportedVersion`, carrying the parsed header: for ApiVersions the broker
  answers with the v0 fallback (`codec.api_versions_fallback`), for any other API
  it closes the connection.
- Bad record data inside a well-formed request (`RecordError` and subclasses) is
  not a protocol violation: it is answered per partition with the Kafka error
  code stored on the exception class (`error_code`).

Our own broken invariants are none of these: they raise AssertionError /
RuntimeError / TypeError loudly.
"""

from __future__ import annotations

from typing import ClassVar

from kio.schema.errors import ErrorCode

from onceflow.protocol.header import RequestHeader

__all__ = (
    "CorruptRecord",
    "ErrorCode",
    "InvalidRecord",
    "ProtocolError",
    "RecordError",
    "UnsupportedCompression",
    "UnsupportedMagic",
    "UnsupportedVersion",
)


class ProtocolError(Exception):
    """The peer broke the Kafka wire protocol: close its connection."""


class UnsupportedVersion(Exception):
    """The request's (api_key, api_version) is not in `apis.SUPPORTED`.

    Deliberately not a ProtocolError subclass: ApiVersions gets an answer (the v0
    fallback), every other API gets its connection closed, and a broad
    `except ProtocolError` must not swallow the difference.
    """

    def __init__(self, header: RequestHeader) -> None:
        super().__init__(f"unsupported api_key={header.api_key} api_version={header.api_version}")
        self.header = header


class RecordError(Exception):
    """Record data that a well-formed request carries is unusable.

    Answered with `error_code` for the partition concerned; the connection stays.
    `position` is the byte offset (within the records blob) of the bad batch, so a
    log recovery can truncate there.
    """

    error_code: ClassVar[ErrorCode] = ErrorCode.corrupt_message

    def __init__(self, message: str, *, position: int = 0) -> None:
        super().__init__(f"{message} (at byte {position})")
        self.position = position


class CorruptRecord(RecordError):
    """Bad length, failed CRC, truncated batch: Kafka's CORRUPT_MESSAGE (2)."""

    error_code = ErrorCode.corrupt_message


class InvalidRecord(RecordError):
    """Well-framed but not acceptable (e.g. two batches in one produce): INVALID_RECORD (87)."""

    error_code = ErrorCode.invalid_record


class UnsupportedMagic(InvalidRecord):
    """A batch whose magic is not 2; Kafka answers produce v3+ with INVALID_RECORD."""


class UnsupportedCompression(RecordError):
    """Unknown codec, or zstd on produce < v7: UNSUPPORTED_COMPRESSION_TYPE (76)."""

    error_code = ErrorCode.unsupported_compression_type
