"""Table identifiers: the cluster template, a topic's alias, and what is refused."""

from __future__ import annotations

import pytest

from icefloe.config import load_config
from icefloe.errors import ConfigError
from icefloe.table_names import TableName, check_template, table_name, topic_table_name


def test_the_default_template_puts_every_topic_in_the_icefloe_namespace() -> None:
    assert table_name("icefloe.{topic}", "orders") == TableName("icefloe", "orders")


def test_dots_in_a_topic_name_become_underscores() -> None:
    assert str(table_name("icefloe.{topic}", "shop.orders.v2")) == "icefloe.shop_orders_v2"


def test_a_longer_identifier_is_a_nested_namespace() -> None:
    assert table_name("lake.raw.kafka_{topic}", "orders") == TableName("lake.raw", "kafka_orders")


def test_an_alias_overrides_the_template_and_an_empty_one_does_not() -> None:
    alias = {"icefloe.table.identifier": "sales.orders"}
    assert str(topic_table_name("icefloe.{topic}", "orders-v2", alias)) == "sales.orders"
    empty = {"icefloe.table.identifier": ""}
    assert str(topic_table_name("icefloe.{topic}", "orders-v2", empty)) == "icefloe.orders-v2"


@pytest.mark.parametrize(
    ("template", "complaint"),
    [
        ("{topic}", "needs a namespace"),
        ("icefloe.{name}", "the only placeholder is {topic}"),
        ("icefloe.{topic!r}", "the only placeholder is {topic}"),
        ("icefloe..{topic}", "must be letters"),
        ("ice floe.{topic}", "must be letters"),
        ("icefloe.{topic", "table identifier template"),
    ],
)
def test_a_bad_template_says_what_is_wrong(template: str, complaint: str) -> None:
    with pytest.raises(ValueError, match=complaint.replace("{", r"\{").replace("}", r"\}")):
        check_template(template)


def test_the_configuration_checks_the_template() -> None:
    with pytest.raises(ConfigError, match="needs a namespace"):
        load_config(env={}, overrides={"table": {"identifier": "{topic}"}})


def test_the_old_namespace_setting_names_its_replacement() -> None:
    with pytest.raises(ConfigError, match=r'identifier = "lake\.\{topic\}"'):
        load_config(env={}, overrides={"table": {"namespace": "lake"}})
