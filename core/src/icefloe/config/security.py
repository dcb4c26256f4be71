"""The ``[security]`` configuration section: listeners' protocols, TLS, SASL and ACLs.

A broker always listens on ``[broker] host:port`` with ``[security] protocol``; ``listeners``
adds more, each written as Kafka writes them: ``PROTOCOL://host:port``, the protocol one of
``PLAINTEXT``, ``SSL``, ``SASL_PLAINTEXT`` and ``SASL_SSL`` (it also names the listener). A
client is told the brokers' addresses on the listener it connected through.
"""

from __future__ import annotations

import enum
from pathlib import Path
from typing import Final, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator


class Protocol(enum.StrEnum):
    PLAINTEXT = "PLAINTEXT"
    SSL = "SSL"
    SASL_PLAINTEXT = "SASL_PLAINTEXT"
    SASL_SSL = "SASL_SSL"

    @property
    def tls(self) -> bool:
        return self in (Protocol.SSL, Protocol.SASL_SSL)

    @property
    def sasl(self) -> bool:
        return self in (Protocol.SASL_PLAINTEXT, Protocol.SASL_SSL)


MECHANISMS: Final = ("SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN", "OAUTHBEARER")
"""The SASL mechanisms Icefloe implements."""
PASSWORD_MECHANISMS: Final = MECHANISMS[:3]
"""Those offered by default: OAUTHBEARER needs an identity provider ([security.oauthbearer])."""


class ListenerAddress(BaseModel):
    model_config = ConfigDict(frozen=True)

    protocol: Protocol
    host: str
    port: int = Field(ge=0, le=65535)

    @classmethod
    def parse(cls, text: str) -> Self:
        """``PROTOCOL://host:port`` (an IPv6 host in brackets)."""
        name, sep, address = text.partition("://")
        host, colon, port = address.rpartition(":")
        valid = ", ".join(p.value for p in Protocol)
        if not sep or not colon or not port.isdigit():
            raise ValueError(f"listener {text!r} is not PROTOCOL://host:port (PROTOCOL: {valid})")
        if name.upper() not in Protocol.__members__:
            raise ValueError(f"listener {text!r}: unknown protocol {name!r}; use one of {valid}")
        return cls(protocol=Protocol(name.upper()), host=host.strip("[]"), port=int(port))

    def __str__(self) -> str:
        return f"{self.protocol.value}://{self.host}:{self.port}"


class TlsOptions(BaseModel):
    """The broker's certificate, and whom it trusts to sign clients' certificates."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    certfile: Path | None = None
    """PEM certificate chain of the broker (the server certificate first)."""
    keyfile: Path | None = None
    """PEM private key (default: in ``certfile``)."""
    key_password: SecretStr | None = None
    cafile: Path | None = None
    """PEM certificates of the authorities that sign client certificates (mutual TLS)."""
    client_auth: Literal["none", "requested", "required"] = "none"
    """Whether clients must present a certificate signed by ``cafile``."""

    @model_validator(mode="after")
    def _client_auth_needs_a_ca(self) -> Self:
        if self.client_auth != "none" and self.cafile is None:
            raise ValueError(
                f'client_auth = "{self.client_auth}" needs cafile: the authority that signs '
                "client certificates"
            )
        return self


class OAuthBearerOptions(BaseModel):
    """How OAUTHBEARER tokens (JWTs) are checked: signature, expiry, audience, issuer."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    jwks_url: str | None = None
    """The identity provider's JSON Web Key Set, fetched and cached (``jwks_refresh_s``)."""
    jwks_file: Path | None = None
    """Or the key set from a file, read once at start."""
    jwks_refresh_s: float = Field(default=300.0, gt=0)
    audience: list[str] = Field(default_factory=list)
    """Tokens must name one of these in ``aud`` (Kafka's ``sasl.oauthbearer.expected.audience``);
    empty: not checked."""
    issuer: str | None = None
    """Tokens must have this ``iss`` (``sasl.oauthbearer.expected.issuer``)."""
    sub_claim: str = "sub"
    """The claim that names the user (``sasl.oauthbearer.sub.claim.name``)."""
    clock_skew_s: int = Field(default=30, ge=0, le=3600)

    @model_validator(mode="after")
    def _one_key_source(self) -> Self:
        if self.jwks_url is not None and self.jwks_file is not None:
            raise ValueError("set jwks_url or jwks_file, not both")
        return self

    @property
    def configured(self) -> bool:
        return self.jwks_url is not None or self.jwks_file is not None


class AclOptions(BaseModel):
    """Authorization by ACLs (Kafka's ``authorizer.class.name``, ``super.users`` and
    ``allow.everyone.if.no.acl.found``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = False
    """Check every request against the cluster's ACLs (managed with CreateAcls/DeleteAcls,
    e.g. ``kafka-acls.sh``). Off, every client may do everything."""
    super_users: list[str] = Field(default_factory=list)
    """Principals allowed everything, ACLs or not (``User:admin``)."""
    allow_everyone_if_no_acl_found: bool = False
    """Whether a resource no ACL names is open to all. Off (Kafka's default): denied."""

    @field_validator("super_users")
    @classmethod
    def _principals(cls, values: list[str]) -> list[str]:
        for value in values:
            kind, colon, name = value.partition(":")
            if not colon or not kind or not name:
                raise ValueError(f"super user {value!r} is not TYPE:NAME (e.g. User:admin)")
        return values


class SecurityOptions(BaseModel):
    """How clients connect and prove who they are."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    protocol: Protocol = Protocol.PLAINTEXT
    """Of the main listener, ``[broker] host:port``."""
    listeners: list[str] = Field(default_factory=list)
    """More listeners, ``PROTOCOL://host:port`` each, one per protocol; with ``--brokers N``
    every broker adds its index to each port, as it does to ``[broker] port``."""
    advertised_listeners: list[str] = Field(default_factory=list)
    """``PROTOCOL://host:port`` clients are told to use for a listener (default: its own)."""
    sasl_mechanisms: list[str] = Field(default_factory=lambda: list(PASSWORD_MECHANISMS))
    """Mechanisms offered on SASL listeners; credentials are managed with ``icefloe users``
    (PLAIN checks a password against the user's stored SCRAM credential)."""
    connections_max_reauth_ms: int = Field(default=0, ge=0)
    """Kafka's ``connections.max.reauth.ms`` (KIP-368): a login holds this long, after which a
    client must log in again on its connection (clients do it by themselves) or be
    disconnected; so a deleted user or a changed password takes effect on open connections
    too. 0 (the default): a login holds for the connection's life."""
    failed_authentication_delay_ms: int = Field(default=100, ge=0, le=60_000)
    """A failed login is answered this late, then its connection closed (slows guessing)."""
    tls: TlsOptions = TlsOptions()
    oauthbearer: OAuthBearerOptions = OAuthBearerOptions()
    acls: AclOptions = AclOptions()

    @field_validator("listeners", "advertised_listeners")
    @classmethod
    def _parse_listeners(cls, values: list[str]) -> list[str]:
        protocols = [ListenerAddress.parse(v).protocol for v in values]
        if len(set(protocols)) != len(protocols):
            raise ValueError("one listener per protocol (its name)")
        return values

    @field_validator("sasl_mechanisms")
    @classmethod
    def _known_mechanisms(cls, values: list[str]) -> list[str]:
        unknown = [v for v in values if v not in MECHANISMS]
        if unknown:
            raise ValueError(f"unknown SASL mechanism {unknown[0]!r}; use {', '.join(MECHANISMS)}")
        return values

    @model_validator(mode="after")
    def _listeners_can_work(self) -> Self:
        for text in self.listeners:
            address = ListenerAddress.parse(text)
            if address.host in ("", "0.0.0.0", "::") and self.advertised(address.protocol) is None:
                raise ValueError(
                    f"listener {text} listens on every address: name the one clients should use "
                    f'in advertised_listeners (e.g. "{address.protocol}://broker.example.com:'
                    f'{address.port}")'
                )
        protocols = [self.protocol, *(ListenerAddress.parse(v).protocol for v in self.listeners)]
        if len(set(protocols)) != len(protocols):
            raise ValueError(
                f"[security] listeners repeats the main listener's protocol {self.protocol}"
            )
        if "OAUTHBEARER" in self.sasl_mechanisms and not self.oauthbearer.configured:
            raise ValueError(
                "OAUTHBEARER needs the identity provider's keys: set [security.oauthbearer] "
                "jwks_url or jwks_file"
            )
        if any(p.tls for p in protocols) and self.tls.certfile is None:
            raise ValueError(
                "a TLS listener (SSL or SASL_SSL) needs [security.tls] certfile (and keyfile)"
            )
        return self

    def listener_addresses(self, host: str, port: int) -> list[ListenerAddress]:
        """Every listener: the main one on ``host:port``, then ``listeners``."""
        return [
            ListenerAddress(protocol=self.protocol, host=host, port=port),
            *(ListenerAddress.parse(v) for v in self.listeners),
        ]

    def advertised(self, protocol: Protocol) -> ListenerAddress | None:
        for text in self.advertised_listeners:
            address = ListenerAddress.parse(text)
            if address.protocol is protocol:
                return address
        return None
