"""Publication acts only on the database its intent recorded, never on a namesake.

An intent records the UUID of its database as staging observed it. When the server
reached now has a database of that name with another UUID (the project points at
another server, or the database was dropped and created again), prepare, publish and
reconcile refuse with ``database_mismatch`` before they close, claim or send anything:
an observation there says nothing about what the intent names, and a closure there
would end a lease on another server's evidence. The namesake is made here by renaming
the real database away and creating a new one under its name on the managed server;
renaming it back shows the refusal changed nothing.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from dpone.connectors.clickhouse_http import HttpTransport
from dpone.contracts.composition_snapshot import SnapshotIntent, SnapshotRecord, SnapshotState
from dpone.errors import DponeError
from dpone.publication.catalog import ClickHouseSnapshotCatalog
from dpone.publication.composition import pool_credentials
from dpone.publication.principals.server_access import ServerAccess
from dpone.publication.store import SqliteSnapshotStore
from dpone.staging.service import StagedTable
from tests import chhttp
from tests.publication_harness import Rig, Row, managed_publication_server

DB = "recordeddb"
ASIDE = "recordeddb_aside"
P = SnapshotState
A_ROWS: list[Row] = [(1, "a-one", 1), (2, "a-two", 2)]
B_ROWS: list[Row] = [(1, "b-one", 10), (3, "b-three", 30)]


@pytest.fixture(scope="module")
def managed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, int, int]]:
    yield from managed_publication_server(tmp_path_factory, "recorded", DB)


@pytest.fixture
def rig(managed: tuple[Path, int, int], tmp_path: Path) -> Rig:
    data_dir, http_port, tcp_port = managed
    return Rig(data_dir, http_port, tcp_port, DB, tmp_path)


class Namesake:
    """While active, ``DB`` is a new, empty database; the real one waits aside."""

    def __init__(self, rig: Rig) -> None:
        self.rig = rig

    def database_uuid(self) -> str:
        found = chhttp.rows(
            self.rig.http_port,
            f"SELECT toString(uuid) AS u FROM system.databases WHERE name = '{DB}'",
        )
        return str(found[0]["u"])

    def __enter__(self) -> str:
        self.rig.admin(f"RENAME DATABASE {DB} TO {ASIDE}")
        self.rig.admin(f"CREATE DATABASE {DB} ENGINE = Atomic")
        return self.database_uuid()

    def __exit__(self, *exc: object) -> None:
        self.rig.admin(f"DROP DATABASE {DB} SYNC")
        self.rig.admin(f"RENAME DATABASE {ASIDE} TO {DB}")


def _refused(caught: pytest.ExceptionInfo[DponeError], recorded: str, found: str) -> None:
    error = caught.value
    assert error.code == "database_mismatch", error
    assert (error.details["recorded_uuid"], error.details["found_uuid"]) == (recorded, found)
    assert DB in error.message and "another server" in error.message


def _target(rig: Rig, name: str) -> tuple[StagedTable, str]:
    """A target holding A's rows and B staged beside it; B's staging and A's UUID."""
    a = rig.stage(A_ROWS, f"{name}-a")
    a_uuid = rig.existing_target(a, name, A_ROWS)
    return rig.stage(B_ROWS, f"{name}-b"), a_uuid


def test_prepare_on_a_namesake_database_closes_and_stores_nothing(rig: Rig) -> None:
    original = Namesake(rig).database_uuid()
    staged, a_uuid = _target(rig, "t_prepare")
    with Namesake(rig) as namesake, pytest.raises(DponeError) as caught:
        rig.prepare(staged, "t_prepare")
    _refused(caught, original, namesake)
    store = SqliteSnapshotStore(rig.store_path)
    assert store.list_snapshots() == []
    # The ingest lease was not closed on the namesake's evidence: still active.
    assert _active(store, "ingest", "t_prepare-b")
    # Back on the database it was staged in, the same generation prepares.
    prepared = rig.prepare(staged, "t_prepare")
    assert (prepared.target_uuid, prepared.generation_uuid) == (a_uuid, staged.uuid)


def test_publish_and_reconcile_on_a_namesake_database_change_nothing(rig: Rig) -> None:
    original = Namesake(rig).database_uuid()
    staged, a_uuid = _target(rig, "t_publish")
    intent = rig.prepare(staged, "t_publish").intent_sha256
    store = SqliteSnapshotStore(rig.store_path)
    history = len(store.history(intent))
    with Namesake(rig) as namesake:
        with pytest.raises(DponeError) as caught:
            rig.components().publisher.publish(intent)
        _refused(caught, original, namesake)
    record = SnapshotRecord.from_bytes(store.load(intent).record_bytes)
    assert (record.state, record.revision) == (P.PREPARED, 1)
    assert len(store.history(intent)) == history  # no claim, no observation written
    assert rig.exchange_events(intent) == []

    # A claim a crash left unresolved: reconcile on the namesake closes nothing.
    done = rig.crash("after-claim", intent)
    assert done.returncode == -signal.SIGKILL, done.stderr
    claimed = len(store.history(intent))
    attempt = SnapshotIntent.from_bytes(store.load(intent).intent_bytes).attempt_id
    assert _active(store, "publisher", attempt)  # closed only by a reconcile
    with Namesake(rig) as namesake:
        with pytest.raises(DponeError) as caught:
            rig.components().publisher.reconcile(intent)
        _refused(caught, original, namesake)
    record = SnapshotRecord.from_bytes(store.load(intent).record_bytes)
    assert (record.state, record.revision) == (P.EXCHANGE_INTENT, 2)
    assert len(store.history(intent)) == claimed
    assert _active(store, "publisher", attempt)
    # On its own database the claim resolves as it would have: the EXCHANGE never ran.
    reconciled = rig.components().publisher.reconcile(intent)
    assert (reconciled.state, reconciled.revision) == (P.NOT_PUBLISHED, 3)
    assert rig.uuid_of("t_publish") == a_uuid and rig.rows_of("t_publish") == sorted(A_ROWS)


def _active(store: SqliteSnapshotStore, role: str, attempt_id: str) -> bool:
    """Whether ``attempt_id`` still holds an active lease in ``role``."""
    return any(
        r.lease.active and r.lease.role == role and r.lease.attempt_id == attempt_id
        for r in store.lease_records(active_only=False)
    )


def test_only_a_reader_that_sees_every_database_tells_a_dropped_one(rig: Rig) -> None:
    """What reconcile and abandon (issue 37, item 6) rest on: where the recorded database
    and tables are now, read by one who sees every database. A database renamed away
    keeps its UUID and its tables (not dropped); a reader that sees only the protected
    names would miss it there, so it is refused as unobservable."""
    original = Namesake(rig).database_uuid()
    staged, a_uuid = _target(rig, "t_sight")
    recorded = (a_uuid, staged.uuid)
    catalog = rig.components().publisher.catalog
    here = catalog.recorded_presence(DB, original, recorded)
    assert (here.named_uuid, here.database_found, here.tables_found) == (
        original,
        True,
        tuple(sorted(recorded)),
    )
    with Namesake(rig) as namesake:
        aside = catalog.recorded_presence(DB, original, recorded)
        assert (aside.named_uuid, aside.database_found, aside.tables_found) == (
            namesake,
            True,
            tuple(sorted(recorded)),
        )
        assert aside.server_id == here.server_id
        access = ServerAccess(rig.data_dir)
        narrow = pool_credentials(access)[access.pool.catalog]
        blind = ClickHouseSnapshotCatalog(
            HttpTransport(access.endpoint(DB), narrow),
            operator=HttpTransport(access.endpoint("system"), narrow),
        )
        with pytest.raises(DponeError) as caught:
            blind.recorded_presence(DB, original, recorded)
        assert caught.value.code == "catalog_unobservable"
        assert "every database" in caught.value.message
