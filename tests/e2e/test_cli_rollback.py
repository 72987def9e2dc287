"""``dpone rollback`` as a user runs it, on the managed server.

One server per module (``--protect rollback_db``); each test has its own target, project
file and work dir. The rollback must be a new, recorded publication whose content is
proven to be what staging once proved, never a blind second EXCHANGE.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dpone.contracts.composition_snapshot import SnapshotIntent
from dpone.publication.store import SqliteSnapshotStore
from dpone.staging.journal import read_events
from tests import chhttp
from tests.plugins.cli import as_json, dpone
from tests.plugins.refresh import (
    SERVER_KINDS,
    clickhouse_section,
    make_source,
    protected_server,
    rows_of,
)

DATABASE = "rollback_db"


@pytest.fixture(scope="module", params=SERVER_KINDS)
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    yield from protected_server(tmp_path_factory, DATABASE, "rollback-ch", request.param)


def project(tmp_path: Path, server: dict[str, Any], target: str) -> Path:
    config = tmp_path / "dpone.toml"
    config.write_text(
        '[project]\nwork_dir = "work"\nstore = "store.sqlite"\nkeep_rollback = 1\n'
        + clickhouse_section(server)
        + '[sources.shop]\nkind = "sqlite"\npath = "shop.db"\n'
        f'[tables.items]\nsource = "shop"\ntable = "items"\ntarget = "{DATABASE}.{target}"\n'
        'order_by = "id"\n'
    )
    return config


def refresh(config: Path) -> dict[str, Any]:
    done = dpone("refresh", "items", "--config", str(config), "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    report: dict[str, Any] = as_json(done)["tables"][0]
    return report


def rollback(config: Path) -> tuple[int, dict[str, Any]]:
    done = dpone("rollback", "items", "--config", str(config), "--json")
    return done.returncode, as_json(done)


def status(config: Path) -> dict[str, Any]:
    found: dict[str, Any] = as_json(dpone("status", "--config", str(config), "--json"))
    return found


def content(port: int, target: str) -> list[list[Any]]:
    found = chhttp.rows(
        port, f"SELECT id, name, toString(price) AS p FROM {DATABASE}.{target} ORDER BY id"
    )
    return [[int(r["id"]), r["name"], r["p"]] for r in found]


def expected(rows: list[tuple[Any, ...]]) -> list[list[Any]]:
    return [list(row) for row in rows]


def uuid_of(port: int, table: str) -> str | None:
    found = chhttp.rows(
        port,
        "SELECT toString(uuid) AS u FROM system.tables WHERE "
        f"database = '{DATABASE}' AND name = '{table}'",
    )
    return found[0]["u"] if found else None


def test_rollback_restores_the_previous_source_and_a_second_swaps_back(
    tmp_path: Path, server: dict[str, Any]
) -> None:
    port = server["http_port"]
    first_rows, second_rows = rows_of(6), rows_of(4, start=50, name="b")
    make_source(tmp_path / "shop.db", first_rows)
    config = project(tmp_path, server, "t_back")
    first = refresh(config)
    make_source(tmp_path / "shop.db", second_rows)
    second = refresh(config)
    assert content(port, "t_back") == expected(second_rows)
    copy = second["generation_table"]

    code, back = rollback(config)
    assert code == 0, back
    assert (back["ok"], back["outcome"], back["state"]) == (True, "published", "published")
    assert content(port, "t_back") == expected(first_rows)
    # The target is the first generation again; the undone one is the new rollback copy.
    assert back["target_uuid_before"] == second["target_uuid_after"]
    assert back["target_uuid_after"] == first["target_uuid_after"] == uuid_of(port, "t_back")
    assert back["copy_table"] == f"{DATABASE}.{copy}"
    assert uuid_of(port, copy) == second["target_uuid_after"]
    # A new intent, published, carrying the first refresh's receipt and content proof.
    assert back["intent_sha256"] not in (first["intent_sha256"], second["intent_sha256"])
    assert back["restored_intent"] == first["intent_sha256"]
    store = SqliteSnapshotStore(tmp_path / "store.sqlite")
    made, staged = (
        SnapshotIntent.from_bytes(store.load(sha).intent_bytes)
        for sha in (back["intent_sha256"], first["intent_sha256"])
    )
    assert store.load(made.sha256).record_bytes  # recorded, like any publication
    assert (made.receipt_sha256, made.semantic_id, made.content_digest, made.source_rows) == (
        staged.receipt_sha256,
        staged.semantic_id,
        staged.content_digest,
        6,
    )
    assert (made.generation_table, made.attempt_id) == (copy, back["attempt_id"])
    # The ingest principal was leased for the rollback attempt and closed by prepare.
    lease = store.get_lease(made.ingest.lease_id)
    assert (lease.role, lease.attempt_id, lease.active) == ("ingest", back["attempt_id"], False)
    # Its evidence is the rollback journal, whose final staged event names the copy.
    events = read_events(Path(back["journal"]))
    assert made.staged_event_sha256 == events[-1].sha256
    final = events[-1].document
    assert (final["state"], final["observed_ownership"]["table_uuid"]) == (
        "staged",
        first["target_uuid_after"],
    )
    assert final["rollback"]["origin_intent"] == first["intent_sha256"]

    found = status(config)
    target = found["targets"][0]
    assert target["last_publication"]["intent_sha256"] == back["intent_sha256"]
    assert target["last_publication"]["rows"] == 6 and target["last_publication"]["rollback"]
    text = dpone("status", "--config", str(config))
    assert f"6 rows, rolled back {target['last_publication']['published_at']}" in text.stdout
    assert [c["uuid"] for c in target["rollback_copies"]] == [second["target_uuid_after"]]
    assert found["needs_person"] == [] and found["ok"] is True

    code, again = rollback(config)
    assert code == 0, again
    assert content(port, "t_back") == expected(second_rows)
    assert again["restored_intent"] == second["intent_sha256"]
    assert uuid_of(port, "t_back") == second["target_uuid_after"]
    assert uuid_of(port, copy) == first["target_uuid_after"]
    # The copy is one table, though two publications (the second refresh and the second
    # rollback) each left it under that name with that UUID.
    copies = status(config)["targets"][0]["rollback_copies"]
    assert [(c["table"], c["uuid"]) for c in copies] == [
        (f"{DATABASE}.{copy}", first["target_uuid_after"])
    ]
    # A refresh after rollbacks: retention proves and drops the copy beyond keep_rollback
    # (the first content, carrying the first staging's mark, under the second's name).
    third_rows = rows_of(5, start=90, name="c")
    make_source(tmp_path / "shop.db", third_rows)
    third = refresh(config)
    assert content(port, "t_back") == expected(third_rows)
    assert third["dropped_rollback_copies"] == [f"{DATABASE}.{copy}"], third
    assert uuid_of(port, copy) is None
    assert status(config)["targets"][0]["last_publication"]["rollback"] is False
    assert uuid_of(port, third["generation_table"]) == second["target_uuid_after"]


def test_rollback_without_a_copy_is_a_coded_error(tmp_path: Path, server: dict[str, Any]) -> None:
    port = server["http_port"]
    make_source(tmp_path / "shop.db", rows_of(3))
    config = project(tmp_path, server, "t_nocopy")
    code, never = rollback(config)
    assert code == 1 and never["ok"] is False
    assert (never["error"]["code"], never["error"]["details"]["reason"]) == (
        "no_rollback_copy",
        "never_published",
    )
    refresh(config)
    code, first = rollback(config)
    assert code == 1 and first["phase"] == "locate"
    assert (first["error"]["code"], first["error"]["details"]["reason"]) == (
        "no_rollback_copy",
        "first_publication",
    )
    assert content(port, "t_nocopy") == expected(rows_of(3))
    text = dpone("rollback", "items", "--config", str(config))
    assert text.returncode == 1 and "no_rollback_copy" in text.stdout
    assert "unchanged" in text.stdout


def test_an_altered_copy_is_refused_and_the_target_is_unchanged(
    tmp_path: Path, server: dict[str, Any]
) -> None:
    port = server["http_port"]
    make_source(tmp_path / "shop.db", rows_of(5))
    config = project(tmp_path, server, "t_altered")
    refresh(config)
    make_source(tmp_path / "shop.db", rows_of(5, start=20, name="x"))
    second = refresh(config)
    copy = second["generation_table"]
    chhttp.query(port, f"INSERT INTO {DATABASE}.{copy} VALUES (999, 'forged', 1.00)")
    code, refused = rollback(config)
    assert code == 1 and refused["ok"] is False
    assert (refused["phase"], refused["error"]["code"]) == ("verify_copy", "content_mismatch")
    assert refused["error"]["details"]["rows"] == 6
    assert refused["error"]["details"]["expected_rows"] == 5
    assert refused["intent_sha256"] is None and refused["journal"] is None
    assert content(port, "t_altered") == expected(rows_of(5, start=20, name="x"))
    assert uuid_of(port, "t_altered") == second["target_uuid_after"]
    last = status(config)["targets"][0]["last_publication"]
    assert last["intent_sha256"] == second["intent_sha256"]


def test_a_rollback_into_a_database_the_server_lacks_names_it_and_its_key(
    tmp_path: Path, server: dict[str, Any]
) -> None:
    config = project(tmp_path, server, "t_nodb")
    config.write_text(config.read_text().replace(f"{DATABASE}.t_nodb", "absent_rb_db.t_nodb"))
    make_source(tmp_path / "shop.db", rows_of(2))
    code, refused = rollback(config)
    assert code == 1 and refused["ok"] is False and refused["phase"] == "check", refused
    error = refused["error"]
    assert error["code"] == "database_missing", error
    assert (error["details"]["database"], error["details"]["key"]) == (
        "absent_rb_db",
        "tables.items.target",
    )
    check = f"dpone check --config {config}"
    assert error["details"]["next_command"] == check and refused["next_commands"] == [check]
    assert "'absent_rb_db'" in error["message"] and "tables.items.target" in error["message"]
    text = dpone("rollback", "items", "--config", str(config))
    assert text.returncode == 1 and "[database_missing]" in text.stdout
    assert f"  next: {check}" in text.stdout
    # Nothing was made on the server: the database is still absent.
    absent = "SELECT count() FROM system.databases WHERE name = 'absent_rb_db'"
    assert chhttp.query(server["http_port"], absent) == "0\n"
