"""The check's batched operator counts: an answer of another shape keeps nothing, so
each count is asked again on its own (never taken as "exists" or "protected")."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dpone.publication.principals import pool_databases

WHERES = ["system.databases WHERE name = 'db'", "system.grants WHERE user_name = 'u'"]


@pytest.mark.parametrize(
    "rows",
    [
        [],  # no row
        [{"n0": 1}],  # a count missing
        [{"n0": 1, "n1": "1"}],  # a count that is text
        [{"n0": True, "n1": 1}],  # a count that is a boolean
        [{"n0": 1, "n1": 1}, {"n0": 1, "n1": 1}],  # two rows
    ],
)
def test_an_answer_of_another_shape_keeps_no_count(
    monkeypatch: pytest.MonkeyPatch, rows: list[dict[str, Any]]
) -> None:
    monkeypatch.setattr(pool_databases, "_operator_read", lambda *_: rows)
    monkeypatch.setattr(pool_databases, "as_access", lambda server: server)
    assert pool_databases._operator_counts(Path("/nowhere"), WHERES) == ({}, None)


def test_integer_counts_and_the_version_are_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    rows = [{"v": "26.9.2.1", "n0": 1, "n1": 0}]
    monkeypatch.setattr(pool_databases, "_operator_read", lambda *_: rows)
    monkeypatch.setattr(pool_databases, "as_access", lambda server: server)
    found = pool_databases._operator_counts(Path("/nowhere"), WHERES, version=True)
    assert found == ({WHERES[0]: True, WHERES[1]: False}, "26.9.2.1")
