"""The ``dpone`` command group."""

from __future__ import annotations

import importlib
import signal
import sys
from types import FrameType

import click

import dpone
from dpone.cli.output import Terminated, report_failure

# Each command's module, imported only when that command runs (or when help lists
# them all): a command pays for its own imports, not for every other command's.
COMMANDS = {
    "server": "dpone.cli.server",
    "pool": "dpone.cli.pool",
    "demo": "dpone.cli.demo",
    "export": "dpone.cli.files",
    "validate": "dpone.cli.files",
    "verify": "dpone.cli.files",
    "stage": "dpone.cli.staging",
    "journal": "dpone.cli.staging",
    "attempts": "dpone.cli.staging",
    "snapshot": "dpone.cli.publication",
    "init": "dpone.cli.project",
    "check": "dpone.cli.project",
    "refresh": "dpone.cli.refresh",
    "rollback": "dpone.cli.rollback",
    "retire": "dpone.cli.retire",
    "status": "dpone.cli.status",
    "doctor": "dpone.cli.doctor",
}


class LazyGroup(click.Group):
    """A group whose commands are looked up in :data:`COMMANDS` when first needed."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        module = COMMANDS.get(cmd_name)
        if module is None:
            return None
        command = getattr(importlib.import_module(module), cmd_name)
        assert isinstance(command, click.Command)
        return command


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(dpone.__version__, prog_name="dpone")
def cli() -> None:
    """Move full-refresh snapshots of SQL Server tables into ClickHouse, with proof.

    Exit codes: 0 success, 1 the operation failed, 2 usage or configuration error,
    3 (status) the server could not be reached.
    """


def _wants_json(args: list[str]) -> bool:
    # Decided from the raw arguments, so a usage error that stops parsing is still
    # reported as JSON when the user asked for JSON.
    options = args[: args.index("--")] if "--" in args else args
    return "--json" in options


def _raise_terminated(signum: int, frame: FrameType | None) -> None:
    raise Terminated(signum)


def main(args: list[str] | None = None) -> None:
    """Console-script entry point and the CLI's one error boundary.

    Every outcome ends here: success, a usage error, a coded dpone error, a signal,
    a closed output pipe, or an unexpected exception (reported as ``internal_error``
    without its text and without a traceback). With ``--json`` exactly one JSON
    object is printed either way. SIGTERM and SIGHUP raise :class:`Terminated`, so temporary
    files are removed on the way out, as on Ctrl-C.
    """
    argv = list(sys.argv[1:] if args is None else args)
    # SIGHUP (the terminal or the cron session went away) is a SIGTERM: clean up, report.
    signal.signal(signal.SIGTERM, _raise_terminated)
    signal.signal(signal.SIGHUP, _raise_terminated)
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
