"""``dpone stage`` and ``dpone journal`` (``dpone attempts`` is :mod:`dpone.cli.attempts`).

A stage that fails or is stopped by a signal says what it left behind (its journal,
its table, its spool, its ingest lease) and the one command that finishes the job,
in text and in the ``--json`` error's details (``left_behind``, ``next_command``).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import click

from dpone.cli.attempts import attempts as attempts  # the command group main.py looks up here
from dpone.cli.interruptions import is_interruption, report_interruption
from dpone.cli.output import emit_json, json_option, reported_errors
from dpone.cli.staging_options import (
    existing_file,
    limit_option,
    server_options,
    staging_config,
    store_option,
    work_dir_option,
)
from dpone.contracts.composition_snapshot import SnapshotLimits
from dpone.errors import ConfigurationError, DponeError
from dpone.ports.clickhouse_request import check_attempt_id
from dpone.project.ingest_leases import lease_ids, release_after_failure, store_given
from dpone.project.server import server_access
from dpone.publication.ceilings.stream_ceilings import stream_refusal
from dpone.publication.composition import (
    ingest_session_notes,
    issue_ingest,
    staging_policy,
)
from dpone.publication.principals.pool_databases import pool_protects
from dpone.publication.store import StoreLocation
from dpone.staging.composition import StagingConfig
from dpone.staging.journal import read_events, verify_journal
from dpone.staging.leftovers import NO_EVENTS, finishing_command, left_behind
from dpone.staging.sink import ClickHouseSink, new_attempt_id


def _with_principal(
    config: StagingConfig,
    principal: str,
    server: dict[str, object],
    store_path: StoreLocation,
    attempt_id: str,
) -> tuple[StagingConfig, str | None]:
    """Stage as a leased ingest principal of the pool (and its lease id), or as the admin."""
    if principal == "admin":
        return config, None
    if server.get("host") is not None:
        if principal == "pool":
            raise ConfigurationError(
                "--principal pool needs the managed local server", code="pool_needs_managed_server"
            )
        return config, None
    given = server.get("project_config")
    access = server_access(
        Path(str(server["data_dir"])), None if given is None else Path(str(given))
    )
    if principal == "auto" and not pool_protects(access, config.endpoint.database):
        return config, None  # no pool over this database: stage as the operator
    issued = issue_ingest(
        access,
        store_path,
        config.endpoint.database,
        attempt_id,
        project=None if given is None else Path(str(given)),
    )
    leased = replace(
        config,
        credentials=issued.credentials,
        principal_uuid=issued.ref.user_uuid,
        # The drain gate notes its session under the lease: prepare's closure closes
        # it and proves it gone.
        session_notes=ingest_session_notes(store_path, issued.ref.lease_id),
    )
    return leased, issued.ref.lease_id


class TerminalProgress:
    """Rows and bytes of long phases on one rewritten stderr line (terminals only)."""

    def __init__(self) -> None:
        self._shown = False

    def __call__(self, phase: str, rows: int, size: int) -> None:
        click.echo(f"\r{phase}: {rows:,} rows, {size / 2**20:,.1f} MiB   ", nl=False, err=True)
        self._shown = True

    def finish(self) -> None:
        if self._shown:
            click.echo("", err=True)


@click.command()
@click.argument("file", type=existing_file)
@click.option(
    "--receipt", "receipt_path", type=existing_file, required=True, help="The file's receipt."
)
@work_dir_option
@click.option("--attempt-id", help="Attempt id (default: time and random).")
@click.option(
    "--principal",
    type=click.Choice(["auto", "pool", "admin"]),
    default="auto",
    show_default=True,
    help="Who stages: a leased ingest user of the publication pool (needed to publish), "
    "or the administrator; auto = the pool when the managed server declares it.",
)
@limit_option
@store_option
@server_options
@json_option
def stage(
    file: Path,
    receipt_path: Path,
    work_dir: Path,
    attempt_id: str | None,
    principal: str,
    limits: SnapshotLimits,
    store_path: StoreLocation,
    as_json: bool,
    **server: object,
) -> None:
    """Stage FILE into a private, verified ClickHouse table."""
    with reported_errors(as_json):
        # An empty --attempt-id is refused like any other invalid one, never replaced;
        # before any server is asked.
        attempt_id = new_attempt_id() if attempt_id is None else check_attempt_id(attempt_id)
        config = staging_config(work_dir=work_dir, **server)  # type: ignore[arg-type]
        # The publication's ceilings bound the stream (a generation over one could
        # never be prepared): stopped where it crosses one, not after.
        session = config.policy.session_timeout_seconds
        config = replace(
            config,
            policy=staging_policy(limits, config.policy, session_timeout_seconds=session),
        )
        progress = None if as_json or not sys.stderr.isatty() else TerminalProgress()
        database = config.endpoint.database
        journal_dir = work_dir / attempt_id
        existed = journal_dir.exists()  # then it is not this run's journal to describe
        # Leases an earlier run of this attempt id holds are never this run's to end.
        earlier = lease_ids(store_path, attempt_id) if principal != "admin" else set()
        lease_id: str | None = None
        try:
            config, lease_id = _with_principal(config, principal, server, store_path, attempt_id)
            staged = ClickHouseSink(config, progress=progress).stage_validated_file(
                file, receipt_path, attempt_id=attempt_id
            )
        except BaseException as caught:  # SIGTERM and Ctrl-C too: say what remains
            if progress is not None:
                progress.finish()
            exc = _as_ceiling(caught, limits, config)
            # Cut short while leasing, the lease may be stored without its id returned.
            taken = [lease_id] if lease_id else sorted(lease_ids(store_path, attempt_id) - earlier)
            leases = [
                release_after_failure(exc, store_path, attempt_id, taken_id, server, database)
                for taken_id in taken
            ]
            journal = None if existed else journal_dir
            _report_stopped(exc, as_json, journal, attempt_id, work_dir, server, store_path, leases)
            if exc is caught:
                raise
            raise exc from caught
        if progress is not None:
            progress.finish()
        payload = {
            "ok": True,
            "database": staged.database,
            "table": staged.table,
            "uuid": staged.uuid,
            "rows": staged.rows,
            "semantic_id": staged.semantic_id,
            "journal": str(staged.journal_path),
            "journal_head": staged.journal_head,
            "converter": staged.converter,
        }
        if as_json:
            emit_json(payload)
        else:
            click.echo(
                f"staged {staged.rows} rows into {staged.database}.{staged.table} (uuid {staged.uuid})"
            )
            click.echo(f"semantic id {staged.semantic_id} (RowBinary by {staged.converter})")
            click.echo(f"journal {staged.journal_path}")
            click.echo(
                f"journal head {staged.journal_head} (dpone journal verify --head checks it)"
            )


def _as_ceiling(exc: BaseException, limits: SnapshotLimits, config: StagingConfig) -> BaseException:
    """``exc``, or the publication ceiling (``limit_exceeded``) whose bound stopped it,
    with what staging said about the attempt (its journal, its last event)."""
    if not isinstance(exc, DponeError):
        return exc
    refusal = stream_refusal(limits, config.policy, exc, lambda ceiling: f"--limit {ceiling}=N")
    if refusal is None:
        return exc
    refusal.add_details(**{k: v for k, v in exc.details.items() if k not in refusal.details})
    return refusal


def _report_stopped(
    exc: BaseException,
    as_json: bool,
    journal_dir: Path | None,
    attempt_id: str,
    work_dir: Path,
    server: Mapping[str, object],
    store_path: StoreLocation,
    leases: list[dict[str, Any]],
) -> None:
    """Say what the failed or stopped stage left (:func:`_what_remains`).

    An interruption is reported here, with its facts, and the command exits with the
    signal's code; a failure gets them in its details (what the error says already
    stays, but the leftover's command comes first) and is raised on by the caller.
    """
    database = str(server["database"])
    details, lines = _what_remains(
        exc, journal_dir, attempt_id, work_dir, database, server, store_given(store_path), leases
    )
    if is_interruption(exc):
        sys.exit(report_interruption(exc, as_json, details, lines))
    if isinstance(exc, DponeError):
        exc.add_details(
            **{
                key: value
                for key, value in details.items()
                if key not in exc.details or (key == "next_command" and value)
            }
        )
    if lines and not as_json:
        click.echo("\n".join(lines), err=True)


def _what_remains(
    exc: BaseException,
    journal_dir: Path | None,
    attempt_id: str,
    work_dir: Path,
    database: str,
    server: Mapping[str, object],
    store: Path | str | None,
    leases: list[dict[str, Any]],
) -> tuple[dict[str, Any], list[str]]:
    """What a failed or stopped stage left behind and the one command that finishes it.

    Read from the attempt's own journal (its last event; ``journal_dir`` None when the
    directory is not this run's) and the store (each lease this run took), so it holds
    for any way the stage ended: a coded error, SIGTERM, Ctrl-C. The attempt's
    finishing command (cleanup, discard, archive) also closes its lease; without one,
    the command is the lease's ``close-lease``. Returns the error's details
    (``attempt_id``, ``state``, ``left_behind``, ``leases``, ``next_command``, and
    ``journal`` when this run made one) and the lines a text run prints. Never
    raises: the primary failure is what the user must see.
    """
    state: str | None = None
    remains: dict[str, str] = {}
    if journal_dir is not None and (journal_dir / "events").is_dir():
        try:
            events = read_events(journal_dir)
        except DponeError as unreadable:
            exc.add_note(f"the journal {journal_dir} could not be read: {unreadable}")
            events = None
        if events is not None:
            last = events[-1].document if events else {}
            state = str(last.get("state")) if events else NO_EVENTS
            remains = left_behind(last, journal_dir)
    for n, lease in enumerate(leases, start=1):
        described = {
            "closed": "closed (its closure proven)",
            "closure_unproven": "ended, its closure not proven",
            "active": "still active",
        }.get(lease["state"], "in an unknown state")
        key = "lease" if n == 1 else f"lease {n}"  # one run takes one lease
        remains[key] = f"{lease['lease_id']} ({lease.get('user', '?')}), {described}"
    finish = None
    if state is not None:
        finish = finishing_command(state, attempt_id, work_dir, database, server, store=store)
    if finish is None:
        finish = next((lease["command"] for lease in leases if lease["command"]), None)
    details: dict[str, Any] = {
        "attempt_id": attempt_id,
        "state": state,
        "left_behind": remains,
        "leases": leases,
        "next_command": finish,
    }
    if state is not None:
        details["journal"] = str(journal_dir)
    if not remains:
        return details, []
    if state == NO_EVENTS:
        head = f"the attempt {attempt_id} stopped before its first journal event (nothing was sent)"
    elif state is not None:
        head = f"the attempt {attempt_id} ended {state}"
    else:
        head = f"the attempt {attempt_id} made no journal"
    lines = [f"{head}; it left behind:"]
    lines += [f"  {what}: {where}" for what, where in remains.items()]
    lines.append(f"to finish: {finish}" if finish else "nothing to finish")
    return details, lines


@click.group()
def journal() -> None:
    """Read and verify attempt journals."""


@journal.command("show")
@click.argument("attempt_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
def journal_show(attempt_dir: Path) -> None:
    """Print every event of ATTEMPT_DIR, one JSON object per line."""
    with reported_errors(False):
        for event in read_events(attempt_dir):
            click.echo(
                json.dumps(
                    {"sha256": event.sha256, **event.document}, sort_keys=True, ensure_ascii=False
                )
            )


@journal.command("verify")
@click.argument("attempt_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option(
    "--head",
    help="SHA-256 of the final event (as `dpone stage` printed it): "
    "the journal must end exactly there.",
)
@json_option
def journal_verify(attempt_dir: Path, head: str | None, as_json: bool) -> None:
    """Check sequence, hash chain and canonical bytes; exit 1 naming the first break.

    An empty journal fails. Without --head, deleted trailing events cannot be noticed.
    """
    with reported_errors(as_json):
        events = verify_journal(attempt_dir, head=head)
        last = events[-1]
        if as_json:
            emit_json(
                {
                    "ok": True,
                    "events": len(events),
                    "last_sha256": last.sha256,
                    "attempt_id": last.document["attempt_id"],
                    "state": last.document.get("state"),
                    "head_checked": head is not None,
                }
            )
        else:
            click.echo(
                f"{attempt_dir}: {len(events)} events verify; last state "
                f"{last.document.get('state')}; head {last.sha256}"
                + (" (as expected)" if head else "")
            )
