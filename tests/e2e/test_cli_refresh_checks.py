"""What would refuse a refresh later is refused before its export (issue 24, item 7).

Before: a missing target database (``nodb.orders``) came back as the server's raw
``Code: 81 ... UNKNOWN_DATABASE`` after the whole export; a table blocked by an
unresolved publication was found only after the export and the stage; a second
refresh started while the first staged re-exported and staged before failing, and
left a generation to discard. Now each is refused in the ``check`` phase, with a
code and the command that resolves it, and nothing is exported or staged.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dpone.publication.store import SqliteSnapshotStore
from tests import chhttp
from tests.plugins.cli import as_json, dpone
from tests.plugins.refresh import (
    SERVER_KINDS,
    make_source,
    project,
    protected_server,
    refresh,
    rows_of,
)

DATABASE = "refresh_db"  # project() of tests/plugins/refresh.py targets this database


@pytest.fixture(scope="module", params=SERVER_KINDS)
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    yield from protected_server(tmp_path_factory, DATABASE, "checks-ch", request.param)


def _exports(tmp_path: Path) -> dict[str, int]:
    exports = tmp_path / "work" / "exports"
    return {p.name: p.stat().st_mtime_ns for p in exports.iterdir()} if exports.is_dir() else {}


def _refused_before_work(
    config: Path, code: str, exports_before: dict[str, int] | None = None
) -> dict[str, Any]:
    """Refresh; it must fail in ``check`` with ``code``, exporting nothing."""
    exit_code, document = refresh(config, "items")
    assert exit_code == 1 and document["ok"] is False, document
    (report,) = document["tables"]
    assert (report["phase"], report["error"]["code"]) == ("check", code), report
    assert list(report["timings"]) == ["check"], report  # no export, no stage
    assert _exports(config.parent) == (exports_before or {})
    return dict(report)


def _attempts(tmp_path: Path) -> set[str]:
    attempts = tmp_path / "work" / "attempts"
    return {p.name for p in attempts.iterdir()} if attempts.is_dir() else set()


def test_a_missing_or_unprotected_database_is_refused_before_the_export(
    tmp_path: Path, server: dict[str, Any]
) -> None:
    make_source(tmp_path / "shop.db", rows_of(10))
    config = project(tmp_path, server, "t_check_db")
    text = config.read_text()
    config.write_text(text.replace(f'"{DATABASE}.t_check_db"', '"nodb.orders"'))
    remote = server["kind"] == "remote"
    # A remote pool sees no database it holds no grant on: both problems are named,
    # the installation's first (the pool must protect it, and it must exist).
    report = _refused_before_work(
        config, "database_not_protected" if remote else "database_missing"
    )
    assert "CREATE DATABASE" in report["error"]["message"] and "nodb" in report["error"]["message"]
    assert "Code: 81" not in report["error"]["message"]
    if remote:
        problems = report["error"]["details"]["problems"]
        assert [p["code"] for p in problems] == ["database_not_protected", "database_missing"]
    # It exists now, but the server does not protect it: the restart (or, on a remote
    # server, the pool rendered again) that does.
    chhttp.query(server["http_port"], "CREATE DATABASE nodb ENGINE = Atomic")
    try:
        report = _refused_before_work(config, "database_not_protected")
        if remote:
            (problem,) = report["error"]["details"]["problems"]
            assert "--protect nodb" in problem["fix"], report
        else:
            assert "--protect nodb" in report["error"]["details"]["next_command"], report
        assert _attempts(tmp_path) == set()
    finally:
        chhttp.query(server["http_port"], "DROP DATABASE nodb")


def _wait_for_state(store: Path, state: str, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 120
    while True:
        try:
            states = [s.state for s in SqliteSnapshotStore(store, create=False).list_snapshots()]
        except Exception:  # polled while the refresh writes it
            states = []
        if state in states:
            return
        assert process.poll() is None, "the refresh ended before the point to kill it"
        assert time.monotonic() < deadline
        time.sleep(0.005)


def _start_refresh(config: Path) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if k != "DPONE_DATA_DIR"}
    return subprocess.Popen(
        [sys.executable, "-m", "dpone", "refresh", "--config", str(config), "items"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )


def test_a_slot_blocked_by_an_unresolved_publication_is_refused_before_the_export(
    tmp_path: Path, server: dict[str, Any]
) -> None:
    rows = rows_of(1_000)
    make_source(tmp_path / "shop.db", rows)
    config = project(tmp_path, server, "t_check_blocked")
    store = tmp_path / "store.sqlite"
    process = _start_refresh(config)
    _wait_for_state(store, "exchange_intent", process)  # claimed: the EXCHANGE may be sent
    process.send_signal(signal.SIGKILL)
    process.wait()
    known = _attempts(tmp_path)
    report = _refused_before_work(config, "slot_blocked", _exports(tmp_path))
    command = report["error"]["details"]["next_command"]
    assert command.split()[1:3] == ["snapshot", "reconcile"], report
    assert _attempts(tmp_path) == known  # nothing staged
    done = dpone(*command.split()[1:], "--json")
    assert as_json(done)["state"] in ("published", "not_published"), done.stdout
    code, document = refresh(config, "items")
    assert code == 0, document


def test_a_second_refresh_of_a_running_table_is_refused_at_once(
    tmp_path: Path, server: dict[str, Any]
) -> None:
    make_source(tmp_path / "shop.db", rows_of(20_000))
    config = project(tmp_path, server, "t_check_busy")
    store = tmp_path / "store.sqlite"
    first = _start_refresh(config)
    _wait_for_state(store, "prepared", first)  # the first one is well past its export
    known = _attempts(tmp_path)
    code, document = refresh(config, "items")
    assert code == 1
    (report,) = document["tables"]
    assert (report["phase"], report["error"]["code"]) == ("check", "refresh_busy"), report
    assert list(report["timings"]) == ["check"], report
    assert _attempts(tmp_path) == known, "the second refresh staged nothing"
    assert first.wait(timeout=120) == 0
    code, document = refresh(config, "items")
    assert code == 0, document


def test_a_published_target_without_its_store_is_refused_before_the_export(
    tmp_path: Path, server: dict[str, Any]
) -> None:
    make_source(tmp_path / "shop.db", rows_of(10))
    config = project(tmp_path, server, "t_check_store")
    code, _ = refresh(config, "items")
    assert code == 0
    store = tmp_path / "store.sqlite"
    moved = tmp_path / "elsewhere.sqlite"
    for suffix in ("", "-wal", "-shm"):
        if Path(f"{store}{suffix}").exists():
            Path(f"{store}{suffix}").rename(f"{moved}{suffix}")
    # Before: the refresh created an empty store and published, orphaning the copies.
    report = _refused_before_work(config, "store_missing", _exports(tmp_path))
    assert str(store) in report["error"]["message"], report
    assert not store.exists()  # no empty store was created
    for suffix in ("", "-wal", "-shm"):
        if Path(f"{moved}{suffix}").exists():
            Path(f"{moved}{suffix}").rename(f"{store}{suffix}")
    code, _ = refresh(config, "items")
    assert code == 0


def test_a_rollback_while_the_table_is_held_is_refused_at_once(
    tmp_path: Path, server: dict[str, Any]
) -> None:
    make_source(tmp_path / "shop.db", rows_of(10))
    config = project(tmp_path, server, "t_check_rb_lock")
    assert refresh(config, "items")[0] == 0
    make_source(tmp_path / "shop.db", rows_of(12))
    assert refresh(config, "items")[0] == 0
    lock = tmp_path / "work" / "locks" / "items.lock"
    fd = os.open(lock, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # as a running refresh of the table holds it
        done = dpone("rollback", "items", "--config", str(config), "--json")
    finally:
        os.close(fd)
    assert done.returncode == 1, done.stdout
    refused = as_json(done)
    assert (refused["phase"], refused["error"]["code"]) == ("check", "refresh_busy"), refused
    assert dpone("rollback", "items", "--config", str(config)).returncode == 0


def test_a_database_that_is_not_atomic_is_refused_before_the_export(
    tmp_path: Path, server: dict[str, Any]
) -> None:
    """Before: a new target in a non-Atomic database (a Replicated or Shared one, here a
    Memory one) was refused only by staging's identity check, after the export (issue
    35, item 8)."""
    make_source(tmp_path / "shop.db", rows_of(3))
    config = project(tmp_path, server, "t_not_atomic")
    config.write_text(config.read_text().replace(f'"{DATABASE}.t_not_atomic"', '"memdb.orders"'))
    chhttp.query(server["http_port"], "CREATE DATABASE memdb ENGINE = Memory")
    try:
        if server["kind"] == "remote":  # its pool protects no memdb: that is said first
            _refused_before_work(config, "database_not_protected")
        else:
            report = _refused_before_work(config, "database_not_atomic")
            assert "Atomic" in report["error"]["message"], report
        assert _attempts(tmp_path) == set()
    finally:
        chhttp.query(server["http_port"], "DROP DATABASE memdb")


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_a_run_observes_its_targets_once_and_refuses_the_blocked_one_in_its_check(
    tmp_path: Path, server: dict[str, Any], jobs: str
) -> None:
    """A run of several tables observes their targets together before the first (issue
    33): a clear table's check does not observe its target again; a blocked one is
    refused by its own check, exporting nothing, and the others publish."""
    make_source(tmp_path / "shop.db", rows_of(5))
    config = project(tmp_path, server, f"t_many_a{jobs}")
    tables = "".join(
        f'[tables.{name}]\nsource = "shop"\ntable = "items"\n'
        f'target = "{DATABASE}.t_many_{name}{jobs}"\norder_by = "id"\n'
        for name in ("b", "c")
    )
    config.write_text(config.read_text().replace("[tables.items]", tables + "[tables.a]"))
    first, document = refresh(config, "--all")
    assert first == 0, document
    port = server["http_port"]
    chhttp.query(port, f"CREATE TABLE {DATABASE}.src_b{jobs} (id Int64) ENGINE = Memory")
    chhttp.query(
        port,
        f"CREATE MATERIALIZED VIEW {DATABASE}.mv_b{jobs} TO {DATABASE}.t_many_b{jobs} "
        f"AS SELECT id, '' AS name, toDecimal64(0, 2) AS price FROM {DATABASE}.src_b{jobs}",
    )
    try:
        code, document = refresh(config, "--all", "--jobs", jobs)
        assert code == 1, document
        reports = {r["table"]: r for r in document["tables"]}
        assert {t: r["outcome"] for t, r in reports.items()} == {
            "a": "published",
            "b": "failed",
            "c": "published",
        }, document
        blocked = reports["b"]
        assert (blocked["phase"], blocked["error"]["code"]) == ("check", "side_effect_present")
        assert list(blocked["timings"]) == ["check"]  # nothing exported or staged
        # The clear ones skip their own observation of the target (three requests when
        # nothing blocks): the refused check, which ends at its observation, sends more.
        checks = {t: r["traffic"]["check"]["requests"] for t, r in reports.items()}
        assert checks["b"] > checks["a"] == checks["c"], checks
        # The run's one look at every target, before the first table, is reported too.
        shared = document["shared_check"]
        assert shared["cleared"] == ["a", "c"], shared
        assert shared["requests"] >= 1 and shared["seconds"] >= 0, shared
    finally:
        chhttp.query(port, f"DROP TABLE {DATABASE}.mv_b{jobs}")
        chhttp.query(port, f"DROP TABLE {DATABASE}.src_b{jobs}")


def test_a_signal_skips_every_table_after_the_one_it_stopped(
    tmp_path: Path, server: dict[str, Any]
) -> None:
    """Before: the table after the stopped one was skipped, and the run went on with
    the rest, publishing them after the SIGTERM."""
    make_source(tmp_path / "shop.db", rows_of(5))
    config = project(tmp_path, server, "t_sig_a")
    tables = "".join(
        f'[tables.{name}]\nsource = "shop"\ntable = "items"\n'
        f'target = "{DATABASE}.t_sig_{name}"\norder_by = "id"\n'
        for name in ("b", "c", "d")
    )
    config.write_text(config.read_text().replace("[tables.items]", "[tables.a]") + tables)
    env = {k: v for k, v in os.environ.items() if k != "DPONE_DATA_DIR"}
    process = subprocess.Popen(
        [sys.executable, "-m", "dpone", "refresh", "--config", str(config), "--all", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    _wait_for_state(tmp_path / "store.sqlite", "prepared", process)
    process.send_signal(signal.SIGTERM)
    out, _ = process.communicate(timeout=120)
    assert process.returncode == 128 + signal.SIGTERM
    document = json.loads(out.decode().splitlines()[-1])
    outcomes = [t["outcome"] for t in document["tables"]]
    assert outcomes[1:] == ["skipped", "skipped", "skipped"], outcomes
    assert document["interrupted"] == "SIGTERM"
