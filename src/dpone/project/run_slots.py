"""A run's share of the pool: its tables wait for a principal of their role in turn.

A ``--jobs`` run may have more tables running than the pool has principals of a role
(exporting and checking need none): a table takes one of the run's slots of the role
before it leases a principal and gives it back once that principal's lease is closed
and proven, so a table waits for its turn instead of failing ``pool_exhausted`` when
the run's other tables hold every principal. The store still decides who leases what;
another process's run is not counted here. See docs/cli.md (``dpone refresh``).
"""

from __future__ import annotations

import threading

from dpone.errors import stop_point

# How often a table waiting for a slot looks whether its run was signalled.
_WAIT_SECONDS = 0.1


class PrincipalSlot:
    """One table's turn at a role's principal: taken once, given back once."""

    def __init__(self, semaphore: threading.BoundedSemaphore | None) -> None:
        self._semaphore = semaphore
        self._held = False

    def take(self) -> None:
        """Wait for the slot (a signal passed to this thread stops the wait)."""
        if self._semaphore is None or self._held:
            return
        while not self._semaphore.acquire(timeout=_WAIT_SECONDS):
            stop_point()
        self._held = True

    def give_back(self) -> None:
        """Give the slot back (again: nothing)."""
        if self._semaphore is not None and self._held:
            self._held = False
            self._semaphore.release()


class PrincipalSlots:
    """``per_role`` slots for each role of the run's tables (None: no run shares them)."""

    def __init__(self, per_role: int | None) -> None:
        self._per_role = per_role
        self._semaphores: dict[str, threading.BoundedSemaphore] = {}
        self._lock = threading.Lock()

    def slot(self, role: str) -> PrincipalSlot:
        """A table's slot of ``role``, not taken yet."""
        if self._per_role is None:
            return PrincipalSlot(None)
        with self._lock:
            semaphore = self._semaphores.setdefault(
                role, threading.BoundedSemaphore(self._per_role)
            )
        return PrincipalSlot(semaphore)
