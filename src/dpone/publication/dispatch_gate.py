"""The one serialization of dispatch against closure, across processes.

A publisher's EXCHANGE (and a first publication's CREATE) and the closure of a
principal each run while holding an exclusive ``fcntl.flock`` on one file beside the
snapshot store (:func:`gate_path`). The executor, holding it, re-checks its lease and
the claim before it opens the drain-gate session and again before it sends; closure
ends the lease while holding it. So once a closure has ended a lease, no process can
open that lease's session or send its statement any more, and a session-opening note
that closure does not find was provably never written.

The file is opened anew for every acquisition: ``flock`` locks belong to an open file
description, so two threads of one process exclude each other exactly as two
processes do. A process that dies (even by SIGKILL) releases the lock with its
descriptors; a process that is only stopped (SIGSTOP) keeps it, and a waiter gives up
after ``wait_seconds`` with ``dispatch_gate_busy`` rather than hang.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from dpone.errors import StateError

GATE_WAIT_SECONDS = 120.0
_POLL_SECONDS = 0.01


class DispatchGateBusy(StateError):
    """The dispatch gate stayed held by another holder for the whole wait."""

    code = "dispatch_gate_busy"


def gate_path(store_path: Path) -> Path:
    """The lock file that serializes dispatch and closure for the store at ``store_path``."""
    return store_path.with_name(store_path.name + ".dispatch.lock")


class DispatchGate:
    """An exclusive, cross-process lock on one file (see the module doc)."""

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

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """Hold the gate for the ``with`` block (``dispatch_gate_busy`` after the wait)."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            deadline = self._clock() + self.wait_seconds
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError as exc:
                    if self._clock() >= deadline:
                        raise DispatchGateBusy(
                            f"the dispatch gate {self.path} stayed held for "
                            f"{self.wait_seconds:g} s",
                            path=str(self.path),
                        ) from exc
                    self._sleep(_POLL_SECONDS)
            yield
        finally:
            os.close(fd)  # closing the description releases the lock
