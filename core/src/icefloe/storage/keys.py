"""The keys of stream storage (the prefixes and their owners are in :mod:`icefloe.keyspace`).

Everything about one stream lives under ``streams/<id>/`` so that adapters which shard by parent
path keep a stream's keys together. The offset index is the sequence
``streams/<id>/index`` whose keys carry two components, (offset end, cumulative size):

    streams/000000000042/index-00000000000000001000-00000000000000524288
"""

from __future__ import annotations

from typing import Final

from icefloe.keyspace import COUNTERS, STREAM_NAMES, STREAMS, prefix_end
from icefloe.ports.metadata import sequence_key, sequence_upper_bound

STREAM_ID_WIDTH: Final = 12


def stream_dir(stream_id: int) -> str:
    return f"{STREAMS}{stream_id:0{STREAM_ID_WIDTH}d}"


def streams_range() -> tuple[str, str]:
    """[start, end) bounds that scan every stream's keys."""
    return STREAMS, prefix_end(STREAMS)


def stream_name(name: str) -> str:
    """A stream's name, pointing to its id."""
    return STREAM_NAMES + name


def stream_record(stream_id: int) -> str:
    """The stream's own record (name, creation time)."""
    return f"{stream_dir(stream_id)}/stream"


def index_sequence(stream_id: int) -> str:
    """The sequence prefix of the stream's offset index."""
    return f"{stream_dir(stream_id)}/index"


INDEX_LEAF: Final = "index-"
"""How the last part of an index key begins: the sequence's name and the dash before each of
its components (end offset, cumulative size)."""


def index_key(stream_id: int, end_offset: int, cumulative_size: int) -> str:
    return sequence_key(index_sequence(stream_id), (end_offset, cumulative_size))


def index_search_key(stream_id: int, end_offset: int) -> str:
    """The least possible key of an entry whose end offset is ``end_offset``.

    ``ceiling(index_search_key(s, x + 1))`` is the first entry with end > x, the one that
    holds offset x.
    """
    return sequence_key(index_sequence(stream_id), (end_offset,))


def index_range(stream_id: int) -> tuple[str, str]:
    """[start, end) bounds that scan exactly the stream's index entries."""
    prefix = index_sequence(stream_id)
    return prefix + "-", sequence_upper_bound(prefix)


def parse_index_key(key: str) -> tuple[int, int, int]:
    """(stream id, end offset, cumulative size) of an index key; ``ValueError`` if it is not
    one. Parsed by hand rather than through :func:`sequence_components`: every index entry
    read, and every notice of one written, passes through here."""
    directory, _, leaf = key.rpartition("/")
    try:
        if not leaf.startswith(INDEX_LEAF):
            raise ValueError(leaf)
        end, cumulative = leaf[len(INDEX_LEAF) :].split("-")
        return int(directory[len(STREAMS) :]), int(end), int(cumulative)
    except ValueError:
        raise ValueError(f"{key!r} is not an index key") from None


def is_index_key(key: str) -> bool:
    return key.startswith(STREAMS) and "/index-" in key


def log_start(stream_id: int) -> str:
    """The stream's log start as DeleteRecords moved it (absent until it first does)."""
    return f"{stream_dir(stream_id)}/log-start"


def is_log_start_key(key: str) -> bool:
    return key.startswith(STREAMS) and key.endswith("/log-start")


def stream_of_key(key: str) -> int:
    """The stream id of any key under ``streams/<id>/``."""
    return int(key[len(STREAMS) :].partition("/")[0])


def producers_prefix(stream_id: int) -> str:
    return f"{stream_dir(stream_id)}/producers/"


def producer_state(stream_id: int, producer_id: int) -> str:
    """An idempotent producer's sequence state on the stream."""
    return f"{producers_prefix(stream_id)}{producer_id}"


def counter(name: str) -> str:
    """A compare-and-set counter (stream ids, producer-id blocks)."""
    return f"{COUNTERS}{name}"
