"""The API table: everything advertised decodes and encodes, and has a handler."""

from __future__ import annotations

import importlib

import pytest
from kio.index import load_request_schema, load_response_schema

from icefloe.broker.apis import SUPPORTED_APIS

ADVERTISED = [
    (api.key, version)
    for api in SUPPORTED_APIS.values()
    for version in range(api.min_version, api.max_version + 1)
]

KAFKA_4_MINIMUMS = {
    **{0: 3, 1: 4, 2: 1, 3: 0, 18: 0, 19: 2, 20: 1, 22: 0, 23: 2, 32: 1, 33: 0, 37: 0},
    # Groups and offsets: KIP-896 removed only OffsetCommit v0-1 and OffsetFetch v0.
    **{8: 2, 9: 1, 10: 0, 11: 0, 12: 0, 13: 0, 14: 0, 15: 0, 16: 0, 42: 0, 47: 0, 68: 0, 69: 0},
    # Partition admin: DeleteRecords, DescribeLogDirs (v0 removed), DescribeProducers.
    **{21: 0, 35: 1, 61: 0},
}
"""Lowest versions Apache Kafka 4.0 still accepts (KIP-896); we must not advertise less."""


@pytest.mark.parametrize(("api_key", "version"), ADVERTISED)
def test_every_advertised_version_has_kio_schemas(api_key: int, version: int) -> None:
    assert load_request_schema(api_key, version).__version__ == version
    assert load_response_schema(api_key, version).__version__ == version


@pytest.mark.parametrize("api", list(SUPPORTED_APIS.values()), ids=lambda a: a.name)
def test_every_api_has_an_importable_handler(api: object) -> None:
    module, _, name = api.handler.partition(":")  # type: ignore[attr-defined]
    assert callable(getattr(importlib.import_module(module), name))


@pytest.mark.parametrize(("api_key", "minimum"), sorted(KAFKA_4_MINIMUMS.items()))
def test_minimum_versions_are_kafka_4_minimums(api_key: int, minimum: int) -> None:
    assert SUPPORTED_APIS[api_key].min_version == minimum
