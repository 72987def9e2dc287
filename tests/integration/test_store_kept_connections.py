"""The SQLite store keeps idle connections for its next calls, on a real file.

A kept connection must behave as a new one would: every read a fresh snapshot (it sees
another process's commit), never left read-only or inside a transaction, never a
connection to another file than the one the path holds now.
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dpone.publication.store import SnapshotStoreError, SqliteSnapshotStore
from dpone.publication.store import connections as kept

_LEASE_ELSEWHERE = """
import sys
from dpone.publication.store import SnapshotStoreError, SqliteSnapshotStore
SqliteSnapshotStore(sys.argv[1]).lease("ingest", ("u2",), "attempt-other")
"""


@pytest.fixture
def opened(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The paths of the new SQLite connections the store opens, from a clean pool."""
    kept.discard_kept_connections()
    paths: list[str] = []
    real = sqlite3.connect

    def counting(database: str, *args: Any, **kwargs: Any) -> sqlite3.Connection:
        paths.append(database)
        conn: sqlite3.Connection = real(database, *args, **kwargs)
        return conn

    monkeypatch.setattr(sqlite3, "connect", counting)
    yield paths
    kept.discard_kept_connections()


def test_store_calls_reuse_one_connection(tmp_path: Path, opened: list[str]) -> None:
    store = SqliteSnapshotStore(tmp_path / "store.sqlite")
    before = len(opened)
    lease = store.lease("ingest", ("u1",), "attempt-1")
    for _ in range(20):
        assert store.get_lease(lease.lease_id).active
    store.end_lease(lease.lease_id)
    assert not store.get_lease(lease.lease_id).active
    assert len(opened) - before <= 1  # at most one new: the one the opening left is kept


def test_a_kept_connection_reads_a_fresh_snapshot(tmp_path: Path, opened: list[str]) -> None:
    path = tmp_path / "store.sqlite"
    store = SqliteSnapshotStore(path)
    mine = store.lease("ingest", ("u1",), "attempt-1")
    assert store.get_lease(mine.lease_id).active  # the connection is idle and kept now
    subprocess.run([sys.executable, "-c", _LEASE_ELSEWHERE, str(path)], check=True)
    before = len(opened)
    # Another process's commit is seen by the kept connection's next read: u2 is taken.
    with pytest.raises(SnapshotStoreError) as exhausted:
        store.lease("ingest", ("u2",), "attempt-2")
    assert exhausted.value.code == "pool_exhausted"
    assert len(opened) == before


def test_a_kept_connection_is_writable_after_a_read(tmp_path: Path, opened: list[str]) -> None:
    store = SqliteSnapshotStore(tmp_path / "store.sqlite")
    store.list_snapshots()  # a read: query_only on, then off again before it is kept
    (conn,) = [c for _key, c in kept._KEPT.idle()]
    assert not conn.in_transaction
    assert conn.execute("PRAGMA query_only").fetchone()[0] == 0
    lease = store.lease("ingest", ("u1",), "attempt-1")  # a write on that same connection
    assert store.get_lease(lease.lease_id).user == "u1"


def test_a_failed_write_leaves_a_clean_kept_connection(tmp_path: Path, opened: list[str]) -> None:
    store = SqliteSnapshotStore(tmp_path / "store.sqlite")

    def stopped_inside() -> None:
        with store._write("probe", "store_commit_unknown") as conn:
            conn.execute("INSERT INTO steps (key, facts, at) VALUES ('k', x'7b7d', 'now')")
            raise RuntimeError("stop inside the unit of work")

    with pytest.raises(RuntimeError):
        stopped_inside()
    (kept_conn,) = [c for _key, c in kept._KEPT.idle()]
    assert not kept_conn.in_transaction
    count = kept_conn.execute("SELECT count(*) FROM steps WHERE key = 'k'").fetchone()[0]
    assert count == 0  # rolled back, not committed by a later use


def test_a_file_replaced_under_the_path_is_never_read_through_a_kept_connection(
    tmp_path: Path, opened: list[str]
) -> None:
    path = tmp_path / "store.sqlite"
    first = SqliteSnapshotStore(path)
    first.lease("ingest", ("u1",), "attempt-1")
    assert first.get_lease(first.lease("ingest", ("u2",), "attempt-2").lease_id).active
    for suffix in ("", "-wal", "-shm"):
        moved = Path(f"{path}{suffix}")
        if moved.exists():
            moved.rename(tmp_path / f"old{suffix}")
    second = SqliteSnapshotStore(path)  # a new store file at the same path
    lease = second.lease("ingest", ("u1",), "attempt-3")  # u1 is free in this one
    assert lease.user == "u1"
    assert SqliteSnapshotStore(tmp_path / "old").lease("ingest", ("u1", "u3"), "a").user == "u3"


def test_a_kept_connection_has_its_stores_busy_timeout(tmp_path: Path, opened: list[str]) -> None:
    path = tmp_path / "store.sqlite"
    SqliteSnapshotStore(path, busy_timeout=0.05).list_snapshots()  # keeps a 50 ms one
    patient = SqliteSnapshotStore(path)
    with patient._reading("probe") as conn:
        assert conn.execute("PRAGMA busy_timeout").fetchone()[0] == 10_000


def test_a_process_keeps_few_connections_over_many_stores(
    tmp_path: Path, opened: list[str]
) -> None:
    stores = [SqliteSnapshotStore(tmp_path / f"store-{n}.sqlite") for n in range(30)]
    for store in stores:
        store.list_snapshots()
    kept_now = [c for _key, c in kept._KEPT.idle()]
    assert len(kept_now) == kept._KEPT.total == 16  # the most recently used stores' only
    newest = {str(s.path.absolute()) for s in stores[-16:]}
    assert {
        key.split("\0")[0].removeprefix("file://").split("?")[0] for key, _c in kept._KEPT.idle()
    } == newest
