"""Hostile names and literals round-trip through the real server."""

from __future__ import annotations

import pytest

from dpone.localserver import ServerInfo
from dpone.sql import quote_identifier, quote_literal
from tests import chhttp
from tests.hostile_values import HOSTILE_NAMES


@pytest.mark.parametrize("text", HOSTILE_NAMES)
def test_literal_round_trips(clickhouse: ServerInfo, text: str) -> None:
    got = chhttp.rows(clickhouse.http_port, f"SELECT {quote_literal(text)} AS v")
    assert got == [{"v": text}]


@pytest.mark.parametrize("name", [n for n in HOSTILE_NAMES if "\0" not in n])
def test_identifier_round_trips(clickhouse: ServerInfo, name: str) -> None:
    port = clickhouse.http_port
    chhttp.query(port, "CREATE DATABASE IF NOT EXISTS quoting_db ENGINE = Atomic")
    table = f"quoting_db.{quote_identifier(name)}"
    chhttp.query(port, f"CREATE TABLE {table} ({quote_identifier(name)} Int8) ENGINE = Memory")
    try:
        found = chhttp.rows(
            port,
            "SELECT name FROM system.columns WHERE database = 'quoting_db' "
            f"AND table = {quote_literal(name)}",
        )
        assert found == [{"name": name}]
    finally:
        chhttp.query(port, f"DROP TABLE {table}")
