"""Client quotas: the rate producers over a quota achieve, and what quotas cost per request.

    python -m tests.bench.quota_bench [--seconds 24] [--window 1.0] [--quotas 250000,1000000]

Starts `icefloe serve` on the embedded default with ``[quotas] window_size_s = --window``,
sets a ``producer_byte_rate`` on one client id per quota, and runs one producer per quota
plus one without a quota, all at once, each as fast as the broker takes it (1 KiB records,
linger 2 ms, 64 KiB batches, at most 128 KiB queued). Printed per producer: the rate over the
whole run, the rate after the first measuring period (Kafka lets a fresh client send
``window_num - 1`` windows' worth at once), and the throttle times librdkafka reported.

Then, in-process, the time the quota hook adds to one request: with no quota set anywhere,
with quotas set but none for this client, and with a produce quota the client is under.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from icefloe.broker.quotas import QuotaManager
from icefloe.config.quotas import QuotaOptions
from icefloe.security.quotas import PRODUCER_BYTE_RATE, QuotaStore, entity
from tests.support import admin_wire
from tests.support.broker import start_icefloe

TOPIC = "quota-bench"


def set_quota(bootstrap: str, client_id: str, value: float) -> None:
    m = admin_wire.module(49, 1)
    request = m.AlterClientQuotasRequest(
        entries=(
            m.EntryData(
                entity=(m.EntityData(entity_type="client-id", entity_name=client_id),),
                ops=(m.OpData(key=PRODUCER_BYTE_RATE, value=value, remove=False),),
            ),
        ),
        validate_only=False,
    )
    answer = admin_wire.call(bootstrap, request)
    assert answer.entries[0].error_code == 0, answer


def produce(bootstrap: str, client_id: str, seconds: float, out: dict[str, Any]) -> None:
    acks: list[tuple[float, int]] = []
    throttles: list[float] = []
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "client.id": client_id,
            "linger.ms": 2,
            "batch.size": 65536,
            "queue.buffering.max.kbytes": 128,
            "throttle_cb": lambda event: throttles.append(event.throttle_time),
        }
    )
    value = b"b" * 1024

    def acked(error: Any, message: Any) -> None:
        if error is None:
            acks.append((time.monotonic(), len(message.value())))

    started = time.monotonic()
    while time.monotonic() - started < seconds:
        try:
            producer.produce(TOPIC, value, on_delivery=acked)
        except BufferError:
            producer.poll(0.005)
        producer.poll(0)
    producer.flush(30)
    out.update(started=started, acks=acks, throttles=throttles)


def rate(run: dict[str, Any], start: float, end: float) -> float:
    acked = sum(size for at, size in run["acks"] if start <= at - run["started"] < end)
    return acked / (end - start)


def achieved(args: argparse.Namespace) -> None:
    quotas = [float(q) for q in args.quotas.split(",")]
    with tempfile.TemporaryDirectory() as folder:
        running = start_icefloe(
            Path(folder) / "data",
            env={"ICEFLOE_QUOTAS__WINDOW_SIZE_S": str(args.window)},
            yielding=True,
        )
        try:
            admin = AdminClient({"bootstrap.servers": running.bootstrap})
            admin.create_topics([NewTopic(TOPIC, 4, 1)])[TOPIC].result(30)
            runs: dict[str, dict[str, Any]] = {}
            for quota in quotas:
                set_quota(running.bootstrap, f"limited-{int(quota)}", quota)
            names = [f"limited-{int(q)}" for q in quotas] + ["unlimited"]
            threads = []
            for name in names:
                runs[name] = {}
                threads.append(
                    threading.Thread(
                        target=produce, args=(running.bootstrap, name, args.seconds, runs[name])
                    )
                )
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        finally:
            running.stop()
    settle = min(11 * args.window, args.seconds / 2)  # after the first measuring period
    print(
        f"window {args.window} s x 11, {args.seconds:.0f} s of producing, "
        f"steady = from {settle:.1f} s on"
    )
    print(
        f"{'client id':<18} {'quota':>10} {'whole run':>10} {'steady':>10} {'ratio':>6} "
        f"{'throttles':>9} {'max ms':>7}"
    )
    for name, quota in [*zip(names, quotas, strict=False), ("unlimited", None)]:
        run = runs[name]
        whole, steady = rate(run, 0, args.seconds), rate(run, settle, args.seconds)
        throttled = [t for t in run["throttles"] if t > 0]
        print(
            f"{name:<18} {quota or 0:>10.0f} {whole:>10.0f} {steady:>10.0f} "
            f"{(steady / quota) if quota else 0:>6.3f} {len(throttled):>9} "
            f"{max(throttled, default=0) * 1000:>7.0f}"
        )


class _Request:
    api_key, api_version, client_id, body = 0, 9, "bench", object()


class _Held:
    size = 1 << 16


class _Connection:
    principal, certificate_principal, throttled_until = None, None, 0.0


class _Context:
    request, held, connection = _Request(), _Held(), _Connection()


async def _handler(ctx: Any, body: Any) -> Any:
    return None


def overhead(rounds: int = 200_000) -> None:
    """Nanoseconds per request the quota hook costs, against the handler called directly."""

    class Store(QuotaStore):
        def __init__(self) -> None:
            super().__init__(None)  # type: ignore[arg-type]

    async def run() -> None:
        ctx: Any = _Context()
        cases = {}
        store = Store()
        manager = QuotaManager(store, QuotaOptions())

        async def direct() -> None:
            for _ in range(rounds):
                await _handler(ctx, ctx.request.body)

        async def hooked() -> None:
            for _ in range(rounds):
                if manager.active:
                    await manager.serve(ctx, _handler)
                else:
                    await _handler(ctx, ctx.request.body)

        async def timed(body: Any) -> float:
            best = []
            for _ in range(5):
                started = time.perf_counter()
                await body()
                best.append((time.perf_counter() - started) / rounds * 1e9)
            return statistics.median(best)

        base = await timed(direct)
        cases["no quota set anywhere"] = await timed(hooked)
        store._remember(entity(client_id="someone-else"), {PRODUCER_BYTE_RATE: 1e6})
        cases["quotas set, none for this client"] = await timed(hooked)
        store._remember(entity(client_id="bench"), {PRODUCER_BYTE_RATE: 1e15})
        cases["a produce quota, under it"] = await timed(hooked)
        print(f"\nper request, handler awaited directly: {base:.0f} ns")
        for name, ns in cases.items():
            print(f"  {name:<34} +{ns - base:.0f} ns")

    asyncio.run(run())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=24)
    parser.add_argument("--window", type=float, default=1.0)
    parser.add_argument("--quotas", default="250000,1000000,4000000")
    args = parser.parse_args()
    achieved(args)
    overhead()


if __name__ == "__main__":
    main()
