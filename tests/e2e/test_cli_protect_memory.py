"""The data directory remembers what the managed server protects (issue 24, item 5).

Through the CLI on the real managed server: a start with ``--protect`` records the set,
a later start without it protects the same databases, ``status`` shows them, every
restart hint names each ``--protect``, and a database that exists but is not protected
is ``database_not_protected`` (not "does not exist … CREATE DATABASE").
"""

from __future__ import annotations

import json
import stat
from pathlib import Path
from typing import Any

from tests import chhttp
from tests.plugins.cli import as_json, dpone
from tests.plugins.refresh import make_source, refresh_items, rows_of, write_project

PROTECTED = ("pm_db", "pm_other")
PLAIN = "pm_plain"  # exists on the server, never protected


def _start(data_dir: Path, *protect: str) -> dict[str, Any]:
    flags = [a for db in protect for a in ("--protect", db)]
    started = dpone("server", "start", "--data-dir", str(data_dir), *flags, "--json")
    assert started.returncode == 0, started.stdout + started.stderr
    info = as_json(started)
    chhttp.register_server(info["http_port"], data_dir)
    return info


def _stop(data_dir: Path) -> None:
    stopped = dpone("server", "stop", "--data-dir", str(data_dir))
    assert stopped.returncode == 0, stopped.stderr


def _project(tmp_path: Path, data_dir: Path, database: str) -> Path:
    config = tmp_path / f"{database}.toml"
    return write_project(config, data_dir, f"{database}.items", work_dir=f"work-{database}")


def test_a_restart_without_protect_protects_what_the_last_start_did(tmp_path: Path) -> None:
    data_dir = tmp_path / "ch"
    first = _start(data_dir, *PROTECTED)
    assert first["protected_databases"] == list(PROTECTED) and first["protected_from"] == "option"
    record = data_dir / "protected.json"
    assert stat.S_IMODE(record.stat().st_mode) == 0o600
    assert json.loads(record.read_bytes()) == {"databases": list(PROTECTED), "version": 1}
    _stop(data_dir)
    expected_start = f"dpone server start --data-dir {data_dir} --protect pm_db --protect pm_other"

    # Stopped: status names the record and the command that starts the server as it was.
    stopped = dpone("server", "status", "--data-dir", str(data_dir), "--json")
    assert stopped.returncode == 1
    assert as_json(stopped)["protected_databases"] == list(PROTECTED)
    assert as_json(stopped)["start_command"] == expected_start

    again = _start(data_dir)  # no --protect: the recorded set
    try:
        assert again["protected_from"] == "record"
        assert again["protected_databases"] == list(PROTECTED)
        status = dpone("server", "status", "--data-dir", str(data_dir))
        assert status.returncode == 0
        assert "protected databases: pm_db, pm_other" in status.stdout
        make_source(tmp_path / "shop.db", rows_of(7))
        code, report = refresh_items(_project(tmp_path, data_dir, "pm_db"))
        assert code == 0, report
        assert report["outcome"] == "published" and report["rows"] == 7
        ids = chhttp.rows(again["http_port"], "SELECT id FROM pm_db.items ORDER BY id")
        assert [int(r["id"]) for r in ids] == list(range(1, 8))

        # A database that exists but that the pool has no grant on: not "does not exist".
        chhttp.query(again["http_port"], f"CREATE DATABASE {PLAIN} ENGINE = Atomic")
        code, report = refresh_items(_project(tmp_path, data_dir, PLAIN))
        assert code == 1 and report["phase"] == "check"  # refused before the export
        error = report["error"]
        assert error["code"] == "database_not_protected", error
        restart = f"dpone server stop --data-dir {data_dir}; {expected_start} --protect {PLAIN}"
        assert error["details"]["next_command"] == restart
        assert error["details"]["database_exists"] is True
        assert restart in error["message"] and "CREATE DATABASE" not in error["message"]
    finally:
        _stop(data_dir)

    # A stopped server's hint starts it as it was: both recorded databases, not only
    # the one the project publishes into.
    done = dpone("refresh", "items", "--config", str(_project(tmp_path, data_dir, "pm_db")))
    assert done.returncode == 1 and "[server_not_running]" in done.stderr
    assert f"`{expected_start}`" in done.stderr

    # A given set replaces the record, and the output says what it was.
    started = dpone("server", "start", "--data-dir", str(data_dir), "--protect", "pm_db")
    try:
        assert started.returncode == 0, started.stderr
        assert "protected databases: pm_db (recorded in" in started.stdout
        assert "they were pm_db, pm_other; the given --protect set replaced" in started.stdout
        assert json.loads(record.read_bytes())["databases"] == ["pm_db"]
    finally:
        _stop(data_dir)
