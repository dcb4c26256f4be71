"""SASL users, kept in the metadata store as salted SCRAM credentials (RFC 5802).

Only what SCRAM's server side needs is stored: the salt, the iteration count, the stored key
``H(HMAC(SaltedPassword, "Client Key"))`` and the server key ``HMAC(SaltedPassword,
"Server Key")``. The password itself is never stored or logged. A user may hold a credential
per mechanism (SCRAM-SHA-256, SCRAM-SHA-512); PLAIN logins are checked against any of them.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

import msgpack

from icefloe.errors import CorruptDataError
from icefloe.keyspace import USERS, prefix_end
from icefloe.ports.metadata import MetadataStore

SCRAM_HASHES: Final[dict[str, Callable[..., hashlib._Hash]]] = {
    "SCRAM-SHA-256": hashlib.sha256,
    "SCRAM-SHA-512": hashlib.sha512,
}
MIN_ITERATIONS: Final = 4096
"""Kafka's minimum for SCRAM credentials."""
MAX_ITERATIONS: Final = 16384
"""Kafka's maximum: past it, a login costs the broker too much CPU."""
DEFAULT_ITERATIONS: Final = 8192
MIN_SALT_BYTES: Final = 12
"""Shorter salts are refused: the SCRAM implementation holds salts to this length."""
MAX_USER_NAME: Final = 256


@dataclass(frozen=True, slots=True)
class ScramCredential:
    mechanism: str
    salt: bytes
    stored_key: bytes
    server_key: bytes
    iterations: int

    @classmethod
    def from_salted_password(
        cls, mechanism: str, salt: bytes, salted_password: bytes, iterations: int
    ) -> ScramCredential:
        digest = SCRAM_HASHES[mechanism]
        client_key = hmac.digest(salted_password, b"Client Key", digest)
        return cls(
            mechanism,
            salt,
            digest(client_key).digest(),
            hmac.digest(salted_password, b"Server Key", digest),
            iterations,
        )

    @classmethod
    def from_password(
        cls, mechanism: str, password: str, iterations: int, salt: bytes | None = None
    ) -> ScramCredential:
        salt = salt if salt is not None else os.urandom(32)
        return cls.from_salted_password(
            mechanism, salt, salted_password(mechanism, password, salt, iterations), iterations
        )

    def matches(self, password: str) -> bool:
        """Whether ``password`` is the one this credential was made from (slow: PBKDF2)."""
        other = ScramCredential.from_password(self.mechanism, password, self.iterations, self.salt)
        return hmac.compare_digest(other.stored_key, self.stored_key)


def salted_password(mechanism: str, password: str, salt: bytes, iterations: int) -> bytes:
    name = SCRAM_HASHES[mechanism]().name
    return hashlib.pbkdf2_hmac(name, password.encode(), salt, iterations)


def check_user_name(name: str) -> None:
    if not name or len(name) > MAX_USER_NAME:
        raise ValueError(f"a user name has 1 to {MAX_USER_NAME} characters")


def check_iterations(iterations: int) -> None:
    if not MIN_ITERATIONS <= iterations <= MAX_ITERATIONS:
        raise ValueError(
            f"iterations must be between {MIN_ITERATIONS} and {MAX_ITERATIONS}, got {iterations}"
        )


class UserStore:
    """The SASL users of the cluster."""

    def __init__(self, metadata: MetadataStore) -> None:
        self._metadata = metadata

    async def credential(self, user: str, mechanism: str) -> ScramCredential | None:
        if not user or len(user) > MAX_USER_NAME or mechanism not in SCRAM_HASHES:
            return None
        record = await self._metadata.get(_key(user, mechanism))
        return None if record is None else _decode(mechanism, record.value)

    async def credentials(self, user: str) -> list[ScramCredential]:
        found = []
        for mechanism in SCRAM_HASHES:
            credential = await self.credential(user, mechanism)
            if credential is not None:
                found.append(credential)
        return found

    async def users(self) -> dict[str, list[ScramCredential]]:
        """Every user with its credentials, by name."""
        out: dict[str, list[ScramCredential]] = {}
        async for record in self._metadata.scan_all(USERS, prefix_end(USERS)):
            quoted, _, mechanism = record.key.removeprefix(USERS).rpartition("/")
            if mechanism in SCRAM_HASHES:
                name = urllib.parse.unquote(quoted)
                out.setdefault(name, []).append(_decode(mechanism, record.value))
        return out

    async def put(self, user: str, credential: ScramCredential) -> None:
        check_user_name(user)
        check_iterations(credential.iterations)
        value = msgpack.packb(
            [credential.salt, credential.stored_key, credential.server_key, credential.iterations]
        )
        await self._metadata.put(_key(user, credential.mechanism), value)

    async def delete(self, user: str, mechanism: str) -> bool:
        """Remove one credential; whether it existed."""
        if not user or len(user) > MAX_USER_NAME or mechanism not in SCRAM_HASHES:
            return False
        return await self._metadata.delete(_key(user, mechanism))


def _key(user: str, mechanism: str) -> str:
    return f"{USERS}{urllib.parse.quote(user, safe='')}/{mechanism}"


def _decode(mechanism: str, value: bytes) -> ScramCredential:
    try:
        salt, stored_key, server_key, iterations = msgpack.unpackb(value)
        return ScramCredential(mechanism, salt, stored_key, server_key, int(iterations))
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise CorruptDataError(f"unreadable {mechanism} credential: {exc}") from exc
