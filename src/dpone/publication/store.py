"""The SQLite snapshot store: publication records, their history and the run registry.

:class:`SqliteSnapshotStore` implements both
:class:`~dpone.ports.composition_snapshot.SnapshotPublicationStore` and
:class:`~dpone.ports.composition_snapshot.SnapshotRunRegistry` in one SQLite file, so
that a compare-and-set can recheck the parent authority (the run, its slot epoch and
its ownership) in the same transaction that writes the record.

The file is created ``0600`` (a missing parent directory is created ``0700``; an
existing one is left as it is) unless the store is opened with ``create=False``: a
command that only reads or continues existing records then fails with
``store_missing`` naming the path, and creates nothing. The store runs in WAL mode with ``synchronous=FULL`` and a busy
timeout, and identifies itself with ``PRAGMA application_id`` and ``PRAGMA
user_version`` (:data:`SCHEMA_VERSION`). A file that is not SQLite, or another
application's database, is refused and never modified.

Layout (every ``at`` is UTC ISO 8601, every ``facts`` canonical JSON bytes)::

    intents  (intent_sha256 PK, intent_bytes, created_at, parent_request,
              database, target_table)                       -- immutable
    records  (intent_sha256 PK -> intents, record_bytes, revision, state)
              -- updated only to revision + 1, never deleted
    history  (id PK autoincrement, intent_sha256, revision, state,
              record_sha256 NULL for an observation, at, facts) -- append-only
    slots    (database, target_table PK, epoch)
    runs     (parent_request PK, database, target_table, attempt_id UNIQUE,
              slot_epoch, attempt_epoch UNIQUE, ownership, admitted_at)
    leases   (lease_id PK, user, role, attempt_id, active, issued_at, ended_at)
              -- at most one active lease per user (partial unique index)
    steps    (id PK autoincrement, key, facts, at)           -- append-only

A lease's holder process (:mod:`dpone.publication.holder_process`) is noted in ``steps``
under the key ``lease/<lease_id>`` in the transaction that issues the lease; an
operator's end of a lease whose holder is gone is noted there too, with the facts
that proved it, in the transaction that ends it.

Triggers enforce what SQL can: immutable intents, append-only history and steps,
records only to the next revision, ownership only forward.

Every write is one unit of work: ``BEGIN IMMEDIATE``, the checks and the writes,
``COMMIT``; anything else rolls back. :func:`_store_error` is the one place where an
``sqlite3`` exception becomes a typed error: an error while committing (or a busy
database during a write) leaves the outcome unknown (``claim_uncertain`` for a
compare-and-set, ``prepare_uncertain`` for ``create``, ``store_commit_unknown``
otherwise); a refused comparison is definite and wrote nothing (``claim_lost``).
``read_back`` always opens a fresh connection.

A run's ``parent_request`` is a random id chosen at admission; its ``attempt_epoch``
is the store-wide admission number (1, 2, ...), its ``slot_epoch`` the slot's epoch
after the admission incremented it.
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
import stat
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any

from dpone.contracts import canonical_json
from dpone.contracts.composition_snapshot import SnapshotState, check_transition, revision_ok
from dpone.contracts.fields import DocumentError, check_type
from dpone.durable_files import fsync_directory
from dpone.errors import StateError
from dpone.ports.composition_snapshot import (
    Admission,
    AttemptEpochs,
    HistoryEntry,
    Lease,
    OwnershipState,
    ParentAuthority,
    StepNote,
    StoredSnapshot,
    TargetSlot,
)
from dpone.publication.holder_process import HolderProcess, current_process

SCHEMA_VERSION = 1
APPLICATION_ID = 0x64703031  # "dp01": marks the file as a dpone snapshot store
BUSY_TIMEOUT_SECONDS = 10.0
# A durable claim not yet resolved: it blocks new admissions to its slot, and RETIRING
# ownership (still retained) may resolve it.
UNRESOLVED_STATES = (SnapshotState.EXCHANGE_INTENT.value, SnapshotState.COMMIT_UNKNOWN.value)
_OWNERSHIP_NEXT = {
    OwnershipState.ACTIVE: OwnershipState.RETIRING,
    OwnershipState.RETIRING: OwnershipState.RETIRED,
}
_SQLITE_BUSY, _SQLITE_LOCKED, _SQLITE_NOTADB = 5, 6, 26

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
    at TEXT NOT NULL, facts BLOB NOT NULL
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
    admitted_at TEXT NOT NULL
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
"""


class SnapshotStoreError(StateError):
    """A store or registry operation was refused, or its outcome is not known.

    Codes: ``claim_lost``, ``claim_uncertain``, ``prepare_uncertain``,
    ``store_commit_unknown``, ``intent_exists``, ``attempt_used``, ``snapshot_not_found``,
    ``attempt_fenced``, ``ownership_not_active``, ``slot_blocked``, ``pool_exhausted``,
    ``lease_not_found``, ``admission_not_found``, ``admission_conflict``,
    ``invalid_ownership_transition``, ``store_unavailable``, ``store_not_sqlite``,
    ``store_schema_mismatch``, ``store_missing``.
    """

    code = "store_unavailable"


@dataclass(frozen=True)
class SnapshotSummary:
    """One stored intent as listed: its slot, creation time and current state."""

    intent_sha256: str
    database: str
    target_table: str
    created_at: str
    state: str
    revision: int
    intent_bytes: bytes


@dataclass(frozen=True)
class LeaseRecord:
    """One lease as stored, with when it was issued and the process that took it."""

    lease: Lease
    issued_at: str
    ended_at: str | None
    holder: HolderProcess | None


def lease_step_key(lease_id: str) -> str:
    """The ``steps`` key under which a lease's holder and its operator end are noted."""
    return f"lease/{lease_id}"


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _store_error(
    exc: BaseException, *, path: Path, operation: str, committing: bool, uncertain: str | None
) -> SnapshotStoreError:
    """The one mapping of a storage failure to a typed error (outcome known or not)."""
    raw = getattr(exc, "sqlite_errorcode", None)
    primary = raw & 0xFF if isinstance(raw, int) else None
    text = str(exc)
    busy = primary in (_SQLITE_BUSY, _SQLITE_LOCKED) or "locked" in text or "busy" in text
    where = {"path": str(path), "operation": operation}
    if uncertain is not None and (committing or busy):
        phase = "while committing" if committing else "while the database was busy"
        return SnapshotStoreError(
            f"{operation} on {path} failed {phase}; whether it was written is unknown: {text}",
            code=uncertain,
            **where,
        )
    if primary == _SQLITE_NOTADB or "file is not a database" in text:
        return SnapshotStoreError(
            f"{path} is not an SQLite database: {text}", code="store_not_sqlite", **where
        )
    return SnapshotStoreError(
        f"{operation} on {path} failed: {text}", code="store_unavailable", **where
    )


def _record_position(record_bytes: bytes) -> tuple[SnapshotState, int]:
    """A record's ``state`` and ``revision`` members, read from its canonical bytes."""
    document = canonical_json.loads(record_bytes, what="snapshot record")
    if not isinstance(document, dict):
        raise DocumentError("a snapshot record must be an object", where="record")
    for name, kind in (("state", str), ("revision", int)):
        if name not in document:
            raise DocumentError(f"record has no {name}", code="missing_member", where=name)
        check_type(document[name], kind, where=f"record.{name}")
    try:
        state = SnapshotState(document["state"])
    except ValueError as exc:
        raise DocumentError(
            f"unknown record state {document['state']!r}", code="unreachable_state"
        ) from exc
    revision = document["revision"]
    if not revision_ok(state, revision):
        raise DocumentError(
            f"{state.value} cannot be at revision {revision}", code="unreachable_state"
        )
    return state, revision


def _statements(script: str) -> Iterator[str]:
    """Split a schema script into statements (``executescript`` would commit first)."""
    buffer = ""
    for line in script.splitlines(keepends=True):
        buffer += line
        if sqlite3.complete_statement(buffer):
            yield buffer.strip()
            buffer = ""


class _UnitOfWork:
    """``BEGIN IMMEDIATE`` ... :meth:`commit`; rolled back unless committed."""

    def __init__(self, store: SqliteSnapshotStore, operation: str, uncertain: str) -> None:
        self.store = store
        self.operation = operation
        self.uncertain = uncertain
        self.committing = False
        self.committed = False

    def __enter__(self) -> sqlite3.Connection:
        self.conn = self.store._connect(self.operation)
        try:
            self.conn.execute("BEGIN IMMEDIATE")
        except BaseException as exc:
            self.conn.close()
            if isinstance(exc, sqlite3.Error):
                raise self._mapped(exc) from exc
            raise
        return self.conn

    def commit(self) -> None:
        self.committing = True
        self.store._before_commit(self.operation)
        self.conn.execute("COMMIT")
        self.store._after_commit(self.operation)
        self.committed = True

    def _mapped(self, exc: BaseException) -> SnapshotStoreError:
        return _store_error(
            exc,
            path=self.store.path,
            operation=self.operation,
            committing=self.committing,
            uncertain=self.uncertain,
        )

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            if not self.committed and self.conn.in_transaction:
                self.conn.execute("ROLLBACK")
        except sqlite3.Error as cleanup:
            if exc is not None:
                exc.add_note(f"the rollback failed too: {cleanup}")
        finally:
            self.conn.close()
        # An exception raised by a commit hook is part of the commit: the outcome is unknown.
        mappable = isinstance(exc, sqlite3.Error) or (
            self.committing and isinstance(exc, Exception)
        )
        if exc is not None and mappable and not isinstance(exc, SnapshotStoreError):
            raise self._mapped(exc) from exc


class SqliteSnapshotStore:
    """Publication records, their history and the run registry in one SQLite file.

    Tests may subclass and override :meth:`_before_commit`, :meth:`_after_commit` and
    :meth:`_after_read_back` to inject faults at those exact points.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        busy_timeout: float = BUSY_TIMEOUT_SECONDS,
        create: bool = True,
    ) -> None:
        """Open (``create``: and create if missing) the store at ``path``.

        With ``create=False`` a missing file, or one that holds no store yet, is
        ``store_missing`` and nothing is created or written.
        """
        self.path = Path(path)
        self.busy_timeout = busy_timeout
        self._uri = f"{self.path.absolute().as_uri()}?mode=rw"
        self._open(create)

    # ------------------------------------------------------------------ fault seams

    def _before_commit(self, operation: str) -> None:
        """Called inside the transaction just before ``COMMIT`` (test seam)."""

    def _after_commit(self, operation: str) -> None:
        """Called right after ``COMMIT`` returned; raising here models a lost answer."""

    def _after_read_back(self, intent_sha256: str, data: bytes | None) -> bytes | None:
        """Called with what the fresh connection read (test seam); returns what to report."""
        return data

    # ------------------------------------------------------------------ connections

    def _missing(self, why: str) -> SnapshotStoreError:
        return SnapshotStoreError(
            f"no snapshot store at {self.path} ({why}); check --store (or the project's store)",
            code="store_missing",
            path=str(self.path),
        )

    def _open(self, create: bool) -> None:
        """Create the file ``0600`` if needed, refuse a foreign one, set WAL, create the schema."""
        where = {"path": str(self.path)}
        try:
            if create:
                # The mode applies only to directories created here; existing ones stay.
                self.path.parent.mkdir(parents=True, mode=0o700, exist_ok=True)
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            else:
                fd = os.open(self.path, os.O_RDWR | os.O_CLOEXEC)
            try:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    raise SnapshotStoreError(
                        f"{self.path} is not a regular file", code="store_unavailable", **where
                    )
            finally:
                os.close(fd)
            if create:
                fsync_directory(self.path.parent)
        except FileNotFoundError as exc:
            if create:  # the parent vanished while it was being created
                raise SnapshotStoreError(
                    f"cannot open the snapshot store {self.path}: {exc}",
                    code="store_unavailable",
                    **where,
                ) from exc
            raise self._missing("the file does not exist") from exc
        except OSError as exc:
            raise SnapshotStoreError(
                f"cannot open the snapshot store {self.path}: {exc}",
                code="store_unavailable",
                **where,
            ) from exc
        with self._reading("open") as conn:
            fresh = self._check_identity(conn)  # before anything could modify a foreign file
        if fresh and not create:
            raise self._missing("the file holds no store yet")
        conn = self._connect("open")
        try:
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        except sqlite3.Error as exc:
            raise self._error(exc, "open") from exc
        finally:
            conn.close()
        if str(mode).lower() != "wal":
            raise SnapshotStoreError(
                f"{self.path} cannot use WAL mode (journal_mode is {mode})",
                code="store_unavailable",
                **where,
            )
        if not fresh:
            return
        with self._write("open", "store_commit_unknown") as work:
            if self._check_identity(work):  # another process may have created it meanwhile
                for statement in _statements(_SCHEMA):
                    work.execute(statement)
                work.execute(f"PRAGMA application_id = {APPLICATION_ID}")
                work.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    def _check_identity(self, conn: sqlite3.Connection) -> bool:
        """True for an empty database; raises unless the file is this store's schema."""
        app = conn.execute("PRAGMA application_id").fetchone()[0]
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        tables = conn.execute("SELECT count(*) FROM sqlite_schema").fetchone()[0]
        if app == 0 and version == 0 and tables == 0:
            return True
        if app != APPLICATION_ID or version != SCHEMA_VERSION:
            raise SnapshotStoreError(
                f"{self.path} is not a dpone snapshot store of schema version {SCHEMA_VERSION}"
                f" (application_id {app}, user_version {version})",
                code="store_schema_mismatch",
                path=str(self.path),
                application_id=app,
                user_version=version,
            )
        return False

    def _connect(self, operation: str) -> sqlite3.Connection:
        """A new connection in autocommit mode; transactions are explicit."""
        try:
            conn = sqlite3.connect(
                self._uri, uri=True, timeout=self.busy_timeout, isolation_level=None
            )
        except sqlite3.Error as exc:
            raise self._error(exc, operation) from exc
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout * 1000)}")
            conn.execute("PRAGMA synchronous = FULL")
            conn.execute("PRAGMA foreign_keys = ON")
        except sqlite3.Error as exc:
            conn.close()
            raise self._error(exc, operation) from exc
        return conn

    def _error(self, exc: BaseException, operation: str) -> SnapshotStoreError:
        return _store_error(
            exc, path=self.path, operation=operation, committing=False, uncertain=None
        )

    @contextmanager
    def _reading(self, operation: str) -> Iterator[sqlite3.Connection]:
        """A read-only snapshot on a fresh connection (``BEGIN`` ... ``ROLLBACK``)."""
        conn = self._connect(operation)
        try:
            conn.execute("PRAGMA query_only = ON")
            conn.execute("BEGIN")
            yield conn
        except sqlite3.Error as exc:
            raise self._error(exc, operation) from exc
        finally:
            conn.close()  # closing ends the read transaction

    @contextmanager
    def _write(self, operation: str, uncertain: str) -> Iterator[sqlite3.Connection]:
        """One unit of work: yields the connection, commits when the block succeeds."""
        work = _UnitOfWork(self, operation, uncertain)
        with work as conn:
            yield conn
            work.commit()

    # ------------------------------------------------------------------ the store

    def create(self, intent_bytes: bytes, record_bytes: bytes, authority: ParentAuthority) -> None:
        """Persist a new intent with its PREPARED record (``intent_exists`` if present).

        ``attempt_used`` when the run (one admitted attempt) already has an intent.

        The authority must be admitted, unfenced and ACTIVE in the same transaction.
        """
        canonical_json.loads(intent_bytes, what="snapshot intent")
        state, revision = _record_position(record_bytes)
        check_transition(None, None, state, revision)
        intent_sha256 = hashlib.sha256(intent_bytes).hexdigest()
        slot = authority.slot
        with self._write("create", "prepare_uncertain") as conn:
            if conn.execute(
                "SELECT 1 FROM intents WHERE intent_sha256 = ?", (intent_sha256,)
            ).fetchone():
                raise SnapshotStoreError(
                    f"intent {intent_sha256} is already stored",
                    code="intent_exists",
                    intent_sha256=intent_sha256,
                )
            # One admitted attempt, one publication (seed O8): preparing the same attempt
            # again, even after a cancellation, would bind the same generation to a
            # second intent and a second publisher.
            used = conn.execute(
                "SELECT intent_sha256 FROM intents WHERE parent_request = ?",
                (authority.parent_request,),
            ).fetchone()
            if used is not None:
                raise SnapshotStoreError(
                    f"the attempt of run {authority.parent_request} already has the publication"
                    f" intent {used[0]}; a new publication needs a new attempt",
                    code="attempt_used",
                    intent_sha256=intent_sha256,
                    existing_intent=used[0],
                    parent_request=authority.parent_request,
                )
            problem = _authority_problem(conn, authority, allow_retiring=False)
            if problem is not None:
                raise SnapshotStoreError(
                    f"intent {intent_sha256} was not stored: {problem[1]}",
                    code=problem[0],
                    intent_sha256=intent_sha256,
                    parent_request=authority.parent_request,
                )
            at = _now()
            conn.execute(
                "INSERT INTO intents VALUES (?, ?, ?, ?, ?, ?)",
                (
                    intent_sha256,
                    intent_bytes,
                    at,
                    authority.parent_request,
                    slot.database,
                    slot.table,
                ),
            )
            conn.execute(
                "INSERT INTO records VALUES (?, ?, ?, ?)",
                (intent_sha256, record_bytes, revision, state.value),
            )
            _append_history(conn, intent_sha256, revision, state.value, record_bytes, at, b"{}")

    def load(self, intent_sha256: str) -> StoredSnapshot:
        """The stored intent and current record (``snapshot_not_found`` when absent)."""
        with self._reading("load") as conn:
            row = conn.execute(
                "SELECT i.intent_bytes, r.record_bytes, r.revision FROM intents i"
                " JOIN records r USING (intent_sha256) WHERE intent_sha256 = ?",
                (intent_sha256,),
            ).fetchone()
        if row is None:
            raise _not_found(intent_sha256)
        return StoredSnapshot(intent_sha256, bytes(row[0]), bytes(row[1]), row[2])

    def list_snapshots(self) -> list[SnapshotSummary]:
        """Every intent with its current state, oldest first (for status and lookups)."""
        with self._reading("list") as conn:
            rows = conn.execute(
                "SELECT i.intent_sha256, i.database, i.target_table, i.created_at, r.state,"
                " r.revision, i.intent_bytes FROM intents i JOIN records r USING (intent_sha256)"
                " ORDER BY i.created_at, i.intent_sha256"
            ).fetchall()
        return [
            SnapshotSummary(row[0], row[1], row[2], row[3], row[4], row[5], bytes(row[6]))
            for row in rows
        ]

    def compare_and_set(
        self,
        intent_sha256: str,
        *,
        expected: bytes,
        replacement: bytes,
        authority: ParentAuthority,
        facts: Mapping[str, Any],
    ) -> None:
        """Replace ``expected`` (exact bytes and revision) by ``replacement`` atomically.

        ``claim_lost``: the stored bytes, the revision or the authority differ; nothing
        was written. ``claim_uncertain``: the commit's outcome is not known.
        RETIRING ownership may still resolve a durable claim (EXCHANGE_INTENT or
        COMMIT_UNKNOWN); every other move needs ACTIVE.
        """
        current, revision = _record_position(expected)
        target, new_revision = _record_position(replacement)
        check_transition(current, revision, target, new_revision)
        facts_bytes = canonical_json.dumps(dict(facts))
        where = {"intent_sha256": intent_sha256, "revision": revision}
        with self._write("compare_and_set", "claim_uncertain") as conn:
            row = conn.execute(
                "SELECT record_bytes, revision FROM records WHERE intent_sha256 = ?",
                (intent_sha256,),
            ).fetchone()
            if row is None:
                raise _not_found(intent_sha256)
            if bytes(row[0]) != expected or row[1] != revision:
                raise SnapshotStoreError(
                    f"claim on {intent_sha256} lost: the stored record is at revision"
                    f" {row[1]} and differs from the expected revision {revision}",
                    code="claim_lost",
                    reason="stale_record",
                    stored_revision=row[1],
                    **where,
                )
            problem = _authority_problem(
                conn,
                authority,
                intent_sha256=intent_sha256,
                allow_retiring=current.value in UNRESOLVED_STATES,
            )
            if problem is not None:
                raise SnapshotStoreError(
                    f"claim on {intent_sha256} lost: {problem[1]}",
                    code="claim_lost",
                    reason=problem[0],
                    **where,
                )
            updated = conn.execute(
                "UPDATE records SET record_bytes = ?, revision = ?, state = ?"
                " WHERE intent_sha256 = ? AND revision = ? AND record_bytes = ?",
                (replacement, new_revision, target.value, intent_sha256, revision, expected),
            ).rowcount
            if updated != 1:  # the checks above ran in this transaction: a broken store
                raise SnapshotStoreError(
                    f"record {intent_sha256} changed inside its own transaction",
                    code="store_unavailable",
                    **where,
                )
            _append_history(
                conn, intent_sha256, new_revision, target.value, replacement, _now(), facts_bytes
            )

    def read_back(self, intent_sha256: str) -> bytes:
        """The current record bytes through a fresh, independent connection."""
        conn = self._connect("read_back")
        try:
            row = conn.execute(
                "SELECT record_bytes FROM records WHERE intent_sha256 = ?", (intent_sha256,)
            ).fetchone()
        except sqlite3.Error as exc:
            raise self._error(exc, "read_back") from exc
        finally:
            conn.close()
        data = self._after_read_back(intent_sha256, None if row is None else bytes(row[0]))
        if data is None:
            raise _not_found(intent_sha256)
        return data

    def observe(self, intent_sha256: str, facts: Mapping[str, Any]) -> None:
        """Append an observation (no record change) at the record's current revision."""
        facts_bytes = canonical_json.dumps(dict(facts))
        with self._write("observe", "store_commit_unknown") as conn:
            row = conn.execute(
                "SELECT revision, state FROM records WHERE intent_sha256 = ?", (intent_sha256,)
            ).fetchone()
            if row is None:
                raise _not_found(intent_sha256)
            _append_history(conn, intent_sha256, row[0], row[1], None, _now(), facts_bytes)

    def history(self, intent_sha256: str) -> list[HistoryEntry]:
        """The full history of one intent, oldest first (``snapshot_not_found``)."""
        with self._reading("history") as conn:
            if not conn.execute(
                "SELECT 1 FROM intents WHERE intent_sha256 = ?", (intent_sha256,)
            ).fetchone():
                raise _not_found(intent_sha256)
            rows = conn.execute(
                "SELECT id, revision, state, record_sha256, at, facts FROM history"
                " WHERE intent_sha256 = ? ORDER BY id",
                (intent_sha256,),
            ).fetchall()
        return [
            HistoryEntry(row[0], row[1], row[2], row[3], row[4], _facts(row[5])) for row in rows
        ]

    def note_step(self, key: str, facts: Mapping[str, Any]) -> StepNote:
        """Durably note a step before any record exists (e.g. a first publication's CREATE).

        Not part of the port: the first publication writes it before dispatching.
        """
        facts_bytes = canonical_json.dumps(dict(facts))
        at = _now()
        with self._write("note_step", "store_commit_unknown") as conn:
            cursor = conn.execute(
                "INSERT INTO steps (key, facts, at) VALUES (?, ?, ?)", (key, facts_bytes, at)
            )
            sequence = cursor.lastrowid
        assert sequence is not None
        return StepNote(sequence, key, at, _facts(facts_bytes))

    def step_notes(self, key: str) -> list[StepNote]:
        """Every note of ``key``, oldest first."""
        with self._reading("step_notes") as conn:
            rows = conn.execute(
                "SELECT id, key, at, facts FROM steps WHERE key = ? ORDER BY id", (key,)
            ).fetchall()
        return [StepNote(row[0], row[1], row[2], _facts(row[3])) for row in rows]

    # ------------------------------------------------------------------ the registry

    def admit(self, slot: TargetSlot, attempt_id: str) -> Admission:
        """Admit ``attempt_id`` for ``slot`` or return its existing admission.

        A new admission increments the slot's epoch and moves older ACTIVE runs of the
        slot to RETIRING; ``slot_blocked`` while a record of the slot is EXCHANGE_INTENT
        or COMMIT_UNKNOWN; ``admission_conflict`` if the attempt holds another slot.
        """
        with self._write("admit", "store_commit_unknown") as conn:
            existing = _admission_row(conn, "attempt_id", attempt_id)
            if existing is not None:
                if existing.slot != slot:
                    raise SnapshotStoreError(
                        f"attempt {attempt_id} is admitted for"
                        f" {existing.slot.database}.{existing.slot.table}",
                        code="admission_conflict",
                        attempt_id=attempt_id,
                    )
                return existing
            blocking = conn.execute(
                "SELECT r.intent_sha256, r.state FROM records r JOIN intents i"
                " USING (intent_sha256) WHERE i.database = ? AND i.target_table = ?"
                f" AND r.state IN ({', '.join('?' for _ in UNRESOLVED_STATES)})"
                " ORDER BY r.intent_sha256",
                (slot.database, slot.table, *UNRESOLVED_STATES),
            ).fetchall()
            if blocking:
                raise SnapshotStoreError(
                    f"{slot.database}.{slot.table} is held by an unresolved publication"
                    f" ({blocking[0][1]} {blocking[0][0]})",
                    code="slot_blocked",
                    attempt_id=attempt_id,
                    intents=[row[0] for row in blocking],
                )
            epoch = _slot_epoch(conn, slot) + 1
            conn.execute(
                "INSERT INTO slots VALUES (?, ?, ?) ON CONFLICT (database, target_table)"
                " DO UPDATE SET epoch = excluded.epoch",
                (slot.database, slot.table, epoch),
            )
            conn.execute(
                "UPDATE runs SET ownership = ? WHERE database = ? AND target_table = ?"
                " AND ownership = ?",
                (
                    OwnershipState.RETIRING.value,
                    slot.database,
                    slot.table,
                    OwnershipState.ACTIVE.value,
                ),
            )
            number = conn.execute("SELECT coalesce(max(attempt_epoch), 0) + 1 FROM runs")
            admission = Admission(
                uuid.uuid4().hex,
                slot,
                attempt_id,
                AttemptEpochs(epoch, number.fetchone()[0]),
                OwnershipState.ACTIVE,
            )
            conn.execute(
                "INSERT INTO runs VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    admission.parent_request,
                    slot.database,
                    slot.table,
                    attempt_id,
                    epoch,
                    admission.epochs.attempt_epoch,
                    admission.ownership.value,
                    _now(),
                ),
            )
        return admission

    def admission(self, attempt_id: str) -> Admission | None:
        """The admission of ``attempt_id``, if any."""
        with self._reading("admission") as conn:
            return _admission_row(conn, "attempt_id", attempt_id)

    def current_epoch(self, slot: TargetSlot) -> int:
        """The slot's current epoch (0 before any admission)."""
        with self._reading("current_epoch") as conn:
            return _slot_epoch(conn, slot)

    def set_ownership(self, parent_request: str, state: OwnershipState) -> None:
        """Move a run's ownership one step forward (setting the current one is a no-op)."""
        with self._write("set_ownership", "store_commit_unknown") as conn:
            run = _admission_row(conn, "parent_request", parent_request)
            if run is None:
                raise SnapshotStoreError(
                    f"no run {parent_request} is admitted",
                    code="admission_not_found",
                    parent_request=parent_request,
                )
            if run.ownership is state:
                return
            if _OWNERSHIP_NEXT.get(run.ownership) is not state:
                raise SnapshotStoreError(
                    f"ownership of {parent_request} cannot move from"
                    f" {run.ownership.value} to {state.value}",
                    code="invalid_ownership_transition",
                    parent_request=parent_request,
                )
            conn.execute(
                "UPDATE runs SET ownership = ? WHERE parent_request = ?",
                (state.value, parent_request),
            )

    def lease(self, role: str, candidates: tuple[str, ...], attempt_id: str) -> Lease:
        """Lease the first candidate without an active lease (``pool_exhausted``)."""
        with self._write("lease", "store_commit_unknown") as conn:
            busy = {
                row[0]
                for row in conn.execute("SELECT user FROM leases WHERE active = 1").fetchall()
            }
            free = [user for user in candidates if user not in busy]
            if not free:
                raise SnapshotStoreError(
                    f"every {role} principal is leased ({', '.join(candidates) or 'none'})",
                    code="pool_exhausted",
                    role=role,
                    attempt_id=attempt_id,
                )
            lease = Lease(uuid.uuid4().hex, free[0], role, attempt_id, True)
            at = _now()
            conn.execute(
                "INSERT INTO leases VALUES (?, ?, ?, ?, 1, ?, NULL)",
                (lease.lease_id, lease.user, role, attempt_id, at),
            )
            # Who holds it, in the same transaction: a holder killed with SIGKILL cannot
            # end its lease, and only this record lets a later reader prove it gone.
            holder = {"step": "issued", "holder": current_process().to_dict()}
            conn.execute(
                "INSERT INTO steps (key, facts, at) VALUES (?, ?, ?)",
                (lease_step_key(lease.lease_id), canonical_json.dumps(holder), at),
            )
        return lease

    def end_lease(self, lease_id: str) -> Lease:
        """End a lease (idempotent); returns it as stored now."""
        with self._write("end_lease", "store_commit_unknown") as conn:
            conn.execute(
                "UPDATE leases SET active = 0, ended_at = ? WHERE lease_id = ? AND active = 1",
                (_now(), lease_id),
            )
            return _lease_row(conn, lease_id)

    def end_lease_of_gone_holder(
        self, lease_id: str, facts: Mapping[str, Any]
    ) -> tuple[Lease, bool]:
        """End an operator-proven abandoned lease and note why, in one transaction.

        ``facts`` are what proved the holder gone (the caller decides; see
        :mod:`dpone.project.leases`). Returns the lease as stored now and whether
        this call ended it (False: it had already ended; nothing is written then).
        """
        note = canonical_json.dumps({"step": "ended_by_operator", **dict(facts)})
        with self._write("end_lease_of_gone_holder", "store_commit_unknown") as conn:
            at = _now()
            ended = conn.execute(
                "UPDATE leases SET active = 0, ended_at = ? WHERE lease_id = ? AND active = 1",
                (at, lease_id),
            ).rowcount
            lease = _lease_row(conn, lease_id)
            if ended:
                conn.execute(
                    "INSERT INTO steps (key, facts, at) VALUES (?, ?, ?)",
                    (lease_step_key(lease_id), note, at),
                )
        return lease, bool(ended)

    def lease_records(self, *, active_only: bool = True) -> list[LeaseRecord]:
        """Leases (by default the active ones), oldest first, with their holder process."""
        where = " WHERE l.active = 1" if active_only else ""
        with self._reading("lease_records") as conn:
            rows = conn.execute(
                f"SELECT {_LEASE_COLUMNS}, issued_at, ended_at FROM leases l{where}"
                " ORDER BY l.rowid"
            ).fetchall()
            notes = conn.execute(
                "SELECT key, facts FROM steps WHERE key LIKE 'lease/%' ORDER BY id"
            ).fetchall()
        issued: dict[str, Mapping[str, Any]] = {}
        for key, data in notes:
            facts = _facts(data)
            if facts.get("step") == "issued":
                issued[str(key)] = facts
        records = []
        for row in rows:
            holder = issued.get(lease_step_key(row[0]), {}).get("holder")
            records.append(
                LeaseRecord(
                    _lease(row[:5]),
                    row[5],
                    row[6],
                    HolderProcess.from_dict(holder) if isinstance(holder, Mapping) else None,
                )
            )
        return records

    def get_lease(self, lease_id: str) -> Lease:
        """A lease as stored now (``lease_not_found``)."""
        with self._reading("get_lease") as conn:
            return _lease_row(conn, lease_id)

    def leases_of(self, attempt_id: str) -> list[Lease]:
        """Every lease ever issued to ``attempt_id``, oldest first."""
        with self._reading("leases_of") as conn:
            rows = conn.execute(
                f"SELECT {_LEASE_COLUMNS} FROM leases WHERE attempt_id = ? ORDER BY rowid",
                (attempt_id,),
            ).fetchall()
        return [_lease(row) for row in rows]


# ---------------------------------------------------------------------- row helpers

_LEASE_COLUMNS = "lease_id, user, role, attempt_id, active"  # the order _lease reads
_RUN_COLUMNS = (
    "parent_request, database, target_table, attempt_id, slot_epoch, attempt_epoch, ownership"
)


def _not_found(intent_sha256: str) -> SnapshotStoreError:
    return SnapshotStoreError(
        f"no snapshot intent {intent_sha256} is stored",
        code="snapshot_not_found",
        intent_sha256=intent_sha256,
    )


def _facts(data: bytes) -> Mapping[str, Any]:
    value = canonical_json.loads(bytes(data), what="history facts")
    assert isinstance(value, dict)
    return value


def _append_history(
    conn: sqlite3.Connection,
    intent_sha256: str,
    revision: int,
    state: str,
    record_bytes: bytes | None,
    at: str,
    facts: bytes,
) -> None:
    digest = None if record_bytes is None else hashlib.sha256(record_bytes).hexdigest()
    conn.execute(
        "INSERT INTO history (intent_sha256, revision, state, record_sha256, at, facts)"
        " VALUES (?, ?, ?, ?, ?, ?)",
        (intent_sha256, revision, state, digest, at, facts),
    )


def _slot_epoch(conn: sqlite3.Connection, slot: TargetSlot) -> int:
    row = conn.execute(
        "SELECT epoch FROM slots WHERE database = ? AND target_table = ?",
        (slot.database, slot.table),
    ).fetchone()
    return 0 if row is None else int(row[0])


def _admission_row(conn: sqlite3.Connection, column: str, value: str) -> Admission | None:
    assert column in ("attempt_id", "parent_request")
    row = conn.execute(f"SELECT {_RUN_COLUMNS} FROM runs WHERE {column} = ?", (value,)).fetchone()
    if row is None:
        return None
    return Admission(
        row[0],
        TargetSlot(row[1], row[2]),
        row[3],
        AttemptEpochs(row[4], row[5]),
        OwnershipState(row[6]),
    )


def _lease(row: tuple[Any, ...]) -> Lease:
    return Lease(row[0], row[1], row[2], row[3], bool(row[4]))


def _lease_row(conn: sqlite3.Connection, lease_id: str) -> Lease:
    row = conn.execute(
        f"SELECT {_LEASE_COLUMNS} FROM leases WHERE lease_id = ?", (lease_id,)
    ).fetchone()
    if row is None:
        raise SnapshotStoreError(
            f"no lease {lease_id} was issued", code="lease_not_found", lease_id=lease_id
        )
    return _lease(row)


def _authority_problem(
    conn: sqlite3.Connection,
    authority: ParentAuthority,
    *,
    allow_retiring: bool,
    intent_sha256: str | None = None,
) -> tuple[str, str] | None:
    """Why ``authority`` may not write now (code, sentence), or None when it may."""
    run = _admission_row(conn, "parent_request", authority.parent_request)
    if run is None:
        return "attempt_fenced", f"run {authority.parent_request} is not admitted"
    if intent_sha256 is not None:
        bound = conn.execute(
            "SELECT parent_request, database, target_table FROM intents WHERE intent_sha256 = ?",
            (intent_sha256,),
        ).fetchone()
        if bound is None or (bound[0], TargetSlot(bound[1], bound[2])) != (
            authority.parent_request,
            authority.slot,
        ):
            return "attempt_fenced", "the intent belongs to another run or slot"
    current = _slot_epoch(conn, authority.slot)
    if run.slot != authority.slot or run.epochs.slot_epoch != authority.slot_epoch:
        return "attempt_fenced", f"run {authority.parent_request} holds another slot epoch"
    if current != authority.slot_epoch:
        return "attempt_fenced", (
            f"the slot is at epoch {current}, the run was admitted at {authority.slot_epoch}"
        )
    allowed = {OwnershipState.ACTIVE} | ({OwnershipState.RETIRING} if allow_retiring else set())
    if run.ownership not in allowed:
        return "ownership_not_active", f"run {authority.parent_request} is {run.ownership.value}"
    return None
