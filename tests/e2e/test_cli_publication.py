"""``dpone snapshot`` as a user runs it: export, stage, prepare, publish, on a managed
server started with ``dpone server start --protect``.

Every step is the ``dpone`` command in a subprocess; the server's answers are read
through the tests' own HTTP client (tests/chhttp.py), never through dpone.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests import chhttp
from tests.e2e.test_cli_server import as_json, dpone

DB = "pubdb"
Row = tuple[int, str | None, int | None]
BASE: list[Row] = [(1, "one", 10), (2, "two", 20), (3, "three", None), (4, None, 40)]


@dataclass(frozen=True)
class Server:
    data_dir: Path
    http_port: int


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A managed server protecting ``pubdb`` (the pool is declared over it)."""
    data_dir = tmp_path_factory.mktemp("pubserver") / "ch"
    started = dpone("server", "start", "--data-dir", str(data_dir), "--protect", DB, "--json")
    assert started.returncode == 0, started.stdout + started.stderr
    info = as_json(started)
    chhttp.register_server(info["http_port"], data_dir)
    try:
        yield Server(data_dir, info["http_port"])
    finally:
        stopped = dpone("server", "stop", "--data-dir", str(data_dir), "--json")
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr


@dataclass(frozen=True)
class Workspace:
    """One test's source, work directory and publication store on the module's server."""

    server: Server
    root: Path

    @property
    def store(self) -> str:
        return str(self.root / "snapshots.sqlite")

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        """A ``dpone`` command on this workspace's server (``--data-dir``) and store."""
        return dpone(*args, "--data-dir", str(self.server.data_dir), "--store", self.store)

    def snapshot(self, verb: str, intent: str) -> subprocess.CompletedProcess[str]:
        if verb == "show":  # show reads the store only
            return dpone("snapshot", "show", intent, "--store", self.store, "--json")
        return self.run("snapshot", verb, intent, "--json")

    def stage(self, rows: list[Row], attempt_id: str) -> dict[str, Any]:
        """Write ``rows`` as the SQLite source, export it, stage it as attempt ``attempt_id``."""
        source = self.root / f"{attempt_id}.db"
        with sqlite3.connect(source) as conn:
            conn.execute("CREATE TABLE items (id bigint NOT NULL, name nvarchar(50), qty int)")
            conn.executemany("INSERT INTO items VALUES (?, ?, ?)", rows)
        conn.close()
        out, receipt = self.root / f"{attempt_id}.tsv", self.root / f"{attempt_id}.receipt.json"
        exported = dpone("export", "--source", f"sqlite:{source}", "--table", "items",
                         "--out", str(out), "--receipt-out", str(receipt), "--json")  # fmt: skip
        assert exported.returncode == 0, exported.stdout + exported.stderr
        staged = self.run("stage", str(out), "--receipt", str(receipt), "--database", DB,
                          "--work-dir", str(self.root / "work"), "--attempt-id", attempt_id, "--json")  # fmt: skip
        assert staged.returncode == 0, staged.stdout + staged.stderr
        answer = as_json(staged)
        assert answer["rows"] == len(rows)
        return answer

    def prepare(self, staged: dict[str, Any], target: str) -> dict[str, Any]:
        done = self.run("snapshot", "prepare", "--journal", staged["journal"],
                        "--target", f"{DB}.{target}", "--json")  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        answer = as_json(done)
        assert (answer["ok"], answer["state"], answer["revision"]) == (True, "prepared", 1)
        assert answer["historical"] is False
        return answer

    def publish(self, intent: str) -> dict[str, Any]:
        done = self.snapshot("publish", intent)
        assert done.returncode == 0, done.stdout + done.stderr
        answer = as_json(done)
        assert (answer["ok"], answer["state"]) == (True, "published")
        return answer

    def show(self, intent: str) -> dict[str, Any]:
        done = self.snapshot("show", intent)
        assert done.returncode == 0, done.stdout + done.stderr
        return as_json(done)

    # ---------------------------------------------------------------- server reads

    def uuid_of(self, table: str) -> str | None:
        found = chhttp.rows(
            self.server.http_port,
            f"SELECT toString(uuid) AS uuid FROM system.tables WHERE database = '{DB}' "
            f"AND name = '{table}'",
        )
        return found[0]["uuid"] if found else None

    def rows_of(self, table: str) -> list[Row]:
        found = chhttp.rows(self.server.http_port, f"SELECT id, name, qty FROM {DB}.{table} ORDER BY id")
        return [(r["id"], r["name"], r["qty"]) for r in found]

    def exchange_events(self, intent: str) -> list[str]:
        """The EXCHANGE's query_log event types (after SYSTEM FLUSH LOGS as the admin)."""
        chhttp.query(self.server.http_port, "SYSTEM FLUSH LOGS")
        found = chhttp.rows(
            self.server.http_port,
            "SELECT toString(type) AS type FROM system.query_log WHERE query_id = "
            f"'dpone-s00-{intent[:32]}-exchange' ORDER BY event_time_microseconds, type",
        )
        return [r["type"] for r in found]


@pytest.fixture
def ws(server: Server, tmp_path: Path) -> Workspace:
    return Workspace(server, tmp_path)


def error_of(done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    """The one JSON error object of a failed command."""
    answer = as_json(done)
    assert answer["ok"] is False, answer
    error = answer["error"]
    assert isinstance(error, dict)
    return error


def steps(history: list[dict[str, Any]]) -> list[tuple[str, int, str | None]]:
    """(state, revision, step) of each history entry, oldest first."""
    return [(h["state"], h["revision"], h["facts"].get("step")) for h in history]


# ---------------------------------------------------------------------- the main path


def test_refreshes_replace_the_target_exactly(ws: Workspace) -> None:
    # First publication: the target does not exist; prepare creates it empty (A), then
    # the one EXCHANGE puts the staged generation (B) under its name.
    first = ws.stage(BASE, "r1")
    prepared = ws.prepare(first, "items")
    intent = prepared["intent_sha256"]
    empty_a = ws.uuid_of("items")
    assert empty_a is not None and prepared["target_uuid"] == empty_a
    assert prepared["generation_uuid"] == first["uuid"]
    assert ws.rows_of("items") == []

    published = ws.publish(intent)
    assert (published["revision"], published["historical"]) == (3, False)
    assert published["target_uuid"] == first["uuid"] == ws.uuid_of("items")
    assert published["generation_uuid"] == empty_a == ws.uuid_of(first["table"])
    assert published["target_rows"] == len(BASE)
    assert ws.rows_of("items") == sorted(BASE)
    assert ws.exchange_events(intent) == ["QueryStart", "QueryFinish"]

    shown = ws.show(intent)
    assert (shown["state"], shown["revision"]) == ("published", 3)
    assert (shown["a_uuid"], shown["b_uuid"]) == (empty_a, first["uuid"])
    assert shown["target"] == f"{DB}.items" and shown["source_rows"] == len(BASE)
    assert shown["content_digest"] == published["target_content_digest"]
    assert steps(shown["history"]) == [
        ("prepared", 1, None),
        ("prepared", 1, "create_target"),
        ("exchange_intent", 2, "claim"),
        ("published", 3, "reconcile"),
    ]
    assert shown["history"][1]["facts"]["query_id"] == (
        f"dpone-s00-{first['journal_head'][:32]}-create-target"
    )
    final = shown["history"][-1]
    assert final["record_sha256"] == published["record_sha256"]
    facts = final["facts"]
    assert (facts["decided"], facts["dispatch_outcome"], facts["exchange_finishes"]) == (
        "published", "acknowledged", 1,
    )  # fmt: skip
    assert (facts["target_uuid"], facts["generation_uuid"]) == (first["uuid"], empty_a)
    closure = facts["closure"]
    assert (closure["proven"], closure["strength"], closure["facts"]["unproven"]) == (
        True, "custodial", [],
    )  # fmt: skip
    assert [s["answer"] for s in closure["facts"]["sessions"]] == [372]

    # A repeated publish is a historical replay: same record, no second EXCHANGE.
    again = ws.snapshot("publish", intent)
    assert again.returncode == 0, again.stdout + again.stderr
    replay = as_json(again)
    assert (replay["state"], replay["revision"], replay["historical"]) == ("published", 3, True)
    assert replay["record_sha256"] == published["record_sha256"]
    assert ws.exchange_events(intent) == ["QueryStart", "QueryFinish"]

    # Second refresh: a row deleted, one updated, one added. Rows absent from the new
    # source disappear: the target is exactly the new source.
    second_rows: list[Row] = [(1, "one", 10), (3, "THREE", 33), (4, None, 40), (5, "five", 50)]
    second = ws.stage(second_rows, "r2")
    prepared2 = ws.prepare(second, "items")
    assert prepared2["target_uuid"] == first["uuid"]  # A is now the first generation
    published2 = ws.publish(prepared2["intent_sha256"])
    assert published2["target_uuid"] == second["uuid"] == ws.uuid_of("items")
    assert ws.uuid_of(second["table"]) == first["uuid"]  # A is retained, never dropped
    assert ws.rows_of("items") == sorted(second_rows)
    assert ws.rows_of(second["table"]) == sorted(BASE)

    # An empty generation gives an empty target.
    third = ws.stage([], "r3")
    prepared3 = ws.prepare(third, "items")
    published3 = ws.publish(prepared3["intent_sha256"])
    assert (published3["target_rows"], published3["target_uuid"]) == (0, third["uuid"])
    assert ws.rows_of("items") == []
    assert ws.uuid_of("items") == third["uuid"]

    # A new publication of an already used attempt is refused: nothing is prepared.
    reused = ws.run("snapshot", "prepare", "--journal", third["journal"], "--target",
                    f"{DB}.items", "--json")  # fmt: skip
    assert reused.returncode == 1, reused.stdout + reused.stderr
    assert error_of(reused)["code"] == "evidence_unverified"
    older = ws.run("snapshot", "prepare", "--journal", first["journal"], "--target",
                   f"{DB}.items", "--json")  # fmt: skip
    assert older.returncode == 1, older.stdout + older.stderr
    assert error_of(older)["code"] == "attempt_fenced"
    assert ws.uuid_of("items") == third["uuid"] and ws.rows_of("items") == []
