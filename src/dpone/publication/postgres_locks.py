"""The dispatch gate and the table lock of a PostgreSQL store, as advisory locks.

Workers on several machines share one PostgreSQL store, so what the SQLite store keeps
as files beside it (:mod:`dpone.publication.dispatch_gate`, and the table lock of
:func:`dpone.project.refresh_checks.table_lock`) is held on that server instead: a
session-level advisory lock on a connection of its own, taken for the ``with`` block
and released when the connection closes. A worker that dies releases it with its
connection; one that is only stopped (SIGSTOP) keeps it, and a waiter gives up after
its wait (``dispatch_gate_busy``) or at once (the table lock: ``refresh_busy``, naming
the holder's host and process). Each lock is scoped to one principal, one slot or one
table, never to the store: a stalled publisher holds up nothing but its own.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import socket
from collections.abc import Callable, Iterator
from typing import Any

from dpone.errors import StateError
from dpone.publication.dispatch_gate import GATE_WAIT_SECONDS, DispatchGateBusy, Gate
from dpone.publication.store.postgres import CONNECT_SECONDS, check_store_url

# The two-int advisory key space: the first int names what is locked (gate or table),
# the second the key's hash (the store's write lock uses the one-bigint space).
_GATE_SPACE = 0x64706701
_TABLE_SPACE = 0x64707401


def _key(space: int, name: str) -> tuple[int, int]:
    digest = int.from_bytes(hashlib.sha256(name.encode("utf-8")).digest()[:4], "big")
    return space - 2**31 if space >= 2**31 else space, digest - 2**31


def _connect(url: str, purpose: str) -> Any:
    import psycopg  # the postgres extra: a PostgreSQL store was opened before this

    return psycopg.connect(
        url,
        autocommit=True,
        connect_timeout=CONNECT_SECONDS,
        application_name=f"dpone {purpose} {socket.gethostname()} pid {os.getpid()}",
    )


class PostgresDispatchGate(Gate):
    """Each principal's and slot's gate as an advisory lock in the store's database."""

    def __init__(self, url: str, *, wait_seconds: float = GATE_WAIT_SECONDS) -> None:
        self.url = check_store_url(url)
        self.wait_seconds = wait_seconds

    @contextlib.contextmanager
    def held(self, user: str) -> Iterator[None]:
        """Hold ``user``'s gate for the ``with`` block (``dispatch_gate_busy`` after the wait)."""
        import psycopg

        conn = _connect(self.url, "gate")
        try:
            conn.execute(f"SET lock_timeout = {max(int(self.wait_seconds * 1000), 1)}")
            try:
                conn.execute("SELECT pg_advisory_lock(%s, %s)", _key(_GATE_SPACE, user))
            except psycopg.errors.LockNotAvailable as exc:
                raise DispatchGateBusy(
                    f"the dispatch gate of {user} (in the store's database) stayed held for "
                    f"{self.wait_seconds:g} s",
                    user=user,
                ) from exc
            yield
        finally:
            conn.close()  # the session ends: the lock is released


@contextlib.contextmanager
def postgres_table_lock(url: str, name: str, busy: Callable[[str], StateError]) -> Iterator[None]:
    """Hold table ``name``'s lock in the store's database, or raise ``busy(holder)`` at
    once when another worker holds it (``holder``: its host and process)."""
    conn = _connect(check_store_url(url), f"table {name}")
    try:
        key = _key(_TABLE_SPACE, name)
        taken = conn.execute("SELECT pg_try_advisory_lock(%s, %s)", key).fetchone()[0]
        if not taken:
            row = conn.execute(
                "SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a "
                "ON a.pid = l.pid WHERE l.locktype = 'advisory' AND l.granted "
                "AND l.classid = %s AND l.objid = %s AND l.objsubid = 2",
                (key[0] & 0xFFFFFFFF, key[1] & 0xFFFFFFFF),
            ).fetchone()
            raise busy(str(row[0]) if row is not None else "another worker")
        yield
    finally:
        conn.close()
