"""Staging table names: one table per attempt id, never shared."""

from __future__ import annotations

import itertools

import pytest

from dpone.connectors.clickhouse_tables import staging_table_name
from dpone.errors import ConfigurationError


def test_separators_do_not_collide() -> None:
    names = {staging_table_name(a) for a in ("a-b", "a_b", "a.b", "a__b", "a_hb", "a-hb")}
    assert len(names) == 6
    assert staging_table_name("a-b") == "dpone_stage_a_hb"
    assert staging_table_name("a_b") == "dpone_stage_a__b"
    assert staging_table_name("a.b") == "dpone_stage_a_db"


def test_every_short_attempt_id_has_its_own_table() -> None:
    alphabet = "ah1_-."
    ids = [
        "".join(t)
        for n in range(1, 5)
        for t in itertools.product(alphabet, repeat=n)
        if t[0].isalnum()
    ]
    names = [staging_table_name(i) for i in ids]
    assert len(set(names)) == len(ids)
    assert all(n.replace("_", "").isalnum() for n in names)  # plain identifiers


def test_an_invalid_attempt_id_has_no_table() -> None:
    with pytest.raises(ConfigurationError):
        staging_table_name("a/b")
