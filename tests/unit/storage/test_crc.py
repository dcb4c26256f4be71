"""CRC-32C that keeps the GIL for short inputs: the same checksums, the GIL let go only for long
ones."""

from __future__ import annotations

import os
from typing import Any

import pytest

from icefloe.storage import crc
from icefloe.storage.crc import RELEASE_THE_GIL_FROM, crc32c


def test_the_checksum_is_crc32c() -> None:
    assert crc32c(b"123456789") == 0xE3069283  # the standard check value of CRC-32C


@pytest.mark.parametrize("size", [0, 1, 64 << 10, RELEASE_THE_GIL_FROM, RELEASE_THE_GIL_FROM + 7])
def test_views_and_continuations_give_the_checksum_of_the_whole(size: int) -> None:
    data = os.urandom(size)
    whole = crc32c(data)
    half = size // 2
    assert crc32c(memoryview(data)[half:], crc32c(memoryview(data)[:half])) == whole
    assert crc32c(bytearray(data)) == whole


def test_the_gil_is_let_go_only_from_a_mebibyte(monkeypatch: pytest.MonkeyPatch) -> None:
    modes: list[int] = []

    def recording(data: Any, value: int, mode: int) -> int:
        modes.append(mode)
        return 0

    monkeypatch.setattr(crc, "_crc32c", recording)
    for size in (64 << 10, RELEASE_THE_GIL_FROM - 1, RELEASE_THE_GIL_FROM):
        crc32c(bytes(size))
    assert modes == [0, 0, 1]  # the library's modes: 0 keeps the GIL, 1 lets it go
