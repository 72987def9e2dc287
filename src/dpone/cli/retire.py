"""``dpone retire NAME``: remove a table's target and rollback copies, recorded and proven.

Thin over :func:`dpone.project.retire.retire`. Without ``--yes`` it only shows what it
would drop (``confirmation_required``, exit 2). With ``--json`` it prints ONE object.
"""

from __future__ import annotations

from pathlib import Path

import click

from dpone.cli.output import (
    config_option,
    echo_warnings,
    emit_json,
    json_option,
    reported_errors,
)
from dpone.project.config import load_project
from dpone.project.retire import RetireReport
from dpone.project.retire import retire as retire_slot


@click.command()
@click.argument("name")
@config_option
@click.option(
    "--yes",
    "confirmed",
    is_flag=True,
    help="Drop the target and its rollback copies (without it, only show what would go).",
)
@json_option
def retire(name: str, config_path: Path, confirmed: bool, as_json: bool) -> None:
    """Remove NAME's target and rollback copies; the store records the slot as retired.

    NAME is a table of the project file, or the target DATABASE.TABLE of one removed
    from it (``dpone status`` names them). Only tables whose UUID the store recorded as
    dpone's, with their ownership mark, are dropped, each as its own journaled attempt;
    anything else found there is kept and listed. Refused while a publication of the
    table is unfinished. Running it again after an interruption finishes the retire.
    """
    with reported_errors(as_json):
        project = load_project(config_path)
        report = retire_slot(project, name, confirmed=confirmed)
        if as_json:
            emit_json(report.to_dict())
        else:
            _echo(report)


def _echo(report: RetireReport) -> None:
    declared = f" ({report.table})" if report.table else ""
    click.echo(f"{report.target}{declared}: retired {report.retired_at}")
    for done in report.finished:
        click.echo(
            f"  finished the drop of {done['table']} an earlier retire left ({done['state']})"
        )
    for dropped in report.dropped:
        role = dropped["role"].replace("_", " ")
        click.echo(f"  dropped {dropped['table']} ({role}, uuid {dropped['uuid']})")
    for table in report.discarded_generations:
        click.echo(f"  discarded {table} (a generation no publication used)")
    if not (report.finished or report.dropped or report.discarded_generations):
        click.echo("  nothing left to drop")
    for kept in report.kept:
        click.echo(
            f"  kept {kept['table']} (uuid {kept['uuid']}): not a table dpone recorded "
            f"creating ({kept['reason']}); drop it yourself if it is not needed"
        )
    echo_warnings(report.warnings)
