"""The Confluent wire format of a record's key or value: what compaction reads before decoding.

``0x00`` (magic) + a 4-byte big-endian schema id + the payload; for Protobuf the payload starts
with the message indexes (a zigzag varint count, then that many zigzag varints; a single ``0``
byte means "the first message"), which the Protobuf decoder reads, not this module. Every byte
here is untrusted: a short or odd header is a :class:`WireError`, never an exception of another
kind.
"""

from __future__ import annotations

from typing import Final

MAGIC: Final = 0
HEADER_BYTES: Final = 5
MAX_MESSAGE_INDEXES: Final = 32
"""Nesting depth of a Protobuf message index path accepted; deeper is a malformed record."""


class WireError(ValueError):
    """A record that is not in the wire format (the text is its dead-letter error)."""


def schema_id(data: bytes | memoryview | None) -> int:
    """The schema id in ``data``'s header.

    Raises:
        WireError: ``data`` is null, too short, does not start with the magic byte, or names
            a negative schema id.
    """
    if data is None:
        raise WireError("no bytes (null)")
    if len(data) < HEADER_BYTES:
        raise WireError(f"{len(data)} bytes: too short for the wire format's 5-byte header")
    if data[0] != MAGIC:
        raise WireError(f"no magic byte: the first byte is {data[0]}, not 0")
    found = int.from_bytes(data[1:HEADER_BYTES], "big", signed=True)  # a Java int
    if found < 0:
        raise WireError(f"schema id {found} is negative")
    return found


def payload(data: bytes) -> bytes:
    """What follows the header (the caller checked the header with :func:`schema_id`)."""
    return data[HEADER_BYTES:]


def message_indexes(data: bytes) -> tuple[list[int], int]:
    """The Protobuf message indexes at the start of ``data``, and where the message starts.

    Raises:
        WireError: a truncated varint, a negative or implausible count.
    """
    count, position = _zigzag(data, 0)
    if count == 0:
        return [0], position
    if count < 0 or count > MAX_MESSAGE_INDEXES:
        raise WireError(f"{count} Protobuf message indexes: not a plausible count")
    indexes = []
    for _ in range(count):
        index, position = _zigzag(data, position)
        if index < 0:
            raise WireError(f"negative Protobuf message index {index}")
        indexes.append(index)
    return indexes, position


def _zigzag(data: bytes, position: int) -> tuple[int, int]:
    result = 0
    for shift in range(0, 64, 7):
        if position >= len(data):
            raise WireError("truncated Protobuf message indexes")
        byte = data[position]
        position += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return (result >> 1) ^ -(result & 1), position
    raise WireError("a Protobuf message index varint longer than 10 bytes")
