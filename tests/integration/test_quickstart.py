"""README's run command, as a new user runs it: install into a fresh environment, serve, produce
with a Kafka client, and find the topic in its Iceberg and Delta tables."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
from kafka import KafkaProducer
from kafka.admin import KafkaAdminClient, NewTopic

from tests.support.servers import free_port, port_open

ROOT = Path(__file__).resolve().parents[2]


def run_command() -> list[str]:
    """The first command of README's "Two commands" section, split at ``&&``."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Two commands", 1)[1]
    command = re.search(r"```\n(.+?)\n```", section, re.S)
    assert command is not None, "README.md has no run command"
    return [part.strip() for part in command.group(1).split("&&")]


def test_readme_run_command_serves_kafka_and_lands_topics_in_tables(tmp_path: Path) -> None:
    install, serve = run_command()
    assert install.startswith("pip install ")
    assert serve.startswith("icefloe serve")
    uv = shutil.which("uv")
    assert uv is not None, "uv is needed to build the fresh environment (scripts/test installs it)"
    venv = tmp_path / "venv"
    subprocess.run([uv, "venv", "-q", "--python", sys.executable, str(venv)], check=True)
    packages = shlex.split(install)[2:]
    subprocess.run(
        [uv, "pip", "install", "-q", "--python", str(venv / "bin" / "python"), *packages],
        cwd=ROOT,
        check=True,
    )

    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("ICEFLOE_")}
    env.update(
        PATH=f"{venv / 'bin'}{os.pathsep}{env['PATH']}",
        ICEFLOE_BROKER__PORT=str(port),
        ICEFLOE_METRICS__PORT="0",
        ICEFLOE_SCHEMA_REGISTRY__PORT="0",
        ICEFLOE_COMPACTOR__MAX_AGE_S="1",
        ICEFLOE_COMPACTOR__MIN_AGE_S="0",
        ICEFLOE_COMPACTOR__INTERVAL_S="0.5",
        # The test's neighbours keep the machine busy: compaction yields to them, briefly.
        ICEFLOE_COMPACTOR__MAX_YIELD_S="2",
    )
    workdir = tmp_path / "work"
    workdir.mkdir()
    server = subprocess.Popen(
        shlex.split(serve),
        cwd=workdir,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not port_open(port):
            assert server.poll() is None, server.stdout.read() if server.stdout else ""
            assert time.monotonic() < deadline, "icefloe serve did not start"
            time.sleep(0.2)

        bootstrap = f"127.0.0.1:{port}"
        admin = KafkaAdminClient(bootstrap_servers=bootstrap)
        admin.create_topics([NewTopic("clicks", 2, 1)])
        admin.close()
        producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
        for i in range(100):
            producer.send("clicks", key=f"user-{i % 7}".encode(), value=f"click {i}".encode())
        producer.flush()
        producer.close()

        rows = wait_for_tables(venv, workdir, env)
        assert {row["format"] for row in rows} == {"iceberg", "delta"}
        delta = next(row for row in rows if row["format"] == "delta")
        table_root = Path(delta["location"].removeprefix("file://"))
        values = sorted(
            v.decode()
            for f in table_root.rglob("*.parquet")
            for v in pq.read_table(f).column("value").to_pylist()
        )
        assert values == sorted(f"click {i}" for i in range(100))
    finally:
        server.send_signal(signal.SIGTERM)
        assert server.wait(60) == 0


def wait_for_tables(venv: Path, workdir: Path, env: dict[str, str]) -> list[dict[str, object]]:
    """`icefloe tables --json` once every record of the topic is in both tables."""
    deadline = time.monotonic() + 90
    while True:
        result = subprocess.run(
            [str(venv / "bin" / "icefloe"), "tables", "--json"],
            cwd=workdir,
            env=env,
            capture_output=True,
            text=True,
        )
        assert result.returncode == 0, result.stderr
        rows = [r for r in json.loads(result.stdout) if r["topic"] == "clicks"]
        if len(rows) == 2 and all(r["lag_records"] == 0 and r["commit"] for r in rows):
            return rows
        assert time.monotonic() < deadline, f"the tables never caught up: {rows}"
        time.sleep(1)
