"""A refresh stopped between its journal's creation and the journal's first event.

Such a stage sent nothing and created no table (every mutation follows its durable
intent), yet its eventless attempt directory and its ingest lease were left for
``dpone attempts archive``. The refresh's own ending now closes the lease and moves the
directory aside as that command would: ``dpone status`` names nothing, and the next
refresh publishes. The signal lands at that exact point by a stage that creates the
directory and then raises ``KeyboardInterrupt``, which is what Python's SIGINT handler
raises; a real signal cannot be aimed at a window this short.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dpone.project.config import load_project
from dpone.project.refresh import RefreshService
from dpone.publication.store import SqliteSnapshotStore
from tests.plugins.cli import as_json, dpone
from tests.plugins.refresh import (
    SERVER_KINDS,
    make_source,
    project,
    protected_server,
    refresh,
    rows_of,
    target_rows,
)

DATABASE = "refresh_db"


@pytest.fixture(scope="module", params=SERVER_KINDS)
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    yield from protected_server(tmp_path_factory, DATABASE, "cut-journal-ch", request.param)


def test_a_stage_cut_before_its_first_event_leaves_nothing_for_a_person(
    tmp_path: Path, server: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    make_source(tmp_path / "shop.db", rows_of(50))
    config = project(tmp_path, server, "cut_journal")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DPONE_DATA_DIR", raising=False)
    loaded = load_project(config)
    service = RefreshService(loaded)

    def cut(*args: Any, **kwargs: Any) -> Any:
        report = args[4]
        os.makedirs(service.attempts_dir / report.attempt_id / "events", mode=0o700)
        raise KeyboardInterrupt

    monkeypatch.setattr(RefreshService, "_stage", lambda self, *a, **k: cut(*a, **k))
    report = service.refresh(loaded.tables["items"]).to_dict()
    assert (report["outcome"], report["phase"], report["interrupted"]) == (
        "interrupted",
        "stage",
        "SIGINT",
    ), report
    assert "settle_failed" not in report["error"]["details"], report
    attempt = report["attempt_id"]
    assert report["left_behind"] == [], report
    assert report["next_commands"] == [f"dpone refresh items --config {config}"], (
        report
    )  # nothing left: the run again
    # Moved aside, never deleted, with a note of the leases it closed.
    assert not (tmp_path / "work" / "attempts" / attempt).exists()
    archived = tmp_path / "work" / "attempts" / ".archived" / attempt
    note = json.loads((archived / "archived.json").read_bytes())
    assert note["attempt_id"] == attempt and note["by"] == "refresh", note
    store = SqliteSnapshotStore(tmp_path / "store.sqlite", create=False)
    leases = store.leases_of(attempt)
    assert [lease.role for lease in leases] == ["ingest"], leases
    assert not leases[0].active and store.closure_proven(leases[0])
    assert note["leases_closed"] == [leases[0].lease_id], note
    status = as_json(dpone("status", "--config", str(config), "--json"))
    assert status["needs_person"] == [] and status["active_leases"] == [], status
    monkeypatch.undo()
    code, document = refresh(config, "items")
    assert code == 0, document
    assert target_rows(server["http_port"], "cut_journal") == [
        [i, f"n{i}\ttab", f"{i}.25"] for i in range(1, 51)
    ]
