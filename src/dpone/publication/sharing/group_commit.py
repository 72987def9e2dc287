"""Calls made at once answered by one batch, each from a batch begun after it was made.

The tables of one run ask the same questions of the server at the same steps: observe
my slot, prove my lease closed. Such a read costs the server what it costs whatever the
number of names it covers (docs/publication.md, "Many tables in one run"), so callers
in different threads that ask at once are answered by one call of a batch function. A
caller is never answered from a batch that began before it asked: what a batch reads
is read after every call it answers was made, as the caller's own read would have been.
"""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from dpone.errors import stop_point

K = TypeVar("K", bound=Hashable)
R = TypeVar("R")
# How often a caller waiting for another's batch looks for a signal passed to it.
_STOP_SECONDS = 0.1


def _copy(exc: Exception) -> Exception:
    """A caller's own copy of a batch's error (its traceback and details its own),
    with the same cause; the error itself when it cannot be copied."""
    try:
        mine = copy.copy(exc)
    except Exception:  # an exception type that does not copy: shared, as raised
        return exc
    mine.__cause__ = exc.__cause__
    return mine


@dataclass(eq=False)  # a call is itself: two calls of one key are two calls
class _Call(Generic[K, R]):
    key: K
    batch: Callable[[Sequence[K]], Mapping[K, R]] | None = None  # its caller's own
    taken: bool = False  # by a batch, which began after the call was made
    abandoned: bool = False  # its caller stopped waiting (a signal passed to it)
    done: bool = False
    result: R | None = None
    error: BaseException | None = None


class GroupCommit(Generic[K, R]):
    """Answer ``call(key)`` from ``batch(keys)``, sharing one batch among callers.

    ``batch`` receives distinct keys and returns a result for every one (a missing
    key is an error for its caller) or raises, which every caller of that batch then
    raises (an interruption of the leading caller's own thread excepted: it alone
    raises it). The first caller not yet taken leads the next batch: it waits up to
    ``gather_seconds`` for ``expected()`` calls to be pending (0: it starts at once),
    then takes every pending call of a distinct key and runs the batch, while the
    calls made since gather for the batch after it (batches may run at once; a key
    pending twice waits for a later batch). A caller waiting for a batch it does not
    lead stops there when a signal was passed to its thread.
    """

    def __init__(
        self,
        batch: Callable[[Sequence[K]], Mapping[K, R]],
        *,
        expected: Callable[[], int] = lambda: 1,
        gather_seconds: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._batch = batch
        self._expected = expected
        self._gather = gather_seconds
        self._clock = clock
        self._changed = threading.Condition()
        self._pending: list[_Call[K, R]] = []  # made, not yet taken by a batch
        self._gathering = False  # a leader is gathering the next batch
        self.batches: list[int] = []  # each batch's size, in order (for reports and tests)

    def __call__(self, key: K, batch: Callable[[Sequence[K]], Mapping[K, R]] | None = None) -> R:
        """The batch's result for ``key``, from a batch begun after this call; a batch
        this caller leads runs ``batch`` (default: the group's)."""
        call: _Call[K, R] = _Call(key, batch)
        with self._changed:
            self._pending.append(call)
            self._changed.notify_all()
            while not call.done:
                if not call.taken and not self._gathering and self._pending[0] is call:
                    self._gathering = True  # this caller leads the next batch
                    break
                self._changed.wait(_STOP_SECONDS)
                self._stop_point(call)
        if not call.done:
            self._lead(call)
        if call.error is not None:
            raise call.error
        return call.result  # type: ignore[return-value]  # set for every answered call

    def _stop_point(self, call: _Call[K, R]) -> None:
        """Stop waiting when a signal was passed to this thread (under the lock): the
        call leaves the queue, or, taken, is answered to nobody."""
        try:
            stop_point()
        except BaseException:
            call.abandoned = True
            if call in self._pending:
                self._pending.remove(call)
                self._changed.notify_all()
            raise

    def _lead(self, own: _Call[K, R]) -> None:
        deadline = self._clock() + self._gather
        with self._changed:
            while len(self._pending) < self._expected() and self._clock() < deadline:
                self._changed.wait(max(0.0, deadline - self._clock()))
            taken = self._take()
            self._gathering = False  # the calls made from now on gather the next batch
            self._changed.notify_all()
        try:
            results: Mapping[K, R] = (own.batch or self._batch)([c.key for c in taken])
        except Exception as exc:  # every caller of the batch raises what it raised
            for call in taken:
                call.error = exc if call is own else _copy(exc)
        except BaseException as exc:
            # This thread was stopped (a signal passed to it): it alone raises it; the
            # others' calls go back to wait for a batch begun after this one.
            own.error = exc
            self._finish([own], again=[c for c in taken if c is not own])
            raise
        else:
            for call in taken:
                if call.key in results:
                    call.result = results[call.key]
                else:
                    call.error = KeyError(call.key)
        self._finish(taken)

    def _take(self) -> list[_Call[K, R]]:
        """The pending calls of distinct keys, in order, marked taken; a repeated key
        stays pending."""
        taken: list[_Call[K, R]] = []
        seen: set[K] = set()
        for call in self._pending:
            if call.key not in seen:
                seen.add(call.key)
                call.taken = True
                taken.append(call)
        self._pending = [c for c in self._pending if not c.taken]
        return taken

    def _finish(self, answered: Sequence[_Call[K, R]], again: Sequence[_Call[K, R]] = ()) -> None:
        """``answered`` are done; ``again`` are pending once more, first (they were
        made before any call pending now)."""
        with self._changed:
            for call in answered:
                call.done = True
            kept = [c for c in again if not c.abandoned]
            for call in kept:
                call.taken = False
            self._pending = [*kept, *self._pending]
            self.batches.append(len(answered) + len(again))
            self._changed.notify_all()
