"""The one JVM of this process, started on first use, and Java futures awaited from asyncio.

JPype runs a JVM inside the Python process; a process can start one JVM, once, and never a
second. It is started lazily, when the first BookKeeper WAL is opened (never when the plugin is
merely installed or listed), with the BookKeeper jars on its class path and bounded heap and
direct memory: ``-Xmx`` and ``-XX:MaxDirectMemorySize`` from the options of the WAL that
started it. The JVM then lives as long as the process. ``-Xrs`` and ``interrupt=False`` leave
SIGINT and SIGTERM to Python (``icefloe serve`` shuts down on them), and the JVM is not
destroyed at exit (destroying it would wait for every Java thread).

Java futures are awaited without blocking the event loop: :func:`await_java` registers a
completion callback (a Python object implementing ``java.util.function.BiConsumer``) that
BookKeeper's own threads call; it hands the outcome to the loop with
``call_soon_threadsafe``.
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import jpype  # type: ignore[import-untyped]  # importing it starts no JVM
import jpype.config  # type: ignore[import-untyped]

from icefloe.errors import ConfigError

REQUIRED_JAR: Final = "bookkeeper-server-"
"""A class path without a jar named like this cannot hold the ledger client."""

_lock = threading.Lock()
_started_by_us: list[str] = []


def class_path_entries(classpath: str) -> list[str]:
    """The jar paths of ``classpath``: folders (every jar in them), globs and jar paths,
    separated by ``os.pathsep``."""
    entries: list[str] = []
    for part in filter(None, classpath.split(os.pathsep)):
        path = Path(part).expanduser()
        if path.is_dir():
            entries.extend(sorted(str(jar) for jar in path.glob("*.jar")))
        elif any(c in part for c in "*?["):
            entries.extend(sorted(glob.glob(str(path))))
        elif path.is_file():
            entries.append(str(path))
    return entries


def ensure_jvm(classpath: str, max_heap_mb: int, max_direct_mb: int) -> None:
    """Start this process's JVM with the BookKeeper jars of ``classpath``, unless it runs.

    Blocking (about a second): call it from a worker thread.

    Raises:
        ConfigError: the class path holds no BookKeeper client, or the JVM that already runs
            in this process cannot load it.
    """

    with _lock:
        if jpype.isJVMStarted():
            _check_client_loads()
            return
        jars = class_path_entries(classpath)
        if not any(Path(jar).name.startswith(REQUIRED_JAR) for jar in jars):
            raise ConfigError(
                f"[wal.bookkeeper] classpath = {classpath!r} holds no {REQUIRED_JAR}*.jar: "
                "point it at a folder with Apache BookKeeper's client jars "
                "(bookkeeper-server 4.17 and its dependencies, e.g. fetched with Maven: "
                "see the icefloe-wal-bookkeeper README)"
            )
        jpype.config.destroy_jvm = False
        try:
            jpype.startJVM(
                f"-Xmx{max_heap_mb}m",
                f"-XX:MaxDirectMemorySize={max_direct_mb}m",
                "-Xrs",
                "--add-opens=java.base/java.nio=ALL-UNNAMED",
                "--add-opens=java.base/jdk.internal.misc=ALL-UNNAMED",
                "-Dio.netty.tryReflectionSetAccessible=true",
                classpath=jars,
                interrupt=False,
            )
        except OSError as exc:
            raise ConfigError(
                f"cannot start a JVM for the BookKeeper WAL ({exc}); install a Java 17+ "
                "runtime or set JAVA_HOME"
            ) from exc
        _started_by_us.append(classpath)
        _check_client_loads()
        _quiet_logging()


def _quiet_logging() -> None:
    """Warnings and errors only from the Java side (BookKeeper logs every ledger at INFO)."""
    try:
        levels = jpype.JClass("org.apache.logging.log4j.Level")
        configurator = jpype.JClass("org.apache.logging.log4j.core.config.Configurator")
    except Exception:  # noqa: BLE001 - no Log4j 2 core on the class path: quiet enough
        return
    configurator.setRootLevel(levels.WARN)
    # Once per client, about what is expected here: no rack-topology script configured, and
    # a worker pool that takes a moment to stop when the WAL closes.
    for name in (
        "org.apache.bookkeeper.client.RackawareEnsemblePlacementPolicyImpl",
        "org.apache.bookkeeper.client.BookKeeper",
    ):
        configurator.setLevel(name, levels.ERROR)


def _check_client_loads() -> None:
    try:
        jpype.JClass("org.apache.bookkeeper.client.api.BookKeeper")
    except Exception as exc:  # any failure to load is the same problem
        started = f" (started with {_started_by_us[0]!r})" if _started_by_us else ""
        raise ConfigError(
            "the JVM already running in this process cannot load the BookKeeper client"
            f"{started}: one JVM per process, so [wal.bookkeeper] classpath must be on it"
        ) from exc


def jvm_running() -> bool:
    return bool(jpype.isJVMStarted())


_callback_class: Any = None


def _completion_callback_class() -> Any:
    """A ``BiConsumer`` implemented in Python (defined once the JVM runs)."""
    global _callback_class
    if _callback_class is None:

        @jpype.JImplements("java.util.function.BiConsumer")
        class _Completion:
            def __init__(self, deliver: Callable[[Any, Any], None]) -> None:
                self._deliver = deliver

            @jpype.JOverride  # type: ignore[untyped-decorator]
            def accept(self, result: Any, error: Any) -> None:
                self._deliver(result, error)

        _callback_class = _Completion
    return _callback_class


class JavaFailure(Exception):
    """A Java future failed: ``cause`` is the Java exception, unwrapped from completion
    wrappers (``CompletionException``, ``ExecutionException``)."""

    def __init__(self, cause: Any) -> None:
        super().__init__(str(cause))
        self.cause = cause


def unwrap(error: Any) -> Any:
    """The Java exception inside completion wrappers."""
    wrappers = (
        jpype.JClass("java.util.concurrent.CompletionException"),
        jpype.JClass("java.util.concurrent.ExecutionException"),
    )
    while isinstance(error, wrappers) and error.getCause() is not None:
        error = error.getCause()
    return error


def await_java(future: Any, convert: Callable[[Any], Any] | None = None) -> asyncio.Future[Any]:
    """An asyncio future completed when the Java ``CompletableFuture`` completes.

    ``convert`` runs on the completing Java thread (with the GIL), e.g. to copy entries out of
    Java buffers and release them there; its exception fails the future. A Java failure is a
    :class:`JavaFailure`.
    """
    loop = asyncio.get_running_loop()
    waiter: asyncio.Future[Any] = loop.create_future()

    def settle(value: Any, failure: BaseException | None) -> None:
        if waiter.done():
            return  # cancelled (a timeout) meanwhile
        if failure is not None:
            waiter.set_exception(failure)
        else:
            waiter.set_result(value)

    def deliver(result: Any, error: Any) -> None:
        failure: BaseException | None = None
        value: Any = None
        if error is not None:
            failure = JavaFailure(unwrap(error))
        elif convert is not None:
            try:
                value = convert(result)
            except Exception as exc:  # noqa: BLE001 - handed to the awaiting coroutine
                failure = exc
        else:
            value = result
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
            loop.call_soon_threadsafe(settle, value, failure)

    future.whenComplete(_completion_callback_class()(deliver))
    return waiter
