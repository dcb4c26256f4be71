"""The server side of one SASL exchange: PLAIN, SCRAM-SHA-256/512 through ``scramp``, or
OAUTHBEARER (:mod:`.oauthbearer`).

Kafka carries SASL in SaslHandshake (the mechanism) then SaslAuthenticate requests (its
bytes). An exchange is created by the handshake and fed each SaslAuthenticate's bytes by
:meth:`SaslExchange.step` until it is done; it never says *why* a login failed beyond
"invalid credentials", so that a client cannot tell an unknown user from a wrong password.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Callable
from typing import Any, Final

from scramp import ScramException, ScramMechanism  # type: ignore[import-untyped]

from icefloe.errors import IcefloeError
from icefloe.security.oauthbearer import InvalidToken, TokenValidator
from icefloe.security.users import ScramCredential, UserStore

MAX_AUTH_BYTES: Final = 16 << 10
"""Longest SASL message read: a login needs a few hundred bytes."""


class AuthenticationFailed(IcefloeError):
    """The login is refused; the message is what the client is told."""


class _Stage(enum.Enum):
    FIRST = enum.auto()
    FINAL = enum.auto()
    DONE = enum.auto()


class SaslExchange:
    """One connection's login with one mechanism."""

    def __init__(
        self, mechanism: str, users: UserStore, tokens: TokenValidator | None = None
    ) -> None:
        self.mechanism = mechanism
        self.principal: str | None = None
        """The user, once the exchange succeeded."""
        self.expires_at: float | None = None
        """When the credential itself expires (an OAUTHBEARER token), seconds since the epoch."""
        self._users = users
        self._tokens = tokens
        self._stage = _Stage.FIRST
        self._scram = ScramMechanism(mechanism) if mechanism.startswith("SCRAM-") else None
        self._server: Any = None
        """scramp's server of a SCRAM exchange (scramp does not export its type)."""
        self._user = ""

    @property
    def done(self) -> bool:
        return self._stage is _Stage.DONE

    async def step(self, auth_bytes: bytes) -> bytes:
        """Take the client's next message and return the answer to send.

        Raises:
            AuthenticationFailed: the credentials do not hold, or the message is malformed.
        """
        if self._stage is _Stage.DONE:
            raise AuthenticationFailed("the SASL exchange is already complete")
        if len(auth_bytes) > MAX_AUTH_BYTES:
            raise AuthenticationFailed(f"SASL message over {MAX_AUTH_BYTES} bytes")
        try:
            text = auth_bytes.decode()
        except UnicodeDecodeError:
            raise AuthenticationFailed("SASL message is not UTF-8") from None
        if self.mechanism == "OAUTHBEARER":
            return await self._oauthbearer(text)
        if self._scram is None:
            return await self._plain(text)
        if self._stage is _Stage.FIRST:
            return await self._scram_first(text)
        return self._scram_final(text)

    async def _plain(self, text: str) -> bytes:
        parts = text.split("\0")
        if len(parts) != 3:
            raise AuthenticationFailed("PLAIN message is not authzid NUL user NUL password")
        authzid, user, password = parts
        if authzid and authzid != user:
            raise AuthenticationFailed("PLAIN: authorization id differs from the user name")
        for credential in await self._users.credentials(user):
            # PBKDF2 takes milliseconds: not on the event loop.
            if await asyncio.to_thread(credential.matches, password):
                return self._succeed(user, b"")
        raise self._invalid()

    async def _oauthbearer(self, text: str) -> bytes:
        if self._tokens is None:
            raise AuthenticationFailed("OAUTHBEARER is not configured on this broker")
        gs2, *pairs = text.split("\x01")
        bearer = next((p[5:] for p in pairs if p.startswith("auth=")), "")
        scheme, _, token = bearer.partition(" ")
        if scheme.lower() != "bearer" or not token:
            raise AuthenticationFailed("OAUTHBEARER message without auth=Bearer <token>")
        try:
            identity = await self._tokens.validate(token.strip())
        except InvalidToken as exc:
            self._stage = _Stage.DONE
            raise AuthenticationFailed(str(exc)) from None
        authzid = next((f[2:] for f in gs2.split(",") if f.startswith("a=")), "")
        if authzid and authzid != identity.principal:
            raise AuthenticationFailed(
                "OAUTHBEARER: authorization id differs from the token's user"
            )
        self.expires_at = identity.expires_at
        return self._succeed(identity.principal, b"")

    async def _scram_first(self, text: str) -> bytes:
        assert self._scram is not None
        user = _scram_user(text)
        if not user:
            raise AuthenticationFailed(f"{self.mechanism}: client-first message without a user")
        credential = await self._users.credential(user, self.mechanism)
        if credential is None:
            raise self._invalid()
        server = self._scram.make_server(_auth_fn(user, credential))
        try:
            server.set_client_first(text)
            answer: str = server.get_server_first()
        except ScramException as exc:
            raise AuthenticationFailed(f"{self.mechanism}: {exc}") from None
        self._server = server
        self._stage = _Stage.FINAL
        self._user = user
        return answer.encode()

    def _scram_final(self, text: str) -> bytes:
        server = self._server
        assert server is not None
        try:
            server.set_client_final(text)
            answer: str = server.get_server_final()
        except ScramException:
            raise self._invalid() from None
        return self._succeed(self._user, answer.encode())

    def _succeed(self, user: str, answer: bytes) -> bytes:
        self.principal = user
        self._stage = _Stage.DONE
        return answer

    def _invalid(self) -> AuthenticationFailed:
        self._stage = _Stage.DONE
        return AuthenticationFailed(
            "Authentication failed during authentication due to invalid credentials with SASL "
            f"mechanism {self.mechanism}"
        )


def _scram_user(client_first: str) -> str | None:
    """The user name of a SCRAM client-first message (``n,,n=user,r=nonce``), unescaped."""
    _cbind, _, rest = client_first.partition(",")
    _authzid, _, bare = rest.partition(",")
    for attribute in bare.split(","):
        if attribute.startswith("n="):
            return attribute[2:].replace("=2C", ",").replace("=3D", "=")
    return None


def _auth_fn(
    user: str, credential: ScramCredential
) -> Callable[[str], tuple[bytes, bytes, bytes, int]]:
    """scramp's credential look-up, answered from the credential read beforehand."""

    def lookup(username: str) -> tuple[bytes, bytes, bytes, int]:
        if username != user:
            raise ScramException("unknown user")
        return credential.salt, credential.stored_key, credential.server_key, credential.iterations

    return lookup
