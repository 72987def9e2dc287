"""Opening the store never drops the locks this process's open connections hold on it.

POSIX record locks belong to a process, and closing any descriptor of a file drops all
of them. A WAL connection holds a SHARED lock on the database file while it is open;
if constructing a store object opened and closed the file, an open connection of the
same process (one left open by an interruption, another store object's) would lose
that lock while SQLite still counts it. Another process's last close then checkpoints
and removes the WAL under it, and commits are lost or the file is left malformed
(``database disk image is malformed`` after a Ctrl-C of ``refresh --jobs``).
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from dpone.publication.store import SnapshotStoreError, SqliteSnapshotStore
from dpone.publication.store.connections import discard_kept_connections

# SQLite's lock bytes (os_unix.c): a SHARED lock is a read lock on one byte of this range.
_SHARED_FIRST, _SHARED_SIZE = 0x40000002, 510

_PROBE = f"""
import fcntl, os, struct, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
ask = struct.pack("hhqqi", fcntl.F_WRLCK, 0, {_SHARED_FIRST}, {_SHARED_SIZE}, 0)
answer = fcntl.fcntl(fd, fcntl.F_GETLK, ask)
print("held" if struct.unpack("hhqqi", answer)[0] != fcntl.F_UNLCK else "free")
"""


def _shared_lock_seen_from_another_process(path: Path) -> bool:
    # F_GETLK never reports the asking process's own locks: ask from another one.
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, str(path)], capture_output=True, text=True, check=True
    )
    return done.stdout.strip() == "held"


def _connect(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, timeout=10)
    conn.execute("PRAGMA busy_timeout = 10000")
    return conn


@pytest.mark.parametrize("create", [True, False], ids=["create", "existing_only"])
def test_an_open_connection_keeps_its_shared_lock_when_a_store_opens_the_file(
    tmp_path: Path, create: bool
) -> None:
    path = tmp_path / "store.sqlite"
    SqliteSnapshotStore(path).list_snapshots()
    held = _connect(path)
    try:
        held.execute("SELECT count(*) FROM sqlite_schema").fetchone()
        assert _shared_lock_seen_from_another_process(path)  # the premise: WAL holds it
        store = SqliteSnapshotStore(path, create=create)
        store.list_snapshots()
        assert _shared_lock_seen_from_another_process(path)
    finally:
        held.close()
    discard_kept_connections()  # the store's idle connections hold the lock too
    assert not _shared_lock_seen_from_another_process(path)  # the probe can say "free"


_WRITER = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=10)
conn.execute("INSERT INTO probe VALUES ('other process')")
conn.close()  # a close that believes it is the last one checkpoints and removes the WAL
"""

_READER = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=10)
print(",".join(r[0] for r in conn.execute("SELECT who FROM probe ORDER BY rowid")))
print(conn.execute("PRAGMA integrity_check").fetchone()[0])
"""


def test_a_commit_beside_a_store_opened_in_the_same_process_is_seen_by_others(
    tmp_path: Path,
) -> None:
    path = tmp_path / "store.sqlite"
    SqliteSnapshotStore(path).list_snapshots()
    held = _connect(path)
    try:
        held.execute("CREATE TABLE probe (who TEXT)")
        held.execute("INSERT INTO probe VALUES ('before')")
        SqliteSnapshotStore(path, create=False).list_snapshots()
        subprocess.run([sys.executable, "-c", _WRITER, str(path)], check=True)
        held.execute("INSERT INTO probe VALUES ('after')")
        # While this process's connection is still open, as a long-lived one would be.
        seen = subprocess.run(
            [sys.executable, "-c", _READER, str(path)], capture_output=True, text=True, check=True
        ).stdout.splitlines()
    finally:
        held.close()
    assert seen == ["before,other process,after", "ok"]


def test_a_store_is_still_created_private_and_a_directory_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "deeper" / "store.sqlite"
    SqliteSnapshotStore(path).list_snapshots()
    assert path.stat().st_mode & 0o777 == 0o600
    directory = tmp_path / "a_directory.sqlite"
    directory.mkdir()
    with pytest.raises(SnapshotStoreError) as caught:
        SqliteSnapshotStore(directory)
    assert caught.value.code == "store_unavailable"
    assert "not a regular file" in str(caught.value)


def test_a_new_store_opens_while_another_connection_holds_its_write_lock(tmp_path: Path) -> None:
    # Another process creating the same new store (refresh --jobs on a fresh project)
    # holds the write lock of the still rollback-journal file: SQLite refuses the switch
    # to WAL at once, without the busy handler. The open waits as the busy timeout would.
    path = tmp_path / "store.sqlite"
    path.touch(mode=0o600)
    other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    other.execute("BEGIN IMMEDIATE")
    release = threading.Timer(0.3, other.execute, args=("ROLLBACK",))
    release.start()
    try:
        store = SqliteSnapshotStore(path, busy_timeout=5.0)
    finally:
        release.join()
        other.close()
    assert store.path == path
    probe = sqlite3.connect(path)
    try:
        assert probe.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert probe.execute("PRAGMA user_version").fetchone()[0] == 2
    finally:
        probe.close()


def test_a_write_lock_held_past_the_busy_timeout_is_a_clear_refusal(tmp_path: Path) -> None:
    path = tmp_path / "store.sqlite"
    path.touch(mode=0o600)
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(SnapshotStoreError) as caught:
            SqliteSnapshotStore(path, busy_timeout=0.2)
    finally:
        other.close()
    assert caught.value.code == "store_unavailable"
    assert caught.value.details["operation"] == "open"
    assert caught.value.details["sqlite_error"] == "SQLITE_BUSY"
    assert str(path) in str(caught.value)
