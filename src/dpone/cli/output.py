"""Shared output and error handling for CLI commands: the one place outcomes become
exit codes, messages and JSON objects.

Exit codes: 0 success, 1 the operation failed, 2 usage or configuration error; after a
signal 128 + its number (130 Ctrl-C, 141 closed output pipe, 143 SIGTERM).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import click

import dpone
from dpone.errors import ConfigurationError, DponeError
from dpone.errors import Terminated as Terminated  # raised by the CLI's signal handler
from dpone.project.config import DEFAULT_CONFIG

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 128 + signal.SIGINT
EXIT_BROKEN_PIPE = 128 + signal.SIGPIPE
EXIT_TERMINATED = 128 + signal.SIGTERM

F = TypeVar("F", bound=Callable[..., Any])


def emit_json(payload: dict[str, Any]) -> None:
    """Print one JSON object on one line of standard output.

    Every object carries ``ok``; a payload without one reports a success.
    """
    document = {"ok": True, **payload}
    click.echo(json.dumps(document, sort_keys=True, ensure_ascii=False))


def echo_warnings(warnings: Iterable[str]) -> None:
    """Print each warning on standard error (never on the JSON output)."""
    for warning in warnings:
        _StderrLine.close()
        click.echo(f"dpone: warning: {warning}", err=True)


class Warnings:
    """What one command warns about: on stderr as it comes (a text run), and listed
    under ``warnings`` in its JSON object, success or failure (see :meth:`document`
    and :func:`reported_errors`)."""

    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json
        self.messages: list[str] = []

    def __call__(self, message: str) -> None:
        self.messages.append(message)
        if not self.as_json:
            echo_warnings([message])

    def document(self) -> dict[str, list[str]]:
        """The member to merge into the command's JSON object."""
        return {"warnings": list(self.messages)}


class _StderrLine:
    """Whether progress text is waiting on the current stderr line (no newline yet)."""

    open = False

    @classmethod
    def close(cls) -> None:
        if cls.open:
            click.echo("", err=True)
            cls.open = False


MIN_RATE_SECONDS = 0.5


def status_line(text: str) -> None:
    """Draw ``text`` on the one rewritten stderr line (a later message starts afresh)."""
    click.echo(f"\r{text}   ", nl=False, err=True)
    _StderrLine.open = True


class TerminalProgress:
    """Rows, bytes and rate of a long phase on one rewritten stderr line (terminals only).

    Any error printed later starts on a fresh line (see :func:`report_failure`).
    """

    def __init__(self, phase: str, clock: Callable[[], float] = time.monotonic) -> None:
        self._phase = phase
        self._clock = clock
        self._started = clock()

    def __call__(self, rows: int, size: int) -> None:
        elapsed = self._clock() - self._started
        parts = []
        if rows > 0:
            parts.append(f"{rows:,} rows")
        if size > 0:
            parts.append(f"{size / 2**20:,.1f} MiB")
        # A rate over a few milliseconds says nothing (it read 169,109,357,616 rows/s).
        if rows > 0 and elapsed >= MIN_RATE_SECONDS:
            parts.append(f"{rows / elapsed:,.0f} rows/s")
        shown = ", ".join(parts) or "running"
        status_line(f"{self._phase}: {shown}")

    @staticmethod
    def finish() -> None:
        """End the progress line."""
        _StderrLine.close()

    @staticmethod
    def on_terminal(as_json: bool) -> bool:
        """Progress is shown only when stderr is a terminal and the output is text."""
        return not as_json and sys.stderr.isatty()


def _where(exc: BaseException) -> str:
    """The innermost dpone frame of a traceback, as ``path:line (function)``."""
    root = Path(dpone.__file__).parent
    found = "unknown"
    for frame in traceback.extract_tb(exc.__traceback__):
        path = Path(frame.filename)
        if path.is_relative_to(root):
            found = f"dpone/{path.relative_to(root)}:{frame.lineno} ({frame.name})"
    return found


def describe_failure(exc: BaseException) -> tuple[int, dict[str, Any]]:
    """The exit code and the JSON ``error`` object of any exception reaching the CLI.

    An unexpected exception becomes ``internal_error``: its type and where it was
    raised, never its text (which may hold a value or a credential).
    """
    if isinstance(exc, DponeError):
        code = EXIT_USAGE if isinstance(exc, ConfigurationError) else EXIT_FAILED
        return code, exc.to_dict()
    if isinstance(exc, click.UsageError):
        return exc.exit_code, {
            "code": "usage_error",
            "message": exc.format_message(),
            "details": {},
        }
    if isinstance(exc, click.ClickException):
        return exc.exit_code, {"code": "cli_error", "message": exc.format_message(), "details": {}}
    if isinstance(exc, click.Abort | KeyboardInterrupt):
        return EXIT_INTERRUPTED, {"code": "interrupted", "message": "interrupted", "details": {}}
    if isinstance(exc, Terminated):
        message = f"stopped by {exc.signum.name}"
        details = {"signal": exc.signum.name}
        return 128 + exc.signum, {"code": "terminated", "message": message, "details": details}
    if isinstance(exc, OSError):
        where = f" ({exc.filename})" if exc.filename else ""
        error = {
            "code": "os_error",
            "message": f"{exc.strerror}{where}",
            "details": {"errno": exc.errno},
        }
        return EXIT_FAILED, error
    name, where = type(exc).__name__, _where(exc)
    return EXIT_FAILED, {
        "code": "internal_error",
        "message": f"unexpected {name} at {where}; this is a bug in dpone, please report it",
        "details": {"exception": name, "where": where},
    }


def _silence_stdout() -> None:
    # The reader of standard output is gone: later writes and the final flush at exit
    # would raise again, so standard output points at /dev/null from now on.
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    finally:
        os.close(devnull)


def report_failure(exc: BaseException, as_json: bool, warnings: Warnings | None = None) -> int:
    """Print one failure (one JSON object with ``as_json``) and return its exit code.

    A closed output pipe (``dpone ... | head``) is not an error to report: it ends
    the command quietly with 141, like a tool killed by SIGPIPE.
    """
    if isinstance(exc, BrokenPipeError):
        _silence_stdout()
        return EXIT_BROKEN_PIPE
    exit_code, error = describe_failure(exc)
    _StderrLine.close()
    if as_json:
        emit_json({"ok": False, "error": error, **(warnings.document() if warnings else {})})
    elif isinstance(exc, click.ClickException):
        exc.show()
    else:
        click.echo(f"dpone: error: [{error['code']}] {error['message']}", err=True)
        tail = error["details"].get("log_tail")
        if tail:
            click.echo(f"server log tail:\n{tail}", err=True)
    return exit_code


@contextmanager
def reported_errors(as_json: bool, warnings: Warnings | None = None) -> Iterator[None]:
    """Turn a :class:`DponeError` or ``OSError`` into a message (or JSON) and an exit code.

    With ``warnings``, a JSON failure lists them too (a text run printed them already).
    Anything else travels on to the boundary in :func:`dpone.cli.main.main`.
    """
    try:
        yield
    except BrokenPipeError:
        raise
    except (DponeError, OSError) as exc:
        sys.exit(report_failure(exc, as_json, warnings))


def json_option(func: Callable[..., Any]) -> Callable[..., Any]:
    """The ``--json`` flag shared by commands that report something."""
    return click.option(
        "--json", "as_json", is_flag=True, help="Print one JSON object instead of text."
    )(func)


def config_option(func: F) -> F:
    """``--config``: the project file (default ``dpone.toml``, or ``$DPONE_CONFIG``).

    Any path is taken as given: a directory, a missing or an unreadable file is the
    command's to report (``load_project``), in dpone's error format and in ``--json``,
    never as a usage error.
    """
    return click.option(
        "--config",
        "config_path",
        type=click.Path(readable=False, path_type=Path),
        default=DEFAULT_CONFIG,
        show_default=True,
        envvar="DPONE_CONFIG",
        help="The project file.",
    )(func)
