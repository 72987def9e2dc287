"""Recovery bound to the endpoint its journal names (issue 26, item 1), on two real servers.

Server A (the session's) stages; server B is a second managed server. A journal of A
handed to ``attempts cleanup`` / ``attempts discard`` / the finalizer pointed at B
must be refused with ``endpoint_mismatch`` naming both identities, write nothing and
drop nothing: B's start time says nothing about an INSERT sent to A, and a table
missing on B says nothing about the table on A. Pointed at A, the same commands work.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from dpone.errors import DponeError
from dpone.localserver import LocalServer, ServerInfo
from dpone.preparation.validated_file_artifact import ContractValidatedFileArtifact
from dpone.staging.composition import build_clickhouse_staging_components, build_transport
from dpone.staging.journal import read_events
from dpone.staging.recovery import cleanup_attempt, discard_attempt
from dpone.staging.service import StagedTable
from tests import chhttp
from tests.plugins.cli import as_json, attempts_command
from tests.plugins.staging import DB, config, crash, create_databases, export_hostile, table_exists

pytestmark = pytest.mark.usefixtures(
    "staging_database"
)  # the databases on server A, for every test here


def snapshot(work: Path) -> dict[str, bytes]:
    """Every file under ``work`` and its bytes (journals and spools)."""
    return {
        str(p.relative_to(work)): p.read_bytes() for p in sorted(work.rglob("*")) if p.is_file()
    }


def server_identity(port: int) -> dict[str, Any]:
    """The identity a managed server answers with, read by the test's own client."""
    [identity] = chhttp.rows(
        port,
        "SELECT toString(uuid) AS u FROM system.databases WHERE name = '_dpone_identity'",
    )
    [database] = chhttp.rows(
        port, f"SELECT toString(uuid) AS u, engine FROM system.databases WHERE name = '{DB}'"
    )
    return {
        "server_id": identity["u"],
        "server_id_source": "dpone_identity_table",
        "database": DB,
        "database_uuid": database["u"],
        "database_engine": database["engine"],
    }


def cli(verb: str, attempt: str, work: Path, info: ServerInfo) -> Any:
    """``dpone attempts VERB ATTEMPT --json`` against the managed server ``info``."""
    return attempts_command(verb, attempt, work, Path(info.data_dir), "--json", database=DB)


def assert_mismatch(error: dict[str, Any], bound: dict[str, Any], other: dict[str, Any]) -> None:
    assert error["code"] == "endpoint_mismatch", error
    assert error["details"]["journal_identity"] == bound
    assert error["details"]["observed_identity"] == other
    assert bound["server_id"] in error["message"] and other["server_id"] in error["message"]


def test_recovery_pointed_at_another_server_is_refused_and_writes_nothing(
    clickhouse: ServerInfo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The CLI reads each managed server's administrator from its own data directory.
    monkeypatch.delenv("DPONE_CLICKHOUSE_USER", raising=False)
    monkeypatch.delenv("DPONE_CLICKHOUSE_PASSWORD", raising=False)
    work = tmp_path / "work"
    path, receipt, _ = export_hostile(tmp_path)
    on_a = build_clickhouse_staging_components(config(clickhouse, work))
    staged: dict[str, StagedTable] = {
        attempt: on_a.validated_file.stage(ContractValidatedFileArtifact(path, receipt), attempt)
        for attempt in ("kept-1", "kept-2")
    }
    acked = crash(clickhouse, work, (path, receipt), "acked-1", "acked", 600.0)
    assert "state" in acked[-1] and acked[-1]["state"] == "verifying"
    unsent = crash(clickhouse, work, (path, receipt), "unsent-1", "unsent", 1.0)
    window = unsent[-1]["dispatch"]
    tables = {a: f"dpone_stage_{a.replace('-', '_h')}" for a in (*staged, "acked-1", "unsent-1")}
    assert all(table_exists(clickhouse, t) for t in tables.values())
    bound = unsent[-1]["endpoint_identity"]
    assert bound == acked[-1]["endpoint_identity"] == server_identity(clickhouse.http_port)
    # B starts after the unsent INSERT's dispatch window closed (and the two-second
    # resolution of the start bound): on A that INSERT is unproven, and B's start would
    # "prove" it (server_restart) if B were taken for A.
    while time.time() * 1000 < window["not_after_ms"] + 2500:
        time.sleep(0.1)
    with LocalServer(tmp_path / "b") as server_b:
        b = server_b.info
        chhttp.register_server(b.http_port, b.data_dir)
        before = snapshot(work)
        on_b = build_transport(config(b, work))
        # A server without the database, or without any dpone identity, is not A either.
        with pytest.raises(DponeError) as caught:
            cleanup_attempt(on_b, work, "acked-1", database=DB)
        assert caught.value.code == "database_missing"
        assert caught.value.details["journal_identity"] == bound
        chhttp.query(b.http_port, f"CREATE DATABASE {DB} ENGINE = Atomic")
        with pytest.raises(DponeError) as caught:
            discard_attempt(on_b, work, "kept-1", database=DB)
        assert caught.value.code == "identity_unavailable"
        assert caught.value.details["journal_identity"] == bound
        create_databases(b.http_port)  # now B has an identity of its own
        other = server_identity(b.http_port)
        assert other["server_id"] != bound["server_id"]
        for operation, attempt in (
            (cleanup_attempt, "acked-1"),
            (cleanup_attempt, "unsent-1"),
            (discard_attempt, "kept-1"),
        ):
            with pytest.raises(DponeError) as caught:
                operation(on_b, work, attempt, database=DB)
            assert_mismatch(caught.value.to_dict(), bound, other)
        on_b_bundle = build_clickhouse_staging_components(config(b, work))
        with pytest.raises(DponeError) as caught:
            on_b_bundle.finalizer.discard(staged["kept-2"])
        assert_mismatch(caught.value.to_dict(), bound, other)
        for verb, attempt in (
            ("cleanup", "acked-1"),
            ("cleanup", "unsent-1"),
            ("discard", "kept-1"),
        ):
            done = cli(verb, attempt, work, b)
            assert done.returncode == 1, done.stdout + done.stderr
            assert_mismatch(as_json(done)["error"], bound, other)
        assert snapshot(work) == before  # same files, same bytes: nothing recorded
        assert all(table_exists(clickhouse, t) for t in tables.values())  # nothing dropped
        assert (
            chhttp.rows(b.http_port, f"SELECT name FROM system.tables WHERE database = '{DB}'")
            == []
        )

    # Pointed at A, the same operations work (or refuse for A's own reason).
    done = cli("cleanup", "acked-1", work, clickhouse)
    assert done.returncode == 0, done.stdout + done.stderr
    assert as_json(done)["state"] == "failed_cleaned"
    done = cli("discard", "kept-1", work, clickhouse)
    assert done.returncode == 0, done.stdout + done.stderr
    assert as_json(done)["state"] == "discarded"
    on_a.finalizer.discard(staged["kept-2"])
    for attempt in ("acked-1", "kept-1", "kept-2"):
        assert not table_exists(clickhouse, tables[attempt])
        # The operator's events record the identity they acted under.
        assert read_events(work / attempt)[-1].document["endpoint_identity"] == bound
    # A has run since before the unsent INSERT's window: nothing proves it gone there.
    refused = cli("cleanup", "unsent-1", work, clickhouse)
    assert refused.returncode == 1 and as_json(refused)["error"]["code"] == "termination_unproven"
    assert table_exists(clickhouse, tables["unsent-1"])
