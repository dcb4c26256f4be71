"""The arithmetic of `icefloe cost`: readings summed over brokers, windows as differences,
prices applied per request class, and the flush profiles modelled at the ingest rate."""

from __future__ import annotations

import pytest

from icefloe.cli.cost_report import Counters, Report, Stored, chart, render
from icefloe.config.cost import CostPrices
from icefloe.config.storage import FlushProfile

PAGE = """\
# TYPE icefloe_kafka_bytes_in counter
icefloe_kafka_bytes_in_total{{topic="a"}} {ingested}
# TYPE icefloe_object_store_requests counter
icefloe_object_store_requests_total{{kind="PUT",by="broker"}} {puts}
icefloe_object_store_requests_total{{kind="PUT",by="compaction"}} 1
icefloe_object_store_requests_total{{kind="GET",by="compaction"}} {gets}
# TYPE icefloe_wal_flush_bytes histogram
icefloe_wal_flush_bytes_count {puts}
icefloe_wal_flush_bytes_sum {ingested}
# TYPE process_start_time_seconds gauge
process_start_time_seconds {started}
"""


def reading(taken_at: float, *pages: dict[str, float]) -> Counters:
    counters = Counters(taken_at=taken_at)
    for page in pages:
        counters.add_scrape(PAGE.format(**page))
    return counters


def test_brokers_are_summed_and_the_earliest_start_counts() -> None:
    counters = reading(
        100.0,
        {"ingested": 2e9, "puts": 1000, "gets": 10, "started": 40},
        {"ingested": 1e9, "puts": 500, "gets": 5, "started": 50},
    )
    assert counters.brokers == 2
    assert counters.ingested_bytes == 3e9
    assert counters.requests == {"PUT": 1502, "GET": 15}
    assert counters.wal_objects == 1500
    assert counters.seconds == 60


def test_a_window_is_the_difference_of_two_readings() -> None:
    first = reading(100.0, {"ingested": 1e9, "puts": 100, "gets": 0, "started": 0})
    later = reading(160.0, {"ingested": 3e9, "puts": 300, "gets": 4, "started": 0})
    window = later.since(first)
    assert window.ingested_bytes == 2e9
    assert window.requests == {"PUT": 200, "GET": 4}
    assert window.seconds == 60


def test_a_broker_restarted_within_the_window_never_counts_negative() -> None:
    first = reading(100.0, {"ingested": 5e9, "puts": 500, "gets": 0, "started": 0})
    later = reading(160.0, {"ingested": 1e9, "puts": 100, "gets": 0, "started": 150})
    assert later.since(first).ingested_bytes == 0


def test_dollars_per_gb_apply_the_put_and_get_prices() -> None:
    counters = reading(100.0, {"ingested": 2e9, "puts": 999, "gets": 1000, "started": 0})
    report = Report(counters, Stored(0, 0, 0), CostPrices(), FlushProfile.COST)
    per_gb = report.dollars_per_gb()
    assert per_gb["requests"] == pytest.approx((1000 * 0.005 + 1000 * 0.0004) / 1000 / 2)
    assert per_gb["storage_month"] is None  # nothing compacted: no Parquet share known


def test_the_flush_profiles_are_modelled_at_the_ingest_rate_per_broker() -> None:
    # 100 MB/s on one broker: the cost profile fills 4 MiB objects, the latency profile
    # seals every 5 ms (500 kB objects).
    counters = reading(100.0, {"ingested": 1e10, "puts": 1, "gets": 0, "started": 0})
    modelled = Report(counters, None, CostPrices(), None).modelled_wal_puts_per_gb()
    assert modelled["cost"] == pytest.approx(1e9 / (4 << 20))
    assert modelled["latency"] == pytest.approx(1e9 / 500_000)


def test_render_without_ingest_says_so() -> None:
    counters = reading(100.0, {"ingested": 0, "puts": 0, "gets": 0, "started": 90})
    lines = render(Report(counters, None, CostPrices(), None), "since start")
    assert "$ per GB ingested: nothing ingested yet" in lines


def test_stored_bytes_are_split_into_wal_parquet_and_the_rest() -> None:
    stored = Stored()
    for key, size in [("wal/1", 10), ("tables/t/p.parquet", 7), ("tables/t/_delta_log/0.json", 2)]:
        stored = stored.plus(key, size, "wal/")
    assert stored == Stored(10, 7, 2)


def test_the_chart_rises_with_the_values() -> None:
    rows = chart([(0.0, 1.0), (10.0, 2.0)], width=10, height=2)
    columns = [row[12:] for row in rows[:2]]  # after the 12-character axis label
    assert columns[0] == " " * 9 + "█"  # only the later, higher value reaches the top row
    assert columns[1] == "█" * 10
    assert rows[-1].split() == ["0", "s", "10", "s"]
