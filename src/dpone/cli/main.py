"""The ``dpone`` command group."""

from __future__ import annotations

import click

import dpone
from dpone.cli.demo import demo
from dpone.cli.files import export, validate, verify
from dpone.cli.server import server
from dpone.cli.staging import attempts, journal, stage


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


def main() -> None:
    """Console-script entry point."""
    cli(prog_name="dpone")
