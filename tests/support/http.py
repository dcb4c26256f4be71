"""Plain HTTP GETs for tests of the brokers' operator endpoints."""

from __future__ import annotations

import urllib.error
import urllib.request


def get(url: str) -> tuple[int, str]:
    """(status, body) of a GET; an error status is returned, not raised."""
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()
