"""Shared output and error handling for CLI commands.

Exit codes: 0 success, 1 the operation failed, 2 usage or configuration error.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import click

from dpone.errors import ConfigurationError, DponeError

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2


def emit_json(payload: dict[str, Any]) -> None:
    """Print one JSON object on one line of standard output."""
    click.echo(json.dumps(payload, sort_keys=True, ensure_ascii=False))


@contextmanager
def reported_errors(as_json: bool) -> Iterator[None]:
    """Turn a :class:`DponeError` into a message (or JSON object) and an exit code."""
    try:
        yield
    except DponeError as exc:
        exit_code = EXIT_USAGE if isinstance(exc, ConfigurationError) else EXIT_FAILED
        if as_json:
            emit_json({"ok": False, "error": exc.to_dict()})
        else:
            click.echo(f"dpone: error: {exc}", err=True)
            tail = exc.details.get("log_tail")
            if tail:
                click.echo(f"server log tail:\n{tail}", err=True)
        sys.exit(exit_code)
    except OSError as exc:
        where = f" ({exc.filename})" if exc.filename else ""
        if as_json:
            emit_json(
                {
                    "ok": False,
                    "error": {
                        "code": "os_error",
                        "message": f"{exc.strerror}{where}",
                        "details": {"errno": exc.errno},
                    },
                }
            )
        else:
            click.echo(f"dpone: error: [os_error] {exc.strerror}{where}", err=True)
        sys.exit(EXIT_FAILED)


def json_option(func: Callable[..., Any]) -> Callable[..., Any]:
    """The ``--json`` flag shared by commands that report something."""
    return click.option(
        "--json", "as_json", is_flag=True, help="Print one JSON object instead of text."
    )(func)
