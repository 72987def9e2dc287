"""A refresh project on a protected server, as the CLI tests drive it.

The server (managed by ``dpone server start --protect`` or remote), the SQLite source
``shop.db`` with its table ``items``, the project file that publishes it into
``refresh_db``, the ``dpone`` commands that run it, and what a test reads back: target
rows, store states, journal states, and the moment to kill a refresh.
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

import pytest

from tests import chhttp
from tests.plugins.cli import as_json, dpone
from tests.remote_server import remote_server

DATABASE = "refresh_db"


# The two kinds of server a project names: the managed local server (data_dir) and a
# server dpone did not start, reached by host, ports and the credentials file of the
# pool its operator installed (tests/remote_server.py).
SERVER_KINDS = ("managed", "remote")


def protected_server(
    tmp_path_factory: pytest.TempPathFactory, database: str, label: str, kind: str = "managed"
) -> Iterator[dict[str, Any]]:
    """A server protecting ``database``, stopped after: the managed one started by the
    CLI with ``--protect database``, or (``kind="remote"``) one dpone reaches only as a
    remote server."""
    if kind == "remote":
        yield from remote_server(tmp_path_factory.mktemp(label), [database])
        return
    data_dir = tmp_path_factory.mktemp(label) / "ch"
    started = dpone("server", "start", "--protect", database, "--data-dir", str(data_dir), "--json")
    assert started.returncode == 0, started.stdout + started.stderr
    info = as_json(started)
    chhttp.register_server(info["http_port"], data_dir)
    try:
        yield {**info, "data_dir": data_dir, "kind": "managed"}
    finally:
        dpone("server", "stop", "--data-dir", str(data_dir))


def clickhouse_section(server: dict[str, Any]) -> str:
    """The ``[clickhouse]`` section that names ``server`` in a project file."""
    if server["kind"] == "remote":
        return str(server["clickhouse_toml"])
    return f'[clickhouse]\ndata_dir = "{server["data_dir"]}"\n'


def make_source(path: Path, rows: list[tuple[Any, ...]]) -> None:
    path.unlink(missing_ok=True)
    with sqlite3.connect(path) as conn:
        conn.execute(
            "CREATE TABLE items (id bigint NOT NULL, name nvarchar(50), price decimal(10, 2))"
        )
        conn.executemany("INSERT INTO items VALUES (?, ?, ?)", rows)
    conn.close()


def project(
    tmp_path: Path, server: dict[str, Any], target: str, extra: str = "", keep: int = 1
) -> Path:
    config = tmp_path / "dpone.toml"
    config.write_text(
        f'[project]\nwork_dir = "work"\nstore = "store.sqlite"\nkeep_rollback = {keep}\n'
        + clickhouse_section(server)
        + '[sources.shop]\nkind = "sqlite"\npath = "shop.db"\n'
        f'[tables.items]\nsource = "shop"\ntable = "items"\ntarget = "{DATABASE}.{target}"\n'
        f'order_by = "id"\n{extra}'
    )
    return config


def refresh(config: Path, *args: str) -> tuple[int, dict[str, Any]]:
    done = dpone("refresh", "--config", str(config), *args, "--json")
    return done.returncode, as_json(done)


def target_rows(port: int, target: str) -> list[list[Any]]:
    found = chhttp.rows(
        port, f"SELECT id, name, toString(price) AS p FROM {DATABASE}.{target} ORDER BY id"
    )
    return [[int(r["id"]), r["name"], r["p"]] for r in found]


def rows_of(count: int, start: int = 1, name: str = "n") -> list[tuple[Any, ...]]:
    return [(i, f"{name}{i}\ttab", f"{i}.25") for i in range(start, start + count)]


def store_states(store: Path) -> list[str]:
    if not store.exists():
        return []
    try:
        with sqlite3.connect(f"file:{store}?mode=ro", uri=True) as conn:
            found = [str(r[0]) for r in conn.execute("SELECT state FROM records")]
        conn.close()
        return found
    except sqlite3.Error:
        return []


def confirmed(event: Path) -> bool:
    """Whether the journal event file ``event`` was confirmed by its writer."""
    return (event.parent / "confirmed").exists()


def converting(attempt: Path) -> bool:
    """The attempt is admitted and converts its rows (a spool directory): nothing sent yet.

    A kill here leaves nothing whose fate needs proof (a kill between a durable INSERT
    intent and its send would leave cleanup refusing until the dispatch window ends).
    """
    # Confirmed events only: a file its writer has not confirmed is not an event yet.
    events = [e for e in sorted(attempt.glob("events/*/attempt.json")) if confirmed(e)]
    try:
        admitted = bool(events) and json.loads(events[-1].read_bytes())["state"] == "checking"
    except (OSError, ValueError):
        return False  # being written
    return admitted and (attempt / "spool").is_dir()


def killed_in(tmp_path: Path, config: Path, ready: Any) -> None:
    """Start a refresh, SIGKILL it as soon as ``ready()`` holds."""
    env = {k: v for k, v in os.environ.items() if k != "DPONE_DATA_DIR"}
    process = subprocess.Popen(
        [sys.executable, "-m", "dpone", "refresh", "--config", str(config), "items"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    try:
        deadline = time.monotonic() + 120
        # A millisecond between checks: some phases last only tens of milliseconds
        # (verification of a 50k-row stage), and a 20 ms pause once missed one in CI.
        while not ready() and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.001)
        assert process.poll() is None, "the refresh ended before the phase was reached"
        process.send_signal(signal.SIGKILL)
    finally:
        process.wait()


def journal_state(attempt: Path | None) -> str | None:
    """``state/outcome`` of the last confirmed event of a staging journal (None: none yet)."""
    if attempt is None:
        return None
    events = sorted((attempt / "events").glob("*"))
    for event in reversed(events):
        if not (event / "confirmed").exists():
            continue  # not an event (yet): its writer has not confirmed it
        try:
            doc = json.loads((event / "attempt.json").read_bytes())
        except (OSError, ValueError):
            continue  # being written
        return f"{doc.get('state')}/{doc.get('outcome')}"
    return None


def write_project(
    config: Path, data_dir: Path, target: str, *, work_dir: str = "work", project_extra: str = ""
) -> Path:
    """A project file publishing the SQLite table ``items`` of ``shop.db`` into ``target``."""
    config.write_text(
        f'[project]\nwork_dir = "{work_dir}"\nstore = "store.sqlite"\n{project_extra}'
        f'[clickhouse]\ndata_dir = "{data_dir}"\n'
        '[sources.shop]\nkind = "sqlite"\npath = "shop.db"\n'
        f'[tables.items]\nsource = "shop"\ntable = "items"\ntarget = "{target}"\n'
        'order_by = "id"\n'
    )
    return config


def refresh_items(config: Path) -> tuple[int, dict[str, Any]]:
    """``dpone refresh items --json``: the exit code and the table's report."""
    done = dpone("refresh", "items", "--config", str(config), "--json")
    return done.returncode, as_json(done)["tables"][0]


def server_options(server: dict[str, Any], root: Path) -> list[str]:
    """The options that name ``server`` on a command: the managed server's data
    directory, or a project file whose ``[clickhouse]`` names the remote one."""
    if server["kind"] != "remote":
        return ["--data-dir", str(server["data_dir"])]
    config = root / "reach" / "dpone.toml"
    if not config.exists():
        config.parent.mkdir(parents=True)
        project(config.parent, server, "t_reach")
    return ["--config", str(config)]


def stage_argv(
    export: tuple[Path, Path], server: dict[str, Any], work: Path, store: Path, attempt: str
) -> list[str]:
    return [
        "stage",
        str(export[0]),
        "--receipt",
        str(export[1]),
        "--work-dir",
        str(work),
        "--database",
        DATABASE,
        *server_options(server, work.parent),
        "--principal",
        "pool",
        "--store",
        str(store),
        "--attempt-id",
        attempt,
    ]
