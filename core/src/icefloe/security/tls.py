"""The TLS context of the broker's TLS listeners, from ``[security.tls]``."""

from __future__ import annotations

import ssl

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
