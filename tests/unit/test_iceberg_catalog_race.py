"""Brokers starting together on one SQLite Iceberg catalog race to create its tables."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from icefloe_table_iceberg.table_format import _sql_catalog
from sqlalchemy.exc import OperationalError


class LosesTheRaceOnce:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, name: str, **properties: str) -> Any:
        self.calls += 1
        if self.calls == 1:
            raise OperationalError(
                "CREATE TABLE", {}, Exception("table iceberg_tables already exists")
            )
        return ("catalog", name)


def test_a_lost_table_creation_race_opens_the_catalog_again() -> None:
    factory = LosesTheRaceOnce()
    assert _sql_catalog(factory, "icefloe", {}) == ("catalog", "icefloe")
    assert factory.calls == 2


def test_other_database_errors_are_not_retried() -> None:
    def broken(name: str, **properties: str) -> Any:
        raise OperationalError("SELECT", {}, Exception("disk I/O error"))

    with pytest.raises(OperationalError, match="disk I/O error"):
        _sql_catalog(broken, "icefloe", {})


def test_two_catalogs_opened_at_once_on_a_new_file_both_work(tmp_path: Path) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from pyiceberg.catalog.sql import SqlCatalog

    properties = {"uri": f"sqlite:///{tmp_path / 'c.db'}", "warehouse": tmp_path.as_uri()}
    with ThreadPoolExecutor(4) as pool:
        catalogs = list(
            pool.map(lambda _: _sql_catalog(SqlCatalog, "icefloe", properties), range(4))
        )
    assert all(c.list_namespaces() == [] for c in catalogs)
