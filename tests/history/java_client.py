"""The Java client in a history run: Kafka's own producer, driven by a small program
(``java/HistorySender.java``, run by Java's source launcher) that prints each operation's
outcome as a JSON line, recorded here like the Python clients' operations."""

from __future__ import annotations

import contextlib
import json
import subprocess
import threading
from pathlib import Path
from typing import Final

from tests.history.recorder import Completed
from tests.history.workload import Setup, Worker
from tests.support.kafka_jvm import LIB, java_executable

PROGRAM: Final = Path(__file__).parent / "java" / "HistorySender.java"
VALUE_BASE: Final = 1_000_000_000
"""Where each Java sender's values start (times its number plus one): far above the Python
clients', so that every value of a key stays unique."""


class JavaSender(Worker):
    """An idempotent Java producer, one record per ``send``; a new client (and process number)
    after each send whose outcome it could not know."""

    def __init__(self, name: str, setup: Setup, seed: int, number: int, log: Path) -> None:
        super().__init__(name, setup, seed)
        self._seed = seed
        self._value_base = VALUE_BASE * (number + 1)
        self._log = log

    def run(self) -> None:
        command = [
            java_executable(),
            "-Xmx256m",
            "-cp",
            f"{LIB}/*",
            str(PROGRAM),
            self.client["bootstrap.servers"],
            self.topic,
            str(self.partitions),
            str(self._seed),
            str(self._value_base),
            repr(self.history.began),
        ]
        processes: dict[int, int] = {}
        try:
            with self._log.open("a") as log:
                program = subprocess.Popen(
                    command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True
                )
                assert program.stdout is not None
                threading.Thread(target=self._stop_when_told, args=(program,), daemon=True).start()
                for line in program.stdout:
                    op = json.loads(line)
                    if op["client"] not in processes:
                        processes[op["client"]] = self.history.new_process()
                    self.process = processes[op["client"]]
                    self._record(op)
                code = program.wait()
            if code != 0:
                self.errors.append(f"{self.name}: the Java sender exited {code} (see {log.name})")
            self.replaced = max(0, len(processes) - 1)
        except Exception as exc:  # a bug in the run: reported, never hidden
            self.errors.append(f"{self.name}: {exc!r}")
            raise

    def _stop_when_told(self, program: subprocess.Popen[str]) -> None:
        """Close the program's stdin once the run stops it: it finishes its send and exits."""
        self.stopping.wait()
        assert program.stdin is not None
        with contextlib.suppress(OSError):
            program.stdin.close()

    def _record(self, op: dict[str, object]) -> None:
        invoke = [["send", op["key"], op["value"]]]
        value = invoke if op["type"] != "ok" else [["send", op["key"], [op["offset"], op["value"]]]]
        self.history.record(
            Completed(
                self.process,
                "send",
                float(op["invoked"]),  # type: ignore[arg-type]
                invoke,
                float(op["completed"]),  # type: ignore[arg-type]
                str(op["type"]),
                value,
                op.get("error"),  # type: ignore[arg-type]
            )
        )
