"""SaslHandshake and SaslAuthenticate: the login on a SASL listener (KIP-152 framing).

SaslHandshake picks the mechanism; SaslAuthenticate carries each message of the exchange
(:mod:`icefloe.security.sasl`). Until the login succeeds the server reads nothing else from the
connection but ApiVersions. A failed login is answered SASL_AUTHENTICATION_FAILED after
``[security] failed_authentication_delay_ms``, logged without any secret, and its connection
closed once the answer is out, as Kafka does.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
from typing import Any, Final

from kio.schema.errors import ErrorCode

from icefloe import metrics
from icefloe.broker.protocol import make
from icefloe.broker.server import RequestContext
from icefloe.errors import IcefloeError
from icefloe.security.sasl import AuthenticationFailed, SaslExchange

log = logging.getLogger(__name__)

_NO_REAUTHENTICATION: Final = datetime.timedelta(0)
"""Session lifetime 0: the client is not asked to log in again (KIP-368 not in force)."""


async def handle_sasl_handshake(ctx: RequestContext, request: Any) -> Any:
    module = ctx.response_module()
    connection = ctx.connection
    offered = tuple(ctx.broker.config.security.sasl_mechanisms)
    if not connection.needs_login or connection.sasl is not None:
        # Not a SASL listener, or a second handshake: Kafka closes such connections.
        connection.doomed = True
        return make(
            module.SaslHandshakeResponse, error_code=ErrorCode.illegal_sasl_state, mechanisms=()
        )
    if request.mechanism not in offered:
        return make(
            module.SaslHandshakeResponse,
            error_code=ErrorCode.unsupported_sasl_mechanism,
            mechanisms=offered,
        )
    connection.sasl = SaslExchange(request.mechanism, ctx.broker.users)
    return make(module.SaslHandshakeResponse, error_code=ErrorCode.none, mechanisms=offered)


async def handle_sasl_authenticate(ctx: RequestContext, request: Any) -> Any:
    module = ctx.response_module()
    connection = ctx.connection
    exchange = connection.sasl
    if exchange is None or exchange.done:
        connection.doomed = True
        return _answer(
            module,
            ErrorCode.illegal_sasl_state,
            "SaslAuthenticate without a SaslHandshake first, or after the login",
        )
    try:
        answer = await exchange.step(bytes(request.auth_bytes))
    except AuthenticationFailed as exc:
        return await _refuse(ctx, module, exchange, str(exc))
    except IcefloeError as exc:  # the user store could not be read
        log.warning("login of %s could not be checked: %s", connection.peer, exc)
        connection.doomed = True
        return _answer(module, ErrorCode.sasl_authentication_failed, "try again later")
    if exchange.principal is not None:  # the exchange is complete
        connection.principal = exchange.principal
        metrics.AUTHENTICATIONS.labels(exchange.mechanism, "success").inc()
        log.info("%s logged in as %s (%s)", connection.peer, exchange.principal, exchange.mechanism)
    return _answer(module, ErrorCode.none, None, answer)


async def _refuse(ctx: RequestContext, module: Any, exchange: SaslExchange, why: str) -> Any:
    connection = ctx.connection
    metrics.AUTHENTICATIONS.labels(exchange.mechanism, "failure").inc()
    log.info("failed %s login from %s: %s", exchange.mechanism, connection.peer, why)
    # Slow the guessing down; the connection closes once this answer is out.
    await asyncio.sleep(ctx.broker.config.security.failed_authentication_delay_ms / 1000)
    connection.doomed = True
    return _answer(module, ErrorCode.sasl_authentication_failed, why)


def _answer(module: Any, error: ErrorCode, message: str | None, auth_bytes: bytes = b"") -> Any:
    return make(
        module.SaslAuthenticateResponse,
        error_code=error,
        error_message=message,
        auth_bytes=auth_bytes,
        session_lifetime=_NO_REAUTHENTICATION,
    )
