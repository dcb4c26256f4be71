"""The TLS context of the broker's TLS listeners, from ``[security.tls]``."""

from __future__ import annotations

import ssl
from typing import Any, Final

from icefloe.config.security import TlsOptions
from icefloe.errors import ConfigError

_CLIENT_AUTH = {
    "none": ssl.CERT_NONE,
    "requested": ssl.CERT_OPTIONAL,
    "required": ssl.CERT_REQUIRED,
}


def server_context(options: TlsOptions) -> ssl.SSLContext:
    """A server context: TLS 1.2 or later, the broker's certificate, and client verification
    as ``client_auth`` asks.

    Raises:
        ConfigError: a file cannot be read or does not hold what it should.
    """
    if options.certfile is None:
        raise ConfigError("a TLS listener needs [security.tls] certfile")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    password = options.key_password.get_secret_value() if options.key_password else None
    try:
        context.load_cert_chain(options.certfile, options.keyfile, password)
        if options.cafile is not None:
            context.load_verify_locations(options.cafile)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(
            f"cannot load the TLS certificate, key or CA ([security.tls]): {exc}"
        ) from exc
    context.verify_mode = _CLIENT_AUTH[options.client_auth]
    return context


_SHORT_NAMES: Final = {
    "commonName": "CN",
    "countryName": "C",
    "localityName": "L",
    "stateOrProvinceName": "ST",
    "organizationName": "O",
    "organizationalUnitName": "OU",
    "streetAddress": "STREET",
    "domainComponent": "DC",
    "userId": "UID",
}
_ESCAPED: Final = frozenset(',+"\\<>;=')


def certificate_principal(certificate: Any) -> str | None:
    """``User:<subject>`` of a verified client certificate, the subject written as Kafka's
    default principal builder writes it (RFC 2253: most specific name first, ``CN=alice,
    OU=eng,O=Acme``); ``None`` when the client sent none."""
    if not isinstance(certificate, dict) or not certificate.get("subject"):
        return None
    names = []
    for rdn in reversed(certificate["subject"]):
        names.append(
            "+".join(f"{_SHORT_NAMES.get(kind, kind)}={_escape(value)}" for kind, value in rdn)
        )
    return "User:" + ",".join(names)


def _escape(value: str) -> str:
    escaped = "".join(f"\\{c}" if c in _ESCAPED else c for c in value)
    if escaped.startswith((" ", "#")):
        escaped = "\\" + escaped
    if escaped.endswith(" ") and not escaped.endswith("\\ "):
        escaped = escaped[:-1] + "\\ "
    return escaped
