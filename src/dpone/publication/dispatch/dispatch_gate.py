"""The serialization of dispatch against closure, one gate per principal, across processes.

A publisher's EXCHANGE (and a first publication's CREATE, and the drop of a target it
created) and the closure of a principal each run while holding an exclusive
``fcntl.flock`` on that principal's file beside the snapshot store (:func:`gate_path`
names the store's, ``<store>.dispatch.lock``; each principal's is that name plus its
user). The executor, holding it, re-checks its lease and the claim before it opens the
drain-gate session and again before it sends; closure ends the lease while holding it.
So once a closure has ended a lease, no process can open that lease's session or send
its statement any more, and a session-opening note that closure does not find was
provably never written. Everything a dispatch or a closure does is the principal's own
(its lease, its sessions, its queries), so the principals do not wait for each other:
one table's closure, with its seconds of process samples, or a stopped holder, never
holds up another table's dispatch or closure under another principal. What a dispatch
changes is also its slot's (the target name), which two attempts of one table share:
each dispatch takes its slot's gate before its principal's
(:meth:`DispatchGate.held_for_slot`). A pool
verification, which signs in as every principal, holds every principal's gate
(:meth:`DispatchGate.held_for_all`, in one order, so no two holders can wait on each
other).

The file is opened anew for every acquisition: ``flock`` locks belong to an open file
description, so two threads of one process exclude each other exactly as two
processes do. A process that dies (even by SIGKILL) releases the lock with its
descriptors; a process that is only stopped (SIGSTOP) keeps it, and a waiter gives up
after ``wait_seconds`` with ``dispatch_gate_busy`` rather than hang.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from dpone.errors import StateError
from dpone.publication.store.postgres import is_store_url

GATE_WAIT_SECONDS = 120.0
_POLL_SECONDS = 0.01
_TOKEN = re.compile(r"[A-Za-z0-9_]{1,64}")


class DispatchGateBusy(StateError):
    """The dispatch gate stayed held by another holder for the whole wait."""

    code = "dispatch_gate_busy"


def gate_path(store_path: Path) -> Path:
    """The store's gate name; each principal's lock file is this name plus its user."""
    return store_path.with_name(store_path.name + ".dispatch.lock")


def gate_for(store: Path | str) -> Gate:
    """The gates of the store at ``store``: files beside a SQLite store, advisory locks
    in a PostgreSQL store's database (:mod:`dpone.publication.dispatch.postgres_locks`)."""
    if isinstance(store, str) and is_store_url(store):
        from dpone.publication.dispatch.postgres_locks import PostgresDispatchGate

        return PostgresDispatchGate(store)
    return DispatchGate(gate_path(Path(store)))


class Gate:
    """Exclusive locks across processes, one per principal and per slot: what a dispatch
    and a closure hold (see the module doc). :meth:`held` is the backend's."""

    wait_seconds: float = GATE_WAIT_SECONDS

    def held(self, user: str) -> contextlib.AbstractContextManager[None]:
        """Hold ``user``'s gate for the ``with`` block (``dispatch_gate_busy`` after the wait)."""
        raise NotImplementedError

    @contextlib.contextmanager
    def held_for_slot(self, database: str, table: str, user: str) -> Iterator[None]:
        """Hold the slot's gate, then ``user``'s: what a dispatch that changes the target
        ``database.table`` holds (its CREATE, the DROP of a table it created, its EXCHANGE).

        Two attempts of one slot publish under different principals; the slot's gate keeps
        one's check-then-DROP of the empty target it created from interleaving with the
        other's EXCHANGE into that name. Always the slot first, then the principal, and a
        closure or a verification never takes a slot's: no two holders wait on each other.
        """
        with self.held(f"slot {database}.{table}"), self.held(user):
            yield

    @contextlib.contextmanager
    def held_for_all(self, users: Iterable[str]) -> Iterator[None]:
        """Hold the gate of every one of ``users``, taken in sorted order."""
        with contextlib.ExitStack() as stack:
            for user in sorted(set(users)):
                stack.enter_context(self.held(user))
            yield


class DispatchGate(Gate):
    """The gates as files beside a SQLite store: one ``flock`` per principal and slot."""

    def __init__(
        self,
        path: Path,
        *,
        wait_seconds: float = GATE_WAIT_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.path = path
        self.wait_seconds = wait_seconds
        self._clock = clock
        self._sleep = sleep

    def path_for(self, user: str) -> Path:
        """The lock file of ``user``'s gate (a name that is not a plain token is hashed)."""
        token = user if _TOKEN.fullmatch(user) else hashlib.sha256(user.encode()).hexdigest()
        return self.path.with_name(f"{self.path.name}.{token}")

    @contextlib.contextmanager
    def held(self, user: str) -> Iterator[None]:
        """Hold ``user``'s gate for the ``with`` block (``dispatch_gate_busy`` after the wait)."""
        path = self.path_for(user)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            deadline = self._clock() + self.wait_seconds
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError as exc:
                    if self._clock() >= deadline:
                        raise DispatchGateBusy(
                            f"the dispatch gate of {user} ({path}) stayed held for "
                            f"{self.wait_seconds:g} s",
                            path=str(path),
                            user=user,
                        ) from exc
                    self._sleep(_POLL_SECONDS)
            yield
        finally:
            os.close(fd)  # closing the description releases the lock
