"""The store's connections: opening the file, fresh reads and units of work.

:class:`StoreConnections` is what every part of the store receives (its own object,
never a base class): every write one unit of work, every read a fresh connection's
snapshot. :class:`SqliteConnections` gives it on one file,
:class:`~dpone.publication.store.postgres.PostgresConnections` on a PostgreSQL database;
both call the store's fault seams (:class:`StoreHooks`) around every ``COMMIT``. See
docs/publication.md ("The snapshot store").
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from types import TracebackType
from typing import Any, Generic, Protocol, TypeVar

from dpone.publication.store.errors import (
    SnapshotStoreError,
    sqlite_busy,
    store_error,
    store_missing,
)
from dpone.publication.store.schema import check_identity, create_schema, migrate, open_file

BUSY_TIMEOUT_SECONDS = 10.0
T = TypeVar("T")


class IdlePool(Generic[T]):
    """Idle store connections kept in this process for the next store calls, per key
    (a store's file or URL), at most ``per_key`` each and ``total`` over all keys (the
    least recently used key's go first); thread-safe.

    The caller decides what may go back (outside any transaction, whole) and closes
    what :meth:`give` refuses or evicts. In a forked child the parent's connections are
    never used nor closed (closing would end or touch them for the parent too): the
    pool forgets them but keeps them referenced, so no collector closes them either.
    """

    def __init__(self, per_key: int, total: int | None = None) -> None:
        self.per_key, self.total = per_key, total
        self._idle: dict[str, list[T]] = {}
        self._lock = threading.Lock()
        self._inherited: list[T] = []
        os.register_at_fork(after_in_child=self._forget)

    def take(self, key: str) -> T | None:
        """The most recently kept connection of ``key``, or None."""
        with self._lock:
            idle = self._idle.get(key)
            return idle.pop() if idle else None

    def give(self, key: str, conn: T) -> tuple[bool, list[T]]:
        """Keep ``conn`` under ``key`` if there is room: whether it was kept, and the
        least recently used connections over the total, taken out for the caller to close."""
        with self._lock:
            idle = self._idle.pop(key, [])  # put back last: the most recently used key
            self._idle[key] = idle
            kept = len(idle) < self.per_key
            if kept:
                idle.append(conn)
            evicted: list[T] = []
            while self.total is not None and self._count() > self.total:
                oldest = next(iter(self._idle))
                evicted.append(self._idle[oldest].pop(0))
                if not self._idle[oldest]:
                    del self._idle[oldest]
            return kept, evicted

    def clear(self) -> list[T]:
        """Take out every idle connection (for the caller to close)."""
        with self._lock:
            taken = [conn for idle in self._idle.values() for conn in idle]
            self._idle.clear()
            return taken

    def idle(self) -> list[tuple[str, T]]:
        """Every idle connection with its key, a copy (what tests look at)."""
        with self._lock:
            return [(key, conn) for key, idle in self._idle.items() for conn in idle]

    def _count(self) -> int:
        return sum(len(idle) for idle in self._idle.values())

    def _forget(self) -> None:
        self._inherited.extend(conn for idle in self._idle.values() for conn in idle)
        self._idle.clear()
        self._lock = threading.Lock()  # the parent's may have been held at the fork


# Idle SQLite connections: a new one costs a file open, the WAL index's mapping and
# three PRAGMAs, and a refresh makes about 200 store calls (a fifth of a small table's
# client CPU, measured 2026-12-07). A connection goes back only outside any
# transaction, its read-only switch off, unbroken; a read on it is still a new
# snapshot (each read begins its own transaction). Four a store file and sixteen over
# all (a process that opened many stores, a test session or an orchestrator, keeps the
# most recently used, not descriptors for every one).
_KEPT: IdlePool[_KeptConnection] = IdlePool(per_key=4, total=16)


class _KeptConnection(sqlite3.Connection):
    """A store connection whose close keeps it for the next store call of this process
    (:data:`_KEPT`), when it is idle and whole; :meth:`discard` really closes it."""

    keep_to: str | None = None  # the pool's key (None: never kept)

    def close(self) -> None:
        kept = False
        try:
            key = self.keep_to
            if key is not None and self._reset():
                kept, evicted = _KEPT.give(key, self)
                for old in evicted:
                    old.discard()
        finally:
            # Anything short of kept (a signal's exception in the reset included) closes
            # it: a connection nobody holds would keep its locks.
            if not kept:
                self.discard()

    def discard(self) -> None:
        """Close for good."""
        self.keep_to = None
        super().close()

    def _reset(self) -> bool:
        """Whether this connection is back to how it was opened (no transaction, writable)."""
        try:
            if self.in_transaction:
                self.execute("ROLLBACK")
            self.execute("PRAGMA query_only = OFF")
        except sqlite3.Error:
            return False
        return not self.in_transaction


def discard_kept_connections() -> None:
    """Really close every idle connection this process keeps (its locks on the files go)."""
    for conn in _KEPT.clear():
        conn.discard()


class StoreCursor(Protocol):
    """What the store's parts read from a statement (sqlite3's cursor, or psycopg's
    behind :mod:`~dpone.publication.store.postgres`)."""

    @property
    def rowcount(self) -> int: ...

    @property
    def lastrowid(self) -> int | None: ...

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...


class StoreConnection(Protocol):
    """A connection inside a store transaction: statements with ``?`` parameters."""

    def execute(self, sql: str, parameters: Any = (), /) -> StoreCursor: ...

    def close(self) -> None: ...


class StoreHooks(Protocol):
    """The fault seams of a store (:class:`~dpone.publication.store.SnapshotStore`'s,
    which tests override): its connections call the commit hooks, its records the
    read-back hook."""

    def _before_commit(self, operation: str) -> None: ...

    def _after_commit(self, operation: str) -> None: ...

    def _after_read_back(self, intent_sha256: str, data: bytes | None) -> bytes | None: ...


class NoHooks:
    """Seams that do nothing: connections opened outside a store facade."""

    def _before_commit(self, operation: str) -> None:
        """Nothing before ``COMMIT``."""

    def _after_commit(self, operation: str) -> None:
        """Nothing after ``COMMIT``."""

    def _after_read_back(self, intent_sha256: str, data: bytes | None) -> bytes | None:
        """What was read, as it was."""
        return data


class StoreConnections(Protocol):
    """One store's connections (:class:`SqliteConnections` or
    :class:`~dpone.publication.store.postgres.PostgresConnections`): what every part of
    the store receives to read and write, and what :class:`UnitOfWork` runs on."""

    path: Path  # the file (a PostgreSQL store's only for messages)
    busy_timeout: float
    hooks: StoreHooks

    @property
    def location(self) -> str:
        """Where the store is, for messages and ownership markers (never a secret)."""
        ...

    def connect(self, operation: str) -> Any:
        """A connection in autocommit mode (a kept idle one when there is one)."""
        ...

    def begin_write(self, conn: Any) -> None:
        """Begin a write transaction: one writer at a time, each seeing every commit."""
        ...

    def storage_errors(self) -> tuple[type[BaseException], ...]:
        """The exceptions of this backend that :meth:`write_error` maps."""
        ...

    def write_error(
        self, exc: BaseException, operation: str, committing: bool, uncertain: str | None
    ) -> SnapshotStoreError:
        """The one mapping of this backend's failure to a typed error."""
        ...

    def error(self, exc: BaseException, operation: str) -> SnapshotStoreError:
        """A failure outside a commit: ``store_unavailable`` (or the backend's own)."""
        ...

    def independent_connection(self, operation: str) -> StoreConnection:
        """A connection shared with no other store call: a new one, never kept."""
        ...

    def reading(self, operation: str) -> AbstractContextManager[StoreConnection]:
        """A read-only snapshot on a fresh connection."""
        ...

    def fresh(self, operation: str) -> AbstractContextManager[StoreConnection]:
        """A new connection of its own, outside any transaction (an independent read)."""
        ...

    def write(self, operation: str, uncertain: str) -> AbstractContextManager[StoreConnection]:
        """One unit of work: yields the connection, commits when the block succeeds."""
        ...


class UnitOfWork:
    """A write: the backend's begin (SQLite's ``BEGIN IMMEDIATE``), the checks and the
    writes, :meth:`commit`; rolled back unless committed. An error while committing (a
    commit hook's included) leaves the outcome unknown."""

    def __init__(self, store: StoreConnections, operation: str, uncertain: str) -> None:
        self.store = store
        self.operation = operation
        self.uncertain = uncertain
        self.committing = False
        self.committed = False

    def __enter__(self) -> Any:
        self.conn = self.store.connect(self.operation)
        try:
            self.store.begin_write(self.conn)
        except BaseException as exc:
            self.conn.close()
            if isinstance(exc, self.store.storage_errors()):
                raise self._mapped(exc) from exc
            raise
        return self.conn

    def commit(self) -> None:
        self.committing = True
        self.store.hooks._before_commit(self.operation)
        self.conn.execute("COMMIT")
        self.store.hooks._after_commit(self.operation)
        self.committed = True

    def _mapped(self, exc: BaseException) -> SnapshotStoreError:
        return self.store.write_error(exc, self.operation, self.committing, self.uncertain)

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        errors = self.store.storage_errors()
        try:
            if not self.committed and self.conn.in_transaction:
                self.conn.execute("ROLLBACK")
        except errors as cleanup:
            if exc is not None:
                exc.add_note(f"the rollback failed too: {cleanup}")
        finally:
            self.conn.close()
        mappable = isinstance(exc, errors) or (self.committing and isinstance(exc, Exception))
        if exc is not None and mappable and not isinstance(exc, SnapshotStoreError):
            raise self._mapped(exc) from exc


@contextmanager
def unit_of_work(
    store: StoreConnections, operation: str, uncertain: str
) -> Iterator[StoreConnection]:
    """One unit of work on ``store``: yields the connection, commits when the block succeeds."""
    work = UnitOfWork(store, operation, uncertain)
    with work as conn:
        yield conn
        work.commit()


@contextmanager
def fresh_connection(store: StoreConnections, operation: str) -> Iterator[StoreConnection]:
    """A new connection of ``store``'s own, outside any transaction (an independent read)."""
    conn = store.independent_connection(operation)
    try:
        yield conn
    except store.storage_errors() as exc:
        raise store.error(exc, operation) from exc
    finally:
        conn.close()


class SqliteConnections:
    """The opened store file: its fresh reads and units of work
    (:class:`StoreConnections` on SQLite)."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        busy_timeout: float = BUSY_TIMEOUT_SECONDS,
        create: bool = True,
        hooks: StoreHooks | None = None,
    ) -> None:
        """Open (``create``: and create if missing) the store at ``path``.

        With ``create=False`` a missing file, or one that holds no store yet, is
        ``store_missing`` and nothing is created or written. ``hooks``: the store's
        fault seams, called around every ``COMMIT`` (the opening's included).
        """
        self.path = Path(path)
        self.busy_timeout = busy_timeout
        self.hooks: StoreHooks = NoHooks() if hooks is None else hooks
        self._uri = f"{self.path.absolute().as_uri()}?mode=rw"
        self._open(create)

    def _open(self, create: bool) -> None:
        """Create the file ``0600`` if needed, refuse a foreign one, set WAL, create the schema."""
        open_file(self.path, create)
        with self.reading("open") as conn:
            assert isinstance(conn, sqlite3.Connection)  # this class's own connections
            identity = check_identity(conn, self.path)  # before anything could modify it
        fresh = identity == "fresh"
        if fresh and not create:
            raise store_missing(self.path, "the file holds no store yet")
        mode = self._switch_to_wal()
        if str(mode).lower() != "wal":
            raise SnapshotStoreError(
                f"{self.path} cannot use WAL mode (journal_mode is {mode})",
                code="store_unavailable",
                path=str(self.path),
            )
        if identity == "current":
            return
        with self.write("open", "store_commit_unknown") as work:
            assert isinstance(work, sqlite3.Connection)
            # Checked again inside the transaction: another process may have created or
            # upgraded it meanwhile.
            if check_identity(work, self.path) == "fresh":
                create_schema(work)
            else:
                migrate(work, self.path)

    def _switch_to_wal(self) -> str:
        """``PRAGMA journal_mode = WAL``, retried while another connection holds a write lock.

        Leaving the rollback journal of a new file needs its exclusive lock, and SQLite
        answers ``SQLITE_BUSY`` at once, without the busy handler, while another connection
        holds the write lock (another process creating the schema of the same new store,
        ``refresh --jobs`` starting on a fresh project): waited for as the busy timeout
        would, never reported as an unavailable store.
        """
        deadline = time.monotonic() + self.busy_timeout
        pause = 0.005
        while True:
            conn = self.connect("open")
            try:
                return str(conn.execute("PRAGMA journal_mode = WAL").fetchone()[0])
            except sqlite3.Error as exc:
                if not sqlite_busy(exc) or time.monotonic() + pause > deadline:
                    raise self.error(exc, "open") from exc
            finally:
                conn.close()
            time.sleep(pause)
            pause = min(pause * 2, 0.1)

    def begin_write(self, conn: Any) -> None:
        """Begin a write transaction: one writer at a time, each seeing every commit."""
        conn.execute("BEGIN IMMEDIATE")

    def storage_errors(self) -> tuple[type[BaseException], ...]:
        """The exceptions of this backend that :meth:`write_error` maps."""
        return (sqlite3.Error,)

    def write_error(
        self, exc: BaseException, operation: str, committing: bool, uncertain: str | None
    ) -> SnapshotStoreError:
        """The one mapping of this backend's failure to a typed error."""
        return store_error(
            exc, path=self.path, operation=operation, committing=committing, uncertain=uncertain
        )

    def connect(self, operation: str, *, keep: bool = True) -> sqlite3.Connection:
        """A connection in autocommit mode (transactions are explicit): a kept idle one
        of this store's file, or a new one (kept when closed, unless not ``keep``)."""
        key = self._kept_key() if keep else None
        kept = _KEPT.take(key) if key is not None else None
        if kept is not None:
            return kept
        try:
            conn = sqlite3.connect(
                self._uri,
                uri=True,
                timeout=self.busy_timeout,
                isolation_level=None,
                factory=_KeptConnection,
                check_same_thread=False,  # used by one thread at a time: the pool's lock
            )
        except sqlite3.Error as exc:
            raise self.error(exc, operation) from exc
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout * 1000)}")
            conn.execute("PRAGMA synchronous = FULL")
            conn.execute("PRAGMA foreign_keys = ON")
        except BaseException as exc:
            # A signal here too: a connection nobody holds would keep its locks until
            # the traceback that references it is gone.
            conn.close()
            if isinstance(exc, sqlite3.Error):
                raise self.error(exc, operation) from exc
            raise
        # Kept only if the path held the same file before and after it was opened.
        conn.keep_to = key if key is not None and key == self._kept_key() else None
        return conn

    def _kept_key(self) -> str | None:
        """The pool's key of this store's file as it is now: its path and its inode (a
        file replaced under the same path is another store), or None when it cannot
        be read (a new connection then fails or succeeds on its own)."""
        try:
            found = os.stat(self.path)
        except OSError:
            return None
        # The busy timeout too: it is set once, when a connection is opened.
        return f"{self._uri}\0{found.st_dev}:{found.st_ino}\0{self.busy_timeout}"

    def error(self, exc: BaseException, operation: str) -> SnapshotStoreError:
        """A failure outside a commit, mapped to a typed error."""
        return store_error(
            exc, path=self.path, operation=operation, committing=False, uncertain=None
        )

    @property
    def location(self) -> str:
        """Where the store is, for messages and ownership markers (never a secret)."""
        return str(self.path.absolute())

    def independent_connection(self, operation: str) -> StoreConnection:
        """A connection shared with no other store call: a new one, never kept."""
        return self.connect(operation, keep=False)

    def fresh(self, operation: str) -> AbstractContextManager[StoreConnection]:
        """A new connection of its own, outside any transaction (an independent read)."""
        return fresh_connection(self, operation)

    @contextmanager
    def reading(self, operation: str) -> Iterator[StoreConnection]:
        """A read-only snapshot on a fresh connection (``BEGIN`` ... ``ROLLBACK``)."""
        conn = self.connect(operation)
        try:
            conn.execute("PRAGMA query_only = ON")
            conn.execute("BEGIN")
            yield conn
        except sqlite3.Error as exc:
            raise self.error(exc, operation) from exc
        finally:
            conn.close()  # ends the read transaction (rolled back if the connection is kept)

    def write(self, operation: str, uncertain: str) -> AbstractContextManager[StoreConnection]:
        """One unit of work: yields the connection, commits when the block succeeds."""
        return unit_of_work(self, operation, uncertain)
