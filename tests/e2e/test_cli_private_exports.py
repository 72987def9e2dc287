"""Exported data is private and does not outlive its publication (issue 24, item 8).

Through the CLI on the real managed server: a refresh's export and receipt are 0600
in 0700 directories dpone made, removed once the table is published unless
``[project] keep_exports = true``, and a file of the user's in ``exports/`` is never
replaced. ``dpone export`` writes 0600 too.
"""

from __future__ import annotations

import sqlite3
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.plugins.cli import as_json, dpone
from tests.plugins.refresh import (
    make_source,
    protected_server,
    refresh_items,
    rows_of,
    write_project,
)

DATABASE = "px_db"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    yield from protected_server(tmp_path_factory, DATABASE, "private-exports-ch")


def _project(tmp_path: Path, server: dict[str, Any], target: str, keep: str = "") -> Path:
    target = f"{DATABASE}.{target}"
    return write_project(tmp_path / "dpone.toml", server["data_dir"], target, project_extra=keep)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_kept_export_is_private_and_the_next_refresh_replaces_it(
    tmp_path: Path, server: dict[str, Any]
) -> None:
    make_source(tmp_path / "shop.db", rows_of(5))
    config = _project(tmp_path, server, "kept", "keep_exports = true\n")
    code, report = refresh_items(config)
    assert code == 0, report
    work, exports = tmp_path / "work", tmp_path / "work" / "exports"
    data, receipt = exports / "items.tsv", exports / "items.tsv.receipt.json"
    assert (_mode(work), _mode(exports)) == (0o700, 0o700)
    assert (_mode(data), _mode(receipt)) == (0o600, 0o600)
    assert data.stat().st_size == report["file_bytes"]
    # The kept export is dpone's own (its receipt describes it): the next run replaces it.
    make_source(tmp_path / "shop.db", rows_of(9))
    code, again = refresh_items(config)
    assert code == 0 and again["rows"] == 9, again
    assert data.stat().st_size == again["file_bytes"] != report["file_bytes"]
    assert _mode(data) == 0o600


def test_the_export_is_removed_once_the_table_is_published(
    tmp_path: Path, server: dict[str, Any]
) -> None:
    make_source(tmp_path / "shop.db", rows_of(4))
    code, report = refresh_items(_project(tmp_path, server, "removed"))
    assert code == 0 and report["outcome"] == "published", report
    exports = tmp_path / "work" / "exports"
    assert sorted(p.name for p in exports.iterdir() if not p.name.startswith(".")) == []


def test_a_user_file_in_exports_is_never_replaced(tmp_path: Path, server: dict[str, Any]) -> None:
    make_source(tmp_path / "shop.db", rows_of(3))
    exports = tmp_path / "work" / "exports"
    exports.mkdir(parents=True, mode=0o755)
    mine = exports / "items.tsv"
    mine.write_bytes(b"my own notes\n")
    mine.chmod(0o644)
    code, report = refresh_items(_project(tmp_path, server, "refused"))
    assert code == 1 and report["phase"] == "export", report
    assert report["error"]["code"] == "export_exists"
    assert str(mine) in report["error"]["message"]
    assert mine.read_bytes() == b"my own notes\n" and _mode(mine) == 0o644
    assert not (exports / "items.tsv.receipt.json").exists()
    assert _mode(exports) == 0o755  # the user's directory keeps its mode


def test_keep_exports_must_be_a_boolean(tmp_path: Path, server: dict[str, Any]) -> None:
    config = _project(tmp_path, server, "x", 'keep_exports = "yes"\n')
    done = dpone("check", "--config", str(config), "--json")
    assert done.returncode == 2
    problems = as_json(done)["error"]["details"]["problems"]
    assert any(
        p["key"] == "project.keep_exports" and p["line"] == 4 and "boolean" in p["message"]
        for p in problems
    ), problems


def test_dpone_export_writes_private_files(tmp_path: Path) -> None:
    source = tmp_path / "shop.db"
    with sqlite3.connect(source) as conn:
        conn.execute("CREATE TABLE t (id bigint NOT NULL)")
        conn.execute("INSERT INTO t VALUES (1)")
    conn.close()
    out = tmp_path / "t.tsv"
    done = dpone("export", "--source", f"sqlite:{source}", "--table", "t", "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert (_mode(out), _mode(tmp_path / "t.tsv.receipt.json")) == (0o600, 0o600)
