"""``dpone check`` names every problem it can find without a server, and every command
that reads the project file reports a path that is not a file in dpone's own format.

No server runs here: the checks under test need none (``clickhouse.data_dir`` is
reported as not running, which the tests expect too).
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from tests.plugins.cli import as_json, dpone
from tests.plugins.refresh import protected_server


def write_project(tmp_path: Path, tables: dict[str, tuple[str, str]]) -> Path:
    """A project over ``shop.db``: per table, its source table and a ``types`` line."""
    text = (
        '[project]\nwork_dir = "work"\nstore = "store.sqlite"\n'
        '[clickhouse]\ndata_dir = "ch"\n'
        '[sources.shop]\nkind = "sqlite"\npath = "shop.db"\n'
    )
    for name, (source_table, types) in tables.items():
        text += (
            f'[tables.{name}]\nsource = "shop"\ntable = "{source_table}"\n'
            f'target = "check_db.{name}"\n{types}\n'
        )
    config = tmp_path / "dpone.toml"
    config.write_text(text)
    return config


def make_tables(path: Path, *statements: str) -> None:
    with sqlite3.connect(path) as conn:
        for statement in statements:
            conn.execute(statement)
    conn.close()


def table_problems(document: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in document["problems"] if p["key"].startswith("tables.")]


def test_check_names_every_type_override_the_policy_refuses(tmp_path: Path) -> None:
    make_tables(
        tmp_path / "shop.db",
        "CREATE TABLE items (id int NOT NULL, price decimal(10, 2), name nvarchar(20), "
        "code char(4), at datetime2(3))",
    )
    types = (
        'types = { id = "Int64", price = "Decimal(9, 2)", name = "FixedString(20)", '
        'code = "FixedString(4)", at = "DateTime64(1, \'UTC\')", gone = "String" }'
    )
    config = write_project(tmp_path, {"items": ("items", types)})
    done = dpone("check", "--config", str(config), "--json")
    assert done.returncode == 1, done.stdout + done.stderr
    document = as_json(done)
    assert document["ok"] is False
    found = table_problems(document)
    # Each refused override is its own problem; the accepted ones (id, code) are not.
    assert [(p["key"], p["code"], p["column"]) for p in found] == [
        ("tables.items.types.gone", "unknown_override_column", "gone"),
        ("tables.items.types.price", "override_not_allowed", "price"),
        ("tables.items.types.name", "override_not_allowed", "name"),
        ("tables.items.types.at", "override_not_allowed", "at"),
    ]
    price = found[1]
    assert price["source_type"] == "decimal(10, 2)" and price["override"] == "Decimal(9, 2)"
    assert "table items" in price["message"] and "'price'" in price["message"]
    assert "decimal(10, 2)" in price["message"] and "not at least as wide" in price["message"]
    assert "only for char(n)" in found[2]["message"]
    assert "less fractional precision" in found[3]["message"]
    # The server's absence is one more problem, not a reason to stop before the types.
    assert [p["key"] for p in document["problems"]][-1] == "clickhouse.data_dir"
    assert document["error"]["code"] == "check_failed"
    assert document["error"]["details"]["problems"] == document["problems"]
    text = dpone("check", "--config", str(config))
    assert text.returncode == 1
    lines = [line for line in text.stdout.splitlines() if line.startswith("tables.")]
    assert [line.split(": ")[0:2] for line in lines] == [
        ["tables.items.types.gone", "[unknown_override_column] table items (source table 'items')"],
        ["tables.items.types.price", "[override_not_allowed] table items (source table 'items')"],
        ["tables.items.types.name", "[override_not_allowed] table items (source table 'items')"],
        ["tables.items.types.at", "[override_not_allowed] table items (source table 'items')"],
    ]


def test_check_names_every_unsupported_column_of_every_table(tmp_path: Path) -> None:
    make_tables(
        tmp_path / "shop.db",
        "CREATE TABLE places (id bigint NOT NULL, geo geography, name nvarchar(10), "
        "v sql_variant, h hierarchyid)",
        "CREATE TABLE fine (id bigint NOT NULL, price decimal(10, 2))",
        "CREATE TABLE other (id bigint NOT NULL, x xml, g geometry)",
    )
    config = write_project(
        tmp_path,
        {
            "places": ("places", ""),
            "fine": ("fine", 'types = { price = "Decimal(12, 2)" }'),
            "other": ("other", ""),
        },
    )
    done = dpone("check", "--config", str(config), "--json")
    assert done.returncode == 1, done.stdout + done.stderr
    found = table_problems(as_json(done))
    assert [(p["key"], p["code"], p["column"], p["source_type"]) for p in found] == [
        ("tables.places.table", "unsupported_type", "geo", "geography"),
        ("tables.places.table", "unsupported_type", "v", "sql_variant"),
        ("tables.places.table", "unsupported_type", "h", "hierarchyid"),
        ("tables.other.table", "unsupported_type", "g", "geometry"),
    ]
    for problem in found:
        table = problem["key"].split(".")[1]
        assert f"table {table}" in problem["message"]
        assert f"'{problem['column']}'" in problem["message"]
        assert problem["source_type"] in problem["message"] and "declare" in problem["message"]
    text = dpone("check", "--config", str(config))
    assert text.returncode == 1
    assert sum(line.startswith("tables.") for line in text.stdout.splitlines()) == 4


def test_a_refused_override_is_found_by_check_as_the_stage_refuses_it(tmp_path: Path) -> None:
    """The check and the export's policy agree: an override that check accepts is
    accepted, one it refuses is refused with the same code the policy raises."""
    make_tables(tmp_path / "shop.db", "CREATE TABLE items (id int NOT NULL, n smallint)")
    config = write_project(tmp_path, {"items": ("items", 'types = { id = "UInt32" }')})
    found = table_problems(as_json(dpone("check", "--config", str(config), "--json")))
    assert [(p["key"], p["code"]) for p in found] == [
        ("tables.items.types.id", "override_not_allowed")
    ]
    assert "UInt32 cannot hold every Int32 value" in found[0]["message"]
    config = write_project(tmp_path, {"items": ("items", 'types = { id = "Int64" }')})
    assert table_problems(as_json(dpone("check", "--config", str(config), "--json"))) == []


def test_refresh_refuses_with_every_override_check_names(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The stage judges overrides by the same policy function as check: it too names
    every refused override, not the first."""
    make_tables(
        tmp_path / "shop.db",
        "CREATE TABLE items (id bigint NOT NULL, price decimal(10, 2), name nvarchar(5))",
        "INSERT INTO items VALUES (1, 2.5, 'a')",
    )
    types = 'types = { id = "Int16", price = "Decimal(9, 2)", name = "LowCardinality(String)" }'
    config = write_project(tmp_path, {"items": ("items", types)})
    for server in protected_server(tmp_path_factory, "check_db", "check-ch"):
        text = config.read_text().replace('data_dir = "ch"', f'data_dir = "{server["data_dir"]}"')
        config.write_text(text)
        checked = table_problems(as_json(dpone("check", "--config", str(config), "--json")))
        done = dpone("refresh", "--all", "--config", str(config), "--json")
        assert done.returncode == 1, done.stdout + done.stderr
        error = as_json(done)["tables"][0]["error"]
        assert error["code"] == "override_not_allowed"
        listed = error["details"]["problems"]
        assert [(p["code"], p["details"]["column"]) for p in listed] == [
            ("override_not_allowed", "id"),
            ("override_not_allowed", "price"),
        ]
        assert [p["column"] for p in checked] == ["id", "price"]
        assert [p["message"].split(": ", 1)[1] for p in checked] == [p["message"] for p in listed]


def assert_own_error(done: Any, code: str, as_json_output: bool) -> dict[str, Any]:
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Usage:" not in done.stderr and "Try 'dpone" not in done.stderr
    if as_json_output:
        document = as_json(done)
        assert document["ok"] is False and document["error"]["code"] == code
        return document
    assert done.stdout == ""
    assert done.stderr.startswith(f"dpone: error: [{code}] "), done.stderr
    return {}


COMMANDS = [("check",), ("refresh", "--all"), ("status",), ("rollback", "items")]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c[0])
def test_a_config_path_that_is_a_directory_gets_dpones_error(
    tmp_path: Path, command: tuple[str, ...]
) -> None:
    folder = tmp_path / "project"
    folder.mkdir()
    text = dpone(*command, "--config", str(folder))
    assert_own_error(text, "config_not_a_file", False)
    assert f"--config {folder / 'dpone.toml'}" in text.stderr
    document = assert_own_error(
        dpone(*command, "--config", str(folder), "--json"), "config_not_a_file", True
    )
    assert document["error"]["details"]["path"] == str(folder)
    # The same through the environment variable.
    env = assert_own_error(
        dpone(*command, "--json", extra_env={"DPONE_CONFIG": str(folder)}),
        "config_not_a_file",
        True,
    )
    assert env["error"] == document["error"]


def test_init_into_a_directory_or_a_missing_directory_says_so(tmp_path: Path) -> None:
    done = dpone("init", "--config", str(tmp_path))
    assert_own_error(done, "config_not_a_file", False)
    assert f"--config {tmp_path / 'dpone.toml'}" in done.stderr
    assert list(tmp_path.iterdir()) == []
    missing = dpone("init", "--config", str(tmp_path / "nowhere" / "dpone.toml"))
    assert_own_error(missing, "config_unwritable", False)
    assert "No such file or directory" in missing.stderr
    wrote = dpone("init", "--config", str(tmp_path / "dpone.toml"))
    assert wrote.returncode == 0 and (tmp_path / "dpone.toml").is_file()


def test_a_config_path_that_is_a_fifo_or_unreadable_does_not_hang(tmp_path: Path) -> None:
    fifo = tmp_path / "dpone.toml"
    os.mkfifo(fifo)
    # Reading a FIFO with no writer would block for ever: it is refused unread.
    done = dpone("check", "--config", str(fifo), "--json")
    document = assert_own_error(done, "config_not_a_file", True)
    assert "is not a regular file" in document["error"]["message"]
    under_a_file = tmp_path / "shop.db"
    under_a_file.write_bytes(b"")
    assert_own_error(
        dpone("status", "--config", str(under_a_file / "dpone.toml"), "--json"),
        "config_missing",
        True,
    )
