"""A source schema change as a decision, not a dead end (issue 24, item 3).

Before: widening a column or adding one failed with ``design_mismatch`` ("differ in
physical design", not what differs) after the export and the stage, and the only way
through was a manual ``DROP TABLE``, which lost the rollback history. Now the refresh
compares the source's columns with the target's before the export and says what
differs, column by column; ``on_design_change = "replace"`` (or ``--design-change
replace``) publishes the new design through the same one EXCHANGE, the old content
stays as the rollback copy, and ``dpone rollback`` works across the change.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import chhttp
from tests.plugins.cli import as_json, dpone
from tests.plugins.refresh import SERVER_KINDS, make_source, project, protected_server, refresh

DATABASE = "refresh_db"  # project() of tests/plugins/refresh.py targets this database


@pytest.fixture(scope="module", params=SERVER_KINDS)
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    yield from protected_server(tmp_path_factory, DATABASE, "design-ch", request.param)


def _wider_source(path: Path, rows: int) -> list[tuple[Any, ...]]:
    """The same table with ``price`` widened to decimal(18, 2) and a new ``qty`` column."""
    path.unlink()
    values = [(i, f"w{i}", f"{i}12345678.25", i * 3) for i in range(1, rows + 1)]
    with sqlite3.connect(path) as conn:
        conn.execute(
            "CREATE TABLE items (id bigint NOT NULL, name nvarchar(50), "
            "price decimal(18, 2), qty int)"
        )
        conn.executemany("INSERT INTO items VALUES (?, ?, ?, ?)", values)
    conn.close()
    return values


def _columns(port: int, target: str) -> list[tuple[str, str]]:
    found = chhttp.rows(
        port,
        "SELECT name, type FROM system.columns WHERE database = 'refresh_db' "
        f"AND table = '{target}' ORDER BY position",
    )
    return [(r["name"], r["type"]) for r in found]


def _values(port: int, target: str, columns: str) -> list[list[str]]:
    found = chhttp.rows(port, f"SELECT {columns} FROM {DATABASE}.{target} ORDER BY id")
    return [[str(v) for v in r.values()] for r in found]


def test_widen_and_add_columns_refused_then_replaced_then_rolled_back(
    tmp_path: Path, server: dict[str, Any]
) -> None:
    port, target = server["http_port"], "t_design"
    make_source(tmp_path / "shop.db", [(i, f"n{i}", f"{i}.25") for i in range(1, 6)])
    config = project(tmp_path, server, target)
    code, first = refresh(config, "items")
    assert code == 0, first
    before = _columns(port, target)
    assert before == [
        ("id", "Int64"),
        ("name", "Nullable(String)"),
        ("price", "Nullable(Decimal(10, 2))"),
    ]
    old_values = _values(port, target, "id, name, toString(price) AS p")
    wider = _wider_source(tmp_path / "shop.db", 7)

    # Refused before the export, column by column; the target is untouched.
    code, refused = refresh(config, "items")
    assert code == 1
    (report,) = refused["tables"]
    assert (report["phase"], report["error"]["code"]) == ("check", "design_changed"), report
    assert list(report["timings"]) == ["check"]
    assert report["error"]["details"]["changes"] == [
        {
            "column": "price",
            "change": "type_changed",
            "target_type": "Nullable(Decimal(10, 2))",
            "source_type": "Nullable(Decimal(18, 2))",
        },
        {"column": "qty", "change": "added", "source_type": "Nullable(Int32)"},
    ]
    message = report["error"]["message"]
    assert "'price' changes type" in message and "'qty' added" in message, message
    assert "--design-change replace" in message
    assert _columns(port, target) == before

    # Replaced through the same one EXCHANGE: the new design and every value exact.
    code, replaced = refresh(config, "items", "--design-change", "replace")
    assert code == 0, replaced
    (report,) = replaced["tables"]
    assert [c["column"] for c in report["design_change"]] == ["price", "qty"]
    assert _columns(port, target) == [
        ("id", "Int64"),
        ("name", "Nullable(String)"),
        ("price", "Nullable(Decimal(18, 2))"),
        ("qty", "Nullable(Int32)"),
    ]
    assert _values(port, target, "id, name, toString(price) AS p, toString(qty) AS q") == [
        [str(i), n, p, str(q)] for i, n, p, q in wider
    ]
    copy = report["generation_table"]
    assert _columns(port, copy) == before  # the previous snapshot, in its own design

    # Rollback across the design change: the old design and content come back.
    done = dpone("rollback", "items", "--config", str(config), "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    assert _columns(port, target) == before
    assert _values(port, target, "id, name, toString(price) AS p") == old_values

    # The table's own setting decides from now on, with no flag.
    config.write_text(config.read_text() + 'on_design_change = "replace"\n')
    code, again = refresh(config, "items")
    assert code == 0, again
    assert [c["column"] for c in again["tables"][0]["design_change"]] == ["price", "qty"]
    assert _columns(port, target)[-1] == ("qty", "Nullable(Int32)")
    status = as_json(dpone("status", "--config", str(config), "--json"))
    assert status["needs_person"] == [], status


def test_a_view_over_the_target_refuses_the_replace_and_is_named(
    tmp_path: Path, server: dict[str, Any]
) -> None:
    port, target = server["http_port"], "t_design_mv"
    make_source(tmp_path / "shop.db", [(i, f"n{i}", f"{i}.25") for i in range(1, 6)])
    config = project(tmp_path, server, target)
    assert refresh(config, "items")[0] == 0
    before = _columns(port, target)
    chhttp.query(port, f"CREATE TABLE {DATABASE}.mv_sink (id Int64) ENGINE = MergeTree ORDER BY id")
    chhttp.query(
        port,
        f"CREATE MATERIALIZED VIEW {DATABASE}.mv_over TO {DATABASE}.mv_sink "
        f"AS SELECT id FROM {DATABASE}.{target}",
    )
    try:
        _wider_source(tmp_path / "shop.db", 7)
        code, refused = refresh(config, "items", "--design-change", "replace")
        assert code == 1
        (report,) = refused["tables"]
        # Before the export (and any stage), naming the view.
        assert (report["phase"], report["error"]["code"]) == ("check", "side_effect_present")
        assert list(report["timings"]) == ["check"], report
        assert "mv_over" in report["error"]["message"], report
        assert _columns(port, target) == before
    finally:
        chhttp.query(port, f"DROP VIEW {DATABASE}.mv_over")
        chhttp.query(port, f"DROP TABLE {DATABASE}.mv_sink")
    status = as_json(dpone("status", "--config", str(config), "--json"))
    assert status["needs_person"] == [], status


def test_a_rollback_copy_whose_design_was_altered_is_refused(
    tmp_path: Path, server: dict[str, Any]
) -> None:
    port, target = server["http_port"], "t_design_altered"
    make_source(tmp_path / "shop.db", [(i, f"n{i}", f"{i}.25") for i in range(1, 6)])
    config = project(tmp_path, server, target)
    assert refresh(config, "items")[0] == 0
    make_source(tmp_path / "shop.db", [(i, f"m{i}", f"{i}.50") for i in range(1, 8)])
    code, second = refresh(config, "items")
    assert code == 0, second
    copy = second["tables"][0]["generation_table"]
    # Same rows, same content: only its design changed. A rollback publishes the copy's
    # design as it is, so this is refused like altered content.
    chhttp.query(
        port, f"ALTER TABLE {DATABASE}.{copy} MODIFY COLUMN name Nullable(String) CODEC(ZSTD(3))"
    )
    done = dpone("rollback", "items", "--config", str(config), "--json")
    assert done.returncode == 1, done.stdout
    refused = as_json(done)
    assert (refused["phase"], refused["error"]["code"]) == ("verify_copy", "design_mismatch")
    assert _values(port, target, "id") == [[str(i)] for i in range(1, 8)]
