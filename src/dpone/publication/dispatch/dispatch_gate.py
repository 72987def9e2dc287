"""The serialization of dispatch against closure, one gate per principal, across processes.

A dispatch (the EXCHANGE, a first publication's CREATE, the drop of a target it created)
and the closure of a principal each hold an exclusive ``fcntl.flock`` on that
principal's file beside the snapshot store (:func:`gate_path`: ``<store>.dispatch.lock``
plus the user), opened anew for every acquisition; a dispatch takes its slot's gate
first (:meth:`DispatchGate.held_for_slot`), and a pool verification holds every
principal's gate (:meth:`DispatchGate.held_for_all`, in one order). Once a closure has
ended a lease under the gate, no dispatch of that lease can open its session or send.
A waiter gives up after ``wait_seconds`` with ``dispatch_gate_busy``. See
docs/publication-principals.md ("The executor", "What the closure rests on").
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

from dpone.errors import StateError, stop_point
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
                    stop_point()  # a table of --jobs waiting here stops when its run does
                    self._sleep(_POLL_SECONDS)
            yield
        finally:
            os.close(fd)  # closing the description releases the lock
