"""The store's SQLite file: its schema, its identity, its creation and its column encodings.

The file is created ``0600`` and identifies itself with ``PRAGMA application_id`` and
``PRAGMA user_version`` (:data:`SCHEMA_VERSION`); a file with another identity is
refused before anything could modify it, an older schema version is upgraded in one
transaction when it is opened (:func:`migrate`) and a newer one refused. The layout and
what each version changed are in docs/publication.md ("The snapshot store").
"""

from __future__ import annotations

import os
import sqlite3
import stat
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from dpone.contracts import canonical_json
from dpone.durable_files import fsync_directory, private_directories
from dpone.publication.store.errors import SnapshotStoreError, store_missing

SCHEMA_VERSION = 2
APPLICATION_ID = 0x64703031  # "dp01": marks the file as a dpone snapshot store

_SCHEMA = """
CREATE TABLE intents (
    intent_sha256 TEXT PRIMARY KEY, intent_bytes BLOB NOT NULL, created_at TEXT NOT NULL,
    parent_request TEXT NOT NULL, database TEXT NOT NULL, target_table TEXT NOT NULL
) STRICT;
CREATE TABLE records (
    intent_sha256 TEXT PRIMARY KEY REFERENCES intents (intent_sha256),
    record_bytes BLOB NOT NULL, revision INTEGER NOT NULL CHECK (revision >= 1),
    state TEXT NOT NULL
) STRICT;
CREATE TABLE history (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    intent_sha256 TEXT NOT NULL REFERENCES intents (intent_sha256),
    revision INTEGER NOT NULL, state TEXT NOT NULL, record_sha256 TEXT,
    at TEXT NOT NULL, facts BLOB NOT NULL, record_bytes BLOB
) STRICT;
CREATE INDEX history_of_intent ON history (intent_sha256, id);
CREATE TABLE slots (
    database TEXT NOT NULL, target_table TEXT NOT NULL, epoch INTEGER NOT NULL,
    PRIMARY KEY (database, target_table)
) STRICT;
CREATE TABLE runs (
    parent_request TEXT PRIMARY KEY, database TEXT NOT NULL, target_table TEXT NOT NULL,
    attempt_id TEXT NOT NULL UNIQUE, slot_epoch INTEGER NOT NULL,
    attempt_epoch INTEGER NOT NULL UNIQUE,
    ownership TEXT NOT NULL CHECK (ownership IN ('active', 'retiring', 'retired')),
    admitted_at TEXT NOT NULL,
    activated INTEGER NOT NULL DEFAULT 1 CHECK (activated IN (0, 1))
) STRICT;
CREATE TABLE leases (
    lease_id TEXT PRIMARY KEY, user TEXT NOT NULL, role TEXT NOT NULL,
    attempt_id TEXT NOT NULL, active INTEGER NOT NULL CHECK (active IN (0, 1)),
    issued_at TEXT NOT NULL, ended_at TEXT
) STRICT;
CREATE UNIQUE INDEX one_active_lease_per_user ON leases (user) WHERE active = 1;
CREATE TABLE steps (
    id INTEGER PRIMARY KEY AUTOINCREMENT, key TEXT NOT NULL, facts BLOB NOT NULL,
    at TEXT NOT NULL
) STRICT;
CREATE INDEX steps_of_key ON steps (key, id);
CREATE TRIGGER intents_immutable BEFORE UPDATE ON intents
    BEGIN SELECT RAISE(ABORT, 'intents are immutable'); END;
CREATE TRIGGER intents_kept BEFORE DELETE ON intents
    BEGIN SELECT RAISE(ABORT, 'intents are immutable'); END;
CREATE TRIGGER records_next_revision BEFORE UPDATE ON records
    WHEN NEW.revision != OLD.revision + 1 OR NEW.intent_sha256 != OLD.intent_sha256
    BEGIN SELECT RAISE(ABORT, 'a record changes only to its next revision'); END;
CREATE TRIGGER records_kept BEFORE DELETE ON records
    BEGIN SELECT RAISE(ABORT, 'records are never deleted'); END;
CREATE TRIGGER history_no_update BEFORE UPDATE ON history
    BEGIN SELECT RAISE(ABORT, 'history is append-only'); END;
CREATE TRIGGER history_no_delete BEFORE DELETE ON history
    BEGIN SELECT RAISE(ABORT, 'history is append-only'); END;
CREATE TRIGGER steps_no_update BEFORE UPDATE ON steps
    BEGIN SELECT RAISE(ABORT, 'steps are append-only'); END;
CREATE TRIGGER steps_no_delete BEFORE DELETE ON steps
    BEGIN SELECT RAISE(ABORT, 'steps are append-only'); END;
CREATE TRIGGER ownership_forward BEFORE UPDATE OF ownership ON runs
    WHEN NEW.ownership != OLD.ownership AND NOT (
        (OLD.ownership = 'active' AND NEW.ownership = 'retiring')
        OR (OLD.ownership = 'retiring' AND NEW.ownership = 'retired'))
    BEGIN SELECT RAISE(ABORT, 'ownership only moves forward'); END;
CREATE TRIGGER activation_forward BEFORE UPDATE OF activated ON runs
    WHEN OLD.activated = 1 AND NEW.activated != 1
    BEGIN SELECT RAISE(ABORT, 'an activated run stays activated'); END;
"""

# From version 1: the two new columns (old history rows keep NULL bytes, old runs were
# activated at admission) and the activation trigger.
_MIGRATE_FROM_1 = """
ALTER TABLE history ADD COLUMN record_bytes BLOB;
ALTER TABLE runs ADD COLUMN activated INTEGER NOT NULL DEFAULT 1 CHECK (activated IN (0, 1));
CREATE TRIGGER activation_forward BEFORE UPDATE OF activated ON runs
    WHEN OLD.activated = 1 AND NEW.activated != 1
    BEGIN SELECT RAISE(ABORT, 'an activated run stays activated'); END;
"""


def _statements(script: str) -> Iterator[str]:
    """Split a schema script into statements (``executescript`` would commit first)."""
    buffer = ""
    for line in script.splitlines(keepends=True):
        buffer += line
        if sqlite3.complete_statement(buffer):
            yield buffer.strip()
            buffer = ""


def create_schema(conn: sqlite3.Connection) -> None:
    """Create every table, index and trigger and stamp the identity, in ``conn``'s transaction."""
    for statement in _statements(_SCHEMA):
        conn.execute(statement)
    conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")


def migrate(conn: sqlite3.Connection, path: Path) -> None:
    """Upgrade a store of an older schema version to :data:`SCHEMA_VERSION`, in ``conn``'s
    transaction (a store already current is left as it is)."""
    if check_identity(conn, path) != "old":
        return
    for statement in _statements(_MIGRATE_FROM_1):
        conn.execute(statement)
    # Version 1 stored no closure proofs, and a user whose last lease ended unproven is
    # not leased again: its ended leases are marked as what they were, trusted as the
    # whole pool was then (``legacy``), so that an upgraded store keeps its pool.
    legacy = canonical_json.dumps(
        {
            "step": "closure",
            "proven": True,
            "legacy": True,
            "reason": "ended before the store kept closure proofs (schema version 1)",
        }
    )
    at = now()
    for (lease_id,) in conn.execute("SELECT lease_id FROM leases WHERE active = 0").fetchall():
        conn.execute(
            "INSERT INTO steps (key, facts, at) VALUES (?, ?, ?)", (f"lease/{lease_id}", legacy, at)
        )
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")


def check_identity(conn: sqlite3.Connection, path: Path) -> str:
    """``fresh`` (an empty database), ``current`` or ``old`` (an upgradable version).

    Raises unless the file is this store's schema, of this version or one it upgrades.
    """
    app = conn.execute("PRAGMA application_id").fetchone()[0]
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    tables = conn.execute("SELECT count(*) FROM sqlite_schema").fetchone()[0]
    if app == 0 and version == 0 and tables == 0:
        return "fresh"
    if app == APPLICATION_ID and version == 1:
        return "old"
    if app != APPLICATION_ID or version != SCHEMA_VERSION:
        raise SnapshotStoreError(
            f"{path} is not a dpone snapshot store of schema version {SCHEMA_VERSION}"
            f" (application_id {app}, user_version {version})",
            code="store_schema_mismatch",
            path=str(path),
            application_id=app,
            user_version=version,
        )
    return "current"


def open_file(path: Path, create: bool) -> None:
    """Check ``path`` is a regular file (``create``: create it ``0600`` first, durably).

    An existing file is only looked at (``stat``), never opened: POSIX record locks
    belong to the process, and closing any descriptor of the file drops all of them,
    including the SHARED lock an open WAL connection of this process holds on it
    (a connection left open by an interruption, or another store object's). SQLite
    still believes it holds that lock, so another process's last close would
    checkpoint and remove the WAL under it: the store ends malformed (SQLite's "How
    To Corrupt", section 2.2). Only a file this call creates (``O_EXCL``) is opened.
    """
    where = {"path": str(path)}
    try:
        if create:
            # 0700 for each directory created here, parents too; existing ones stay.
            private_directories(path.parent)
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            except FileExistsError:
                pass  # someone's store, or another process's new one: only looked at
            else:
                os.close(fd)  # new and empty: no connection can hold a lock on it yet
                fsync_directory(path.parent)
        if not stat.S_ISREG(os.stat(path).st_mode):
            raise SnapshotStoreError(
                f"{path} is not a regular file", code="store_unavailable", **where
            )
    except FileNotFoundError as exc:
        if create:  # the parent or the file vanished while it was being created
            raise SnapshotStoreError(
                f"cannot open the snapshot store {path}: {exc}",
                code="store_unavailable",
                **where,
            ) from exc
        raise store_missing(path, "the file does not exist") from exc
    except OSError as exc:
        raise SnapshotStoreError(
            f"cannot open the snapshot store {path}: {exc}",
            code="store_unavailable",
            **where,
        ) from exc


def now() -> str:
    """The current time as every ``at`` column holds it (UTC ISO 8601, microseconds)."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def decode_facts(data: bytes) -> Mapping[str, Any]:
    """A ``facts`` column (canonical JSON bytes of an object) as a mapping."""
    value = canonical_json.loads(bytes(data), what="history facts")
    assert isinstance(value, dict)
    return value
