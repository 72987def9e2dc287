"""``dpone attempts`` and ``dpone stage`` on bad input: coded errors, nothing hidden."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from dpone.publication.store import SqliteSnapshotStore
from dpone.staging.journal import ClickHouseFileAttemptJournal, read_events
from tests import chhttp
from tests.plugins.cli import as_json, dpone
from tests.plugins.staging import export_hostile


def _journal(work: Path, attempt: str, *documents: dict[str, Any]) -> Path:
    journal = ClickHouseFileAttemptJournal(work, attempt)
    journal.open()
    for document in documents:
        journal.record(document)
    return journal.attempt_dir


def _unsettled_insert(database: str) -> dict[str, Any]:
    now = int(time.time() * 1000)
    return {
        "state": "loading",
        "outcome": "intent",
        "query": {"kind": "insert", "query_id": "dpone-b02-x-1-insert"},
        "dispatch": {"not_before_ms": now, "not_after_ms": now + 600_000},
        "principal": {"user": "dpone_admin"},
        "planned_ownership": {"database": database, "table": "dpone_stage_x_h1"},
        "cleanup_inventory": {},
    }


def test_one_corrupt_journal_does_not_hide_the_others(tmp_path: Path) -> None:
    work = tmp_path / "work"
    _journal(work, "good-1", _unsettled_insert("stg"))
    bad = _journal(work, "bad-1", _unsettled_insert("stg"))
    event = bad / "events" / "000001" / "attempt.json"
    event.write_bytes(event.read_bytes()[:-5])  # a torn, unparsable event
    done = dpone("attempts", "list", "--work-dir", str(work), "--json")
    assert done.returncode == 1
    payload = as_json(done)
    assert payload["ok"] is False and payload["error"]["code"] == "journal_unreadable"
    assert [a["attempt_id"] for a in payload["attempts"]] == ["good-1"]
    [unreadable] = payload["unreadable"]
    assert unreadable["attempt_id"] == "bad-1" and unreadable["error"]["code"].startswith("journal")
    text = dpone("attempts", "list", "--work-dir", str(work))
    assert text.returncode == 1
    assert text.stdout.startswith("good-1: loading") and "bad-1: journal unreadable" in text.stdout
    assert "[journal_unreadable]" in text.stderr


def test_a_missing_work_dir_is_a_coded_error(tmp_path: Path) -> None:
    done = dpone("attempts", "list", "--work-dir", str(tmp_path / "nonexist"), "--json")
    assert done.returncode == 2 and as_json(done)["error"]["code"] == "work_dir_missing"


def test_cleanup_with_a_wrong_database_asks_no_server(tmp_path: Path) -> None:
    """The journal's database is compared before any query (port 1: nothing listens)."""
    work = tmp_path / "work"
    _journal(work, "x-1", _unsettled_insert("stg"))
    done = dpone(
        "attempts",
        "cleanup",
        "x-1",
        "--work-dir",
        str(work),
        "--database",
        "other",
        "--host",
        "127.0.0.1",
        "--http-port",
        "1",
        "--tcp-port",
        "1",
        "--json",
        extra_env={"DPONE_CLICKHOUSE_USER": "u", "DPONE_CLICKHOUSE_PASSWORD": "p"},
    )
    assert done.returncode == 1 and as_json(done)["error"]["code"] == "database_mismatch"
    assert len(read_events(work / "x-1")) == 1  # nothing written


def test_empty_attempt_id_is_refused(tmp_path: Path) -> None:
    path, receipt, _ = export_hostile(tmp_path)
    done = dpone(
        "stage",
        str(path),
        "--receipt",
        str(receipt),
        "--work-dir",
        str(tmp_path / "w"),
        "--attempt-id",
        "",
        "--database",
        "stg",
        "--host",
        "127.0.0.1",
        "--http-port",
        "1",
        "--tcp-port",
        "1",
        "--json",
    )
    assert done.returncode == 2 and as_json(done)["error"]["code"] == "invalid_attempt_id"
    assert not (tmp_path / "w").exists() or list((tmp_path / "w").iterdir()) == []


def test_failed_stage_and_discard_end_their_ingest_leases(tmp_path: Path) -> None:
    path, receipt, _ = export_hostile(tmp_path)
    data_dir, store = tmp_path / "ch", tmp_path / "store.sqlite"
    server = as_json(
        dpone("server", "start", "--data-dir", str(data_dir), "--protect", "stg", "--json")
    )
    try:
        chhttp.register_server(server["http_port"], data_dir)

        def stage(attempt: str, receipt_path: Path) -> Any:
            return dpone(
                "stage",
                str(path),
                "--store",
                str(store),
                "--receipt",
                str(receipt_path),
                "--work-dir",
                str(tmp_path / "work"),
                "--database",
                "stg",
                "--data-dir",
                str(data_dir),
                "--attempt-id",
                attempt,
                "--json",
            )

        done = stage("ok-1", receipt)
        assert done.returncode == 0, done.stdout + done.stderr
        [lease] = SqliteSnapshotStore(store).leases_of("ok-1")
        assert lease.active  # a staged table keeps its principal until published or discarded
        wrong = tmp_path / "wrong.receipt.json"
        wrong.write_bytes(b"{}")  # not a receipt: the stage fails after its lease
        failed = stage("bad-1", wrong)
        assert failed.returncode != 0
        leases = SqliteSnapshotStore(store).leases_of("bad-1")
        assert len(leases) == 1 and not leases[0].active
        gone = dpone(
            "attempts",
            "discard",
            "ok-1",
            "--store",
            str(store),
            "--work-dir",
            str(tmp_path / "work"),
            "--database",
            "stg",
            "--data-dir",
            str(data_dir),
            "--json",
        )
        assert gone.returncode == 0, gone.stdout + gone.stderr
        assert not SqliteSnapshotStore(store).leases_of("ok-1")[0].active
    finally:
        dpone("server", "stop", "--data-dir", str(data_dir))
