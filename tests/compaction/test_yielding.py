"""Compaction that yields to a busy host (:mod:`icefloe.compaction.yielding`): the host's CPU
read from the kernel's figures, the gate's waits and their bound, and a background compactor
and its local engine waiting at the gate."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from icefloe.compaction import yielding
from icefloe.compaction.local_engine import LocalCompactionEngine
from icefloe.compaction.service import Compactor
from icefloe.compaction.yielding import HostCpu, LoadGate
from icefloe.config import load_config
from icefloe.ports.compaction import CompactionTask
from icefloe.storage.records import Record
from icefloe.topics.registry import Topic
from tests.compaction.conftest import opened_parts
from tests.support.waiting import eventually


class FakeProc:
    """A ``/proc`` of a 2-core host whose ticks the test moves on."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.busy = 0
        self.idle = 0
        self.write()

    def tick(self, busy: int, idle: int, **processes: int) -> None:
        self.busy += busy
        self.idle += idle
        self.write()
        for pid, ticks in processes.items():
            self.process(int(pid.removeprefix("pid")), ticks)

    def write(self) -> None:
        # user nice system idle iowait irq softirq steal guest guest_nice
        user, system = self.busy // 2, self.busy - self.busy // 2
        (self.root / "stat").write_text(
            f"cpu  {user} 0 {system} {self.idle} 0 0 0 0 0 0\ncpu0 0 0 0 0 0 0 0 0 0 0\n"
        )

    def process(self, pid: int, ticks: int) -> None:
        (self.root / str(pid)).mkdir(exist_ok=True)
        # pid (comm) state ppid ... utime stime: a name with spaces and parentheses
        fields = ["S"] + ["0"] * 10 + [str(ticks - ticks // 2), str(ticks // 2)] + ["0"] * 30
        (self.root / str(pid) / "stat").write_text(f"{pid} (a (b) c) " + " ".join(fields))


@pytest.fixture
def proc(tmp_path: Path) -> FakeProc:
    return FakeProc(tmp_path / "proc")


@pytest.fixture(autouse=True)
def fake_proc_dir(tmp_path: Path) -> None:
    (tmp_path / "proc").mkdir()


def test_host_cpu_is_the_busy_share_of_all_cores(proc: FakeProc) -> None:
    cpu = HostCpu(list, proc.root)
    assert cpu.sample() is None  # nothing to compare with yet
    proc.tick(busy=150, idle=50)
    assert cpu.sample() == pytest.approx(0.75)
    proc.tick(busy=0, idle=200)
    assert cpu.sample() == 0.0


def test_host_cpu_leaves_out_compactions_own_processes(proc: FakeProc) -> None:
    pids = [7]
    cpu = HostCpu(lambda: pids, proc.root)
    proc.tick(busy=0, idle=0, pid7=100)
    cpu.sample()
    proc.tick(busy=160, idle=40, pid7=180)  # 80 of the 160 busy ticks were the worker's
    assert cpu.sample() == pytest.approx(0.4)
    pids.append(8)  # a worker started since: all its CPU falls in the span
    proc.tick(busy=100, idle=100, pid7=180, pid8=60)
    assert cpu.sample() == pytest.approx(0.2)
    pids.remove(7)  # a worker gone is not counted at all
    (proc.root / "7" / "stat").unlink()
    proc.tick(busy=100, idle=100, pid8=60)
    assert cpu.sample() == pytest.approx(0.5)


@pytest.mark.parametrize(
    "stat",
    ["", "intr 1 2 3\n", "cpu  1 2 x 4 5 6 7 8\n", "cpu  1 2\n"],
    ids=["empty", "no cpu line", "not a number", "short"],
)
def test_host_cpu_unreadable_figures_are_no_load(proc: FakeProc, stat: str) -> None:
    cpu = HostCpu(list, proc.root)
    cpu.sample()
    (proc.root / "stat").write_text(stat)
    assert cpu.sample() is None
    (proc.root / "stat").unlink()
    assert cpu.sample() is None
    assert not HostCpu.available(proc.root)


def test_host_cpu_a_process_whose_stat_is_malformed_counts_nothing(proc: FakeProc) -> None:
    cpu = HostCpu(lambda: [9], proc.root)
    cpu.sample()
    (proc.root / "9").mkdir()
    (proc.root / "9" / "stat").write_text("9 (x) S 1 2")
    proc.tick(busy=100, idle=100)
    assert cpu.sample() == pytest.approx(0.5)


class Loads:
    """A host CPU that reports the loads it is given, one a sample."""

    def __init__(self, *loads: float | None) -> None:
        self.loads = list(loads)
        self.samples = 0

    def sample(self) -> float | None:
        self.samples += 1
        return self.loads.pop(0) if len(self.loads) > 1 else self.loads[0]


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def gate_of(loads: Loads, clock: Clock, threshold: float = 0.5, wait_s: float = 10) -> LoadGate:
    return LoadGate(threshold, wait_s, loads, clock)  # type: ignore[arg-type]


def test_gate_holds_only_while_engaged_and_the_host_is_busy() -> None:
    clock = Clock()
    gate = gate_of(Loads(0.9), clock)
    assert not gate.holding()  # not engaged: what is asked for at once never waits
    with gate.engaged():
        assert gate.holding()
    assert not gate.holding()
    quiet = gate_of(Loads(0.5), clock)
    with quiet.engaged():
        assert not quiet.holding()  # at the threshold is not above it


def test_gate_samples_the_host_at_most_once_a_sample_span() -> None:
    clock = Clock()
    loads = Loads(0.9, 0.1)
    gate = gate_of(loads, clock)
    with gate.engaged():
        assert gate.holding()
        clock.now += yielding.SAMPLE_S / 2
        assert gate.holding()  # the busy sample still stands
        assert loads.samples == 1
        clock.now += yielding.SAMPLE_S / 2
        assert not gate.holding()
        assert loads.samples == 2


def test_gate_waits_at_most_its_longest_wait_then_until_the_host_is_quiet() -> None:
    clock = Clock()
    gate = gate_of(Loads(0.9, 0.9, 0.9, 0.2, 0.9), clock, wait_s=10)
    with gate.engaged():
        assert gate.holding()
        clock.now += 9
        assert gate.holding()
        clock.now += 2  # 11 s busy: compaction goes on although the host is still busy
        assert not gate.holding()
        clock.now += 1
        assert not gate.holding()  # quiet
        clock.now += 1
        assert gate.holding()  # busy again: a new wait


@pytest.mark.parametrize(("threshold", "wait_s"), [(1.0, 10.0), (0.5, 0.0)])
def test_gate_switched_off_never_samples(threshold: float, wait_s: float) -> None:
    loads = Loads(1.0)
    gate = gate_of(loads, Clock(), threshold, wait_s)
    with gate.engaged():
        assert not gate.holding()
    assert loads.samples == 0


def test_gate_with_no_figures_never_holds() -> None:
    gate = gate_of(Loads(None), Clock())
    with gate.engaged():
        assert not gate.holding()


async def test_local_engine_starts_each_task_past_the_gate(tmp_path: Path) -> None:
    """Tasks start one by one as workers free up, each once the gate lets it: a run waits
    between its tasks while the host is busy."""
    config = load_config(env={}, overrides={"data_dir": str(tmp_path)})
    passed = 0
    opened = asyncio.Event()

    async def gate() -> None:
        nonlocal passed
        await opened.wait()
        passed += 1
        opened.clear()  # the next task waits for the gate to open again

    engine = LocalCompactionEngine(config, workers=1, before_task=gate)
    try:
        tasks = [CompactionTask(f"t{i}", (), ()) for i in range(3)]
        run = asyncio.create_task(engine.run(tasks))
        for expected in (1, 2, 3):
            await asyncio.sleep(0.1)
            assert engine.tasks_finished() == expected - 1
            assert passed == expected - 1
            opened.set()
            await eventually(lambda e=expected: engine.tasks_finished() == e, 60)
        assert await run == []
    finally:
        await engine.close()


@contextlib.asynccontextmanager
async def background_compactor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gate: LoadGate, *, on_this_host: bool = True
) -> AsyncIterator[tuple[Compactor, Topic]]:
    """A background compactor behind ``gate`` (rounds every 50 ms, everything due at once),
    and a topic of 10 records in the WAL."""
    monkeypatch.setattr(LoadGate, "for_this_host", lambda *_, **__: gate)
    config = load_config(
        env={},
        overrides={
            "data_dir": str(tmp_path),
            "storage": {"flush_interval_ms": 2},
            "compactor": {"interval_s": 0.05, "min_age_s": 0, "max_age_s": 0},
        },
    )
    async with opened_parts(config) as (storage, topics, compactor):
        if not on_this_host:
            monkeypatch.setattr(compactor.engine, "runs_on_this_host", lambda: False)
        topic = await topics.create("t", 1)
        now_ms = int(time.time() * 1000)
        await storage.append(topic.streams[0], [Record(i, now_ms, None, b"v") for i in range(10)])
        stop = asyncio.Event()
        rounds = asyncio.create_task(compactor.run(stop))
        try:
            yield compactor, topic
        finally:
            stop.set()
            await rounds


async def until_compacted(compactor: Compactor, topic: Topic) -> None:
    for _ in range(600):
        if (await compactor.backlog(topic))[0] == 0:
            return
        await asyncio.sleep(0.1)
    raise AssertionError("not compacted within a minute")


async def test_background_compaction_waits_for_a_busy_host(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    host, clock = Loads(0.9), Clock()
    gate = LoadGate(0.5, 3600, host, clock)  # type: ignore[arg-type]
    async with background_compactor(tmp_path, monkeypatch, gate) as (compactor, topic):
        await asyncio.sleep(1.0)  # about twenty rounds, each finding the host busy
        assert (await compactor.backlog(topic))[0] == 10
        assert host.samples >= 1
        host.loads = [0.1]
        clock.now += yielding.SAMPLE_S
        await until_compacted(compactor, topic)


async def test_compaction_on_another_host_never_waits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    host = Loads(0.9)
    gate = LoadGate(0.5, 3600, host, Clock())  # type: ignore[arg-type]
    on_cluster = background_compactor(tmp_path, monkeypatch, gate, on_this_host=False)
    async with on_cluster as (compactor, topic):
        await until_compacted(compactor, topic)
    assert host.samples == 0
