"""A Spark standalone cluster on loopback: one master and two workers, started from the
workspace's PySpark distribution (its own launch classes and jars, no other Spark install) the
first time a test asks for it, and stopped when the test process exits.

Two workers of two cores hold two applications of two one-core executors each (one on each
worker). The executors run the workspace's Python (the engine's ``python`` option), which has
Icefloe installed, and reach the test's files at the same paths: the local object store works
on this one-machine cluster as a shared filesystem would on a real one.
"""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.servers import ServerProcess, free_port, port_open

WORKERS = 2
WORKER_CORES = 2
"""Two per worker, though each application takes one on each (``spark.cores.max``): so a
second driver (a compactor started while another's executors are up) gets executors too."""
WORKER_MEMORY = "1g"
JVM_OPTIONS = ["-Xmx256m", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC"]
"""The master and worker daemons are small; executors get their own heap."""


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent


@dataclass(frozen=True)
class SparkCluster:
    master_url: str
    master: ServerProcess
    workers: tuple[ServerProcess, ...]
    workdir: Path

    def engine_options(self, **conf: str) -> dict[str, Any]:
        """``[compaction.spark]`` options for this cluster: two executors of one core, the
        driver (this process) on loopback, the executors on this interpreter."""
        return {
            "master": self.master_url,
            "app_name": "icefloe-compaction-cluster-test",
            "python": sys.executable,
            "log_level": "WARN",
            "conf": {
                "spark.ui.enabled": "false",
                "spark.driver.memory": "512m",
                "spark.driver.host": "127.0.0.1",
                "spark.driver.bindAddress": "127.0.0.1",
                "spark.executor.memory": "512m",
                "spark.executor.cores": "1",
                "spark.cores.max": str(WORKERS),
                "spark.executor.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
                "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
                **conf,
            },
        }

    def executor_pids(self) -> list[int]:
        """Process ids of the executors the workers run now (their child JVMs)."""
        workers = {w.process.pid for w in self.workers if w.process is not None}
        pids = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                parent = int((entry / "stat").read_text().rpartition(")")[2].split()[1])
                command = (entry / "cmdline").read_bytes()
            except (OSError, ValueError, IndexError):
                continue
            if parent in workers and b"CoarseGrainedExecutorBackend" in command:
                pids.append(int(entry.name))
        return sorted(pids)

    def wait_for_executors(self, count: int, timeout: float = 60.0) -> list[int]:
        """The executors' pids once ``count`` of them run."""
        deadline = time.monotonic() + timeout
        while len(pids := self.executor_pids()) < count:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{count} executors did not start (running: {pids})")
            time.sleep(0.2)
        return pids

    def stop(self) -> None:
        for worker in self.workers:
            worker.stop()
        self.master.stop()
        shutil.rmtree(self.workdir, ignore_errors=True)


def _registered(log: Path) -> bool:
    return log.exists() and "Successfully registered with master" in log.read_text(errors="replace")


@functools.cache
def spark_cluster() -> SparkCluster:
    """The test process's cluster, started on first use (about 10 s)."""
    home = spark_home()
    java_home = os.environ.get("JAVA_HOME")  # Spark's own launcher prefers it to PATH
    java = shutil.which("java", path=os.path.join(java_home, "bin")) if java_home else None
    java = java or shutil.which("java")
    if java is None:
        raise RuntimeError("the Spark cluster needs Java 17 or later on PATH or in JAVA_HOME")
    workdir = Path(tempfile.mkdtemp(prefix="icefloe-spark-cluster-"))
    classpath = f"{home}/jars/*"
    env = {
        "SPARK_HOME": str(home),  # where workers find the jars for the executors they launch
        # Spark's launcher tells a distribution from a source build by its RELEASE file,
        # which PySpark's lacks: without the Scala line it looks for build directories.
        "SPARK_SCALA_VERSION": "2.13",
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_LOG_DIR": str(workdir),
        "SPARK_WORKER_DIR": str(workdir / "work"),
    }
    no_rest = "-Dspark.master.rest.enabled=false"
    port = free_port()
    master = ServerProcess(
        "spark-master",
        [
            *(java, *JVM_OPTIONS, no_rest, "-cp", classpath),
            *("org.apache.spark.deploy.master.Master", "--host", "127.0.0.1"),
            *("--port", str(port), "--webui-port", str(free_port())),
        ],
        workdir,
        ready=lambda: port_open(port),
        env=env,
        timeout=90.0,
    ).start()
    url = f"spark://127.0.0.1:{port}"
    workers = []
    try:
        for i in range(WORKERS):
            folder = workdir / f"worker-{i}"
            # Each worker on a loopback address of its own: Spark runs a speculative copy on
            # another host than the slow attempt, and tells hosts apart by address.
            host = f"127.0.0.{i + 1}"
            worker = ServerProcess(
                f"spark-worker-{i}",
                [
                    *(java, *JVM_OPTIONS, "-cp", classpath),
                    *("org.apache.spark.deploy.worker.Worker", url, "--host", host),
                    *(
                        "--cores",
                        str(WORKER_CORES),
                        "--memory",
                        WORKER_MEMORY,
                        "--webui-port",
                        str(free_port()),
                    ),
                    *("--work-dir", str(folder / "work")),
                ],
                folder,
                ready=lambda folder=folder, i=i: _registered(folder / f"spark-worker-{i}.log"),
                env={**env, "SPARK_LOCAL_IP": host},
                timeout=90.0,
            )
            workers.append(worker.start())
    except BaseException:
        for worker in workers:
            worker.stop()
        master.stop()
        raise
    cluster = SparkCluster(url, master, tuple(workers), workdir)
    atexit.register(cluster.stop)
    return cluster


# --- slow tasks, for the failure tests ------------------------------------------------------

SLOW_S = 40.0
"""How long the first attempt of a slowed task waits: far longer than a job takes."""


def slowed(marks: str, write_first: bool, config: Any, task: Any) -> Any:
    """Runs on an executor in place of ``executor.run_task``: the first attempt of a run's
    first task (with ``write_first``, after writing its files) leaves its pid in
    ``marks/slow`` and waits (to be killed, or outrun by a speculative copy); a later
    attempt of it leaves ``marks/attempt-<n>``; every other task runs normally."""
    from icefloe_compaction_spark import executor
    from pyspark import TaskContext

    context = TaskContext.get()
    attempt = context.attemptNumber() if context is not None else 0
    first = task.task_id.endswith("-0")
    outcome = None
    if first and attempt == 0:
        if write_first:
            outcome = executor.run_task(config, task)
        Path(marks, "slow").write_text(str(os.getpid()))
        time.sleep(SLOW_S)
    elif first:
        Path(marks, f"attempt-{attempt}").write_text(str(os.getpid()))
    return outcome or executor.run_task(config, task)


def install_slow_tasks(marks: Path, write_first: bool) -> Callable[[], None]:
    """Make this driver's compaction jobs run :func:`slowed`; returns the undo."""
    from icefloe_compaction_spark import engine, executor
    from pyspark import cloudpickle

    class Slowed:
        run_task = staticmethod(functools.partial(slowed, str(marks), write_first))

    module = sys.modules[__name__]
    cloudpickle.register_pickle_by_value(module)  # type: ignore[no-untyped-call]
    engine._ship_by_value()  # the real executor module, before it is replaced
    engine.executor = Slowed  # type: ignore[assignment]

    def undo() -> None:
        engine.executor = executor
        cloudpickle.unregister_pickle_by_value(module)  # type: ignore[no-untyped-call]

    return undo


def compact_as_slow_driver(config: Any, marks: Path) -> None:
    """A compactor process (the Spark driver) whose run's first task writes its files and
    then waits: for the test to kill this process mid-run."""
    import asyncio

    from icefloe.compaction.service import Compactor
    from icefloe.storage.engine import StreamStorage
    from icefloe.topics.registry import TopicRegistry

    async def main() -> None:
        async with await StreamStorage.open(config) as storage:
            topics = TopicRegistry(storage)
            await topics.start()
            compactor = await Compactor.open(config, storage, topics)
            install_slow_tasks(marks, write_first=True)
            await compactor.until_idle()

    asyncio.run(main())
    raise SystemExit("the compactor finished before it was killed")
