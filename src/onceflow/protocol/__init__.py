"""The sans-IO Kafka protocol layer: frames, request/response codec, record batches.

Nothing in this package performs I/O or imports asyncio/socket: it turns bytes
into requests and responses into bytes. See docs/architecture.md, "protocol".
"""

from onceflow.protocol.apis import SUPPORTED, ApiKey
from onceflow.protocol.codec import (
    Request,
    RequestHeader,
    api_versions_fallback,
    build_response,
    decode_request,
    encode_response,
)
from onceflow.protocol.errors import (
    CorruptRecord,
    ErrorCode,
    ProtocolError,
    RecordError,
    UnsupportedMagic,
    UnsupportedVersion,
)
from onceflow.protocol.framing import FRAME_BYTES_MAX_DEFAULT, FrameReader, encode_frame

__all__ = (
    "FRAME_BYTES_MAX_DEFAULT",
    "SUPPORTED",
    "ApiKey",
    "CorruptRecord",
    "ErrorCode",
    "FrameReader",
    "ProtocolError",
    "RecordError",
    "Request",
    "RequestHeader",
    "UnsupportedMagic",
    "UnsupportedVersion",
    "api_versions_fallback",
    "build_response",
    "decode_request",
    "encode_frame",
    "encode_response",
)
