"""A quiet idempotent producer, side by side: one record to every partition after each pause.

    python -m tests.bench.quiet_producer_bench [--rounds 3] [--sends 12] [--pauses 0.2,1.5]
        [--partitions 8] [--new-producers 12] [--java-records 20] [--java-pause 2]

Most producers of a quiet topic send now and then, and Kafka's clients are idempotent by
default. Each round starts Apache Kafka 4.1.1 and `icefloe serve` (embedded default, one
broker) in turn, creates a topic, and measures idempotent producers (acks=all, linger.ms=5,
records of 1 KiB):

- a confluent-kafka producer sends a record to each partition and waits for the
  acknowledgements, ``--sends`` times after each pause (librdkafka sends one produce request
  per partition): the median time from the first send to the last acknowledgement;
- ``--new-producers`` new producers, one after the other, each asking for a producer id and
  sending a record to each partition in one Produce request, as the Java client does (over
  the wire, without a client library, whose own timers would dominate: librdkafka takes half a
  second for its first send to either broker): the median time of the two requests;
- Kafka's ProducerPerformance sends ``--java-records`` records, one every ``--java-pause``
  seconds (the Java client keeps to one partition for ``batch.size`` bytes, so to one
  partition here): its median latency.

Prints each round, then the medians over all rounds and the Icefloe/Kafka ratios.
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import confluent_kafka
from kio.schema.init_producer_id.v4.request import InitProducerIdRequest
from kio.static.primitive import i16, i64

from tests.bench.sidebyside import icefloe_server
from tests.bench.sidebyside.kafka import (
    DEFAULT_LIB,
    KAFKA_VERSION,
    Java,
    create_kafka_topic,
    ensure_jars,
    find_java,
    start_kafka,
)
from tests.bench.sidebyside.workloads import Server, producer_performance
from tests.support.kafka_wire import KafkaWire, batch_of, produce_request_for
from tests.support.topics import create_topic

TOPIC = "quiet"
RECORD = os.urandom(1024)
SYSTEMS = ("kafka", "icefloe")
PRODUCER_SETTINGS = {"acks": "all", "linger.ms": 5, "enable.idempotence": True}


def sends(bootstrap: str, partitions: int, pauses: list[float], count: int) -> dict[float, float]:
    """The median milliseconds of ``count`` sends after each pause."""
    producer = confluent_kafka.Producer(PRODUCER_SETTINGS | {"bootstrap.servers": bootstrap})

    def send_to_all() -> float:
        started = time.perf_counter()
        for partition in range(partitions):
            producer.produce(TOPIC, RECORD, partition=partition)
        if producer.flush(30):
            raise RuntimeError("records unacknowledged after 30 s")
        return 1000 * (time.perf_counter() - started)

    send_to_all()  # connections, metadata and producer id: not part of the measure
    medians = {}
    for pause in pauses:
        taken = []
        for _ in range(count):
            time.sleep(pause)
            taken.append(send_to_all())
        medians[pause] = statistics.median(taken)
    return medians


def first_sends(bootstrap: str, partitions: int, count: int) -> float:
    """The median milliseconds of ``count`` new producers' first send, made as the Java client
    makes it: InitProducerId, then one Produce request with a batch for every partition (on
    one connection, over the wire, so that the client's own timers do not count)."""
    taken = []
    with KafkaWire(bootstrap) as wire:
        for _ in range(count):
            started = time.perf_counter()
            producer = wire.request(
                InitProducerIdRequest(
                    transactional_id=None,
                    transaction_timeout=datetime.timedelta(seconds=60),
                    producer_id=i64(-1),
                    producer_epoch=i16(-1),
                )
            )
            answer = wire.request(first_batches(producer.producer_id, partitions))
            taken.append(1000 * (time.perf_counter() - started))
            codes = [p.error_code for t in answer.responses for p in t.partition_responses]
            if producer.error_code or any(codes):
                raise RuntimeError(f"the first send failed: {producer.error_code}, {codes}")
    return statistics.median(taken)


def first_batches(producer_id: int, partitions: int) -> Any:
    """A Produce request with a producer's first batch (one record) for each partition."""
    first = batch_of([RECORD], producer_id=producer_id, producer_epoch=0, base_sequence=0)
    return produce_request_for(TOPIC, dict.fromkeys(range(partitions), first))


@contextmanager
def running(system: str, java: Java, workdir: Path, partitions: int) -> Iterator[Server]:
    """A fresh broker of ``system`` with the topic created."""
    if system == "kafka":
        (workdir / "kafka").mkdir()
        broker = start_kafka(java, workdir / "kafka")
        try:
            create_kafka_topic(broker.bootstrap, TOPIC, partitions)
            yield broker
        finally:
            broker.stop()
        return
    (workdir / "icefloe").mkdir()
    server = icefloe_server.start(workdir / "icefloe" / "data", "latency", 1)
    try:
        create_topic(server.running, TOPIC, partitions)
        yield server
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.quiet_producer_bench")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sends", type=int, default=12, help="sends after each pause")
    parser.add_argument("--pauses", default="0.2,1.5", help="seconds, comma-separated")
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--new-producers", type=int, default=12)
    parser.add_argument("--java-records", type=int, default=20)
    parser.add_argument("--java-pause", type=float, default=2.0, help="seconds between records")
    args = parser.parse_args()
    try:
        pauses = [float(p) for p in args.pauses.split(",")]
    except ValueError:
        parser.error(f"--pauses {args.pauses!r}: expected seconds, comma-separated")
    if args.java_pause <= 0:
        parser.error("--java-pause must be more than 0 seconds")
    java = find_java(ensure_jars(DEFAULT_LIB))
    results: dict[str, list[dict[str, float]]] = {system: [] for system in SYSTEMS}
    for round_number in range(1, args.rounds + 1):
        for system in SYSTEMS:
            with (
                tempfile.TemporaryDirectory(prefix="icefloe-quiet-") as tmp,
                running(system, java, Path(tmp), args.partitions) as server,
            ):
                medians = sends(server.bootstrap, args.partitions, pauses, args.sends)
                first = first_sends(server.bootstrap, args.partitions, args.new_producers)
                java_run = producer_performance(
                    java, server, TOPIC, args.java_records, len(RECORD), 1 / args.java_pause
                )
            measures = {f"confluent after {p:g} s, median ms": ms for p, ms in medians.items()}
            measures["a new producer's first send to every partition, median ms"] = first
            every = f"Java, a record every {args.java_pause:g} s"
            measures[f"{every}, median ms"] = java_run["p50_ms"]
            results[system].append(measures)
            shown = ", ".join(f"{name} {value:.1f}" for name, value in measures.items())
            print(f"[round {round_number}/{args.rounds}] {label(system)}: {shown}", flush=True)
    print()
    print(f"| measure | Kafka {KAFKA_VERSION} | Icefloe | ratio |")
    print("|---|---|---|---|")
    for name in results["kafka"][0]:
        kafka, icefloe = (statistics.median(r[name] for r in results[s]) for s in SYSTEMS)
        print(f"| {name} | {kafka:.1f} | {icefloe:.1f} | {icefloe / kafka:.2f} |")


def label(system: str) -> str:
    return f"Kafka {KAFKA_VERSION}" if system == "kafka" else "Icefloe latency"


if __name__ == "__main__":
    main()
