"""OAUTHBEARER tokens (RFC 7628, KIP-255): JWTs checked against the identity provider's keys.

A token is accepted when its signature verifies with a key of the configured JSON Web Key Set
(asymmetric algorithms only: a shared secret would let anyone who can read it mint tokens), it
has not expired (``exp`` is required), and its audience and issuer are the expected ones. The
user is the ``sub_claim`` claim. The checks are PyJWT's (``pip install 'icefloe[oauth]'``).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Final

from icefloe.config.security import OAuthBearerOptions
from icefloe.errors import ConfigError, IcefloeError

ALGORITHMS: Final = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384",
                     "ES512", "EdDSA")  # fmt: skip


class InvalidToken(IcefloeError):
    """The token is refused; the message says why (it holds nothing secret)."""


@dataclass(frozen=True, slots=True)
class Identity:
    principal: str
    expires_at: float
    """The token's ``exp``, seconds since the epoch."""


class TokenValidator:
    """Checks OAUTHBEARER tokens; keeps the key set (fetched in a thread, cached)."""

    def __init__(self, options: OAuthBearerOptions) -> None:
        try:
            import jwt
        except ImportError:
            raise ConfigError(
                "OAUTHBEARER logins need PyJWT: pip install 'icefloe[oauth]'"
            ) from None
        self._jwt = jwt
        self._options = options
        self._client: Any = None
        self._keys: Any = None
        if options.jwks_url is not None:
            self._client = jwt.PyJWKClient(
                options.jwks_url, cache_keys=True, lifespan=int(options.jwks_refresh_s), timeout=10
            )
        elif options.jwks_file is not None:
            try:
                self._keys = jwt.PyJWKSet.from_json(options.jwks_file.read_text())
            except (OSError, jwt.PyJWTError, ValueError) as exc:
                raise ConfigError(
                    f"[security.oauthbearer] jwks_file {options.jwks_file}: {exc}"
                ) from exc

    async def validate(self, token: str) -> Identity:
        """Raises:
        InvalidToken: with the reason.
        """
        return await asyncio.to_thread(self._validate, token)

    def _validate(self, token: str) -> Identity:
        jwt = self._jwt
        options = self._options
        try:
            key = self._signing_key(token)
            claims = jwt.decode(
                token,
                key.key,
                algorithms=list(ALGORITHMS),
                audience=options.audience or None,
                issuer=options.issuer,
                leeway=options.clock_skew_s,
                options={"require": ["exp"], "verify_aud": bool(options.audience)},
            )
        except jwt.PyJWTError as exc:
            raise InvalidToken(f"invalid token: {exc}") from None
        principal = claims.get(options.sub_claim)
        if not isinstance(principal, str) or not principal:
            raise InvalidToken(f"invalid token: no {options.sub_claim!r} claim naming the user")
        return Identity(principal, float(claims["exp"]))

    def _signing_key(self, token: str) -> Any:
        jwt = self._jwt
        if self._client is not None:
            try:
                return self._client.get_signing_key_from_jwt(token)
            except jwt.PyJWKClientConnectionError as exc:
                raise InvalidToken(f"the identity provider's keys are unreachable: {exc}") from None
        kid = jwt.get_unverified_header(token).get("kid")
        for key in self._keys.keys:
            if kid is None or key.key_id == kid:
                return key
        raise InvalidToken(f"invalid token: no key {kid!r} in the key set")
