"""``dpone rollback TABLE``: restore the rollback copy through a new publication.

Thin over :class:`dpone.project.rollback.RollbackService`. With ``--json`` it prints
ONE object: the table's report (``ok``, ``outcome``, ``phase``, ``error``, ...).
"""

from __future__ import annotations

from pathlib import Path

import click

from dpone.cli.output import config_option, json_option, reported_errors
from dpone.cli.refresh import (
    echo_evidence,
    finish_runs,
    preflight,
    select_tables,
)
from dpone.project.config import load_project
from dpone.project.rollback import RollbackReport, RollbackService


@click.command()
@click.argument("name")
@config_option
@json_option
def rollback(name: str, config_path: Path, as_json: bool) -> None:
    """Put TABLE's previous content back, as a new recorded publication.

    The copy the last publication left is checked (UUID, rows, content digest against
    the evidence that staged it) before anything is published. Exit 0 only when the
    rollback was published.
    """
    with reported_errors(as_json):
        project = load_project(config_path)
        tables = select_tables(project, (name,), False)
        preflight(project, tables)
        report = RollbackService(project).rollback(tables[0])
        if not as_json:
            _echo(report)
        finish_runs([report], as_json, report.to_dict)


def _echo(report: RollbackReport) -> None:
    head = f"{report.table} -> {report.target}"
    if report.ok:
        click.echo(f"{head}: rolled back to {report.rows} rows from {report.copy_table}")
        click.echo(
            f"  target uuid {report.target_uuid_before} -> {report.target_uuid_after}; "
            f"the undone content is the rollback copy {report.copy_table}"
        )
    else:
        error = report.error or {}
        click.echo(
            f"{head}: NOT rolled back ({report.outcome}, phase {report.phase}): "
            f"[{error.get('code')}] {error.get('message')}"
        )
        if report.outcome == "failed":
            click.echo("  the target is unchanged")
    echo_evidence(report)
