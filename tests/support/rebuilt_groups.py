"""Rebuilt row groups made from batch bytes, as tests compare them."""

from __future__ import annotations

from icefloe.storage.batch import read_header
from icefloe.storage.rebuilt import RebuiltGroup


def parsed_group(data: bytes) -> RebuiltGroup:
    """The group of the record batches back to back in ``data``, where each one starts and
    the offset after it read from their headers."""
    positions = [0]
    next_offsets = []
    while positions[-1] < len(data):
        header = read_header(data, positions[-1])
        positions.append(positions[-1] + header.size)
        next_offsets.append(header.base_offset + header.last_offset_delta + 1)
    return RebuiltGroup(data, positions, next_offsets)
