"""``dpone snapshot`` as a user runs it: export, stage, prepare, publish, on a managed
server started with ``dpone server start --protect``, and on a server dpone did not
start, named by a project file (``--config``).

Every step is the ``dpone`` command in a subprocess; the server's answers are read
through the tests' own HTTP client (tests/chhttp.py), never through dpone.
"""

from __future__ import annotations

import json
import os
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
from tests.plugins.cli import as_json, dpone
from tests.plugins.refresh import SERVER_KINDS
from tests.remote_server import remote_server

DB = "pubdb"
Row = tuple[int, str | None, int | None]
# How many processes publish the same intent at once.
CALLERS = 5
BASE: list[Row] = [(1, "one", 10), (2, "two", 20), (3, "three", None), (4, None, 40)]


@dataclass(frozen=True)
class Server:
    """The server the commands reach: ``where`` names it on their command lines."""

    where: tuple[str, ...]  # ("--data-dir", D) for the managed one, ("--config", F) remote
    http_port: int


@pytest.fixture(scope="module", params=SERVER_KINDS)
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    """A server protecting ``pubdb``: the managed one (``dpone server start --protect``),
    or one dpone did not start, named by a project file's ``[clickhouse] host``."""
    if request.param == "remote":
        root = tmp_path_factory.mktemp("pubremote")
        for info in remote_server(root, [DB]):
            project = root / "dpone.toml"
            project.write_text(
                '[project]\nwork_dir = "work"\nstore = "store.sqlite"\n' + info["clickhouse_toml"]
            )
            yield Server(("--config", str(project)), info["http_port"])
        return
    data_dir = tmp_path_factory.mktemp("pubserver") / "ch"
    started = dpone("server", "start", "--data-dir", str(data_dir), "--protect", DB, "--json")
    assert started.returncode == 0, started.stdout + started.stderr
    info = as_json(started)
    chhttp.register_server(info["http_port"], data_dir)
    try:
        yield Server(("--data-dir", str(data_dir)), info["http_port"])
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
        """A ``dpone`` command on this workspace's server and store."""
        return dpone(*args, *self.server.where, "--store", self.store)

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
        exported = dpone(
            "export",
            "--source",
            f"sqlite:{source}",
            "--table",
            "items",
            "--out",
            str(out),
            "--receipt-out",
            str(receipt),
            "--json",
        )
        assert exported.returncode == 0, exported.stdout + exported.stderr
        staged = self.run(
            "stage",
            str(out),
            "--receipt",
            str(receipt),
            "--database",
            DB,
            "--work-dir",
            str(self.root / "work"),
            "--attempt-id",
            attempt_id,
            "--json",
        )
        assert staged.returncode == 0, staged.stdout + staged.stderr
        answer = as_json(staged)
        assert answer["rows"] == len(rows)
        return answer

    def prepare(self, staged: dict[str, Any], target: str) -> dict[str, Any]:
        done = self.run(
            "snapshot",
            "prepare",
            "--journal",
            staged["journal"],
            "--target",
            f"{DB}.{target}",
            "--json",
        )
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
        found = chhttp.rows(
            self.server.http_port, f"SELECT id, name, qty FROM {DB}.{table} ORDER BY id"
        )
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
        ("prepared", 1, "limits_checked"),
        ("exchange_intent", 2, "claim"),
        ("published", 3, "reconcile"),
    ]
    assert shown["history"][1]["facts"]["query_id"] == (
        f"dpone-s00-{first['journal_head'][:32]}-create-target"
    )
    # The final observations the ceilings were checked against, kept with the intent.
    checked = shown["history"][2]["facts"]["observed"]
    assert checked["source_rows"] == len(BASE)
    assert checked["total_transient_storage_bytes"] == (
        checked["retained_storage_bytes"] + checked["generation_storage_bytes"]
    )
    assert checked["generation_storage_bytes"] > 0
    final = shown["history"][-1]
    assert final["record_sha256"] == published["record_sha256"]
    verified = dpone("snapshot", "verify", intent, "--store", ws.store, "--json")
    assert verified.returncode == 0, verified.stdout + verified.stderr
    chain = json.loads(verified.stdout)
    assert (chain["verified"], chain["revisions"], chain["problems"]) == (True, 3, [])
    facts = final["facts"]
    assert (facts["decided"], facts["dispatch_outcome"], facts["exchange_finishes"]) == (
        "published",
        "acknowledged",
        1,
    )
    assert (facts["target_uuid"], facts["generation_uuid"]) == (first["uuid"], empty_a)
    closure = facts["closure"]
    assert (closure["proven"], closure["strength"], closure["facts"]["unproven"]) == (
        True,
        "custodial",
        [],
    )
    assert [s["answer"] for s in closure["facts"]["sessions"]] == [372]

    # A repeated publish is a historical replay: same record, no second EXCHANGE.
    again = ws.snapshot("publish", intent)
    assert again.returncode == 0, again.stdout + again.stderr
    replay = as_json(again)
    assert (replay["state"], replay["revision"], replay["historical"]) == ("published", 3, True)
    assert replay["record_sha256"] == published["record_sha256"]
    assert ws.exchange_events(intent) == ["QueryStart", "QueryFinish"]
    # The replay needs no server: the store alone answers it.
    no_server = ws.root / "no-server"
    offline = dpone(
        "snapshot", "publish", intent, "--store", ws.store, "--data-dir", str(no_server), "--json"
    )
    assert offline.returncode == 0, offline.stdout + offline.stderr
    assert as_json(offline)["record_sha256"] == published["record_sha256"]
    assert as_json(offline)["historical"] is True
    assert not no_server.exists()  # nothing was started or created there

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
    reused = ws.run(
        "snapshot", "prepare", "--journal", third["journal"], "--target", f"{DB}.items", "--json"
    )
    assert reused.returncode == 1, reused.stdout + reused.stderr
    assert error_of(reused)["code"] == "evidence_unverified"
    older = ws.run(
        "snapshot", "prepare", "--journal", first["journal"], "--target", f"{DB}.items", "--json"
    )
    assert older.returncode == 1, older.stdout + older.stderr
    assert error_of(older)["code"] == "attempt_fenced"
    assert ws.uuid_of("items") == third["uuid"] and ws.rows_of("items") == []


def test_cancel_leaves_the_target_and_the_attempt_cannot_be_prepared_again(ws: Workspace) -> None:
    base = ws.stage(BASE, "c0")
    ws.publish(ws.prepare(base, "kept")["intent_sha256"])
    before = (ws.uuid_of("kept"), ws.rows_of("kept"))
    assert before == (base["uuid"], sorted(BASE))

    staged = ws.stage([(9, "nine", 9)], "c1")
    intent = ws.prepare(staged, "kept")["intent_sha256"]
    prepare_again = (
        "snapshot",
        "prepare",
        "--journal",
        staged["journal"],
        "--target",
        f"{DB}.kept",
        "--json",
    )
    # One attempt, one intent: a second prepare of the same attempt is refused.
    twice = ws.run(*prepare_again)
    assert twice.returncode == 1, twice.stdout + twice.stderr
    refused = error_of(twice)
    assert (refused["code"], refused["details"]["existing_intent"]) == ("attempt_used", intent)

    cancelled = ws.snapshot("cancel", intent)
    assert cancelled.returncode == 0, cancelled.stdout + cancelled.stderr
    answer = as_json(cancelled)
    assert (answer["ok"], answer["state"], answer["revision"]) == (True, "not_published", 2)
    assert answer["historical"] is False
    assert (ws.uuid_of("kept"), ws.rows_of("kept")) == before
    shown = ws.show(intent)
    assert (shown["record"]["reason"], shown["record"]["claim"]) == ("cancelled", None)
    assert steps(shown["history"]) == [
        ("prepared", 1, None),
        ("prepared", 1, "limits_checked"),
        ("not_published", 2, "cancel"),
        ("not_published", 2, "cancel_closure"),
    ]
    assert shown["history"][3]["facts"]["closure"]["proven"] is True

    # Publishing a cancelled intent replays its record: nothing is sent (exit 1: not
    # published), and cancelling again replays too.
    late = ws.snapshot("publish", intent)
    assert late.returncode == 1, late.stdout + late.stderr
    replay = as_json(late)
    assert (replay["state"], replay["revision"], replay["historical"]) == ("not_published", 2, True)
    assert replay["error"]["code"] == "not_published"
    assert replay["record_sha256"] == answer["record_sha256"]
    again = ws.snapshot("cancel", intent)
    assert again.returncode == 0 and as_json(again)["historical"] is True
    after = ws.run(*prepare_again)
    assert after.returncode == 1 and error_of(after)["code"] == "attempt_used"
    assert ws.exchange_events(intent) == []
    assert (ws.uuid_of("kept"), ws.rows_of("kept")) == before


def test_an_older_attempt_is_fenced_out(ws: Workspace) -> None:
    base = ws.stage(BASE, "f0")
    ws.publish(ws.prepare(base, "fenced")["intent_sha256"])
    older = ws.stage([(1, "older", 1)], "f1")
    newer = ws.stage([(2, "newer", 2)], "f2")
    a1 = ws.prepare(older, "fenced")["intent_sha256"]
    a2 = ws.prepare(newer, "fenced")["intent_sha256"]

    refused = ws.snapshot("publish", a1)
    assert refused.returncode == 1, refused.stdout + refused.stderr
    error = error_of(refused)
    assert error["code"] == "attempt_fenced"
    assert (error["details"]["slot_epoch"], error["details"]["current_epoch"]) == (2, 3)
    assert (ws.uuid_of("fenced"), ws.rows_of("fenced")) == (base["uuid"], sorted(BASE))
    assert ws.exchange_events(a1) == []
    shown = ws.show(a1)
    assert (shown["state"], shown["revision"], len(shown["history"])) == ("prepared", 1, 2)

    published = ws.publish(a2)
    assert published["target_uuid"] == newer["uuid"] == ws.uuid_of("fenced")
    assert ws.rows_of("fenced") == [(2, "newer", 2)]
    # Even after the newer publication, the older intent never gets its EXCHANGE.
    still = ws.snapshot("publish", a1)
    assert still.returncode == 1 and error_of(still)["code"] == "attempt_fenced"
    assert ws.uuid_of("fenced") == newer["uuid"]


def test_bad_inputs_give_one_coded_json_error_each(ws: Workspace) -> None:
    def refused(done: subprocess.CompletedProcess[str], exit_code: int, code: str) -> None:
        assert done.returncode == exit_code, done.stdout + done.stderr
        assert error_of(done)["code"] == code

    for verb in ("publish", "reconcile", "cancel", "show"):
        refused(ws.snapshot(verb, "not-an-intent"), 2, "invalid_intent_id")
        refused(ws.snapshot(verb, "A" * 64), 2, "invalid_intent_id")
        # No store yet: these commands never create one.
        refused(ws.snapshot(verb, "0" * 64), 1, "store_missing")
        assert not Path(ws.store).exists()
    staged = ws.stage(BASE, "b1")
    for verb in ("publish", "reconcile", "cancel", "show"):
        refused(ws.snapshot(verb, "0" * 64), 1, "snapshot_not_found")
    for target in ("nodot", f"{DB}.", ".items", f"{DB}.a.b"):
        done = ws.run(
            "snapshot", "prepare", "--journal", staged["journal"], "--target", target, "--json"
        )
        refused(done, 2, "invalid_target")
    # A journal that does not end in `staged` (its final event removed).
    unfinished = ws.root / "unfinished"
    shutil.copytree(staged["journal"], unfinished)
    events = sorted((unfinished / "events").iterdir())
    shutil.rmtree(events[-1])
    done = ws.run(
        "snapshot", "prepare", "--journal", str(unfinished), "--target", f"{DB}.never", "--json"
    )
    refused(done, 1, "evidence_unverified")
    assert error_of(done)["details"]["reason"] == "final_not_staged"
    empty = ws.root / "empty"
    empty.mkdir()
    done = ws.run(
        "snapshot", "prepare", "--journal", str(empty), "--target", f"{DB}.never", "--json"
    )
    refused(done, 1, "journal_missing")  # not a journal at all
    # A generation reference that is not the journal's final event.
    done = ws.run(
        "snapshot",
        "prepare",
        "--journal",
        staged["journal"],
        "--target",
        f"{DB}.never",
        "--generation",
        "1" * 64,
        "--json",
    )
    refused(done, 1, "evidence_unverified")
    assert error_of(done)["details"]["reason"] == "generation_ref_mismatch"
    assert ws.uuid_of("never") is None  # nothing was created on the way


def test_concurrent_publishers_dispatch_one_exchange(ws: Workspace) -> None:
    base = ws.stage(BASE, "k0")
    ws.publish(ws.prepare(base, "raced")["intent_sha256"])
    staged = ws.stage([(7, "seven", 7), (8, None, None)], "k1")
    intent = ws.prepare(staged, "raced")["intent_sha256"]
    env = {k: v for k, v in os.environ.items() if k != "DPONE_DATA_DIR"}
    command = [
        sys.executable,
        "-m",
        "dpone",
        "snapshot",
        "publish",
        intent,
        *ws.server.where,
        "--store",
        ws.store,
        "--json",
    ]
    callers = [
        subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
        )
        for _ in range(CALLERS)
    ]
    answers = []
    for caller in callers:
        out, err = caller.communicate(timeout=180)
        lines = out.splitlines()
        assert len(lines) == 1, out + err
        answers.append((caller.returncode, json.loads(lines[0])))

    # Exactly one EXCHANGE reached the server: one QueryStart/QueryFinish pair.
    assert ws.exchange_events(intent) == ["QueryStart", "QueryFinish"]
    shown = ws.show(intent)
    assert (shown["state"], shown["revision"]) == ("published", 3)
    final = shown["history"][-1]["record_sha256"]
    claims = [h for h in shown["history"] if h["facts"].get("step") == "claim"]
    assert len(claims) == 1
    for code, answer in answers:
        if answer["ok"]:
            assert code == 0
            assert (answer["state"], answer["revision"]) == ("published", 3)
            assert answer["record_sha256"] == final
        else:  # the documented answer of a caller that found the claim still open
            assert (code, answer["error"]["code"]) == (1, "claim_exists")
    # At most the winner answered from its own observation; the others replayed.
    assert sum(1 for _, a in answers if a["ok"] and a["historical"] is False) == 1
    assert sum(1 for _, a in answers if a["ok"]) >= 1
    assert ws.uuid_of("raced") == staged["uuid"]
    assert ws.rows_of("raced") == [(7, "seven", 7), (8, None, None)]
