"""Produce with one real client, read back with the others, through `icefloe serve`.

For each compression codec one client writes keyed records with headers over eight
partitions (the writer rotates between clients), and every other client reads them back by
manual assignment: same keys, values, headers and timestamps, offsets gapless from 0.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterator

import pytest

from tests.support.broker import RunningIcefloe, start_icefloe
from tests.support.kafka_clients import CLIENTS, Message, consume, produce, supports
from tests.support.topics import create_topic

PARTITIONS = 8
RECORDS = 100_000
WRITER = {
    "none": "kafka-python",
    "gzip": "aiokafka",
    "snappy": "confluent",
    "lz4": "aiokafka",
    "zstd": "confluent",
}
"""The client that writes each codec's topic: every client writes at least once."""
BASE_TIMESTAMP = 1_700_000_000_000


def sample(count: int, partitions: int) -> list[Message]:
    """Records spread round-robin; a few null keys and values, repeated header keys.

    No record has both a null key and a null value: kafka-python refuses to send one.
    """
    return [
        Message(
            partition=i % partitions,
            offset=-1,
            key=None if i % 997 == 1 else f"key-{i}".encode(),
            value=None if i % 1009 == 0 else f"value-{i}-".encode() + bytes(i % 40),
            headers=(("seq", str(i).encode()), ("dup", b"first"), ("dup", b"")),
            timestamp=BASE_TIMESTAMP + i,
        )
        for i in range(count)
    ]


def expected_by_partition(messages: list[Message]) -> dict[int, list[Message]]:
    """What a reader must see: each partition's records in send order, offsets from 0."""
    out: dict[int, list[Message]] = {}
    for m in messages:
        stored = out.setdefault(m.partition, [])
        stored.append(Message(m.partition, len(stored), m.key, m.value, m.headers, m.timestamp))
    return out


@pytest.fixture(scope="module")
def icefloe_module(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningIcefloe]:
    running = start_icefloe(tmp_path_factory.mktemp("matrix") / "data")
    yield running
    running.stop()


@pytest.fixture(scope="module")
def written(icefloe_module: RunningIcefloe) -> Callable[[str], dict[int, list[Message]]]:
    """Writes a codec's topic on first use; returns what each of its partitions must hold."""

    @functools.cache
    def write(codec: str) -> dict[int, list[Message]]:
        messages = sample(RECORDS, PARTITIONS)
        topic = f"matrix-{codec}"
        create_topic(icefloe_module, topic, PARTITIONS)
        started = time.monotonic()
        produce(WRITER[codec], icefloe_module.bootstrap, topic, messages, codec=codec)
        elapsed = time.monotonic() - started
        print(f"{WRITER[codec]} wrote {RECORDS} {codec} records in {elapsed:.1f}s")
        return expected_by_partition(messages)

    return write


READS = [
    pytest.param(
        codec,
        reader,
        id=f"{codec}-{WRITER[codec]}-to-{reader}",
        marks=pytest.mark.skipif(
            not supports(reader, codec),
            reason=f"{reader} lacks its optional {codec} codec package",
        ),
    )
    for codec in WRITER
    for reader in CLIENTS
    if reader != WRITER[codec]
]


@pytest.mark.slow
@pytest.mark.parametrize(("codec", "reader"), READS)
def test_a_client_reads_exactly_what_another_wrote(
    icefloe_module: RunningIcefloe,
    written: Callable[[str], dict[int, list[Message]]],
    codec: str,
    reader: str,
) -> None:
    expected = written(codec)
    started = time.monotonic()
    got = consume(
        reader,
        icefloe_module.bootstrap,
        f"matrix-{codec}",
        {p: len(records) for p, records in expected.items()},
    )
    print(f"{reader} read {RECORDS} {codec} records in {time.monotonic() - started:.1f}s")
    for partition, records in expected.items():
        assert got[partition] == records, f"partition {partition} differs"
