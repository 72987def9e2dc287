"""The dispatch gate and the table lock of a PostgreSQL store, as advisory locks.

Workers on several machines share one PostgreSQL store, so what the SQLite store keeps
as files beside it (:mod:`dpone.publication.dispatch.dispatch_gate`, and the table lock
of :func:`dpone.project.refresh_checks.table_lock`) is a session-level advisory lock on
that server, on a session of its own, scoped to one principal, one slot or one table,
and released when the session ends. A lock found gone when its block ends is
``advisory_lock_lost``. See docs/publication-principals.md ("What the closure rests on")
and docs/deploying.md.
"""

from __future__ import annotations

import contextlib
import hashlib
import socket
from collections.abc import Callable, Iterator
from typing import Any

from dpone.errors import StateError
from dpone.publication.dispatch.dispatch_gate import GATE_WAIT_SECONDS, DispatchGateBusy, Gate
from dpone.publication.store.errors import SnapshotStoreError
from dpone.publication.store.postgres import check_store_url, connect

# The two-int advisory key space: the first int names what is locked (gate or table),
# the second the key's hash (the store's write lock uses the one-bigint space).
_GATE_SPACE = 0x64706701
_TABLE_SPACE = 0x64707401


class AdvisoryLockLost(StateError):
    """A held advisory lock was gone when its block ended (its session was ended)."""

    code = "advisory_lock_lost"


def _key(space: int, name: str) -> tuple[int, int]:
    digest = int.from_bytes(hashlib.sha256(name.encode("utf-8")).digest()[:4], "big")
    return space, digest - 2**31


def _session(url: str, purpose: str) -> Any:
    """A session for one lock (``store_unavailable`` when the server cannot be reached)."""
    import psycopg  # the postgres extra: a PostgreSQL store was opened before this

    try:
        return connect(url, f"{purpose} {socket.gethostname()}")
    except psycopg.Error as exc:
        raise SnapshotStoreError(
            f"cannot reach the store {url} for its {purpose}: {str(exc).strip()}",
            code="store_unavailable",
            store=url,
        ) from exc


def _still_held(conn: Any, key: tuple[int, int]) -> bool:
    found = conn.execute(
        "SELECT count(*) FROM pg_locks WHERE pid = pg_backend_pid() AND locktype = 'advisory'"
        " AND granted AND classid = %s AND objid = %s AND objsubid = 2",
        (key[0] & 0xFFFFFFFF, key[1] & 0xFFFFFFFF),
    ).fetchone()
    return bool(found and found[0] == 1)


@contextlib.contextmanager
def _held_until_end(conn: Any, key: tuple[int, int], what: str) -> Iterator[None]:
    """Yield while ``key`` is held on ``conn``; then check it still was, and end it."""
    import psycopg

    try:
        yield
        try:
            held = _still_held(conn, key)
        except psycopg.Error:
            held = False
        if not held:
            raise AdvisoryLockLost(
                f"the lock of {what} was lost while held (its session was ended): another "
                "worker may have taken it meanwhile",
                lock=what,
            )
    finally:
        conn.close()  # the session ends: the lock is released


class PostgresDispatchGate(Gate):
    """Each principal's and slot's gate as an advisory lock in the store's database."""

    def __init__(self, url: str, *, wait_seconds: float = GATE_WAIT_SECONDS) -> None:
        self.url = check_store_url(url)
        self.wait_seconds = wait_seconds

    @contextlib.contextmanager
    def held(self, user: str) -> Iterator[None]:
        """Hold ``user``'s gate for the ``with`` block (``dispatch_gate_busy`` after the wait)."""
        import psycopg

        conn = _session(self.url, "gate")
        key = _key(_GATE_SPACE, user)
        try:
            conn.execute(f"SET lock_timeout = {max(int(self.wait_seconds * 1000), 1)}")
            conn.execute("SELECT pg_advisory_lock(%s, %s)", key)
        except (psycopg.errors.LockNotAvailable, psycopg.errors.QueryCanceled) as exc:
            conn.close()
            raise DispatchGateBusy(
                f"the dispatch gate of {user} (in the store's database) stayed held for "
                f"{self.wait_seconds:g} s",
                user=user,
            ) from exc
        except psycopg.Error as exc:
            conn.close()
            raise SnapshotStoreError(
                f"the dispatch gate of {user} could not be taken: {str(exc).strip()}",
                code="store_unavailable",
                store=self.url,
            ) from exc
        with _held_until_end(conn, key, f"the dispatch gate of {user}"):
            yield


@contextlib.contextmanager
def postgres_table_lock(url: str, name: str, busy: Callable[[str], StateError]) -> Iterator[None]:
    """Hold table ``name``'s lock in the store's database, or raise ``busy(holder)`` at
    once when another worker holds it (``holder``: its process and host)."""
    import psycopg

    conn = _session(check_store_url(url), f"table {name}")
    key = _key(_TABLE_SPACE, name)
    try:
        taken = conn.execute("SELECT pg_try_advisory_lock(%s, %s)", key).fetchone()[0]
        holder = None if taken else _holder(conn, key)
    except psycopg.Error as exc:
        conn.close()
        raise SnapshotStoreError(
            f"the lock of table {name} could not be taken: {str(exc).strip()}",
            code="store_unavailable",
            store=url,
        ) from exc
    if holder is not None:
        conn.close()
        raise busy(holder)
    with _held_until_end(conn, key, f"table {name}"):
        yield


def _holder(conn: Any, key: tuple[int, int]) -> str:
    """Who holds ``key`` in this database: its session's name (``dpone pid N ...``)."""
    row = conn.execute(
        "SELECT a.application_name, a.client_addr FROM pg_locks l JOIN pg_stat_activity a "
        "ON a.pid = l.pid WHERE l.locktype = 'advisory' AND l.granted "
        "AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) "
        "AND l.classid = %s AND l.objid = %s AND l.objsubid = 2",
        (key[0] & 0xFFFFFFFF, key[1] & 0xFFFFFFFF),
    ).fetchone()
    if row is None:
        return "another worker"
    return f"{row[0]} from {row[1]}" if row[1] is not None else str(row[0])
