"""DescribeUserScramCredentials and AlterUserScramCredentials (KIP-554): SASL users over the
Kafka protocol, as ``kafka-configs --alter --entity-type users`` and the Admin clients manage
them. A client sends a salt and the salted password, never the password.

Listing users takes DESCRIBE on the cluster and changing them ALTER, when ACLs are on
(``[security.acls]``); with them off, any client that can connect may manage users, as in
Kafka without an authorizer.
"""

from __future__ import annotations

import datetime
import enum
from collections import Counter
from typing import Any

from kio.schema.errors import ErrorCode

from icefloe.broker.protocol import make
from icefloe.broker.server import RequestContext
from icefloe.security.acls import Operation, ResourceType
from icefloe.security.users import (
    MAX_ITERATIONS,
    MAX_USER_NAME,
    MIN_ITERATIONS,
    MIN_SALT_BYTES,
    ScramCredential,
)

_NO_THROTTLE = datetime.timedelta(0)


class Mechanism(enum.IntEnum):
    """Kafka's ScramMechanism codes."""

    SCRAM_SHA_256 = 1
    SCRAM_SHA_512 = 2

    @property
    def sasl_name(self) -> str:
        return self.name.replace("_", "-")

    @classmethod
    def of(cls, code: int) -> Mechanism | None:
        return cls(code) if code in cls._value2member_map_ else None


async def handle_describe_user_scram_credentials(ctx: RequestContext, request: Any) -> Any:
    module = ctx.response_module()
    users = ctx.broker.users
    results = []
    if not ctx.allows(Operation.DESCRIBE, ResourceType.CLUSTER):
        return make(
            module.DescribeUserScramCredentialsResponse,
            throttle_time=_NO_THROTTLE,
            error_code=ErrorCode.cluster_authorization_failed,
            error_message="listing users takes DESCRIBE on the cluster",
            results=(),
        )
    if request.users is None:
        for name, credentials in sorted((await users.users()).items()):
            results.append(_described(module, name, credentials))
    else:
        names = [u.name for u in request.users]
        repeated = {n for n, count in Counter(names).items() if count > 1}
        for name in dict.fromkeys(names):
            if name in repeated:
                results.append(
                    _described(module, name, [], ErrorCode.duplicate_resource, "named twice")
                )
                continue
            credentials = await users.credentials(name)
            if credentials:
                results.append(_described(module, name, credentials))
            else:
                results.append(
                    _described(
                        module,
                        name,
                        [],
                        ErrorCode.resource_not_found,
                        f"user {name!r} has no SCRAM credential",
                    )
                )
    return make(
        module.DescribeUserScramCredentialsResponse,
        throttle_time=_NO_THROTTLE,
        error_code=ErrorCode.none,
        error_message=None,
        results=tuple(results),
    )


def _described(
    module: Any,
    name: str,
    credentials: list[ScramCredential],
    error: ErrorCode = ErrorCode.none,
    message: str | None = None,
) -> Any:
    return make(
        module.DescribeUserScramCredentialsResult,
        user=name,
        error_code=error,
        error_message=message,
        credential_infos=tuple(
            make(
                module.CredentialInfo,
                mechanism=Mechanism[c.mechanism.replace("-", "_")].value,
                iterations=c.iterations,
            )
            for c in credentials
        ),
    )


async def handle_alter_user_scram_credentials(ctx: RequestContext, request: Any) -> Any:
    module = ctx.response_module()
    users = ctx.broker.users
    pairs = [(d.name, d.mechanism) for d in request.deletions] + [
        (u.name, u.mechanism) for u in request.upsertions
    ]
    repeated = {name for (name, _), count in Counter(pairs).items() if count > 1}
    outcome: dict[str, tuple[ErrorCode, str | None]] = {}

    def fail(name: str, error: ErrorCode, message: str) -> None:
        outcome.setdefault(name, (error, message))

    if not ctx.allows(Operation.ALTER, ResourceType.CLUSTER):
        for name, _ in pairs:
            fail(name, ErrorCode.cluster_authorization_failed, "changing users takes ALTER")
    # Check everything first: a user's changes are applied only if all of them are valid.
    for name in repeated:
        fail(
            name,
            ErrorCode.duplicate_resource,
            "a user's credential for one mechanism is altered twice in one request",
        )
    for change in (*request.deletions, *request.upsertions):
        if not change.name or len(change.name) > MAX_USER_NAME:
            fail(
                change.name,
                ErrorCode.unacceptable_credential,
                "user names have 1 to 256 characters",
            )
        elif Mechanism.of(change.mechanism) is None:
            fail(
                change.name,
                ErrorCode.unsupported_sasl_mechanism,
                f"unknown SCRAM mechanism {change.mechanism}",
            )
    for upsert in request.upsertions:
        if not MIN_ITERATIONS <= upsert.iterations <= MAX_ITERATIONS:
            fail(
                upsert.name,
                ErrorCode.unacceptable_credential,
                f"iterations must be between {MIN_ITERATIONS} and {MAX_ITERATIONS}",
            )
        elif len(upsert.salt) < MIN_SALT_BYTES or not upsert.salted_password:
            fail(
                upsert.name,
                ErrorCode.unacceptable_credential,
                f"the salt must have at least {MIN_SALT_BYTES} bytes, and the salted password some",
            )
    for deletion in request.deletions:
        mechanism = Mechanism.of(deletion.mechanism)
        if (
            deletion.name not in outcome
            and mechanism is not None
            and await users.credential(deletion.name, mechanism.sasl_name) is None
        ):
            fail(
                deletion.name,
                ErrorCode.resource_not_found,
                f"user {deletion.name!r} has no {mechanism.sasl_name} credential",
            )

    for deletion in request.deletions:
        mechanism = Mechanism.of(deletion.mechanism)
        if deletion.name not in outcome and mechanism is not None:
            await users.delete(deletion.name, mechanism.sasl_name)
    for upsert in request.upsertions:
        mechanism = Mechanism.of(upsert.mechanism)
        if upsert.name not in outcome and mechanism is not None:
            credential = ScramCredential.from_salted_password(
                mechanism.sasl_name, upsert.salt, upsert.salted_password, upsert.iterations
            )
            await users.put(upsert.name, credential)
    names = dict.fromkeys(name for name, _ in pairs)
    return make(
        module.AlterUserScramCredentialsResponse,
        throttle_time=_NO_THROTTLE,
        results=tuple(
            make(
                module.AlterUserScramCredentialsResult,
                user=name,
                error_code=outcome.get(name, (ErrorCode.none, None))[0],
                error_message=outcome.get(name, (ErrorCode.none, None))[1],
            )
            for name in names
        ),
    )
