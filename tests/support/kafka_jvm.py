"""Apache Kafka 4.1.1's own Java classes — its command-line tools and clients — run from the
jars `scripts/servers.d/kafka-jars.sh` fetches from Maven Central.

Each run starts a JVM. The first run of a main class that succeeds leaves a class-data archive
of what it loaded beside the jars, and every later run of that class maps it rather than
loading and verifying those classes again: a tool starts in about 0.9 s instead of 1.9. The
archive is written under a name of its own and renamed into place only once complete, since
the JVM crashes on a truncated one; one the JVM cannot use (another JDK) is ignored with a
warning on stderr.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import pytest

from tests.support.servers import ROOT

KAFKA_VERSION: Final = "4.1.1"
LIB: Final = ROOT / ".servers" / f"kafka-{KAFKA_VERSION}" / "lib"
REQUIRED_JARS: Final = (f"kafka_2.13-{KAFKA_VERSION}.jar", f"kafka-tools-{KAFKA_VERSION}.jar")
LOG4J_CONFIG: Final = ROOT / "tests" / "bench" / "sidebyside" / "log4j2.properties"
CLASS_ARCHIVES: Final = LIB.parent / "class-archives"
TOOL_TIMEOUT_S: Final = 120

TOPICS: Final = "org.apache.kafka.tools.TopicCommand"
CONFIGS: Final = "kafka.admin.ConfigCommand"
CONSUMER_GROUPS: Final = "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand"
DELETE_RECORDS: Final = "org.apache.kafka.tools.DeleteRecordsCommand"
LOG_DIRS: Final = "org.apache.kafka.tools.LogDirsCommand"
TRANSACTIONS: Final = "org.apache.kafka.tools.TransactionsCommand"
ACLS: Final = "org.apache.kafka.tools.AclCommand"


def java_executable() -> str:
    """``java``, with Kafka's jars fetched; the test fails naming the fix otherwise."""
    missing = [jar for jar in REQUIRED_JARS if not (LIB / jar).exists()]
    if missing or not (LIB / ".complete").exists():
        what = ", ".join(missing) or "an unfinished download"
        pytest.fail(
            f"Kafka {KAFKA_VERSION}'s jars are missing from {LIB} ({what}): "
            "run scripts/install-servers (scripts/servers.d/kafka-jars.sh)"
        )
    java = shutil.which("java")
    if java is None:
        pytest.fail("`java` is not on PATH: run scripts/install-servers, which installs a JDK")
    return java


def run_java(
    main_class: str, *args: str, timeout: float = TOOL_TIMEOUT_S
) -> subprocess.CompletedProcess[str]:
    """``main_class`` from Kafka's jars, run to the end."""
    java = java_executable()
    archive = CLASS_ARCHIVES / f"{main_class}.jsa"
    archive_part = None
    if archive.exists():
        sharing = [f"-XX:SharedArchiveFile={archive}"]
    else:
        CLASS_ARCHIVES.mkdir(exist_ok=True)
        archive_part = archive.with_name(f"{archive.name}.{uuid.uuid4().hex}.part")
        sharing = [f"-XX:ArchiveClassesAtExit={archive_part}"]
    command = [
        java,
        "-Xmx256m",
        "-XX:TieredStopAtLevel=1",  # quick start-up matters more than peak speed here
        *sharing,
        "-Xlog:disable",
        "-Xlog:all=warning:stderr",  # the JVM's own warnings stay out of the output tests read
        f"-Dlog4j2.configurationFile={LOG4J_CONFIG}",
        "-cp",
        f"{LIB}/*",
        main_class,
        *args,
    ]
    succeeded = False
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
        succeeded = done.returncode == 0
    finally:
        if archive_part is not None:
            _keep_archive(archive_part, archive, complete=succeeded)
    return done


def _keep_archive(part: Path, archive: Path, *, complete: bool) -> None:
    """A JVM that ended well wrote its archive whole; any other may have left part of one."""
    with contextlib.suppress(FileNotFoundError):
        if complete:
            part.replace(archive)  # atomic: another run sees all of it or none
        else:
            part.unlink()


def compile_java(source: Path, classes: Path) -> list[str]:
    """Compile ``source`` against Kafka's jars into ``classes``; the command that runs its main
    class (arguments to follow)."""
    java = java_executable()
    javac = shutil.which("javac")
    if javac is None:
        pytest.fail("`javac` is not on PATH: run scripts/install-servers, which installs a JDK")
    compiled = subprocess.run(
        [javac, "-cp", f"{LIB}/*", "-d", str(classes), str(source)],
        capture_output=True,
        text=True,
        timeout=TOOL_TIMEOUT_S,
    )
    assert compiled.returncode == 0, compiled.stderr
    command = [java, "-Xmx256m", f"-Dlog4j2.configurationFile={LOG4J_CONFIG}"]
    return [*command, "-cp", f"{LIB}/*:{classes}", source.stem]


@dataclass(frozen=True)
class KafkaTools:
    """Kafka's command-line tools against the cluster at ``bootstrap``."""

    bootstrap: str

    def run(self, main_class: str, *args: str, expect_failure: bool = False) -> str:
        """The tool's standard output (and standard error, when it is expected to fail)."""
        done = run_java(main_class, "--bootstrap-server", self.bootstrap, *args)
        shown = f"{main_class} {' '.join(args)}: exit {done.returncode}\n{done.stdout}{done.stderr}"
        if expect_failure:
            assert done.returncode != 0, shown
            return done.stdout + done.stderr
        assert done.returncode == 0, shown
        return done.stdout


def rows(output: str) -> list[list[str]]:
    """A tool's table output, one list of columns per line."""
    return [line.split() for line in output.splitlines() if line.strip()]
