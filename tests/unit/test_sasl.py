"""The server side of SASL logins, against scramp's client and credentials kept in the
embedded metadata store; and the [security] section's checks."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from scramp import ScramClient

from icefloe.config import load_config
from icefloe.embedded.sqlite_metadata import SqliteMetadataStore
from icefloe.errors import ConfigError
from icefloe.ports.base import OpenContext
from icefloe.security.sasl import AuthenticationFailed, SaslExchange
from icefloe.security.users import ScramCredential, UserStore


@pytest.fixture
async def users(tmp_path: Path) -> AsyncIterator[UserStore]:
    metadata = await SqliteMetadataStore.open(
        SqliteMetadataStore.options_model(), OpenContext(data_dir=tmp_path)
    )
    store = UserStore(metadata)
    for mechanism in ("SCRAM-SHA-256", "SCRAM-SHA-512"):
        await store.put("ann", ScramCredential.from_password(mechanism, "s3cret", 4096))
    yield store
    await metadata.close()


async def scram_login(users: UserStore, mechanism: str, user: str, password: str) -> str | None:
    client = ScramClient([mechanism], user, password)
    exchange = SaslExchange(mechanism, users)
    server_first = await exchange.step(client.get_client_first().encode())
    client.set_server_first(server_first.decode())
    server_final = await exchange.step(client.get_client_final().encode())
    client.set_server_final(server_final.decode())  # the client checks the server too
    return exchange.principal


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
async def test_scram_logs_in_with_the_right_password(users: UserStore, mechanism: str) -> None:
    assert await scram_login(users, mechanism, "ann", "s3cret") == "ann"


async def test_scram_refuses_a_wrong_password_and_an_unknown_user_alike(users: UserStore) -> None:
    messages = []
    for user, password in (("ann", "guess"), ("bob", "s3cret")):
        with pytest.raises(AuthenticationFailed) as refused:
            await scram_login(users, "SCRAM-SHA-256", user, password)
        messages.append(str(refused.value))
    assert messages[0] == messages[1]
    assert "invalid credentials" in messages[0]


async def test_plain_checks_the_password_against_the_scram_credential(users: UserStore) -> None:
    exchange = SaslExchange("PLAIN", users)
    assert await exchange.step(b"\0ann\0s3cret") == b""
    assert exchange.principal == "ann"
    for message in (b"\0ann\0wrong", b"other\0ann\0s3cret", b"no separators", b"\xff\0\0"):
        with pytest.raises(AuthenticationFailed):
            await SaslExchange("PLAIN", users).step(message)


async def test_an_exchange_takes_no_message_after_it_is_done(users: UserStore) -> None:
    exchange = SaslExchange("PLAIN", users)
    await exchange.step(b"\0ann\0s3cret")
    with pytest.raises(AuthenticationFailed, match="already complete"):
        await exchange.step(b"\0ann\0s3cret")


async def test_an_oversized_message_is_refused_unread(users: UserStore) -> None:
    with pytest.raises(AuthenticationFailed, match="over"):
        await SaslExchange("SCRAM-SHA-256", users).step(b"n,,n=ann,r=" + b"x" * 100_000)


def test_listeners_are_written_as_kafka_writes_them() -> None:
    config = load_config(
        env={
            "ICEFLOE_SECURITY__LISTENERS": '["SASL_PLAINTEXT://0.0.0.0:9093"]',
            "ICEFLOE_SECURITY__ADVERTISED_LISTENERS": '["SASL_PLAINTEXT://kafka.example:9093"]',
        }
    )
    [main, extra] = config.security.listener_addresses("127.0.0.1", 9092)
    assert (main.protocol.value, main.port) == ("PLAINTEXT", 9092)
    assert (extra.protocol.value, extra.host, extra.port) == ("SASL_PLAINTEXT", "0.0.0.0", 9093)
    advertised = config.security.advertised(extra.protocol)
    assert advertised is not None
    assert advertised.host == "kafka.example"


@pytest.mark.parametrize(
    ("listeners", "message"),
    [
        ('["SASL_SSL://127.0.0.1:9093"]', "needs [security.tls] certfile"),
        ('["HTTP://0.0.0.0:9093"]', "unknown protocol"),
        ('["SASL_PLAINTEXT:9093"]', "is not PROTOCOL://host:port"),
        ('["PLAINTEXT://127.0.0.1:9093"]', "repeats the main listener's protocol"),
        ('["SASL_PLAINTEXT://0.0.0.0:9093"]', "name the one clients should use"),
    ],
)
def test_a_listener_that_cannot_work_is_refused_at_start(listeners: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        load_config(env={"ICEFLOE_SECURITY__LISTENERS": listeners})


def test_oauthbearer_needs_the_identity_providers_keys() -> None:
    with pytest.raises(ConfigError, match=r"set \[security.oauthbearer\] jwks_url or jwks_file"):
        load_config(env={"ICEFLOE_SECURITY__SASL_MECHANISMS": '["OAUTHBEARER"]'})


def test_oauthbearer_without_pyjwt_names_the_extra_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from icefloe.config.security import OAuthBearerOptions
    from icefloe.security.oauthbearer import TokenValidator

    monkeypatch.setitem(sys.modules, "jwt", None)  # as if PyJWT were not installed
    with pytest.raises(ConfigError, match=r"pip install 'icefloe\[oauth\]'"):
        TokenValidator(OAuthBearerOptions(jwks_url="http://127.0.0.1:1/jwks.json"))
