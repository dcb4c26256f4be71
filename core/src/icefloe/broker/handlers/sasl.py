"""SaslHandshake and SaslAuthenticate: the login on a SASL listener (KIP-152 framing).

SaslHandshake picks the mechanism; SaslAuthenticate carries each message of the exchange
(:mod:`icefloe.security.sasl`). Until the login succeeds the server reads nothing else from the
connection but ApiVersions. A failed login is answered SASL_AUTHENTICATION_FAILED after
``[security] failed_authentication_delay_ms``, logged without any secret, and its connection
closed once the answer is out, as Kafka does.

With ``[security] connections_max_reauth_ms`` set, a login holds that long (KIP-368): the answer
tells the client, which logs in again on the same connection, with the same mechanism and user,
before the time is up; the server closes a connection whose login expired.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import time
from typing import Any

from kio.schema.errors import ErrorCode

from icefloe import metrics
from icefloe.broker.protocol import make
from icefloe.broker.server import RequestContext
from icefloe.errors import IcefloeError
from icefloe.security.sasl import AuthenticationFailed, SaslExchange

log = logging.getLogger(__name__)


async def handle_sasl_handshake(ctx: RequestContext, request: Any) -> Any:
    module = ctx.response_module()
    connection = ctx.connection
    offered = tuple(ctx.broker.config.security.sasl_mechanisms)
    previous = connection.sasl
    renewing = previous is not None and previous.done and connection.login_expires is not None
    if not connection.needs_login or (previous is not None and not renewing):
        # Not a SASL listener, or a handshake in the middle of a login: Kafka closes.
        connection.doomed = True
        return make(
            module.SaslHandshakeResponse, error_code=ErrorCode.illegal_sasl_state, mechanisms=()
        )
    if renewing and previous is not None and request.mechanism != previous.mechanism:
        connection.doomed = True  # KIP-368: a login is renewed with the same mechanism
        return make(
            module.SaslHandshakeResponse,
            error_code=ErrorCode.unsupported_sasl_mechanism,
            mechanisms=(previous.mechanism,),
        )
    if request.mechanism not in offered:
        return make(
            module.SaslHandshakeResponse,
            error_code=ErrorCode.unsupported_sasl_mechanism,
            mechanisms=offered,
        )
    connection.sasl = SaslExchange(request.mechanism, ctx.broker.users, ctx.broker.tokens)
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
    lifetime = datetime.timedelta(0)
    if exchange.principal is not None:  # the exchange is complete
        if connection.principal not in (None, exchange.principal):
            return await _refuse(ctx, module, exchange, "a renewed login may not change the user")
        connection.principal = exchange.principal
        reauth_ms = ctx.broker.config.security.connections_max_reauth_ms
        if reauth_ms:
            # As Kafka: the login holds until the earlier of the limit and the token's expiry.
            seconds = reauth_ms / 1000
            if exchange.expires_at is not None:
                seconds = max(0.0, min(seconds, exchange.expires_at - time.time()))
            lifetime = datetime.timedelta(seconds=seconds)
            connection.login_expires = time.monotonic() + seconds
        metrics.AUTHENTICATIONS.labels(exchange.mechanism, "success").inc()
        log.info("%s logged in as %s (%s)", connection.peer, exchange.principal, exchange.mechanism)
    return _answer(module, ErrorCode.none, None, answer, lifetime)


async def _refuse(ctx: RequestContext, module: Any, exchange: SaslExchange, why: str) -> Any:
    connection = ctx.connection
    metrics.AUTHENTICATIONS.labels(exchange.mechanism, "failure").inc()
    log.info("failed %s login from %s: %s", exchange.mechanism, connection.peer, why)
    # Slow the guessing down; the connection closes once this answer is out.
    await asyncio.sleep(ctx.broker.config.security.failed_authentication_delay_ms / 1000)
    connection.doomed = True
    return _answer(module, ErrorCode.sasl_authentication_failed, why)


def _answer(
    module: Any,
    error: ErrorCode,
    message: str | None,
    auth_bytes: bytes = b"",
    lifetime: datetime.timedelta = datetime.timedelta(0),
) -> Any:
    """A SaslAuthenticate answer; ``lifetime`` 0 tells the client its login never expires."""
    return make(
        module.SaslAuthenticateResponse,
        error_code=error,
        error_message=message,
        auth_bytes=auth_bytes,
        session_lifetime=lifetime,
    )
