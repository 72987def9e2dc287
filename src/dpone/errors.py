"""The error hierarchy of dpone.

Every error carries a stable machine-readable ``code`` and optional ``details`` that
name where the problem is (file, record ordinal, column, byte offset, query id).
Middle classes group errors by kind so callers can catch a family without string
matching. The original exception is always kept as ``__cause__`` by the raiser.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator, Mapping
from types import MappingProxyType
from typing import Any


class DponeError(Exception):
    """Root of every error dpone raises on purpose."""

    code: str = "dpone_error"

    def __init__(self, message: str, *, code: str | None = None, **details: Any) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code
        self.message = message
        self.details: Mapping[str, Any] = MappingProxyType(dict(details))

    def __str__(self) -> str:
        return f"[{self.code}] {self.message}"

    def add_details(self, **more: Any) -> None:
        """Attach facts learned while the error travelled up (never removes any)."""
        self.details = MappingProxyType({**self.details, **more})

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready description (code, message, details) for ``--json`` output."""
        return {"code": self.code, "message": self.message, "details": dict(self.details)}


class ConfigurationError(DponeError):
    """The caller asked for something that cannot work as configured."""

    code = "configuration_error"


class FormatError(DponeError):
    """Input bytes do not follow the declared format."""

    code = "format_error"


class PolicyError(DponeError):
    """A value or schema is outside the declared finite policy."""

    code = "policy_error"


class TransportError(DponeError):
    """A request to ClickHouse failed or its outcome is not proven."""

    code = "transport_error"


class DeadlineError(DponeError):
    """An absolute deadline expired."""

    code = "deadline_expired"


class JournalError(DponeError):
    """A durable record could not be written or does not verify."""

    code = "journal_error"


class StateError(DponeError):
    """An operation is not allowed in the current state."""

    code = "state_error"


class LocalServerError(DponeError):
    """The managed local ClickHouse server could not be started, found or stopped."""

    code = "local_server_error"


class Terminated(BaseException):
    """SIGTERM or SIGHUP arrived; raised by the CLI's handler so ``finally`` blocks clean up.

    A ``BaseException`` like ``KeyboardInterrupt``: code that handles ``Exception``
    must not swallow it. ``signum`` says which signal it was.
    """

    def __init__(self, signum: int = signal.SIGTERM) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signal.Signals(signum)


# The signals that stop a command: Ctrl-C, SIGTERM, SIGHUP.
STOPPING_SIGNALS = frozenset({signal.SIGINT, signal.SIGTERM, signal.SIGHUP})


@contextlib.contextmanager
def stopping_signals_held() -> Iterator[None]:
    """Hold the stopping signals for a few statements that must happen together; one
    that came meanwhile is raised (by the handlers) as the block ends. Only the calling
    thread's mask changes (Python runs handlers in the main thread); a signal passed on
    to this thread (:func:`pass_signal`) is held the same way."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, STOPPING_SIGNALS)
    _HELD.depth = getattr(_HELD, "depth", 0) + 1
    try:
        yield
    finally:
        _HELD.depth -= 1
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
        stop_point()


def signal_exception(signum: int) -> BaseException:
    """The exception a stopping signal raises: KeyboardInterrupt for SIGINT, as Python's
    own handler does, else :class:`Terminated`."""
    return KeyboardInterrupt() if signum == signal.SIGINT else Terminated(signum)


# Signals the main thread passed on to other threads of this process, by thread (the
# Thread itself: a thread's id may be given to a new thread once it ended), not yet
# raised there; and each thread's depth of held blocks.
_PASSED: dict[threading.Thread, list[signal.Signals]] = {}
_PASSED_LOCK = threading.Lock()
_HELD = threading.local()


def pass_signal(thread: threading.Thread, signum: int) -> None:
    """Pass a stopping signal the main thread received on to ``thread``: it is raised
    there at the thread's next :func:`stop_point`, once for each time it was passed, as
    the signal itself is raised once in the main thread."""
    with _PASSED_LOCK:
        _PASSED.setdefault(thread, []).append(signal.Signals(signum))


def stop_point() -> None:
    """Raise here a signal passed on to this thread (:func:`pass_signal`), unless a
    block holds the stopping signals (raised as it ends). A point where a thread may
    stop as the main thread stops at any statement: before each request to a server,
    at each report of progress and in each wait of a table."""
    if getattr(_HELD, "depth", 0):
        return
    me = threading.current_thread()
    with _PASSED_LOCK:
        passed = _PASSED.get(me)
        if not passed:
            return
        signum = passed.pop(0)
    raise signal_exception(signum)


def forget_passed_signals(thread: threading.Thread) -> None:
    """Drop what was passed on to ``thread`` and never raised (it ended first)."""
    with _PASSED_LOCK:
        _PASSED.pop(thread, None)


def interruption_signal(exc: BaseException) -> signal.Signals | None:
    """The signal an exception stands for (Ctrl-C, SIGTERM, SIGHUP), or None."""
    if isinstance(exc, KeyboardInterrupt):
        return signal.SIGINT
    if isinstance(exc, Terminated):
        return exc.signum
    return None
