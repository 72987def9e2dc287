"""``dpone refresh``: the full refresh of the project's tables, one attempt each.

Thin over :class:`dpone.project.refresh.RefreshService`. With ``--json`` the command
prints ONE object, ``{"ok": ..., "tables": [...]}``, one member per table (the rule
that every ``--json`` prints exactly one object holds here too).
"""

from __future__ import annotations

import shlex
import signal
import time
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import click

from dpone.cli.output import (
    MIN_RATE_SECONDS,
    TerminalProgress,
    config_option,
    echo_warnings,
    emit_json,
    json_option,
    reported_errors,
    status_line,
)
from dpone.connectors.http_connections import POOL
from dpone.errors import ConfigurationError
from dpone.project.config import DESIGN_CHANGES, MAX_JOBS, Project, TableConfig, load_project
from dpone.project.design_change import describe_change
from dpone.project.jobs import RefreshOne, Running, TableProgress, run_jobs
from dpone.project.refresh import RefreshService, TableReport
from dpone.project.refresh_checks import catalog_cleared
from dpone.project.table_run import RunReport
from dpone.publication.composition import pool_credentials
from dpone.publication.sharing.run_sharing import RunSharing

F = TypeVar("F", bound=Callable[..., Any])


class PhaseProgress:
    """One rewritten stderr line per phase: rows, bytes and rate (terminals only)."""

    def __init__(self) -> None:
        self._phase: str | None = None
        self._line: TerminalProgress | None = None

    def __call__(self, phase: str, rows: int, size: int) -> None:
        if phase != self._phase or self._line is None:
            self.finish()
            self._phase, self._line = phase, TerminalProgress(phase)
        self._line(rows, size)

    def finish(self) -> None:
        if self._line is not None:
            TerminalProgress.finish()
        self._phase = self._line = None


def select_tables(project: Project, names: tuple[str, ...], every: bool) -> list[TableConfig]:
    """The tables named (in the order given), or all of them with ``--all``."""
    if every and names:
        raise ConfigurationError("give table names or --all, not both", code="usage_error")
    if every:
        return list(project.tables.values())
    if not names:
        raise ConfigurationError(
            f"name the tables to refresh or pass --all (the project declares: "
            f"{', '.join(project.tables) or 'none'})",
            code="no_tables_selected",
        )
    unknown = [n for n in names if n not in project.tables]
    if unknown:
        raise ConfigurationError(
            f"{', '.join(unknown)}: not declared in {project.path} (it declares: "
            f"{', '.join(project.tables)})",
            code="unknown_table",
            tables=unknown,
        )
    return [project.tables[n] for n in dict.fromkeys(names)]


def preflight(project: Project, tables: list[TableConfig]) -> None:
    """The managed server runs and declares the pool, before any table is touched."""
    for table in tables:
        project.clickhouse.access.endpoint(table.database)
    pool_credentials(project.clickhouse.access)


@click.command()
@click.argument("names", nargs=-1)
@click.option("--all", "every", is_flag=True, help="Refresh every table of the project.")
@config_option
@click.option(
    "--allow-shrink",
    is_flag=True,
    help="Publish even when the new generation is smaller than the shrink guard allows.",
)
@click.option("--fail-fast", is_flag=True, help="Stop at the first table that fails.")
@click.option(
    "--jobs",
    type=click.IntRange(1, MAX_JOBS),
    default=None,
    help=f"Tables refreshed at once, in threads of one process (default: the project's "
    f"`jobs`, else 1; at most {MAX_JOBS}, twice the pool's size: a table waits for a "
    "free principal).",
)
@click.option(
    "--design-change",
    type=click.Choice(DESIGN_CHANGES),
    default=None,
    help="When the source's columns differ from the target's: refuse before the export, "
    "or publish the new design (default: each table's `on_design_change`, else refuse).",
)
@json_option
def refresh(
    names: tuple[str, ...],
    every: bool,
    config_path: Path,
    allow_shrink: bool,
    fail_fast: bool,
    jobs: int | None,
    design_change: str | None,
    as_json: bool,
) -> None:
    """Export, stage, prepare, guard and publish each table; report what happened.

    Exit 0 only when every table was published.
    """
    with reported_errors(as_json):
        project = load_project(config_path)
        tables = select_tables(project, names, every)
        preflight(project, tables)
        # The targets of several tables are observed together once, before the first.
        started, sent = time.monotonic(), POOL.traffic()
        cleared = catalog_cleared(project, tables)
        shared = {
            "cleared": sorted(cleared),
            "seconds": round(time.monotonic() - started, 3),
            **POOL.traffic().since(sent).to_dict(),
        }
        jobs = min(jobs or project.jobs, len(tables))
        if jobs > 1:
            sharing = RunSharing()

            def refresh_one(table: TableConfig, progress: TableProgress) -> TableReport:
                service = _service(project, allow_shrink, design_change, progress, cleared, sharing)
                return service.refresh(table)

            _refresh_jobs(
                config_path, tables, jobs, refresh_one, fail_fast, as_json, shared, sharing
            )
            return
        progress = PhaseProgress() if TerminalProgress.on_terminal(as_json) else None
        service = _service(project, allow_shrink, design_change, progress, cleared)
        reports: list[TableReport] = []
        stopped = False
        for table in tables:
            # A signal stops the run, as --fail-fast does at a failure: every later table
            # is skipped (not only the next one, whose skipped report says neither).
            stopped = stopped or bool(
                reports and (reports[-1].interrupted or (fail_fast and not reports[-1].ok))
            )
            if stopped:
                skipped = TableReport(table.name, table.qualified_target, "")
                skipped.outcome = "skipped"
                reports.append(skipped)
                continue
            report = service.refresh(table)
            reports.append(report)
            if not as_json:
                _echo(report)
        finish_runs(
            reports,
            as_json,
            lambda: {"tables": [r.to_dict() for r in reports], "shared_check": shared},
        )


def _service(
    project: Project,
    allow_shrink: bool,
    design_change: str | None,
    progress: PhaseProgress | TableProgress | None,
    cleared: frozenset[str] = frozenset(),
    sharing: RunSharing | None = None,
) -> RefreshService:
    return RefreshService(
        project,
        allow_shrink=allow_shrink,
        design_change=design_change,
        progress=progress,
        done=progress.finish if progress is not None else None,
        cleared=cleared,
        sharing=sharing,
    )


def _refresh_jobs(
    config_path: Path,
    tables: list[TableConfig],
    jobs: int,
    refresh_one: RefreshOne,
    fail_fast: bool,
    as_json: bool,
    shared: dict[str, Any],
    sharing: RunSharing,
) -> None:
    on_terminal = TerminalProgress.on_terminal(as_json)
    # Text reports in the project's order, each as soon as every earlier one is shown.
    unshown = deque(t.name for t in tables)
    held: dict[str, dict[str, Any]] = {}

    def show(report: dict[str, Any]) -> None:
        held[str(report["table"])] = report
        while not as_json and unshown and unshown[0] in held:
            TerminalProgress.finish()
            _echo(TableReport(**held[unshown.popleft()]))

    shown = [""]

    def changed(running: list[Running], done: int, waiting: int) -> None:
        described = [describe_progress(name, progress) for name, progress in running]
        line = f"{'; '.join(described) or '-'} ({done} done, {waiting} waiting)"
        if on_terminal and line != shown[0]:
            shown[0] = line
            status_line(line)

    documents, stopped_by = run_jobs(
        tables,
        jobs,
        refresh_one,
        fail_fast=fail_fast,
        on_report=show,
        on_change=changed,
        again=lambda table: shlex.join(
            ["dpone", "refresh", table.name, "--config", str(config_path)]
        ),
        sharing=sharing,
    )
    TerminalProgress.finish()
    reports = [TableReport(**d) for d in documents]
    if not as_json:  # those held behind a table never reported, and the skipped
        for report in reports:
            if report.table in unshown:
                _echo(report)
    # How many tables each shared read answered, by kind and database, in order.
    document = {
        "tables": documents,
        "jobs": jobs,
        "shared_check": shared,
        "shared_reads": sharing.batches(),
    }
    finish_runs(reports, as_json, lambda: document, stopped_by)


def finish_runs(
    reports: Sequence[RunReport],
    as_json: bool,
    document: Callable[[], dict[str, Any]],
    stopped_by: str | None = None,
) -> None:
    """Print the JSON object (``document``) and exit: 0 only when every run succeeded.

    A run stopped by a signal (one of ``reports``, or ``stopped_by``: the signal the
    caller itself received) exits 128 + its number after the reports are printed, and
    the JSON object says so at the top too (``interrupted`` and an ``error``).
    """
    ok = all(r.ok for r in reports)
    stopped = next((r for r in reports if r.interrupted), None)
    signame = stopped.interrupted if stopped is not None else stopped_by
    if as_json:
        payload = {"ok": ok and signame is None, **document()}
        if signame is not None:
            error = stopped.error if stopped is not None else None
            payload |= {
                "interrupted": signame,
                "error": error
                or {"code": "interrupted", "message": f"stopped by {signame}", "details": {}},
            }
        emit_json(payload)
    if signame is not None:
        raise SystemExit(128 + signal.Signals[signame])
    if not ok:
        raise SystemExit(1)


def _echo(report: TableReport) -> None:
    head = f"{report.table} -> {report.target}"
    if report.outcome == "skipped":
        click.echo(f"{head}: skipped (not started)")
        echo_evidence(report)
        return
    if report.ok:
        was = "new target" if report.created_target else f"was {report.previous_rows}"
        click.echo(
            f"{head}: published {report.rows} rows ({was}), "
            f"{(report.file_bytes or 0) / 1024:,.1f} KiB exported"
        )
        click.echo(
            f"  target uuid {report.target_uuid_before} -> {report.target_uuid_after}; "
            f"rollback copy {report.generation_table}"
        )
        if report.design_change:
            changed = "; ".join(describe_change(c) for c in report.design_change)
            click.echo(f"  new design: {changed}")
    else:
        error = report.error or {}
        click.echo(
            f"{head}: NOT published ({report.outcome}, phase {report.phase}): "
            f"[{error.get('code')}] {error.get('message')}"
        )
        # An interrupted run decided its intent on the way out: with nothing left, it
        # was not published.
        settled = report.outcome == "interrupted" and not report.left_behind
        if report.outcome in ("failed", "not_published") or settled:
            click.echo("  the target is unchanged")
    if report.ok and report.error:
        click.echo(f"  {report.phase}: [{report.error.get('code')}] {report.error.get('message')}")
    for dropped in report.dropped_rollback_copies:
        click.echo(f"  dropped old rollback copy {dropped}")
    timings = ", ".join(f"{k} {v:.2f}s" for k, v in report.timings.items())
    click.echo(f"  phases: {timings}")
    echo_evidence(report)
    echo_warnings(report.warnings)


def echo_evidence(report: RunReport) -> None:
    """The lines a table's run ends with: its intent, its journal, what it left, what
    to run next."""
    if report.intent_sha256:
        click.echo(f"  intent {report.intent_sha256} ({report.state}@{report.revision})")
    if report.journal:
        click.echo(f"  journal {report.journal}")
    if report.interrupted and not report.left_behind:
        click.echo("  left nothing to finish" + (" (published)" if report.ok else ""))
    for item in report.left_behind:
        what = item.get("attempt_id") or item.get("intent_sha256") or item.get("lease_id")
        click.echo(f"  left: {item.get('kind')} {what}")
    for command in report.next_commands:
        click.echo(f"  next: {command}")


def describe_progress(name: str, progress: dict[str, Any] | None) -> str:
    """``name: phase, rows, rate`` for one running table (the rate after half a second)."""
    if not progress:
        return f"{name}: starting"
    parts = [str(progress.get("phase"))]
    rows, seconds = int(progress.get("rows") or 0), float(progress.get("seconds") or 0)
    if rows > 0:
        parts.append(f"{rows:,} rows")
        if seconds >= MIN_RATE_SECONDS:
            parts.append(f"{rows / seconds:,.0f} rows/s")
    return f"{name}: {', '.join(parts)}"
