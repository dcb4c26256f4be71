"""The CompactionEngine port: turn WAL chunks into Parquet files, one per stream range.

Contract (executable form: ``icefloe.testing.compaction_contract``):

- ``run(tasks)`` executes every task and returns, per task, the files it wrote. A task names
  source objects and, for each, the stream ranges to extract; the engine reads each source
  once and writes one Parquet file per stream through the ObjectStore port, at the path the
  task gives. A source is a chunk of a WAL object (compaction) or a whole Parquet data file
  (table maintenance merging small files); one stream's ranges all come from one kind.
  Running a task twice writes the same file contents to the same paths (tasks are
  deterministic), so a retried or speculative execution is harmless.
- A stream the task names in ``time_partitions`` is split wherever the hour (day) of the record
  timestamp changes, in offset order: each run of records becomes a file of its own, named by
  :func:`piece_path` (the folder of the stream's path, then :func:`data_file_name`), and
  carries its ``time_bucket``. A stream written whole goes to its path.
- A stream the task names in ``cleaning`` is log-compacted (Kafka's ``cleanup.policy=compact``):
  its sources are data files, each rewritten to one file over the same offsets that keeps
  only what :class:`CleanSpec` says survives (the latest record of each key, tombstones until
  their horizon), named by :func:`cleaned_path`. A source left with no record joins the
  next file's range (the previous one's at the end); the task's last record stays if none
  would.
- The engine holds no state between calls; a failed task raises and writes no index entry.
"""

from __future__ import annotations

import abc
import enum
import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from icefloe.ports.base import Port, PortKind
from icefloe.ports.object_store import RequestStats
from icefloe.ports.table import TimePartition


class Source(enum.StrEnum):
    """What a stream range is read from."""

    WAL = "wal"
    """A chunk ``[byte_start, byte_end)`` of the WAL object ``ref``."""
    PARQUET = "parquet"
    """The whole Parquet data file at object-store key ``ref`` (byte range ignored)."""


@dataclass(frozen=True, slots=True)
class StreamRange:
    """Records ``[start_offset, end_offset)`` of one stream, and where they are read from."""

    stream_id: int
    partition: int
    start_offset: int
    end_offset: int
    ref: str
    byte_start: int
    byte_end: int
    source: Source = Source.WAL


@dataclass(frozen=True, slots=True)
class CleanSpec:
    """What log compaction keeps of one stream's data files (Kafka's log cleaner).

    The records from ``dirty_start`` on are the *dirty* part: the latest offset of each of
    their keys is what survives, everywhere in the task's range. Records before it were
    cleaned before (their keys are unique among themselves) and stay unless a dirty record
    has their key. Records without a key go (Kafka refuses them on a compacted topic; older
    ones are dropped as Kafka's cleaner drops them); records of control batches stay.
    """

    dirty_start: int
    delete_horizon_ms: int
    """Tombstones (null values) stamped before this go."""
    delete_retention_ms: int
    """``delete.retention.ms``: a kept tombstone goes this long after its timestamp."""


@dataclass(frozen=True, slots=True)
class CompactionTask:
    """Everything one task reads and writes. A stream's ranges must tile one offset range."""

    task_id: str
    ranges: tuple[StreamRange, ...]
    output_paths: tuple[tuple[int, str], ...]
    """``(stream_id, object key)`` of the Parquet file to write for each stream."""
    time_partitions: tuple[tuple[int, TimePartition], ...] = ()
    """``(stream_id, hour or day)`` of the streams whose files split by record time."""
    cleaning: tuple[tuple[int, CleanSpec], ...] = ()
    """``(stream_id, spec)`` of the streams this task log-compacts (their sources are data
    files, each rewritten without the records the spec removes)."""
    aborted: tuple[tuple[int, int, int, int], ...] = ()
    """``(stream_id, producer id, first offset, marker offset)`` of the aborted transactions
    whose records the task's WAL ranges may hold: they stay out of the data files, as do the
    transaction markers (control batches) themselves, so the tables hold committed records
    only."""
    typed: tuple[tuple[int, str, tuple[str, ...]], ...] = ()
    """``(stream_id, topic, sides)`` of the streams of schema-backed topics: the sides
    (``"key"``, ``"value"``) decoded from the Confluent wire format into typed columns
    (:mod:`icefloe.schemas.columns`) as WAL chunks become rows; the topic names the registry
    subjects (``<topic>-value``) whose versions fix the columns' types."""
    codecs: tuple[tuple[int, str], ...] = ()
    """``(stream_id, codec)`` of the streams whose data files are compressed with another codec
    than zstd (``none``, ``snappy``, ``gzip``: the topic's ``icefloe.table.compression``)."""

    def refs(self) -> list[str]:
        """The sources the task reads (WAL objects or data files), each once, in first-use
        order."""
        return list(dict.fromkeys(r.ref for r in self.ranges))


@dataclass(frozen=True, slots=True)
class WrittenFile:
    task_id: str
    stream_id: int
    path: str
    """Object-store key of the Parquet file."""
    size: int
    record_count: int
    start_offset: int
    end_offset: int
    row_groups: tuple[tuple[int, int], ...]
    """``(first offset, last offset)`` of each row group."""
    min_timestamp: int
    max_timestamp: int
    time_bucket: int | None = None
    """The hour (day) since the epoch of every record, for a stream split by time."""
    tombstone_expiry_ms: int | None = None
    """Log compaction only: when the earliest tombstone kept in the file may go."""
    dead_letters: int = 0
    """Typed columns only: records of the file that did not decode (their typed column is
    null; their error column says why)."""
    dead_letter_path: str | None = None
    """Typed columns only: object key of the file holding a copy of those records' rows for
    the topic's dead-letter table (``None`` when there are none); never an index entry."""
    dead_letter_size: int = 0


def data_file_name(stream_id: int, start_offset: int, end_offset: int) -> str:
    """The name of the data file holding ``[start_offset, end_offset)`` of a stream.

    The stream id keeps apart the files of a topic deleted and created again under the same
    name: both write to the same folders, from offset 0.
    """
    return f"{start_offset:020d}-{end_offset:020d}-s{stream_id}.parquet"


def piece_path(path: str, stream_id: int, start_offset: int, end_offset: int) -> str:
    """Where one run of a stream split by time goes, beside the stream's ``path``."""
    folder = path.rpartition("/")[0]
    return f"{folder}/" * bool(folder) + data_file_name(stream_id, start_offset, end_offset)


def cleaned_path(
    path: str, stream_id: int, start_offset: int, end_offset: int, task_id: str
) -> str:
    """Where log compaction writes the file of ``[start_offset, end_offset)``, beside ``path``.

    The task id keeps it apart from the file it replaces, which has the same offsets.
    """
    folder = path.rpartition("/")[0]
    name = data_file_name(stream_id, start_offset, end_offset).removesuffix(".parquet")
    return f"{folder}/" * bool(folder) + f"{name}-c{task_id[:16]}.parquet"


class CompactionEngine(Port):
    """Runs compaction tasks; see the module docstring for the contract."""

    kind: ClassVar[PortKind] = PortKind.COMPACTION

    @functools.cached_property
    def stats(self) -> RequestStats:
        """The object-store requests this engine's tasks sent, where the engine can tell
        (each task opens a store of its own, in another process or on another machine)."""
        return RequestStats()

    def tasks_finished(self) -> int:
        """How many tasks this engine finished so far, for progress reports. An engine that
        can tell while a run goes on overrides this; by default a run's tasks count when it
        returns."""
        return self._finished

    _finished = 0

    def runs_on_this_host(self) -> bool:
        """Whether tasks run on this host, beside its brokers: background compaction then
        waits while the host is busy with clients (``[compactor] yield_above_cpu``). An
        engine whose tasks run elsewhere (a cluster) returns ``False``."""
        return True

    async def run(self, tasks: Sequence[CompactionTask]) -> list[WrittenFile]:
        ids = [t.task_id for t in tasks]
        if len(set(ids)) != len(ids):
            raise ValueError("task ids must be unique within a run")
        if not tasks:
            return []
        files = await self._run(list(tasks))
        self._finished += len(tasks)
        return files

    @abc.abstractmethod
    async def _run(self, tasks: list[CompactionTask]) -> list[WrittenFile]: ...
