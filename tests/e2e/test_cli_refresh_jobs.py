"""``dpone refresh --all --jobs N``: many tables at once (issues 24 and 33).

N tables run at once in threads of one process (issue 33; N worker processes
before), each table with its own lease and report; a failing table does not stop the
others; a signal reaches every running table once and each says what it left; the run
killed outright leaves what ``dpone status`` names and resolves.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dpone.publication.store import SqliteSnapshotStore
from tests import chhttp
from tests.plugins.cli import as_json, dpone, run_on_terminal
from tests.plugins.refresh import SERVER_KINDS, clickhouse_section, protected_server

DATABASE = "jobs_db"


@pytest.fixture(scope="module", params=SERVER_KINDS)
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    yield from protected_server(tmp_path_factory, DATABASE, "jobs-ch", request.param)


def _project(tmp_path: Path, server: dict[str, Any], tables: int, rows: int, tag: str) -> Path:
    """``tables`` SQLite tables of ``rows`` rows each, one project table per source table."""
    with sqlite3.connect(tmp_path / "shop.db") as conn:
        for n in range(tables):
            conn.execute(f"CREATE TABLE t{n:02d} (id bigint NOT NULL, name nvarchar(40))")
            conn.executemany(
                f"INSERT INTO t{n:02d} VALUES (?, ?)",
                [(i, f"table {n} row {i}") for i in range(rows)],
            )
    conn.close()
    text = (
        '[project]\nwork_dir = "work"\nstore = "store.sqlite"\n'
        + clickhouse_section(server)
        + '[sources.shop]\nkind = "sqlite"\npath = "shop.db"\n'
    )
    for n in range(tables):
        text += (
            f'[tables.t{n:02d}]\nsource = "shop"\ntable = "t{n:02d}"\n'
            f'target = "{DATABASE}.{tag}_{n:02d}"\norder_by = "id"\n'
        )
    config = tmp_path / "dpone.toml"
    config.write_text(text)
    return config


def _count(port: int, table: str) -> int:
    return int(chhttp.rows(port, f"SELECT count() AS n FROM {DATABASE}.{table}")[0]["n"])


def test_twenty_tables_with_eight_jobs_each_publish_with_their_own_report(
    tmp_path: Path, server: dict[str, Any]
) -> None:
    config = _project(tmp_path, server, 20, 1_000, "many")
    # One table's source table is gone: it fails alone, the others go on.
    with sqlite3.connect(tmp_path / "shop.db") as conn:
        conn.execute("DROP TABLE t07")
    conn.close()
    # Eight at once, twice the pool: a table waits its turn at a principal.
    done = dpone("refresh", "--all", "--jobs", "8", "--config", str(config), "--json")
    assert done.returncode == 1, done.stdout + done.stderr
    document = as_json(done)
    assert document["jobs"] == 8 and document["ok"] is False
    # Tables that asked at once shared one read: observations, last looks and closure proofs.
    shared = document["shared_reads"]
    for kind in ("observe", "identities", "close", "side_effects"):
        sizes = shared[f"{kind}:{DATABASE}"]
        assert max(sizes) > 1, shared
    assert sum(shared[f"close:{DATABASE}"]) == 2 * 19, shared  # an ingest and a publisher each
    assert sum(shared[f"side_effects:{DATABASE}"]) == 19, shared  # a last look each
    reports = {r["table"]: r for r in document["tables"]}
    assert list(reports) == [f"t{n:02d}" for n in range(20)]  # the project's order
    assert (reports["t07"]["outcome"], reports["t07"]["phase"]) == ("failed", "export")
    published = [r for name, r in reports.items() if name != "t07"]
    failed = [
        (r["table"], r["phase"], r["error"]) for r in published if r["outcome"] != "published"
    ]
    assert failed == [], failed
    assert all(r["rows"] == 1_000 for r in published)
    assert len({r["attempt_id"] for r in published}) == 19  # one attempt each
    for n in range(20):
        if n != 7:
            assert _count(server["http_port"], f"many_{n:02d}") == 1_000
    store = SqliteSnapshotStore(tmp_path / "store.sqlite", create=False)
    leases = store.lease_records(active_only=False)
    assert leases and all(not r.lease.active for r in leases)
    assert {r.lease.attempt_id for r in leases} >= {r["attempt_id"] for r in published}
    # One process took every lease: the run's, not a process per table or worker.
    holders = {r.holder.pid for r in leases if r.holder is not None}
    assert len(holders) == 1, holders
    text = dpone("refresh", "t03", "t00", "t02", "t01", "--jobs", "2", "--config", str(config))
    assert text.returncode == 0, text.stdout + text.stderr
    heads = [line.split(" ->")[0] for line in text.stdout.splitlines() if ": published" in line]
    assert heads == ["t03", "t00", "t02", "t01"], text.stdout  # the order asked for
    assert text.stdout.count(": published 1000 rows") == 4, text.stdout


def _refreshing(options: list[str]) -> subprocess.Popen[str]:
    """``dpone refresh OPTIONS`` started (its output piped, as text), not awaited."""
    env = {k: v for k, v in os.environ.items() if k != "DPONE_DATA_DIR"}
    return subprocess.Popen(
        [sys.executable, "-m", "dpone", "refresh", *options],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def _await_intents(process: subprocess.Popen[str], store: Path, count: int) -> None:
    """Return once the run stored ``count`` intents (it must still run meanwhile)."""
    deadline = time.monotonic() + 120
    while True:
        try:
            found = len(SqliteSnapshotStore(store, create=False).list_snapshots())
        except Exception:  # polled while the refreshes write it
            found = 0
        if found >= count:
            return
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.005)


def _running_until_intents(
    tmp_path: Path, server: dict[str, Any], tag: str, intents: int
) -> tuple[Path, subprocess.Popen[str]]:
    """A project of six tables of 20,000 rows, and its `refresh --all --jobs 3 --json`
    still running once it stored ``intents`` intents."""
    config = _project(tmp_path, server, 6, 20_000, tag)
    process = _refreshing(["--all", "--jobs", "3", "--config", str(config), "--json"])
    _await_intents(process, tmp_path / "store.sqlite", intents)
    return config, process


def test_the_run_killed_outright_leaves_what_status_names_and_resolves(
    tmp_path: Path, server: dict[str, Any]
) -> None:
    # Killed once two intents are stored: tables in several phases at once.
    config, process = _running_until_intents(tmp_path, server, "kill", 2)
    process.send_signal(signal.SIGKILL)
    out, _ = process.communicate(timeout=60)
    assert process.returncode == -signal.SIGKILL and out == "", out
    # What the killed run left, status names with the command that resolves it; a
    # claim's reconcile or a PREPARED intent's cancel leaves its generation to discard,
    # named by the next status.
    for _ in range(3):
        status = as_json(dpone("status", "--config", str(config), "--json"))
        for item in status["needs_person"]:
            assert item["command"], item
            done = dpone(*shlex.split(item["command"])[1:], cwd=tmp_path)
            # A reconcile that proves the EXCHANGE never ran exits 1: not published.
            resolved = done.returncode == 0 or "state not_published" in done.stdout
            assert resolved, (item, done.stdout, done.stderr)
    status = as_json(dpone("status", "--config", str(config), "--json"))
    assert status["needs_person"] == [] and status["active_leases"] == [], status
    again = dpone("refresh", "--all", "--jobs", "3", "--config", str(config), "--json")
    assert again.returncode == 0, again.stdout + again.stderr
    for n in range(6):
        assert _count(server["http_port"], f"kill_{n:02d}") == 20_000


def test_a_signal_reaches_every_running_table_once_and_each_says_what_it_left(
    tmp_path: Path, server: dict[str, Any]
) -> None:
    # Stopped once three intents are stored: three tables are past their stage.
    config, process = _running_until_intents(tmp_path, server, "stop", 3)
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=180)
    assert process.returncode == 128 + signal.SIGINT, (out, err)
    (line,) = out.splitlines()
    document = json.loads(line)
    assert document["interrupted"] == "SIGINT" and document["ok"] is False, document
    reports = document["tables"]
    assert [r["table"] for r in reports] == [f"t{n:02d}" for n in range(6)]
    outcomes = [r["outcome"] for r in reports]
    assert "skipped" in outcomes, outcomes  # nothing new started after the signal
    stopped = [r for r in reports if r["interrupted"]]
    # The running tables got it (in publish, where it lands, a table's ending may
    # reconcile its EXCHANGE to published: interrupted, yet published).
    assert stopped, reports
    for report in stopped:
        assert report["interrupted"] == "SIGINT", report
        assert report["outcome"] in ("interrupted", "published"), report
        # Each child got the signal once: its ending ran to the end, not cut short.
        assert "settle_cut" not in report["error"]["details"], report
    for report in reports:
        if report["outcome"] in ("interrupted", "skipped"):
            assert report["next_commands"], report
    status = as_json(dpone("status", "--config", str(config), "--json"))
    assert status["needs_person"] == [] and status["active_leases"] == [], status
    again = dpone("refresh", "--all", "--jobs", "3", "--config", str(config), "--json")
    assert again.returncode == 0, again.stdout + again.stderr
    for n in range(6):
        assert _count(server["http_port"], f"stop_{n:02d}") == 20_000


def test_on_a_terminal_one_line_shows_every_running_tables_phase(
    tmp_path: Path, server: dict[str, Any]
) -> None:
    config = _project(tmp_path, server, 3, 20_000, "line")
    code, out, err = run_on_terminal(
        ["refresh", "--all", "--jobs", "3", "--config", str(config)], tmp_path
    )
    assert code == 0, out + err
    assert out.count(": published 20000 rows") == 3, out
    lines = err.split("\r")
    # Each table is seen in its phases, side by side with the others on one line.
    for name in ("t00", "t01", "t02"):
        assert any(f"{name}: prepare" in line for line in lines), err
        assert any(f"{name}: publish" in line for line in lines), err
    assert any(line.count("prepare") + line.count("publish") >= 2 for line in lines), err
    assert "rows/s" not in err or all(
        int(rate.replace(",", "")) < 100_000_000 for rate in re.findall(r"([0-9,]+) rows/s", err)
    ), err  # sane rates only
