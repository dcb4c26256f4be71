"""`icefloe serve` fails fast and loudly: a broker that cannot start ends the run at once with
one line naming the cause and the fix. Once running, one broker's trouble stays its own: a
broker killed from outside is restarted at once however often, one that keeps crashing is
restarted with a back-off while the others serve, and only when every broker keeps crashing
does `serve` give up with a non-zero status."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from confluent_kafka import Message, Producer
from confluent_kafka.admin import AdminClient

from icefloe.broker.serve import MAX_CRASHES_IN_A_ROW
from tests.support.broker import RunningIcefloe, broker_pids, start_icefloe
from tests.support.http import get
from tests.support.servers import free_port, port_open
from tests.support.topics import create_topic

START_LIMIT_S = 45
"""Generous: the point is that serve ends by itself, not how fast (a busy CI machine)."""


def serve(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("ICEFLOE_")}
    return subprocess.Popen(
        [sys.executable, "-m", "icefloe", "serve", *args],
        cwd=tmp_path,
        env={
            **environment,
            "ICEFLOE_METRICS__PORT": "0",
            "ICEFLOE_SCHEMA_REGISTRY__PORT": "0",
            **(env or {}),
        },
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finished(process: subprocess.Popen[str]) -> tuple[int, str, str]:
    try:
        out, err = process.communicate(timeout=START_LIMIT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate()
        raise AssertionError(f"serve did not exit by itself; stderr: {err[-2000:]}") from None
    return process.returncode, out, err


def last_line(text: str) -> str:
    return text.strip().splitlines()[-1]


def refused_start(tmp_path: Path, *args: str) -> str:
    """Run `serve` with ``args``, which must end it with status 1 before it serves and without
    a traceback; return its last line on stderr."""
    status, out, err = finished(serve(tmp_path, *args))
    assert status == 1
    assert "Icefloe is serving" not in out
    assert "Traceback" not in err
    return last_line(err)


def test_a_taken_port_ends_serve_with_the_port_and_the_fix(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        status, out, err = finished(serve(tmp_path, "--port", str(port), "--data-dir", "d"))

    assert status == 1
    assert "Icefloe is serving" not in out
    line = last_line(err)
    assert line.startswith("icefloe: ")
    assert f"port {port}" in line
    assert "already in use" in line
    assert "--port" in line
    assert "Traceback" not in err


def test_a_taken_metrics_port_ends_serve_with_the_port_and_the_fix(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        line = refused_start(
            tmp_path, "--port", str(free_port()), "--metrics-port", str(port), "--data-dir", "d"
        )

    assert f"cannot serve metrics on 127.0.0.1:{port}" in line
    assert "--metrics-port" in line
    assert "[metrics] enabled = false" in line


def test_a_taken_schema_registry_port_ends_serve_with_the_port_and_the_fix(
    tmp_path: Path,
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        line = refused_start(
            tmp_path,
            *("--port", str(free_port()), "--schema-registry-port", str(port)),
            *("--data-dir", "d"),
        )

    assert f"cannot serve the schema registry on 127.0.0.1:{port}" in line
    assert "--schema-registry-port" in line
    assert "[schema_registry] enabled = false" in line


def test_two_listeners_configured_on_one_port_end_serve_before_it_listens(tmp_path: Path) -> None:
    port = free_port()
    metrics_port = port + 1  # the second broker's Kafka port
    line = refused_start(
        tmp_path,
        *("--port", str(port), "--brokers", "2", "--metrics-port", str(metrics_port)),
        *("--data-dir", "d"),
    )

    assert line.startswith("icefloe: [metrics] port (broker 0) and [broker] port (broker 1)")
    assert f"port {metrics_port}" in line
    assert not (tmp_path / "d").exists()  # nothing started


def test_an_unusable_data_folder_ends_serve_with_the_folder_and_the_fix(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("not a folder")

    status, _, err = finished(
        serve(tmp_path, "--port", str(free_port()), "--data-dir", "a-file/data")
    )

    assert status == 1
    line = last_line(err)
    assert "a-file/data" in line
    assert "--data-dir" in line
    assert "Traceback" not in err


def test_an_unreachable_metadata_store_ends_serve_with_the_section_to_check(
    tmp_path: Path,
) -> None:
    closed = free_port()  # nothing listens there
    env = {
        "ICEFLOE_METADATA__BACKEND": "etcd",
        "ICEFLOE_METADATA__ETCD__ENDPOINTS": f'["http://127.0.0.1:{closed}"]',
    }

    status, _, err = finished(
        serve(tmp_path, "--port", str(free_port()), "--data-dir", "d", env=env)
    )

    assert status == 1
    line = last_line(err)
    assert "unreachable" in line
    assert "[metadata] (etcd)" in line
    assert "Traceback" not in err


def test_an_unreachable_table_catalog_leaves_kafka_served_and_says_so(tmp_path: Path) -> None:
    """Compaction opens the table catalogs behind the broker's start: a catalog that cannot be
    reached keeps compaction waiting (and says why), not the Kafka clients."""
    closed = free_port()  # nothing listens there
    running = start_icefloe(
        tmp_path / "data",
        env={
            "ICEFLOE_TABLE__FORMATS": '["iceberg"]',
            "ICEFLOE_TABLE__ICEBERG__CATALOG": "rest",
            "ICEFLOE_TABLE__ICEBERG__URI": f"http://127.0.0.1:{closed}/catalog",
        },
    )
    try:
        create_topic(running, "orders")
        delivered: list[Message] = []
        producer = Producer({"bootstrap.servers": running.bootstrap})
        producer.produce(
            "orders", b"kept", on_delivery=lambda _, message: delivered.append(message)
        )
        assert producer.flush(30) == 0
        assert [m.error() for m in delivered] == [None]
        assert delivered[0].offset() == 0
        deadline = time.monotonic() + START_LIMIT_S
        while "compaction cannot start" not in running.log_path.read_text():
            assert time.monotonic() < deadline, running.log_path.read_text()[-2000:]
            time.sleep(0.2)
        assert str(closed) in running.log_path.read_text()
        [url] = running.metrics_urls
        assert "\nicefloe_compactor_open 0.0\n" in get(url)[1]
    finally:
        running.stop()


def test_a_wrong_table_option_ends_serve_with_the_option(tmp_path: Path) -> None:
    env = {"ICEFLOE_TABLE__FORMATS": '["iceberg"]', "ICEFLOE_TABLE__ICEBERG__CATALOGUE": "rest"}

    status, out, err = finished(
        serve(tmp_path, "--port", str(free_port()), "--data-dir", "d", env=env)
    )

    assert status == 1
    assert "Icefloe is serving" not in out
    line = last_line(err)
    assert "catalogue" in line
    assert "did you mean 'catalog'?" in line
    assert "Traceback" not in err


def test_a_killed_broker_is_restarted_at_once_however_often(tmp_path: Path) -> None:
    running = start_icefloe(tmp_path / "data", brokers=2)
    try:
        _, other = broker_pids(running)
        nodes = _node_ids(running)
        killed: list[int] = []
        for _ in range(MAX_CRASHES_IN_A_ROW + 1):  # more kills than crashes serve tolerates
            os.kill(_serving_broker(running, other, killed), signal.SIGKILL)
        _serving_broker(running, other, killed)
        assert running.process.poll() is None
        assert other in broker_pids(running)  # the other broker served throughout
        # Restarted at its address, the broker kept its node id: clients wait on ids.
        assert _node_ids(running) == nodes
    finally:
        running.stop()
    log = running.log_path.read_text()
    assert log.count("was killed; restarting in 1 s") == MAX_CRASHES_IN_A_ROW + 1
    assert "in a row" not in log


def test_a_broker_that_keeps_crashing_backs_off_while_the_others_serve(tmp_path: Path) -> None:
    running = start_icefloe(tmp_path / "data", brokers=2)
    try:
        _, other = broker_pids(running)
        crashed: list[int] = []
        for _ in range(MAX_CRASHES_IN_A_ROW):
            os.kill(_serving_broker(running, other, crashed, within=60), signal.SIGABRT)  # a crash
        time.sleep(1)  # serve has seen the last crash (it polls five times a second)
        assert running.process.poll() is None
        assert other in broker_pids(running)
    finally:
        running.stop()
    log = running.log_path.read_text()
    for crashes, delay in ((1, 1), (2, 2), (3, 4), (4, 8), (5, 16)):
        assert f"; crash {crashes} in a row); restarting in {delay} s" in log


def test_serve_gives_up_when_every_broker_keeps_crashing(tmp_path: Path) -> None:
    running = start_icefloe(tmp_path / "data")
    deadline = time.monotonic() + 120  # the back-off between crashes grows: 1 + 2 + 4 + 8 s
    crashed: set[int] = set()
    while running.process.poll() is None:
        assert time.monotonic() < deadline, "serve kept restarting a crashing broker"
        for pid in set(broker_pids(running)) - crashed:
            os.kill(pid, signal.SIGABRT)
            crashed.add(pid)
        time.sleep(0.1)

    assert running.process.returncode == 1
    log = running.log_path.read_text()
    assert f"every broker crashed {MAX_CRASHES_IN_A_ROW} times in a row" in log
    assert len(crashed) == MAX_CRASHES_IN_A_ROW


def _node_ids(running: RunningIcefloe) -> dict[int, int]:
    """The node ids the cluster's metadata lists, with their ports."""
    listed = AdminClient({"bootstrap.servers": running.bootstrap}).list_topics(timeout=30)
    return {broker.id: broker.port for broker in listed.brokers.values()}


def _serving_broker(
    running: RunningIcefloe, other: int, gone: list[int], within: float = START_LIMIT_S
) -> int:
    """The pid of the broker besides ``other`` once it serves again (listens on its port), not
    one of those ``gone``; it is added to them."""
    deadline = time.monotonic() + within
    while True:
        pids = [p for p in broker_pids(running) if p != other and p not in gone]
        if pids and all(port_open(running.port + i) for i in range(running.brokers)):
            gone.append(pids[0])
            return pids[0]
        assert time.monotonic() < deadline, "the broker was not restarted"
        time.sleep(0.1)


def test_port_zero_gives_every_broker_a_free_port_of_its_own(tmp_path: Path) -> None:
    process = serve(tmp_path, "--brokers", "2", "--port", "0", "--data-dir", "d")
    try:
        assert process.stdout is not None
        deadline = time.monotonic() + START_LIMIT_S
        line = ""
        while not line.startswith("Icefloe is serving Kafka at ") and time.monotonic() < deadline:
            line = process.stdout.readline()
            assert line or process.poll() is None, "serve exited before it served"
        assert line.startswith("Icefloe is serving Kafka at "), "serve did not start"
        named = line.split("on ports ")[1].split(";")[0]
        ports = [int(p) for p in named.split(", ")]
        # Each broker bound a port of its own (not port 1, base 0 + 1), and says which.
        assert len(set(ports)) == 2
        assert all(p >= 1024 for p in ports)
        assert f"at 127.0.0.1:{ports[0]} " in line
        for port in ports:
            with socket.create_connection(("127.0.0.1", port), timeout=5):
                pass
    finally:
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=START_LIMIT_S)
