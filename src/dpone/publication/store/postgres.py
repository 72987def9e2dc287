"""The snapshot store on PostgreSQL: one store that the workers of a project share.

``[project] store = "postgresql://USER@HOST:PORT/DB"`` keeps everything the SQLite store
keeps in the schema ``dpone`` of that database, with the SQLite store's semantics: a
write is one unit of work behind a transaction-scoped advisory lock of the store, a read
one ``REPEATABLE READ`` snapshot, ``read_back`` a connection of its own, and triggers
refuse what SQL can. The store's parts run their statements unchanged through
:class:`_Connection`, which gives psycopg the ``?`` parameters as its own. The password
is libpq's (``PGPASSFILE`` or ``~/.pgpass``) and never appears in the URL, argv, a report
or an error. See docs/publication.md ("The snapshot store") and docs/deploying.md.
"""

from __future__ import annotations

import os
import re
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

from dpone.errors import ConfigurationError
from dpone.publication.store.connections import (
    BUSY_TIMEOUT_SECONDS,
    IdlePool,
    NoHooks,
    StoreConnection,
    StoreCursor,
    StoreHooks,
    fresh_connection,
    unit_of_work,
)
from dpone.publication.store.errors import SnapshotStoreError
from dpone.publication.store.schema import APPLICATION_ID, SCHEMA_VERSION

if TYPE_CHECKING:
    import psycopg

SCHEMA = "dpone"
URL_SCHEMES = ("postgresql", "postgres")
# The advisory lock every write takes first (one bigint key: the store's; the dispatch
# gate and the table lock use the two-int key space, which never overlaps it).
WRITE_LOCK_KEY = APPLICATION_ID
CONNECT_SECONDS = 10
# A writer idle inside its transaction this long is ended by the server (its lock freed).
WRITE_IDLE_SECONDS = 60.0

_SCHEMA_SQL = """
CREATE TABLE store_identity (
    application_id BIGINT NOT NULL, schema_version INTEGER NOT NULL
);
CREATE TABLE intents (
    intent_sha256 TEXT PRIMARY KEY, intent_bytes BYTEA NOT NULL, created_at TEXT NOT NULL,
    parent_request TEXT NOT NULL, database TEXT NOT NULL, target_table TEXT NOT NULL
);
CREATE TABLE records (
    intent_sha256 TEXT PRIMARY KEY REFERENCES intents (intent_sha256),
    record_bytes BYTEA NOT NULL, revision INTEGER NOT NULL CHECK (revision >= 1),
    state TEXT NOT NULL
);
CREATE TABLE history (
    id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    intent_sha256 TEXT NOT NULL REFERENCES intents (intent_sha256),
    revision INTEGER NOT NULL, state TEXT NOT NULL, record_sha256 TEXT,
    at TEXT NOT NULL, facts BYTEA NOT NULL, record_bytes BYTEA
);
CREATE INDEX history_of_intent ON history (intent_sha256, id);
CREATE TABLE slots (
    database TEXT NOT NULL, target_table TEXT NOT NULL, epoch BIGINT NOT NULL,
    PRIMARY KEY (database, target_table)
);
CREATE TABLE runs (
    parent_request TEXT PRIMARY KEY, database TEXT NOT NULL, target_table TEXT NOT NULL,
    attempt_id TEXT NOT NULL UNIQUE, slot_epoch BIGINT NOT NULL,
    attempt_epoch BIGINT NOT NULL UNIQUE,
    ownership TEXT NOT NULL CHECK (ownership IN ('active', 'retiring', 'retired')),
    admitted_at TEXT NOT NULL,
    activated INTEGER NOT NULL DEFAULT 1 CHECK (activated IN (0, 1))
);
CREATE TABLE leases (
    lease_id TEXT PRIMARY KEY, "user" TEXT NOT NULL, role TEXT NOT NULL,
    attempt_id TEXT NOT NULL, active INTEGER NOT NULL CHECK (active IN (0, 1)),
    issued_at TEXT NOT NULL, ended_at TEXT,
    rowid BIGINT GENERATED ALWAYS AS IDENTITY UNIQUE
);
CREATE UNIQUE INDEX one_active_lease_per_user ON leases ("user") WHERE active = 1;
CREATE TABLE steps (
    id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY, key TEXT NOT NULL,
    facts BYTEA NOT NULL, at TEXT NOT NULL
);
CREATE INDEX steps_of_key ON steps (key, id);
CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN RAISE EXCEPTION '%', TG_ARGV[0]; END $$;
CREATE TRIGGER intents_immutable BEFORE UPDATE OR DELETE ON intents
    FOR EACH ROW EXECUTE FUNCTION refuse('intents are immutable');
CREATE TRIGGER records_next_revision BEFORE UPDATE ON records FOR EACH ROW
    WHEN (NEW.revision != OLD.revision + 1 OR NEW.intent_sha256 != OLD.intent_sha256)
    EXECUTE FUNCTION refuse('a record changes only to its next revision');
CREATE TRIGGER records_kept BEFORE DELETE ON records
    FOR EACH ROW EXECUTE FUNCTION refuse('records are never deleted');
CREATE TRIGGER history_append_only BEFORE UPDATE OR DELETE ON history
    FOR EACH ROW EXECUTE FUNCTION refuse('history is append-only');
CREATE TRIGGER steps_append_only BEFORE UPDATE OR DELETE ON steps
    FOR EACH ROW EXECUTE FUNCTION refuse('steps are append-only');
CREATE TRIGGER kept_intents BEFORE TRUNCATE ON intents
    FOR EACH STATEMENT EXECUTE FUNCTION refuse('intents are immutable');
CREATE TRIGGER kept_records BEFORE TRUNCATE ON records
    FOR EACH STATEMENT EXECUTE FUNCTION refuse('records are never deleted');
CREATE TRIGGER kept_history BEFORE TRUNCATE ON history
    FOR EACH STATEMENT EXECUTE FUNCTION refuse('history is append-only');
CREATE TRIGGER kept_steps BEFORE TRUNCATE ON steps
    FOR EACH STATEMENT EXECUTE FUNCTION refuse('steps are append-only');
CREATE TRIGGER ownership_forward BEFORE UPDATE OF ownership ON runs FOR EACH ROW
    WHEN (NEW.ownership != OLD.ownership AND NOT (
        (OLD.ownership = 'active' AND NEW.ownership = 'retiring')
        OR (OLD.ownership = 'retiring' AND NEW.ownership = 'retired')))
    EXECUTE FUNCTION refuse('ownership only moves forward');
CREATE TRIGGER activation_forward BEFORE UPDATE OF activated ON runs FOR EACH ROW
    WHEN (OLD.activated = 1 AND NEW.activated != 1)
    EXECUTE FUNCTION refuse('an activated run stays activated');
"""


def is_store_url(location: str | os.PathLike[str]) -> bool:
    """Whether ``location`` names a PostgreSQL store (``postgresql://...``, any case)."""
    return isinstance(location, str) and location.split("://", 1)[0].lower() in URL_SCHEMES


# libpq parameters that carry a secret: never in the URL, wherever they appear.
_SECRET_PARAMETERS = ("password", "sslpassword")


def check_store_url(url: str) -> str:
    """``url`` when it names a database without a password (``store_url_invalid``)."""
    parts = urlsplit(url)
    query = {key.lower() for key in parse_qs(parts.query, keep_blank_values=True)}
    if parts.password is not None or query & set(_SECRET_PARAMETERS):
        # Never echoed: the URL holds a secret.
        raise ConfigurationError(
            "the PostgreSQL store's URL carries a password: remove it and give the password "
            "in a libpq password file (PGPASSFILE or ~/.pgpass)",
            code="store_url_invalid",
        )
    if parts.scheme.lower() not in URL_SCHEMES or not parts.hostname or len(parts.path) < 2:
        raise ConfigurationError(
            f"{url!r} is not a PostgreSQL store: postgresql://USER@HOST:PORT/DATABASE",
            code="store_url_invalid",
            url=url,
        )
    return url


def connect(url: str, purpose: str, *, search_path: str | None = None) -> Any:
    """A new autocommit session to ``url`` (the password from libpq's password file),
    with TCP keepalives, so that a lost host's session ends in about half a minute,
    and none of the role's idle or statement timeouts, which would end a held lock's
    session without a word. ``purpose`` leads the session's name (``pg_stat_activity``)."""
    psycopg = _psycopg()
    options = "-c idle_session_timeout=0 -c statement_timeout=0"
    if search_path is not None:
        options += f" -c search_path={search_path}"
    return psycopg.connect(
        url,
        autocommit=True,
        connect_timeout=CONNECT_SECONDS,
        application_name=f"dpone pid {os.getpid()} {purpose}"[:63],
        keepalives=1,
        keepalives_idle=10,
        keepalives_interval=5,
        keepalives_count=3,
        options=options,
    )


def _psycopg() -> Any:
    try:
        import psycopg
    except ImportError as exc:
        raise ConfigurationError(
            "a PostgreSQL store needs psycopg: `pip install 'dpone[postgres]'`",
            code="postgres_not_installed",
        ) from exc
    return psycopg


_PLACEHOLDER = re.compile(r"\?")


class _Cursor:
    """A psycopg cursor as the store's parts read it (with ``lastrowid``)."""

    def __init__(self, cursor: psycopg.Cursor[Any], lastrowid: int | None) -> None:
        self._cursor = cursor
        self._lastrowid = lastrowid

    @property
    def rowcount(self) -> int:
        return int(self._cursor.rowcount)

    @property
    def lastrowid(self) -> int | None:
        return self._lastrowid

    def fetchone(self) -> Any:
        return self._cursor.fetchone()

    def fetchall(self) -> list[Any]:
        return list(self._cursor.fetchall())


# Idle connections kept per store URL in this process: a new PostgreSQL session costs a
# TCP connection and a SCRAM sign-in (about 6 ms here), and a refresh makes hundreds of
# store calls. A connection goes back only outside any transaction and unbroken.
# Each with when it went back.
_KEPT: IdlePool[tuple[psycopg.Connection[Any], float]] = IdlePool(per_key=4)
# A connection idle longer than this is asked ``SELECT 1`` before it is used again (the
# server may have ended the session meanwhile).
_IDLE_CHECK_SECONDS = 5.0


class _Connection:
    """A psycopg connection that runs the store's SQLite-style statements."""

    def __init__(
        self,
        conn: psycopg.Connection[Any],
        url: str | None = None,
        reopen: Callable[[], psycopg.Connection[Any]] | None = None,
    ) -> None:
        self.conn = conn
        self.url = url  # kept for reuse on close (None: closed for good)
        # A kept session the server may have ended while idle: until its first statement
        # succeeds, a broken session is replaced once (nothing was sent through it yet).
        self._reopen = reopen

    def execute(self, sql: str, parameters: Any = (), /) -> StoreCursor:
        text = _PLACEHOLDER.sub("%s", sql.replace("%", "%%"))
        returning = text.lstrip().upper().startswith("INSERT INTO STEPS")
        if returning:
            text += " RETURNING id"
        try:
            cursor = self.conn.execute(text, tuple(parameters))
        except _psycopg().OperationalError:
            if self._reopen is None:
                raise
            self.conn.close()
            self.conn = self._reopen()
            self._reopen = None
            cursor = self.conn.execute(text, tuple(parameters))
        self._reopen = None
        lastrowid = None
        if returning:
            row = cursor.fetchone()
            assert row is not None  # INSERT ... RETURNING gives its row
            lastrowid = int(row[0])
        return _Cursor(cursor, lastrowid)

    @property
    def in_transaction(self) -> bool:
        status = self.conn.info.transaction_status
        return bool(status != _psycopg().pq.TransactionStatus.IDLE)

    def close(self) -> None:
        conn, url = self.conn, self.url
        reusable = (
            url is not None
            and not conn.closed
            and conn.info.transaction_status == _psycopg().pq.TransactionStatus.IDLE
        )
        if reusable and url is not None and _KEPT.give(url, (conn, time.monotonic()))[0]:
            return
        conn.close()


def _usable(conn: psycopg.Connection[Any], since: float) -> bool:
    """Whether a kept connection still works (asked only after a long idle)."""
    if conn.closed:
        return False
    if time.monotonic() - since < _IDLE_CHECK_SECONDS:
        return True
    try:
        conn.execute("SELECT 1")
    except _psycopg().Error:
        conn.close()
        return False
    return True


class PostgresConnections:
    """The store's schema in a PostgreSQL database, with its reads and units of work
    (:class:`~dpone.publication.store.connections.StoreConnections` on PostgreSQL)."""

    def __init__(
        self,
        url: str,
        *,
        busy_timeout: float = BUSY_TIMEOUT_SECONDS,
        create: bool = True,
        hooks: StoreHooks | None = None,
    ) -> None:
        """Open (``create``: and create if missing) the store in the database ``url`` names.

        With ``create=False`` a database without the store's schema is ``store_missing``
        and nothing is created. ``hooks``: the store's fault seams, called around every
        ``COMMIT`` (the opening's included).
        """
        self.url = check_store_url(url)
        # Only for messages; a PostgreSQL store has no file.
        self.path = Path(self.url.replace("://", "/"))
        self.busy_timeout = busy_timeout
        self.hooks: StoreHooks = NoHooks() if hooks is None else hooks
        self._open(create)

    @property
    def location(self) -> str:
        """The store's URL (it never holds a password: :func:`check_store_url`)."""
        return self.url

    def connect(self, operation: str) -> _Connection:
        """A kept idle session of this store when one still works, else a new one."""
        found = _KEPT.take(self.url)
        if found is not None and _usable(*found):
            return _Connection(found[0], self.url, self._reopen)
        return self._new_connection(operation, keep=True)

    def _new_connection(self, operation: str, *, keep: bool) -> _Connection:
        psycopg = _psycopg()
        try:
            conn = connect(self.url, f"store {socket.gethostname()}", search_path=SCHEMA)
        except psycopg.Error as exc:
            raise self.error(exc, operation) from exc
        return _Connection(conn, self.url if keep else None, self._reopen if keep else None)

    def _reopen(self) -> psycopg.Connection[Any]:
        """A new session for a kept one the server ended while it was idle."""
        conn: psycopg.Connection[Any] = connect(
            self.url, f"store {socket.gethostname()}", search_path=SCHEMA
        )
        return conn

    def begin_write(self, conn: Any) -> None:
        """The SQLite store's ``BEGIN IMMEDIATE``: the store's advisory lock, first.

        A wait for the lock that runs out wrote nothing: ``store_busy``, definite. A
        writer that stalls inside its transaction (stopped, or its host lost) is ended
        by the server after :data:`WRITE_IDLE_SECONDS`, so it holds the others up no
        longer than that.
        """
        conn.execute("BEGIN ISOLATION LEVEL READ COMMITTED")
        conn.execute(f"SET LOCAL lock_timeout = {max(int(self.busy_timeout * 1000), 1)}")
        conn.execute(
            f"SET LOCAL idle_in_transaction_session_timeout = {int(WRITE_IDLE_SECONDS * 1000)}"
        )
        try:
            conn.execute(f"SELECT pg_advisory_xact_lock({WRITE_LOCK_KEY})")
        except _psycopg().errors.LockNotAvailable as exc:
            raise SnapshotStoreError(
                f"the store {self.url} stayed locked by another writer for "
                f"{self.busy_timeout:g} s; nothing was written: run it again",
                code="store_busy",
                store=self.url,
            ) from exc

    def storage_errors(self) -> tuple[type[BaseException], ...]:
        """psycopg's errors: what :meth:`write_error` maps."""
        return (_psycopg().Error,)

    def error(self, exc: BaseException, operation: str) -> SnapshotStoreError:
        """A failure outside a commit: ``store_unavailable``."""
        return self.write_error(exc, operation, False, None)

    def write_error(
        self, exc: BaseException, operation: str, committing: bool, uncertain: str | None
    ) -> SnapshotStoreError:
        """The one mapping of a PostgreSQL failure to a typed error (outcome known or not)."""
        psycopg = _psycopg()
        busy = isinstance(exc, psycopg.errors.LockNotAvailable)
        where = {"store": self.url, "operation": operation}
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if uncertain is not None and (committing or busy):
            phase = "while committing" if committing else "while the store was busy"
            return SnapshotStoreError(
                f"{operation} on {self.url} failed {phase}; whether it was written is "
                f"unknown: {text}",
                code=uncertain,
                **where,
            )
        return SnapshotStoreError(
            f"{operation} on {self.url} failed: {text}", code="store_unavailable", **where
        )

    def _open(self, create: bool) -> None:
        """Refuse a foreign schema, create the store's when missing (``create``)."""
        with self.reading("open") as conn:
            identity = _identity(conn, self.url)
        if identity == "current":
            return
        if not create:
            raise SnapshotStoreError(
                f"no snapshot store in {self.url} (the database has no {SCHEMA} schema yet); "
                "check the project's store",
                code="store_missing",
                store=self.url,
            )
        with self.write("open", "store_commit_unknown") as work:
            # Checked again under the write lock: another worker may have created it.
            if _identity(work, self.url) == "fresh":
                work.execute(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}")
                for statement in _statements(_SCHEMA_SQL):
                    work.execute(statement)
                work.execute(
                    "INSERT INTO store_identity VALUES (?, ?)", (APPLICATION_ID, SCHEMA_VERSION)
                )

    def independent_connection(self, operation: str) -> StoreConnection:
        """A session of its own, never a kept one: the read-back is independent."""
        return self._new_connection(operation, keep=False)

    def fresh(self, operation: str) -> AbstractContextManager[StoreConnection]:
        """A new session of its own, outside any transaction (an independent read)."""
        return fresh_connection(self, operation)

    def write(self, operation: str, uncertain: str) -> AbstractContextManager[StoreConnection]:
        """One unit of work: yields the connection, commits when the block succeeds."""
        return unit_of_work(self, operation, uncertain)

    @contextmanager
    def reading(self, operation: str) -> Iterator[StoreConnection]:
        """One ``REPEATABLE READ`` read-only snapshot on a kept or new session."""
        conn = self.connect(operation)
        psycopg = _psycopg()
        try:
            conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            yield conn
            conn.execute("ROLLBACK")  # ends the snapshot: the connection may be kept
        except psycopg.Error as exc:
            raise self.error(exc, operation) from exc
        finally:
            conn.close()  # kept only outside a transaction (else closed, which ends it)


def _identity(conn: StoreConnection, url: str) -> str:
    """``fresh`` (no store schema) or ``current``; anything else is refused."""
    # A plain read of the catalog, in the statement's snapshot: it sees a schema another
    # worker committed while this one waited for the write lock (to_regclass reads the
    # session's catalog cache, which that wait does not refresh).
    found = conn.execute(
        "SELECT 1 FROM pg_catalog.pg_tables WHERE schemaname = ? AND tablename = ?",
        (SCHEMA, "store_identity"),
    ).fetchone()
    if found is None:
        return "fresh"
    rows = conn.execute(f"SELECT application_id, schema_version FROM {SCHEMA}.store_identity")
    stamped = rows.fetchall()
    if stamped != [(APPLICATION_ID, SCHEMA_VERSION)]:
        raise SnapshotStoreError(
            f"the {SCHEMA} schema of {url} is not a dpone snapshot store of schema version "
            f"{SCHEMA_VERSION} (found {stamped})",
            code="store_schema_mismatch",
            store=url,
        )
    return "current"


def _statements(script: str) -> Iterator[str]:
    """The schema's statements (a function body's ``$$`` ... ``$$`` kept whole)."""
    buffer = ""
    for line in script.strip().splitlines(keepends=True):
        buffer += line
        quoted = buffer.count("$$") % 2 == 1
        if buffer.rstrip().endswith(";") and not quoted:
            yield buffer.strip().rstrip(";")
            buffer = ""
