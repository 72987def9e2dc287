"""Reporting a command stopped by a signal together with what it left behind.

The CLI's boundary (:func:`dpone.cli.output.report_failure`) reports Ctrl-C and
SIGTERM as ``interrupted`` / ``terminated`` with the exit code of the signal, but it
knows nothing of the command's work. A command that can say what its interruption
left (an attempt's journal, a lease, a table) reports it here instead, in the same
shape: the same ``code``, ``message`` and exit code, and its facts added to the
error's ``details`` (``--json``) or printed as lines before the error line (text).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import click

from dpone.cli.output import Terminated, describe_failure, emit_json


def is_interruption(exc: BaseException) -> bool:
    """Whether ``exc`` stands for a signal (Ctrl-C, SIGTERM) rather than a failure."""
    return isinstance(exc, KeyboardInterrupt | click.Abort | Terminated)


def report_interruption(
    exc: BaseException,
    as_json: bool,
    details: Mapping[str, Any],
    lines: Sequence[str] = (),
) -> int:
    """Print the interruption ``exc`` with ``details``; return its exit code (130, 143...).

    With ``as_json`` one object: ``{"ok": false, "error": {"code", "message",
    "details"}}``, the details being the boundary's (``signal``, when it gives one)
    and ``details``. Otherwise ``lines`` on standard error, then the boundary's
    ``dpone: error: [code] message`` line.
    """
    exit_code, error = describe_failure(exc)
    error = {**error, "details": {**error.get("details", {}), **details}}
    if as_json:
        emit_json({"ok": False, "error": error})
    else:
        for line in lines:
            click.echo(line, err=True)
        click.echo(f"dpone: error: [{error['code']}] {error['message']}", err=True)
    return exit_code
