"""ApiVersions: what this broker speaks, straight from the API table."""

from __future__ import annotations

import datetime
import struct
from typing import Any

from kio.schema.errors import ErrorCode

from icefloe.broker import protocol
from icefloe.broker.apis import SUPPORTED_APIS
from icefloe.broker.protocol import make
from icefloe.broker.server import RequestContext

_NO_THROTTLE = datetime.timedelta(0)


def _response(module: Any, error: ErrorCode) -> Any:
    apis = tuple(
        make(module.ApiVersion, api_key=a.key, min_version=a.min_version, max_version=a.max_version)
        for a in sorted(SUPPORTED_APIS.values(), key=lambda a: a.key)
    )
    return make(
        module.ApiVersionsResponse, error_code=error, api_keys=apis, throttle_time=_NO_THROTTLE
    )


async def handle_api_versions(ctx: RequestContext, request: Any) -> Any:
    return _response(ctx.response_module(), ErrorCode.none)


def unsupported_version_response(frame: bytes | memoryview) -> protocol.ResponseFrame:
    """Kafka's answer to an ApiVersions version it does not know: a v0 response saying
    UNSUPPORTED_VERSION and listing what is supported, so the client can retry."""
    (correlation_id,) = struct.unpack_from(">i", frame, 4) if len(frame) >= 8 else (0,)
    body = _response(
        protocol.response_module(protocol.API_VERSIONS_KEY, 0), ErrorCode.unsupported_version
    )
    return protocol.encode_response(protocol.API_VERSIONS_KEY, 0, correlation_id, body)
