"""Apache Kafka 4.1.1 from Maven Central, and one KRaft broker of it on 127.0.0.1.

The jars are fetched once with Maven (``kafka-pom.xml`` beside this file) into a gitignored
folder. The broker is one JVM that is both broker and controller, with Kafka's defaults except
what a single node on loopback needs (:data:`SINGLE_NODE_SETTINGS`).
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka.admin import AdminClient, NewTopic

from tests.support.servers import ROOT, free_ports, port_open

KAFKA_VERSION = "4.1.1"
HERE = Path(__file__).resolve().parent
POM = HERE / "kafka-pom.xml"
LOG4J_CONFIG = HERE / "log4j2.properties"
DEFAULT_LIB = ROOT / ".servers" / f"kafka-{KAFKA_VERSION}" / "lib"
DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1:copy-dependencies"
REQUIRED_JARS = (f"kafka_2.13-{KAFKA_VERSION}.jar", f"kafka-tools-{KAFKA_VERSION}.jar")
COMPLETE_MARKER = ".complete"

MAVEN_TIMEOUT_S = 900
STORAGE_TOOL_TIMEOUT_S = 120
START_TIMEOUT_S = 120
STOP_TIMEOUT_S = 60

BROKER_JVM_OPTIONS = (
    # What Kafka's own start script gives the broker.
    "-server",
    "-XX:+UseG1GC",
    "-XX:MaxGCPauseMillis=20",
    "-XX:InitiatingHeapOccupancyPercent=35",
    "-XX:+ExplicitGCInvokesConcurrent",
    "-Djava.awt.headless=true",
)

SINGLE_NODE_SETTINGS = """\
process.roles=broker,controller
node.id=1
controller.quorum.bootstrap.servers=127.0.0.1:{controller}
listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller}
advertised.listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller}
controller.listener.names=CONTROLLER
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT
log.dirs={log_dir}
offsets.topic.replication.factor=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
"""
"""server.properties: every line that is not a Kafka default, all of them for a single node."""


class SetupError(RuntimeError):
    """Something the benchmark needs is missing or does not work (Java, Maven, the jars)."""


def require_program(name: str, why: str) -> str:
    """The path of ``name`` on PATH, or a :class:`SetupError` saying what it is needed for."""
    found = shutil.which(name)
    if found is None:
        raise SetupError(f"`{name}` is not on PATH; it is needed {why}")
    return found


def ensure_jars(lib: Path = DEFAULT_LIB) -> Path:
    """The folder of Kafka's jars, fetched from Maven Central on first use."""
    if (lib / COMPLETE_MARKER).exists() and all((lib / jar).exists() for jar in REQUIRED_JARS):
        return lib
    mvn = require_program("mvn", f"once, to fetch Kafka {KAFKA_VERSION} from Maven Central")
    partial = lib.with_name(lib.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.parent.mkdir(parents=True, exist_ok=True)
    print(f"fetching Kafka {KAFKA_VERSION} from Maven Central into {lib} …", flush=True)
    command = [
        mvn,
        "-q",
        "-B",
        "-f",
        str(POM),
        DEPENDENCY_PLUGIN,
        "-DincludeScope=runtime",
        f"-DoutputDirectory={partial}",
    ]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=MAVEN_TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        raise SetupError(f"Maven did not finish within {MAVEN_TIMEOUT_S} s") from exc
    missing = [jar for jar in REQUIRED_JARS if not (partial / jar).exists()]
    if done.returncode != 0 or missing:
        output = (done.stdout + done.stderr)[-3000:]
        raise SetupError(f"Maven could not fetch Kafka (exit {done.returncode}):\n{output}")
    (partial / COMPLETE_MARKER).write_text(" ".join(command) + "\n")
    shutil.rmtree(lib, ignore_errors=True)
    partial.rename(lib)
    return lib


@dataclass(frozen=True)
class Java:
    """How to run a Kafka class: the java program, the jar folder and a heap size."""

    program: str
    lib: Path

    def command(self, main_class: str, args: list[str], heap: str, *jvm: str) -> list[str]:
        return [
            self.program,
            f"-Xmx{heap}",
            *jvm,
            f"-Dlog4j2.configurationFile={LOG4J_CONFIG}",
            "-cp",
            f"{self.lib}/*",  # java expands the wildcard itself
            main_class,
            *args,
        ]

    def version(self) -> str:
        done = subprocess.run(
            [self.program, "-version"], capture_output=True, text=True, timeout=60
        )
        lines = (done.stderr or done.stdout).splitlines()
        return lines[0] if lines else "unknown"


def find_java(lib: Path) -> Java:
    """Java 17 or later on PATH, with the Kafka jars (fetched if need be)."""
    program = require_program("java", f"to run Kafka {KAFKA_VERSION} (Java 17 or later)")
    return Java(program, ensure_jars(lib))


@dataclass
class KafkaBroker:
    """A running single-node Kafka: its JVM process, port and log."""

    process: subprocess.Popen[bytes]
    port: int
    log_path: Path
    settings: str = field(repr=False)

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def pids(self) -> list[int]:
        return [self.process.pid] if self.process.poll() is None else []

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def stop(self) -> None:
        """SIGTERM (a controlled shutdown), then SIGKILL after :data:`STOP_TIMEOUT_S`."""
        if self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(30)


def start_kafka(java: Java, workdir: Path, heap: str = "1G") -> KafkaBroker:
    """Format a fresh KRaft log folder in ``workdir`` and start a broker on free ports."""
    port, controller = free_ports(2)
    log_dir = workdir / "kafka-logs"
    settings = SINGLE_NODE_SETTINGS.format(port=port, controller=controller, log_dir=log_dir)
    properties = workdir / "server.properties"
    properties.write_text(settings)
    cluster_id = _storage_tool(java, ["random-uuid"]).strip().splitlines()[-1]
    _storage_tool(java, ["format", "-t", cluster_id, "-c", str(properties), "--standalone"])
    log_path = workdir / "kafka.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            java.command(
                "kafka.Kafka", [str(properties)], heap, f"-Xms{heap}", *BROKER_JVM_OPTIONS
            ),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    broker = KafkaBroker(process, port, log_path, settings)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            break
        if port_open(port):
            return broker
        time.sleep(0.2)
    broker.stop()
    raise SetupError(f"Kafka did not start; the end of its log:\n{broker.log_tail()}")


def _storage_tool(java: Java, args: list[str]) -> str:
    command = java.command("kafka.tools.StorageTool", args, "256M")
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=STORAGE_TOOL_TIMEOUT_S
        )
    except subprocess.TimeoutExpired as exc:
        raise SetupError(f"kafka-storage {args[0]} took over {STORAGE_TOOL_TIMEOUT_S} s") from exc
    if done.returncode != 0:
        raise SetupError(
            f"kafka-storage {' '.join(args)} failed (exit {done.returncode}):\n"
            f"{(done.stdout + done.stderr)[-3000:]}"
        )
    return done.stdout


def create_kafka_topic(bootstrap: str, name: str, partitions: int, timeout: float = 60) -> None:
    """Create a topic with Kafka's default replication and wait until every partition leads."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(name, partitions)], request_timeout=timeout)
    for future in futures.values():
        future.result(timeout)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        topic = admin.list_topics(name, timeout=10).topics.get(name)
        leaders = [] if topic is None or topic.error else list(topic.partitions.values())
        if len(leaders) == partitions and all(p.leader >= 0 for p in leaders):
            return
        time.sleep(0.2)
    raise SetupError(f"topic {name} has no leader for every partition after {timeout} s")
