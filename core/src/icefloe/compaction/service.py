"""The compactor: one leader in the cluster plans tasks and runs them through the saga.

Leadership is an ephemeral key held through a metadata-store session, so when the leader dies
another broker takes over within the lease time and first finishes the tasks it left. A leader
acts only while it can prove its lease, and each saga step is fenced by its term
(:mod:`.leadership`). A run that fails is tried again, and set aside after failing repeatedly
(:mod:`.committer`), without holding up the runs of other streams; the leader never exits on
a failure, it backs off. Besides
compaction, the leader applies retention, log-compacts topics with ``cleanup.policy=compact``
(:mod:`.cleaner`) and maintains the tables (:mod:`.maintenance`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import astuple, dataclass
from typing import Final, Self

from icefloe import config as configuration
from icefloe import metrics
from icefloe.compaction import cleaner, dropping, maintenance, retention
from icefloe.compaction.committer import Committer, TaskRecord, TopicsFailedError
from icefloe.compaction.leadership import UNLEADED, LeadershipLostError, Lease
from icefloe.compaction.maintenance import TableSettings
from icefloe.compaction.planner import (
    Plan,
    StreamBacklog,
    TaskKind,
    backlog_after_run,
    plan_task,
    read_backlog,
)
from icefloe.compaction.yielding import LoadGate
from icefloe.config.compactor import CompactorOptions
from icefloe.errors import AlreadyExistsError, ConflictError, IcefloeError
from icefloe.keyspace import COMPACTION
from icefloe.ports.base import OpenContext
from icefloe.ports.compaction import CompactionEngine
from icefloe.ports.metadata import MUST_NOT_EXIST, Session
from icefloe.ports.table import TableFormat, TableSpec
from icefloe.storage.engine import StreamStorage
from icefloe.tables import layout
from icefloe.topics.configs import time_partition, typed_sides
from icefloe.topics.registry import Topic, TopicRegistry

log = logging.getLogger(__name__)

LEADER_KEY: Final = COMPACTION + "leader"
REWRITES_PER_ROUND: Final = 16
"""Merges of small files per maintenance round; the rest wait for the next one."""
BACKLOG_REPORT_INTERVAL_S: Final = 10.0
"""How often the compaction leader sets the backlog gauges."""
RENEWAL_POLL_S: Final = 0.1
"""How often a leader that cannot prove its lease looks whether a keep-alive renewed it."""
PASS_RETRY_MAX_S: Final = 60.0
"""The longest back-off between the leader's passes while each one fails."""
OPEN_RETRY_FIRST_S: Final = 1.0
OPEN_RETRY_MAX_S: Final = 60.0
"""Back-off between attempts to open the compactor's backends (a table catalog may be down)."""


@dataclass(frozen=True, slots=True)
class Progress:
    """What one run did, for progress reporting."""

    tasks: int
    streams: int
    records: int
    source_bytes: int
    """Bytes read: WAL chunks (compaction) or data files (rewrite)."""
    parquet_bytes: int


class Compactor:
    """Plans and runs compaction for every topic."""

    def __init__(
        self,
        storage: StreamStorage,
        topics: TopicRegistry,
        engine: CompactionEngine,
        table_formats: Mapping[str, TableFormat],
        options: CompactorOptions,
        gate: LoadGate | None = None,
    ) -> None:
        self.storage = storage
        self.topics = topics
        self._engine = engine
        self.table_formats = dict(table_formats)
        """The enabled table formats by name (``"iceberg"``), all committing the same files."""
        self._options = options
        self._gate = gate or LoadGate(1.0, 0.0, None)
        """Whether to wait for the host's clients before planning a run (:mod:`.yielding`)."""
        self.committer = Committer(
            storage.metadata,
            storage.offset_index,
            storage.object_store,
            engine,
            table_formats,
            self._table_spec,
            expire_every=options.expire_every_commits,
            history_ms=self._history_ms,
            is_live=self._is_live,
            set_aside_retry_s=options.set_aside_retry_s,
        )
        self._held: frozenset[int] = frozenset()
        """Streams of unfinished runs left for a later round (failed, or set aside)."""
        self._set_aside_topics: set[str] = set()
        """Topics whose set-aside gauge this compactor set."""
        self._next_maintenance = 0.0
        self._next_retention_check = 0.0
        self._next_orphan_sweep = 0.0
        self._backlogs: dict[int, StreamBacklog] = {}
        """What the planner last read of each stream's index past its entries in tables."""
        self._next_backlog_report = 0.0
        self._reported_backlog: set[str] = set()
        """Topics whose backlog gauges this compactor set (as leader)."""

    @staticmethod
    def check(config: configuration.Config) -> None:
        """Find the configured compaction engine and table formats and validate their options,
        without opening them.

        Raises:
            ConfigError: a backend is unknown or not installed, or an option is wrong.
        """
        configuration.resolve_one(config, CompactionEngine)
        configuration.resolve(config, TableFormat)

    @classmethod
    async def open(
        cls,
        config: configuration.Config,
        storage: StreamStorage,
        topics: TopicRegistry,
        *,
        own_process: bool = False,
    ) -> Self:
        """Open the configured compaction engine and table formats. ``own_process`` says
        that this process is the compactor's alone (its CPU is compaction's, not clients')."""
        options = config.compactor
        gate = LoadGate.for_this_host(
            options.yield_above_cpu, options.max_yield_s, own_process=own_process
        )
        context = OpenContext(
            data_dir=config.data_dir,
            object_store=storage.object_store,
            wal=storage.wal,
            config=config,
            before_local_task=gate.wait,
        )
        engine = await configuration.resolve_one(config, CompactionEngine).open(context)
        table_formats = {
            backend.name: await backend.open(context)
            for backend in configuration.resolve(config, TableFormat)
        }
        return cls(storage, topics, engine, table_formats, options, gate)

    @property
    def engine(self) -> CompactionEngine:
        return self._engine

    async def backlog(self, topic: Topic) -> tuple[int, int]:
        """(records, bytes) of ``topic`` still only in the WAL."""
        waiting = await self._waiting(topic)
        return waiting.records, waiting.size

    async def _waiting(
        self, topic: Topic, backlogs: dict[int, StreamBacklog] | None = None
    ) -> _Waiting:
        waiting = _Waiting()
        for stream in topic.streams:
            backlog = await read_backlog(self.storage.index, stream, backlogs)
            waiting.records += backlog.records
            waiting.size += backlog.size
            if backlog.oldest_ms is not None:
                waiting.oldest_ms = min(waiting.oldest_ms, backlog.oldest_ms)
        return waiting

    async def close(self) -> None:
        await self._engine.close()
        for table_format in self.table_formats.values():
            await table_format.close()

    async def compact_once(self, *, force: bool = False) -> Progress | None:
        """Drop the tables of deleted topics and finish any unfinished run, then plan and run
        new runs if some are due: up to ``max_runs_in_flight`` of them, on disjoint streams."""
        done: list[Progress] = []
        await self._compact(force, done.append, self._options.max_runs_in_flight)
        if not done:
            return None
        return Progress(*(sum(column) for column in zip(*(astuple(p) for p in done), strict=True)))

    async def _compact(
        self, force: bool, report: Callable[[Progress], None], max_runs: int | None
    ) -> int:
        """Compact in runs, at most ``max_runs_in_flight`` at once (each on streams no other
        running one holds), until nothing is due or ``max_runs`` were planned; returns the
        number of tasks. In the background (:meth:`run`), no run is planned while the host is
        busy with clients (:mod:`.yielding`). Unfinished runs go first; one that fails, or is
        set aside, keeps its streams out of new runs and stops nothing else."""
        await self.drop_deleted_topics()
        tasks = 0
        held: set[int] = set()
        aside: list[TaskRecord] = []
        now_ms = int(time.time() * 1000)
        for found in await self.committer.unfinished():
            try:
                record = await self.committer.claim(found)
            except ConflictError:  # changed since it was listed: the next round sees it again
                held.update(s.stream_id for s in found.streams)
                continue
            if record.set_aside(now_ms):
                aside.append(record)
                held.update(s.stream_id for s in record.streams)
                continue
            log.info("resuming compaction run %s from %s", record.key, record.state)
            self._backlogs.clear()
            if (failed := await self._finish(record)) is not None:
                held.update(s.stream_id for s in record.streams)
                if failed.set_aside(now_ms):
                    aside.append(failed)
                continue
            source_bytes = sum(r.byte_end - r.byte_start for r in record.ranges)
            report(_progress(record, source_bytes))
            tasks += len(record.tasks)
        self._report_set_aside(aside)
        self._held = frozenset(held)
        running: dict[asyncio.Task[Progress | None], Plan] = {}
        planned = 0
        try:
            while True:
                while (
                    len(running) < self._options.max_runs_in_flight
                    and (max_runs is None or planned < max_runs)
                    and not self._gate.holding()
                ):
                    busy = frozenset(s.stream_id for p in running.values() for s in p.streams)
                    plan = await plan_task(
                        self.storage.index,
                        self.topics.cached(),
                        self._options,
                        int(time.time() * 1000),
                        force=force,
                        transactions=self.storage.transactions,
                        busy=busy | self._held,
                        backlogs=self._backlogs,
                    )
                    if plan is None:
                        break
                    planned += 1
                    running[asyncio.create_task(self._run(plan))] = plan
                if not running:
                    return tasks
                finished, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                for run in finished:
                    plan = running.pop(run)
                    progress = run.result()
                    if progress is None:  # failed: tried again next round
                        self._held |= {s.stream_id for s in plan.streams}
                        continue
                    tasks += progress.tasks
                    report(progress)
        finally:
            # A lost lease stops the others: they finish later, as unfinished runs.
            for run in running:
                run.cancel()
            await asyncio.gather(*running, return_exceptions=True)

    async def _finish(self, record: TaskRecord) -> TaskRecord | None:
        """Take ``record`` through the rest of the saga; if it fails, the record with the
        failure counted (it may be set aside now: see :mod:`.committer`)."""
        try:
            await self.committer.finish(record)
            return None
        except LeadershipLostError:
            raise
        except Exception as exc:  # noqa: BLE001 - any failure, an SDK's own errors too
            return await self._note_failure(record, exc) or record

    async def _note_failure(self, record: TaskRecord, error: Exception) -> TaskRecord | None:
        failed = error.failures if isinstance(error, TopicsFailedError) else None
        for topic in failed or record.topics:
            metrics.COMPACTION_RUN_FAILURES.labels(topic).inc()
        try:
            stored = await self.committer.note_failure(record, error)
        except LeadershipLostError:
            raise
        except Exception:
            log.warning("compaction run %s failed: %s", record.run_id, error, exc_info=True)
            return None
        if stored is None:
            return None
        streams = ", ".join(f"{s.topic}-{s.partition}" for s in stored.streams)
        run = f"compaction run {stored.run_id}{stored.suffix} ({streams}, in state {stored.state})"
        if stored.retry_after_ms:
            retry_at = time.localtime(stored.retry_after_ms / 1000)
            log.error(
                "%s set aside after %d failures in a row: %s. Its partitions wait, the others "
                "go on; it is tried again at %s, or at once after `icefloe tables retry`.",
                run,
                stored.failures,
                stored.error,
                time.strftime("%Y-%m-%d %H:%M:%S", retry_at),
            )
        else:
            log.warning(
                "%s failed (%d in a row); tried again next round: %s",
                run,
                stored.failures,
                stored.error,
                exc_info=error,
            )
        return stored

    def _report_set_aside(self, aside: list[TaskRecord]) -> None:
        counts: dict[str, int] = {}
        for record in aside:
            for topic in record.topics:
                counts[topic] = counts.get(topic, 0) + 1
        for topic in self._set_aside_topics - counts.keys():
            if topic in self._reported_backlog:
                metrics.COMPACTION_RUNS_SET_ASIDE.labels(topic).set(0)
            else:  # deleted, or no longer ours to report
                with contextlib.suppress(KeyError):
                    metrics.COMPACTION_RUNS_SET_ASIDE.remove(topic)
        for topic, count in counts.items():
            metrics.COMPACTION_RUNS_SET_ASIDE.labels(topic).set(count)
        self._set_aside_topics = set(counts)

    def _maintainable(self) -> list[Topic]:
        """The topics that no unfinished run holds a stream of: maintenance of the others
        waits for those runs."""
        return [t for t in self.topics.cached() if not self._held.intersection(t.streams)]

    async def drop_deleted_topics(self) -> int:
        """Drop the tables of deleted topics (:mod:`.dropping`); return how many topics."""
        deleted = await self.topics.deleted()
        for topic in deleted:
            spec = self._table_spec_of(topic.topic.name, topic.topic.configs)
            store = self.storage.object_store
            await dropping.drop_tables(topic, spec, self.table_formats, store)
            # Its dead-letter table too, had it ever one (the config may have changed since).
            name = topic.topic.name
            await dropping.drop_tables(
                topic,
                layout.dead_letter_spec(store, spec, name),
                self.table_formats,
                store,
                root=layout.dead_letter_root(name),
                metadata_root=layout.dead_letter_metadata_root(name),
            )
            await self.committer.forget_cleaned(topic.topic.streams)
            await self.topics.forget_deleted(topic)
        if deleted:
            self.committer.forget_tables()
        return len(deleted)

    async def rewrite_once(self) -> Progress | None:
        """Merge one run of small data files, if a topic has one."""
        plan = await maintenance.plan_rewrite(
            self.storage.index, self._maintainable(), self._options
        )
        if plan is None:
            return None
        return await self._run(plan)

    async def clean_once(self, *, force: bool = False) -> Progress | None:
        """Log-compact the streams of compacted topics that are due (:mod:`.cleaner`); with
        ``force``, every stream with anything not cleaned yet."""
        plan = await cleaner.plan_clean(
            self.storage.index,
            self.committer,
            self._maintainable(),
            self._options,
            self.storage.options,
            int(time.time() * 1000),
            force=force,
        )
        if plan is None:
            return None
        return await self._run(plan)

    async def enforce_retention(self) -> int:
        """Apply ``retention.ms``/``retention.bytes`` to every topic; entries removed."""
        now_ms = int(time.time() * 1000)
        removed = 0
        for topic in self._maintainable():
            if not TableSettings.of(topic, self._options).delete_with_retention:
                removed += await retention.enforce(self.storage, topic, now_ms)
            elif plan := await retention.plan_expiry(self.storage, topic, now_ms):
                await self._run(plan)
                removed += sum(len(s.entries) for s in plan.streams)
        return removed

    async def collect_garbage(self, *, orphans: bool = True) -> list[str]:
        """Delete retired data files past their grace period and, with ``orphans``, every
        topic's orphaned files; return the deleted keys."""
        now = time.time()
        deleted = await self.committer.delete_retired(int(now * 1000))
        for topic in self.topics.cached() if orphans else ():
            age_ms = TableSettings.of(topic, self._options).orphan_age_ms
            if age_ms < 0:
                continue
            deleted += await maintenance.sweep_orphans(
                topic,
                index=self.storage.index,
                store=self.storage.object_store,
                committer=self.committer,
                table_formats=self.table_formats,
                older_than_s=now - age_ms / 1000,
            )
        return deleted

    async def maintain(self) -> None:
        """Log-compact what is due, rewrite small files (a bounded number of runs, so
        compaction is not held up), then collect garbage (orphans every
        ``orphan_sweep_interval_s``: finding them lists every table)."""
        # Forgotten now and then, so nothing the planner assumed can hide WAL entries for long.
        self._backlogs.clear()
        await self.clean_once()
        for _ in range(REWRITES_PER_ROUND):
            if await self.rewrite_once() is None:
                break
        sweep = time.monotonic() >= self._next_orphan_sweep
        if sweep:
            self._next_orphan_sweep = time.monotonic() + self._options.orphan_sweep_interval_s
        await self.collect_garbage(orphans=sweep)

    async def until_idle(self, report: Callable[[Progress], None] | None = None) -> int:
        """Compact everything now (ignoring ages and sizes), ``max_runs_in_flight`` runs at a
        time, reporting each run as it ends; return the number of tasks."""
        return await self._compact(True, report or (lambda _: None), None)

    async def run(self, stop: asyncio.Event) -> None:
        """Compete for leadership and compact every ``interval_s`` while leader."""
        metadata = self.storage.metadata
        while not stop.is_set():
            try:
                session = await metadata.open_session(self._options.lease_ttl_s)
            except IcefloeError as exc:  # the store is down: compete again later
                log.warning("cannot compete for compaction: %s", exc)
                await _sleep_until(stop, self._options.interval_s)
                continue
            try:
                won = await metadata.put(
                    LEADER_KEY, b"", expected_version=MUST_NOT_EXIST, session=session
                )
            except IcefloeError as exc:
                if not isinstance(exc, AlreadyExistsError):
                    log.warning("cannot compete for compaction: %s", exc)
                await _close_quietly(session)
                await _sleep_until(stop, self._options.interval_s)
                continue
            lease = Lease(session, won.version)
            log.info("this broker leads compaction (term %d)", lease.term)
            self.committer.lease = lease
            self.committer.forget_tables()
            self._backlogs.clear()  # another leader may have compacted since this one last led
            try:
                with self._yielding():
                    await self._lead_while_held(stop, lease)
            finally:
                log.info("this broker stopped leading compaction (term %d)", lease.term)
                self.committer.lease = UNLEADED
                self._forget_backlog(self._reported_backlog)  # the next leader reports it
                self._reported_backlog = set()
                self._report_set_aside([])
                await _close_quietly(session)

    async def _lead_while_held(self, stop: asyncio.Event, lease: Lease) -> None:
        """Lead until ``stop``, or until the session is lost. The moment the lease can no
        longer be proven, the round under way is cancelled, whatever step it is at (the steps
        are fenced, see :mod:`.leadership`); if a keep-alive is answered before the session is
        lost, nobody else can have taken the leader key meanwhile, and the leader goes on in
        the same term."""
        session = lease.session
        assert session is not None
        while not stop.is_set():
            leading = asyncio.create_task(self._lead(stop, lease))
            try:
                while not leading.done():
                    remaining = lease.deadline() - time.monotonic()
                    if remaining <= 0 or not session.alive:
                        break
                    await asyncio.wait({leading, session.lost}, timeout=remaining)
                else:
                    with contextlib.suppress(LeadershipLostError):
                        leading.result()
            finally:
                leading.cancel()
                await asyncio.gather(leading, return_exceptions=True)
            if stop.is_set() or not await _renewed(lease, stop):
                return

    async def _lead(self, stop: asyncio.Event, lease: Lease) -> None:
        """Compact, apply retention and maintain the tables every ``interval_s`` while this
        compactor holds ``lease``; a pass that fails is tried again after a back-off."""
        failed_passes = 0
        while not stop.is_set():
            lease.check()
            try:
                await self._pass()
                failed_passes = 0
            except LeadershipLostError:
                raise
            except Exception:
                failed_passes += 1
                log.warning("compaction failed; will retry", exc_info=True)
            if time.monotonic() >= self._next_backlog_report:
                # Reads every stream's newest index entries: not on every pass.
                self._next_backlog_report = time.monotonic() + BACKLOG_REPORT_INTERVAL_S
                with contextlib.suppress(IcefloeError):  # the gauges wait till next time
                    await self.report_backlog()
            pause = self._options.interval_s * 2 ** min(failed_passes, 10)
            await _sleep_until(stop, min(pause, max(PASS_RETRY_MAX_S, self._options.interval_s)))

    async def _pass(self) -> None:
        """One pass of the leader: compaction, then retention, log compaction and table
        maintenance when each is due."""
        await self.compact_once()
        if time.monotonic() >= self._next_retention_check:
            self._next_retention_check = time.monotonic() + self._options.retention_check_interval_s
            await self.enforce_retention()
        await self.clean_once()
        if time.monotonic() >= self._next_maintenance:
            self._next_maintenance = time.monotonic() + self._options.maintenance_interval_s
            await self.maintain()

    def _yielding(self) -> contextlib.AbstractContextManager[None]:
        """Waiting for a busy host, unless tasks run elsewhere (a Spark cluster takes no cores
        from this host's clients)."""
        if self._engine.runs_on_this_host():
            return self._gate.engaged()
        return contextlib.nullcontext()

    async def _run(self, plan: Plan) -> Progress | None:
        """Take a new run through the saga; ``None`` if it failed (to be tried again)."""
        try:
            record = await self.committer.start(plan)
        except LeadershipLostError:
            raise
        except Exception:
            log.warning("compaction run %s could not start", plan.run_id, exc_info=True)
            return None
        try:
            if await self._finish(record) is not None:
                return None
        finally:
            # Their entries changed, or may have: summed up again unless known (below).
            before = {s.stream_id: self._backlogs.pop(s.stream_id, None) for s in plan.streams}
        if plan.kind is TaskKind.COMPACT:
            _count_compacted(plan, record)
            for stream in plan.streams:
                backlog = before[stream.stream_id]
                if backlog is not None and stream.stream_id not in self._backlogs:
                    kept = await backlog_after_run(self.storage.index, backlog, stream.entries)
                    if kept is not None:
                        self._backlogs[stream.stream_id] = kept
        return _progress(record, sum(e.size for s in plan.streams for e in s.entries))

    async def report_backlog(self) -> None:
        """Set the backlog gauges: per topic, what waits in the WAL and since when."""
        now_ms = time.time() * 1000
        reported = set()
        for topic in self.topics.cached():
            waiting = await self._waiting(topic, self._backlogs)
            metrics.COMPACTION_BACKLOG_RECORDS.labels(topic.name).set(waiting.records)
            metrics.COMPACTION_BACKLOG_BYTES.labels(topic.name).set(waiting.size)
            age_s = max(0.0, now_ms - waiting.oldest_ms) / 1000 if waiting.records else 0.0
            metrics.COMPACTION_BACKLOG_AGE.labels(topic.name).set(age_s)
            # Every topic's failures and set-aside runs are exported, at 0 while there are
            # none, so that a rate or an alert on them has a series from the start.
            metrics.COMPACTION_RUN_FAILURES.labels(topic.name)
            if topic.name not in self._set_aside_topics:
                metrics.COMPACTION_RUNS_SET_ASIDE.labels(topic.name).set(0)
            reported.add(topic.name)
        self._forget_backlog(self._reported_backlog - reported)
        self._reported_backlog = reported

    def _forget_backlog(self, topics: set[str]) -> None:
        """Remove the backlog gauges and failure counts of ``topics`` (deleted, or no longer
        ours to report)."""
        for topic in topics:
            for gauge in (
                metrics.COMPACTION_BACKLOG_RECORDS,
                metrics.COMPACTION_BACKLOG_BYTES,
                metrics.COMPACTION_BACKLOG_AGE,
                metrics.COMPACTION_RUN_FAILURES,
                metrics.COMPACTION_RUNS_SET_ASIDE,
            ):
                with contextlib.suppress(KeyError):
                    gauge.remove(topic)

    def _table_spec(self, topic_name: str) -> TableSpec:
        topic = self.topics.get_cached(topic_name)
        configs = topic.configs if topic is not None else {}  # deleted meanwhile
        return self._table_spec_of(topic_name, configs)

    def _table_spec_of(self, topic_name: str, configs: Mapping[str, str]) -> TableSpec:
        name = self.topics.table_name_of(topic_name, configs)
        store = self.storage.object_store
        return layout.table_spec(
            store, name, topic_name, time_partition(configs), typed_sides(configs)
        )

    def _is_live(self, topic_name: str, stream_id: int) -> bool:
        topic = self.topics.get_cached(topic_name)
        return topic is not None and stream_id in topic.streams

    def _history_ms(self, topic_name: str) -> int:
        topic = self.topics.get_cached(topic_name)
        if topic is None:
            return int(self._options.history_retention_s * 1000)
        return TableSettings.of(topic, self._options).history_ms


async def open_when_reachable(
    config: configuration.Config,
    storage: StreamStorage,
    topics: TopicRegistry,
    stopping: asyncio.Event,
    *,
    own_process: bool = False,
) -> Compactor | None:
    """Open the configured compactor, trying again after a back-off while one of its backends
    cannot be reached; ``None`` if ``stopping`` is set first."""
    delay = OPEN_RETRY_FIRST_S
    while not stopping.is_set():
        try:
            return await Compactor.open(config, storage, topics, own_process=own_process)
        except Exception as exc:  # noqa: BLE001 - an SDK's own errors (a catalog's HTTP client)
            log.error("compaction cannot start: %s; trying again in %.0f s", exc, delay)
        await _sleep_until(stopping, delay)
        delay = min(delay * 2, OPEN_RETRY_MAX_S)
    return None


def _count_compacted(plan: Plan, record: TaskRecord) -> None:
    topic_of = {s.stream_id: s.topic for s in plan.streams}
    for stream in plan.streams:
        wal_bytes = sum(e.size for e in stream.entries)
        metrics.COMPACTED_BYTES.labels(stream.topic).inc(wal_bytes)
    for f in record.files or ():
        metrics.COMPACTED_PARQUET_BYTES.labels(topic_of[f.stream_id]).inc(f.size)
        if f.dead_letters:
            metrics.DEAD_LETTERS.labels(topic_of[f.stream_id]).inc(f.dead_letters)


@dataclass
class _Waiting:
    """What of a topic waits in the WAL for compaction."""

    records: int = 0
    size: int = 0
    oldest_ms: float = float("inf")
    """When its oldest waiting entry was written."""


def _progress(record: TaskRecord, source_bytes: int) -> Progress:
    files = record.files or []
    return Progress(
        tasks=len(record.tasks),
        streams=len(record.streams),
        records=sum(f.record_count for f in files),
        source_bytes=source_bytes,
        parquet_bytes=sum(f.size for f in files),
    )


async def _renewed(lease: Lease, stop: asyncio.Event) -> bool:
    """Wait until ``lease`` can be proven again (``True``), or its session is lost or
    ``stop`` set."""
    session = lease.session
    assert session is not None
    if not session.alive:
        return False
    log.warning(
        "the compaction lease of term %d was not renewed in time: compaction waits until it "
        "is, or until it is lost",
        lease.term,
    )
    while time.monotonic() >= lease.deadline():
        if stop.is_set() or session.lost.done():
            return False
        await asyncio.wait({session.lost}, timeout=RENEWAL_POLL_S)
    log.info("the compaction lease of term %d is renewed: compaction goes on", lease.term)
    return True


async def _close_quietly(session: Session) -> None:
    """Close ``session``; a store that cannot be reached lets it expire instead."""
    try:
        await session.close()
    except IcefloeError as exc:
        log.info("compaction session not closed (it expires): %s", exc)


async def _sleep_until(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)
