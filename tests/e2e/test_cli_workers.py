"""Workers sharing one project through a PostgreSQL store, as an orchestrator runs them.

Each worker is a real process with a work directory of its own and the same project
(its tables, its pool, its PostgreSQL store); a throwaway PostgreSQL cluster holds the
store and a managed ClickHouse server of this module's takes the targets.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from dpone.errors import StateError
from dpone.publication.dispatch.postgres_locks import postgres_table_lock
from dpone.publication.store import store_exists
from tests import chhttp
from tests.plugins.cli import as_json, dpone

DATABASE = "workers_db"
TABLES = [f"t{n:02d}" for n in range(30)]
ROWS = 20


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    data_dir = tmp_path_factory.mktemp("workers-ch") / "ch"
    started = dpone("server", "start", "--data-dir", str(data_dir), "--protect", DATABASE, "--json")
    assert started.returncode == 0, started.stdout + started.stderr
    info = as_json(started)
    chhttp.register_server(info["http_port"], data_dir)
    try:
        yield {**info, "data_dir": data_dir}
    finally:
        dpone("server", "stop", "--data-dir", str(data_dir))


def make_source(path: Path, rows: int, label: str) -> None:
    with sqlite3.connect(path) as conn:
        for name in TABLES:
            conn.execute(f"DROP TABLE IF EXISTS {name}")
            conn.execute(f"CREATE TABLE {name} (id bigint NOT NULL, label nvarchar(30))")
            conn.executemany(
                f"INSERT INTO {name} VALUES (?, ?)",
                [(i, f"{label}-{name}-{i}") for i in range(1, rows + 1)],
            )
    conn.close()


def worker_config(root: Path, n: int, server: dict[str, Any], store: str) -> Path:
    """Worker ``n``'s copy of the project: its own work directory, the shared store."""
    home = root / f"worker{n}"
    home.mkdir(parents=True, exist_ok=True)
    tables = "".join(
        f'[tables.{name}]\nsource = "src"\ntable = "{name}"\n'
        f'target = "{DATABASE}.{name}"\norder_by = "id"\n'
        for name in TABLES
    )
    config = home / "dpone.toml"
    config.write_text(
        f'[project]\nwork_dir = "work"\nstore = "{store}"\n'
        f'[clickhouse]\ndata_dir = "{server["data_dir"]}"\n'
        f'[sources.src]\nkind = "sqlite"\npath = "{root / "src.db"}"\n' + tables
    )
    return config


def start(config: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "dpone", "refresh", "--config", str(config), *args, "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={k: v for k, v in os.environ.items() if k != "DPONE_DATA_DIR"},
    )


def labels(port: int, name: str) -> list[str]:
    return [
        str(r["label"])
        for r in chhttp.rows(port, f"SELECT label FROM {DATABASE}.{name} ORDER BY id")
    ]


def states(store: str) -> list[str]:
    with psycopg.connect(store, autocommit=True) as conn:
        return [str(r[0]) for r in conn.execute("SELECT state FROM dpone.records")]


def test_three_workers_share_one_store_and_a_killed_one_is_resolved_from_another(
    tmp_path: Path, server: dict[str, Any], postgres_store: str
) -> None:
    port = server["http_port"]
    make_source(tmp_path / "src.db", ROWS, "one")
    configs = [worker_config(tmp_path, n, server, postgres_store) for n in range(3)]
    # An orchestrator's three tasks: ten tables each, two at a time, all at once.
    running = [
        start(config, *TABLES[10 * n : 10 * n + 10], "--jobs", "2")
        for n, config in enumerate(configs)
    ]
    for process in running:
        out, err = process.communicate(timeout=600)
        failed = [t["error"] for t in json.loads(out.splitlines()[-1])["tables"] if t["error"]]
        assert process.returncode == 0, (failed, err[-2000:])
    for name in TABLES:
        assert labels(port, name) == [f"one-{name}-{i}" for i in range(1, ROWS + 1)]
    # The work of all three is in the one store; each worker kept its own files.
    assert states(postgres_store).count("published") == 30
    assert all((c.parent / "work" / "attempts").is_dir() for c in configs)

    # A table another worker holds is refused at once, naming the holder.
    def busy(holder: str) -> StateError:
        return StateError(holder)

    with postgres_table_lock(postgres_store, "t00", busy):
        code, report = _refresh(configs[1], "t00")
    assert code != 0
    (refused,) = report["tables"]
    assert (refused["phase"], refused["error"]["code"]) == ("check", "refresh_busy"), refused
    assert f"pid {os.getpid()}" in refused["error"]["message"]

    # Worker 0 is killed while it publishes t05 (after its EXCHANGE was claimed).
    make_source(tmp_path / "src.db", ROWS + 1, "two")
    before = states(postgres_store).count("exchange_intent")
    victim = start(configs[0], "t05")
    deadline = time.monotonic() + 120
    while states(postgres_store).count("exchange_intent") == before:
        assert victim.poll() is None and time.monotonic() < deadline, "publish not reached"
        time.sleep(0.002)
    victim.send_signal(signal.SIGKILL)
    victim.communicate()

    # Worker 2 sees what worker 0 left, in the shared store, and resolves it.
    status = dpone("status", "--config", str(configs[2]), "--json")
    assert status.returncode == 1, status.stdout
    needs = as_json(status)["needs_person"]
    assert [n["kind"] for n in needs] == ["exchange_intent"], needs
    # Its publisher lease is listed with the worker whose files the attempt needs.
    leased = {e["attempt_id"]: e for e in as_json(status)["active_leases"]}
    victims = [e for e in leased.values() if e["worker"]["pid"] == victim.pid]
    assert len(victims) == 1, leased
    journal = Path(victims[0]["worker"]["journal"])
    assert journal.parent == configs[0].parent / "work" / "attempts" and journal.is_dir()
    command = needs[0]["command"].split()
    assert command[:3] == ["dpone", "snapshot", "reconcile"] and postgres_store in command
    done = as_json(dpone(*command[1:], "--json"))
    assert done["state"] in ("published", "not_published"), done
    expected = {"published": ROWS + 1, "not_published": ROWS}[done["state"]]
    assert len(labels(port, "t05")) == expected
    if done["state"] == "not_published":
        # Its staged generation is discarded from the worker whose journal it is.
        (item,) = as_json(dpone("status", "--config", str(configs[0]), "--json"))["needs_person"]
        assert item["kind"] == "staged_unpublished"
        assert dpone(*item["command"].split()[1:]).returncode == 0

    # The next run publishes every table exactly, from any worker.
    code, report = _refresh(configs[1], "--all", "--jobs", "2")
    assert code == 0, report
    for name in TABLES:
        assert labels(port, name) == [f"two-{name}-{i}" for i in range(1, ROWS + 2)]
    assert dpone("status", "--config", str(configs[2])).returncode == 0
    assert store_exists(postgres_store)


def _refresh(config: Path, *args: str) -> tuple[int, dict[str, Any]]:
    done = dpone("refresh", "--config", str(config), *args, "--json")
    return done.returncode, as_json(done)
