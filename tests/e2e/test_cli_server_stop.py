"""A server stop while a refresh's INSERT runs, then a restart: nothing stays wedged.

Issue 24, item 1: the stop cut the ingest user's INSERT, whose ``QueryStart`` the
saved query log keeps without a finish; every later refresh of the table failed at
``prepare`` with ``ingest_not_quiescent`` and ``dpone status`` named nothing. Now the
restart settles what the stopped server ran (no query of a gone server process can
still write), status names one command per leftover, and after them the next refresh
publishes. Each test stops its own server.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import chhttp
from tests.plugins.cli import as_json, dpone
from tests.plugins.refresh import confirmed, make_source, project, rows_of, target_rows

DATABASE = "refresh_db"  # project() of tests/plugins/refresh.py targets this database


@pytest.fixture
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    data_dir = tmp_path_factory.mktemp("stop-ch") / "ch"
    started = dpone("server", "start", "--protect", DATABASE, "--data-dir", str(data_dir), "--json")
    assert started.returncode == 0, started.stdout + started.stderr
    info = {**as_json(started), "data_dir": data_dir, "kind": "managed"}
    try:
        yield info
    finally:
        dpone("server", "stop", "--data-dir", str(data_dir))


def _loading(attempts: Path) -> bool:
    """An attempt journaled ``loading``: its INSERT is being sent (where the issue stopped)."""
    for event in attempts.glob("*/events/*/attempt.json"):
        if not confirmed(event):
            continue  # not an event (yet)
        try:
            if json.loads(event.read_bytes())["state"] == "loading":
                return True
        except (OSError, ValueError):
            continue  # being written
    return False


def _refresh_cut_by_stop(config: Path, server: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "DPONE_DATA_DIR"}
    process = subprocess.Popen(
        [sys.executable, "-m", "dpone", "refresh", "--config", str(config), "items", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    deadline = time.monotonic() + 120
    while not _loading(config.parent / "work" / "attempts"):
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "the refresh never sent its INSERT"
        time.sleep(0.01)
    stopped = dpone("server", "stop", "--data-dir", str(server["data_dir"]))
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    out, err = process.communicate(timeout=180)
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)


def test_server_stop_mid_insert_then_restart_then_refresh_publishes(
    tmp_path: Path, server: dict[str, Any]
) -> None:
    rows = rows_of(2_000_000, name="a longer name that makes the insert take seconds ")
    make_source(tmp_path / "shop.db", rows)
    config = project(tmp_path, server, "t_stop")
    cut = _refresh_cut_by_stop(config, server)
    assert cut.returncode == 1, cut.stdout + cut.stderr
    (failed,) = as_json(cut)["tables"]
    # The stop cuts the INSERT (stage), or, when the INSERT's answer came first, the
    # closure that prepare runs next: either way the refresh failed and must not wedge.
    assert failed["phase"] in ("stage", "prepare") and failed["outcome"] == "failed", failed
    # The restart every hint names: the data directory remembers what it protects.
    started = dpone("server", "start", "--data-dir", str(server["data_dir"]), "--json")
    assert started.returncode == 0, started.stdout + started.stderr
    port = as_json(started)["http_port"]
    chhttp.register_server(port, server["data_dir"])
    status = as_json(dpone("status", "--config", str(config), "--json"))
    commands = [item["command"] for item in status["needs_person"]]
    assert commands and all(commands), status  # every leftover has its command
    for command in commands:
        done = subprocess.run(
            [sys.executable, "-m", "dpone", *command.split()[1:], "--json"],
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )
        assert done.returncode == 0, (command, done.stdout, done.stderr)
    after = as_json(dpone("status", "--config", str(config), "--json"))
    assert after["needs_person"] == [], after
    for _ in range(2):  # before: prepare failed with ingest_not_quiescent, every time
        again = dpone("refresh", "--config", str(config), "items", "--json")
        assert again.returncode == 0, again.stdout + again.stderr
    expected = [[i, name, price] for i, name, price in rows]
    assert target_rows(port, "t_stop") == expected
