"""Overload for a broker: producers at full speed plus raw connections that pipeline requests
and never read an answer, while the broker's memory is sampled.

Used by ``tests/integration/test_memory_budget.py`` and ``tests/bench/overload_bench.py``.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import confluent_kafka

from tests.support.kafka_wire import batch_of, encode_request, fetch_request, produce_request


def memory_mib(pid: int) -> tuple[float, float]:
    """(current RSS, peak RSS so far) of a process, in MiB (VmRSS and VmHWM)."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0]) / 1024
    return fields["VmRSS"], fields["VmHWM"]


_CLIENT_BUFFER = 4 << 20


@dataclass
class Overload:
    bootstrap: str
    topic: str
    partitions: int
    producers: int = 8
    pipeliners: int = 8
    batch_bytes: int = 512 << 10
    """Size of the batches the raw pipelining connections send."""

    def run(self, seconds: float) -> int:
        """Overload the broker for ``seconds``; return the records the producers got acked."""
        stop = threading.Event()
        acked = [0]
        threads = [
            threading.Thread(target=self._produce, args=(stop, acked), daemon=True)
            for _ in range(self.producers)
        ]
        pipelining = threading.Thread(target=self._pipeline, args=(stop,), daemon=True)
        for thread in (*threads, pipelining):
            thread.start()
        time.sleep(seconds)
        stop.set()
        for thread in (*threads, pipelining):
            thread.join(60)
        return acked[0]

    def _produce(self, stop: threading.Event, acked: list[int]) -> None:
        """A confluent-kafka producer sending 1 KiB records as fast as it is let."""
        producer = confluent_kafka.Producer(
            {"bootstrap.servers": self.bootstrap, "linger.ms": 5, "acks": "all"}
        )

        def delivered(error: object, message: object) -> None:
            if error is None:
                acked[0] += 1

        value = os.urandom(1024)
        while not stop.is_set():
            try:
                producer.produce(self.topic, value=value, on_delivery=delivered)
            except BufferError:
                producer.poll(0.05)  # the client's own queue is full: the broker pushes back
            producer.poll(0)
        producer.flush(30)

    def _pipeline(self, stop: threading.Event) -> None:
        asyncio.run(self._pipelines(stop))

    async def _pipelines(self, stop: threading.Event) -> None:
        host, port = self.bootstrap.rsplit(":", 1)
        batch = batch_of([os.urandom(1000) for _ in range(self.batch_bytes // 1100)])
        frames = [
            encode_request(produce_request(self.topic, p % self.partitions, batch), 1, "flood")
            for p in range(self.partitions)
        ]
        fetch = encode_request(
            fetch_request(self.topic, 0, 0, max_bytes=50 << 20, partition_max_bytes=50 << 20),
            2,
            "flood",
        )
        await asyncio.gather(
            *(
                self._never_reading(host, int(port), frames if i % 2 else [fetch], stop)
                for i in range(self.pipeliners)
            )
        )

    async def _never_reading(
        self, host: str, port: int, frames: list[bytes], stop: threading.Event
    ) -> None:
        """Send frames back to back and never read a response: the broker must push back."""
        _, writer = await asyncio.open_connection(host, port)
        try:
            i = 0
            while not stop.is_set():
                # Keep the socket full without piling up bytes in this process.
                if writer.transport.get_write_buffer_size() < _CLIENT_BUFFER:
                    writer.write(frames[i % len(frames)])
                    i += 1
                else:
                    await asyncio.sleep(0.02)
        except ConnectionError:
            pass
        finally:
            writer.transport.abort()  # nothing is read, so nothing would ever flush
