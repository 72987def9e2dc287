"""The ``dpone`` command group."""

from __future__ import annotations

import signal
import sys
from types import FrameType

import click

import dpone
from dpone.cli.demo import demo
from dpone.cli.files import export, validate, verify
from dpone.cli.output import Terminated, report_failure
from dpone.cli.project import check, init
from dpone.cli.publication import snapshot
from dpone.cli.refresh import refresh
from dpone.cli.rollback import rollback
from dpone.cli.server import server
from dpone.cli.staging import attempts, journal, stage
from dpone.cli.status import status


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(dpone.__version__, prog_name="dpone")
def cli() -> None:
    """Move full-refresh snapshots of SQL Server tables into ClickHouse, with proof.

    Exit codes: 0 success, 1 the operation failed, 2 usage or configuration error.
    """


cli.add_command(server)
cli.add_command(demo)
cli.add_command(export)
cli.add_command(validate)
cli.add_command(verify)
cli.add_command(stage)
cli.add_command(journal)
cli.add_command(attempts)
cli.add_command(snapshot)
cli.add_command(init)
cli.add_command(check)
cli.add_command(refresh)
cli.add_command(rollback)
cli.add_command(status)


def _wants_json(args: list[str]) -> bool:
    # Decided from the raw arguments, so a usage error that stops parsing is still
    # reported as JSON when the user asked for JSON.
    options = args[: args.index("--")] if "--" in args else args
    return "--json" in options


def _raise_terminated(signum: int, frame: FrameType | None) -> None:
    raise Terminated


def main(args: list[str] | None = None) -> None:
    """Console-script entry point and the CLI's one error boundary.

    Every outcome ends here: success, a usage error, a coded dpone error, a signal,
    a closed output pipe, or an unexpected exception (reported as ``internal_error``
    without its text and without a traceback). With ``--json`` exactly one JSON
    object is printed either way. SIGTERM raises :class:`Terminated`, so temporary
    files are removed on the way out, as on Ctrl-C.
    """
    argv = list(sys.argv[1:] if args is None else args)
    signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        result = cli.main(args=argv, prog_name="dpone", standalone_mode=False)
    except SystemExit:
        raise
    except BaseException as exc:  # the boundary: nothing passes it unreported
        try:
            code = report_failure(exc, _wants_json(argv))
        except BrokenPipeError as closed:  # the report itself met a closed pipe
            code = report_failure(closed, False)
        sys.exit(code)
    sys.exit(result if isinstance(result, int) else 0)
