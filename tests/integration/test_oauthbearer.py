"""OAUTHBEARER logins through confluent-kafka: JWTs signed by the identity provider's key are
accepted, and expired tokens, tokens for another audience and tokens signed by another key
are refused. The broker fetches the provider's key set over HTTP, as from a real one."""

from __future__ import annotations

import http.server
import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import jwt
import pytest
from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from cryptography.hazmat.primitives.asymmetric import rsa
from jwt.algorithms import RSAAlgorithm

from tests.support.broker import RunningIcefloe, start_icefloe
from tests.support.servers import free_port

AUDIENCE = "icefloe-test"
ISSUER = "https://idp.example"


@dataclass
class Provider:
    """A stand-in identity provider: a signing key and its key set served over HTTP."""

    key: rsa.RSAPrivateKey
    jwks_url: str

    def token(self, subject: str = "alice", lifetime_s: float = 600, **claims: Any) -> str:
        now = time.time()
        payload = {"sub": subject, "aud": AUDIENCE, "iss": ISSUER, "iat": int(now)}
        payload["exp"] = int(now + lifetime_s)
        payload.update(claims)
        return jwt.encode(payload, self.key, algorithm="RS256", headers={"kid": "k1"})


@pytest.fixture(scope="module")
def provider() -> Iterator[Provider]:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    public = json.loads(RSAAlgorithm.to_jwk(key.public_key()))
    key_set = json.dumps({"keys": [{**public, "kid": "k1", "alg": "RS256", "use": "sig"}]})

    class KeySet(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = key_set.encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), KeySet)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield Provider(key, f"http://127.0.0.1:{server.server_port}/jwks.json")
    server.shutdown()


@dataclass
class Cluster:
    icefloe: RunningIcefloe
    sasl_port: int


@pytest.fixture(scope="module")
def cluster(provider: Provider, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    port = free_port()
    running = start_icefloe(
        tmp_path_factory.mktemp("oauth") / "data",
        env={
            "ICEFLOE_SECURITY__LISTENERS": f'["SASL_PLAINTEXT://127.0.0.1:{port}"]',
            "ICEFLOE_SECURITY__SASL_MECHANISMS": '["OAUTHBEARER", "SCRAM-SHA-256"]',
            "ICEFLOE_SECURITY__OAUTHBEARER__JWKS_URL": provider.jwks_url,
            "ICEFLOE_SECURITY__OAUTHBEARER__AUDIENCE": f'["{AUDIENCE}"]',
            "ICEFLOE_SECURITY__OAUTHBEARER__ISSUER": ISSUER,
            "ICEFLOE_SECURITY__FAILED_AUTHENTICATION_DELAY_MS": "10",
        },
    )
    try:
        admin = AdminClient({"bootstrap.servers": running.bootstrap})
        admin.create_topics([NewTopic("tokens", 1)])["tokens"].result(30)
        yield Cluster(running, port)
    finally:
        running.stop()


def client_config(
    cluster: Cluster, token: Callable[[], str], errors: list[KafkaError]
) -> dict[str, Any]:
    def oauth_cb(_config: str) -> tuple[str, float]:
        # The client is told a lifetime of its own, so that it sends even an expired token:
        # the broker must be the one to refuse it.
        return token(), time.time() + 600

    return {
        "bootstrap.servers": f"127.0.0.1:{cluster.sasl_port}",
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanisms": "OAUTHBEARER",
        "oauth_cb": oauth_cb,
        "error_cb": errors.append,
    }


def test_a_token_of_the_provider_logs_in_and_produces(cluster: Cluster, provider: Provider) -> None:
    errors: list[KafkaError] = []
    producer = Producer(client_config(cluster, provider.token, errors))
    producer.produce("tokens", b"with a token")
    assert producer.flush(30) == 0
    assert errors == []
    assert "logged in as alice (OAUTHBEARER)" in cluster.icefloe.log_path.read_text()


@pytest.mark.parametrize(
    ("case", "make_token"),
    [
        ("expired", lambda p: p.token(lifetime_s=-120)),
        ("another audience", lambda p: p.token(aud="someone-else")),
        ("another issuer", lambda p: p.token(iss="https://evil.example")),
        ("no subject", lambda p: p.token(sub="")),
        (
            "another key",
            lambda p: jwt.encode(
                {"sub": "alice", "aud": AUDIENCE, "iss": ISSUER, "exp": int(time.time()) + 600},
                rsa.generate_private_key(public_exponent=65537, key_size=2048),
                algorithm="RS256",
                headers={"kid": "k1"},
            ),
        ),
    ],
)
def test_a_bad_token_is_refused(
    cluster: Cluster, provider: Provider, case: str, make_token: Callable[[Provider], str]
) -> None:
    errors: list[KafkaError] = []
    token = make_token(provider)
    admin = AdminClient(client_config(cluster, lambda: token, errors))
    with pytest.raises(KafkaException):
        admin.list_topics(timeout=2)
    admin.poll(1)
    assert any(e.code() == KafkaError._AUTHENTICATION for e in errors), (case, errors)
