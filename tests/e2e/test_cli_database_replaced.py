"""A database dropped and created again under an open claim does not wedge its target
(issue 37, item 6).

Before: a refresh stopped after its claim (EXCHANGE_INTENT) whose database was then
dropped and created again left the slot blocked for good: reconcile answered
``database_mismatch`` forever, every new refresh got ``slot_blocked`` with no next
command, and the publisher principal stayed leased. Now ``dpone status`` names one
command, ``dpone snapshot abandon``: it reconciles the claim to COMMIT_UNKNOWN (the
tables went with the database: no outcome can be proven) with the publisher closed,
and frees the target; the next refresh publishes exactly the source.
"""

from __future__ import annotations

import json
import shlex
import sqlite3
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from dpone.contracts.composition_snapshot import SnapshotRecord
from dpone.publication.store import SqliteSnapshotStore
from tests import chhttp
from tests.plugins.cli import as_json, dpone
from tests.plugins.refresh import (
    DATABASE,
    SERVER_KINDS,
    killed_in,
    make_source,
    project,
    protected_server,
    refresh,
    rows_of,
    store_states,
    target_rows,
)


@pytest.fixture(scope="module", params=SERVER_KINDS)
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    """The managed server, and one reached only by host, ports and credentials file
    (where the keeper's global SHOW TABLES proves the database dropped)."""
    yield from protected_server(tmp_path_factory, DATABASE, "replaced-ch", request.param)


def _active_leases(store: Path) -> list[tuple[str, str]]:
    with closing(sqlite3.connect(f"file:{store}?mode=ro", uri=True)) as conn:
        rows = conn.execute("SELECT user, role FROM leases WHERE active = 1").fetchall()
        return [(str(user), str(role)) for user, role in rows]


def _database_uuid(port: int) -> str:
    found = chhttp.rows(
        port, f"SELECT toString(uuid) AS u FROM system.databases WHERE name = '{DATABASE}'"
    )
    return str(found[0]["u"])


def test_a_claim_whose_database_was_dropped_and_created_again_is_abandoned(
    tmp_path: Path, server: dict[str, Any]
) -> None:
    port, store = server["http_port"], tmp_path / "store.sqlite"
    make_source(tmp_path / "shop.db", rows_of(6))
    config = project(tmp_path, server, "t_replaced")
    assert refresh(config, "items")[0] == 0
    make_source(tmp_path / "shop.db", rows_of(9, name="new"))
    # Stopped with its claim stored: the EXCHANGE unsent, or sent with its answer lost.
    killed_in(tmp_path, config, lambda: "exchange_intent" in store_states(store))
    [(intent, state)] = [
        (s.intent_sha256, s.state)
        for s in SqliteSnapshotStore(store, create=False).list_snapshots()
        if s.state != "published"
    ]
    assert state == "exchange_intent"
    recorded = _database_uuid(port)
    chhttp.query(port, f"DROP DATABASE {DATABASE} SYNC")
    chhttp.query(port, f"CREATE DATABASE {DATABASE} ENGINE = Atomic")
    assert _database_uuid(port) != recorded
    # The publisher principal of the claim is still leased.
    assert [role for _, role in _active_leases(store)] == ["publisher"]

    # A refresh is refused before its export, naming the same one command.
    code, blocked = refresh(config, "items")
    error = blocked["tables"][0]["error"]
    assert (code, error["code"]) == (1, "slot_blocked"), blocked
    assert shlex.split(error["details"]["next_command"])[:4] == [
        "dpone",
        "snapshot",
        "abandon",
        intent,
    ]

    # Status names the one command that resolves it.
    status = dpone("status", "--config", str(config), "--json")
    assert status.returncode == 1, status.stdout + status.stderr
    needs = as_json(status)["needs_person"]
    assert [(n["kind"], n.get("intent_sha256")) for n in needs] == [
        ("database_replaced", intent)
    ], needs
    command = shlex.split(needs[0]["command"])
    assert command[:4] == ["dpone", "snapshot", "abandon", intent]
    assert "dropped" in needs[0]["message"]

    done = dpone(*command[1:], "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    answer = json.loads(done.stdout)
    assert (answer["state"], answer["revision"], answer["historical"]) == (
        "commit_unknown",
        3,
        False,
    )
    assert answer["database_replaced"]["recorded_uuid"] == recorded
    assert answer["database_replaced"]["found_uuid"] == _database_uuid(port)

    # The record reached COMMIT_UNKNOWN honestly: its publisher closed and proven, the
    # tables unobserved (they are gone), the reason named; no lease stays active.
    opened = SqliteSnapshotStore(store, create=False)
    record = SnapshotRecord.from_bytes(opened.load(intent).record_bytes)
    assert (record.state.value, record.revision, record.reason) == (
        "commit_unknown",
        3,
        "database_replaced",
    )
    assert record.closure is not None and record.closure.proven
    assert record.observation is not None and record.observation.target_uuid is None
    assert _active_leases(store) == []
    steps = [entry.facts.get("step") for entry in opened.history(intent)]
    assert steps[-2:] == ["reconcile", "abandon"], steps

    # Abandoned once: again answers the earlier note and changes nothing.
    again = json.loads(dpone(*command[1:], "--json").stdout)
    assert again["historical"] is True and again["abandoned_at"] == answer["abandoned_at"]

    # Nothing blocks the target any more, and a new refresh publishes exactly.
    clean = dpone("status", "--config", str(config), "--json")
    assert as_json(clean)["needs_person"] == [], clean.stdout
    code, published = refresh(config, "items")
    assert code == 0, published
    assert target_rows(port, "t_replaced") == [[i, f"new{i}\ttab", f"{i}.25"] for i in range(1, 10)]
    assert _active_leases(store) == []


def test_abandon_refuses_while_the_recorded_database_still_exists(
    tmp_path: Path, server: dict[str, Any]
) -> None:
    """Renamed away (its UUID still on the server) is not dropped: nothing is noted."""
    port, store = server["http_port"], tmp_path / "store.sqlite"
    make_source(tmp_path / "shop.db", rows_of(3))
    config = project(tmp_path, server, "t_aside")
    assert refresh(config, "items")[0] == 0
    make_source(tmp_path / "shop.db", rows_of(4))
    killed_in(tmp_path, config, lambda: "exchange_intent" in store_states(store))
    [intent] = [
        s.intent_sha256
        for s in SqliteSnapshotStore(store, create=False).list_snapshots()
        if s.state == "exchange_intent"
    ]
    aside = f"{DATABASE}_aside"
    chhttp.query(port, f"RENAME DATABASE {DATABASE} TO {aside}")
    chhttp.query(port, f"CREATE DATABASE {DATABASE} ENGINE = Atomic")
    try:
        done = dpone(
            *("snapshot", "abandon", intent, "--store", str(store)),
            *("--config", str(config), "--json"),
        )
        assert done.returncode == 1, done.stdout + done.stderr
        error = json.loads(done.stdout)["error"]
        assert error["code"] == "database_not_replaced", error
        assert "renamed" in error["message"]
        opened = SqliteSnapshotStore(store, create=False)
        assert SnapshotRecord.from_bytes(opened.load(intent).record_bytes).revision == 2
        assert opened.step_notes(f"abandoned/{intent}") == []
    finally:
        chhttp.query(port, f"DROP DATABASE {DATABASE} SYNC")
        chhttp.query(port, f"RENAME DATABASE {aside} TO {DATABASE}")
    reconciled = dpone(
        *("snapshot", "reconcile", intent, "--store", str(store)),
        *("--config", str(config), "--json"),
    )
    assert json.loads(reconciled.stdout)["state"] in ("published", "not_published")
