"""``dpone attempts``: attempts that need an operator, and the commands that finish them.

``list`` names each one's command (``next_command``); ``cleanup`` proves and drops,
``discard`` drops a staged table never published, ``archive`` moves aside an attempt
whose journal holds no event. Each ends the attempt's ingest lease with a proven
closure.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import click

from dpone.cli.connection import project_server_option
from dpone.cli.output import emit_json, json_option, reported_errors
from dpone.cli.server import data_dir_option
from dpone.cli.staging_options import server_options, staging_config, store_option, work_dir_option
from dpone.errors import ConfigurationError, StateError
from dpone.project.config import load_project
from dpone.project.ingest_leases import close_abandoned_leases, release_ingest_leases, store_given
from dpone.project.server import server_access
from dpone.publication.composition import DEFAULT_STORE
from dpone.publication.store import StoreLocation
from dpone.staging.composition import build_transport
from dpone.staging.leftovers import (
    NO_EVENTS,
    archive_attempt,
    attempt_directory,
    empty_attempt,
    finishing_command,
    refuse_empty_journal,
)
from dpone.staging.recovery import (
    RECOVERY_STEPS,
    AttemptSummary,
    cleanup_attempt,
    discard_attempt,
    survey_attempts,
)


@click.group()
def attempts() -> None:
    """Attempts that need an operator, and their verified cleanup."""


@attempts.command("list")
@click.option(
    "--work-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Directory holding attempt journals (default with --config: the project's "
    "work_dir/attempts).",
)
@click.option("--all", "show_all", is_flag=True, help="Also list attempts that need nothing.")
@click.option(
    "--store",
    "store_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help=f"The publication store the attempts' leases are in (repeated in the commands "
    f"shown; default: the project's store with --config, else {DEFAULT_STORE}).",
)
@data_dir_option
@project_server_option
@json_option
def attempts_list(
    work_dir: Path | None,
    show_all: bool,
    store_path: StoreLocation | None,
    data_dir: Path,
    project_config: Path | None,
    as_json: bool,
) -> None:
    """List attempts that ended retained_unknown or cleanup_failed, or never ended.

    Each comes with the command that finishes it (``next_command``): cleanup, the
    discard of a staged table, or for a journal without any event (its process
    stopped before the first one) ``attempts archive``. With ``--config`` the
    project's attempts, store and server are the defaults, and the commands name its
    server as ``dpone status`` does.
    """
    with reported_errors(as_json):
        work_dir, store_path, server = _list_scope(work_dir, store_path, data_dir, project_config)
        if not work_dir.is_dir():
            raise ConfigurationError(
                f"work directory {work_dir} does not exist",
                code="work_dir_missing",
                path=str(work_dir),
            )
        summaries, unreadable = survey_attempts(work_dir)
        found = [a for a in summaries if show_all or a.needs_operator]
        commands = {
            a.attempt_id: finishing_command(
                a.state,
                a.attempt_id,
                work_dir,
                str((a.planned_table or {}).get("database")),
                server,
                store=store_given(store_path),
            )
            for a in found
        }
        if unreadable:
            # Listed with the others, and the command fails: each needs an operator.
            first = unreadable[0].error
            broken = StateError(
                f"{len(unreadable)} attempt journal(s) in {work_dir} cannot be read "
                f"(first: {unreadable[0].path.name}: [{first.code}] {first.message})",
                code="journal_unreadable",
            )
        if as_json:
            payload: dict[str, Any] = {
                "ok": not unreadable,
                "attempts": [
                    {**a.to_dict(), "next_command": commands[a.attempt_id]} for a in found
                ],
                "unreadable": [u.to_dict() for u in unreadable],
            }
            if unreadable:
                payload["error"] = broken.to_dict()
            emit_json(payload)
            if unreadable:
                sys.exit(1)
            return
        if not found and not unreadable:
            click.echo("no attempt" if show_all else "no attempt needs an operator")
            return
        for a in found:
            _echo_attempt(a, commands[a.attempt_id])
        for u in unreadable:
            click.echo(f"{u.path.name}: journal unreadable: [{u.error.code}] {u.error.message}")
        if any(a.needs_operator and a.state != NO_EVENTS for a in found):
            click.echo("recovery: " + "; then ".join(RECOVERY_STEPS))
        if unreadable:
            raise broken


def _list_scope(
    work_dir: Path | None,
    store_path: StoreLocation | None,
    data_dir: Path,
    project_config: Path | None,
) -> tuple[Path, StoreLocation, dict[str, object]]:
    """The attempts directory, the store and the server options ``attempts list`` uses:
    as given, else (with ``--config``) the project's, named as ``dpone status`` names
    them (a remote server by ``--config``, the managed one by its data directory)."""
    if project_config is None:
        if work_dir is None:
            raise ConfigurationError(
                "give --work-dir (the directory holding the attempt journals) or --config "
                "(a project file, whose work_dir/attempts is then listed)",
                code="work_dir_missing",
            )
        return work_dir, store_path or DEFAULT_STORE, {"data_dir": data_dir}
    project = load_project(project_config)
    server: dict[str, object] = (
        {"project_config": project.path}
        if project.server_arguments()[0] == "--config"
        else {"data_dir": project.clickhouse.data_dir}
    )
    return (
        work_dir if work_dir is not None else project.work_dir / "attempts",
        store_path or project.store,
        server,
    )


def _echo_attempt(a: AttemptSummary, command: str | None) -> None:
    """One attempt of ``attempts list``, as text, with the command that finishes it."""
    click.echo(f"{a.attempt_id}: {a.state} (event {a.last_sequence}, error {a.error_code})")
    if a.unconfirmed is not None:
        click.echo(
            f"  event {a.unconfirmed['sequence']} was "
            + ("written but never confirmed" if a.unconfirmed["written"] else "torn")
            + f" by its writer: not adopted; the attempt is {a.state} "
            "(the next command moves it aside)"
        )
    if a.state == NO_EVENTS:
        click.echo(
            "  no journal event: nothing was sent and no table was created; "
            f"archive it with: {command}"
        )
        return
    table = a.planned_table or {}
    click.echo(
        f"  table {table.get('database')}.{table.get('table')} uuid {a.table_uuid}; "
        f"sent {', '.join(a.sent_mutations) or 'nothing'}"
    )
    if a.state == "staged":
        click.echo(f"  staged, not published by dpone; drop it with: {command}")
        return
    click.echo(f"  inventory {json.dumps(a.inventory, sort_keys=True)}")
    if command and a.needs_operator:
        click.echo(f"  finish with: {command}")


@attempts.command("cleanup")
@click.argument("attempt_id")
@work_dir_option
@store_option
@server_options
@json_option
def attempts_cleanup(
    attempt_id: str, work_dir: Path, store_path: StoreLocation, as_json: bool, **server: object
) -> None:
    """Clean ATTEMPT_ID up when its queries' terminal state is proven; refuse otherwise.

    ATTEMPT_ID names a directory directly inside --work-dir, and the server must be
    the one the attempt's journal bound (endpoint_mismatch). Once cleaned up, the
    attempt's ingest lease in the publication store ends too.
    """
    with reported_errors(as_json):
        # Before the server is even looked for: a bad id is the user's first error, and
        # a journal without events is archived, never cleaned (nothing to prove).
        _refuse_eventless(work_dir, attempt_id, server, store_path)
        config = staging_config(work_dir=work_dir, **server)  # type: ignore[arg-type]
        summary = cleanup_attempt(
            build_transport(config), work_dir, attempt_id, database=config.endpoint.database
        )
        # The journal is terminal now: nothing of this attempt can use its principal.
        release_ingest_leases(store_path, summary.attempt_id, server, config.endpoint.database)
        if as_json:
            emit_json({"ok": True, **summary.to_dict()})
        else:
            click.echo(f"{attempt_id}: cleaned up, now {summary.state}")


@attempts.command("discard")
@click.argument("attempt_id")
@work_dir_option
@store_option
@server_options
@json_option
def attempts_discard(
    attempt_id: str, work_dir: Path, store_path: StoreLocation, as_json: bool, **server: object
) -> None:
    """Drop the staged table of ATTEMPT_ID (never published) after verifying it is its own.

    As for cleanup, ATTEMPT_ID names a directory directly inside --work-dir and the
    server must be the one the journal bound. The attempt's ingest lease in the
    publication store ends too.
    """
    with reported_errors(as_json):
        _refuse_eventless(work_dir, attempt_id, server, store_path)  # as for cleanup
        config = staging_config(work_dir=work_dir, **server)  # type: ignore[arg-type]
        summary = discard_attempt(
            build_transport(config), work_dir, attempt_id, database=config.endpoint.database
        )
        release_ingest_leases(store_path, summary.attempt_id, server, config.endpoint.database)
        if as_json:
            emit_json({"ok": True, **summary.to_dict()})
        else:
            table = summary.planned_table or {}
            click.echo(
                f"{attempt_id}: dropped {table.get('database')}.{table.get('table')}, "
                f"now {summary.state}"
            )


def _refuse_eventless(
    work_dir: Path, attempt_id: str, server: Mapping[str, object], store_path: StoreLocation
) -> None:
    """A bad attempt id, or a journal without events (``journal_empty``, naming the
    ``attempts archive`` command with these options), refused before any server."""
    path = attempt_directory(work_dir, attempt_id)
    if (path / "events").is_dir():
        archive = finishing_command(
            NO_EVENTS, attempt_id, work_dir, "", server, store=store_given(store_path)
        )
        refuse_empty_journal(path, attempt_id, str(archive))


@attempts.command("archive")
@click.argument("attempt_id")
@work_dir_option
@store_option
@data_dir_option
@project_server_option
@json_option
def attempts_archive(
    attempt_id: str,
    work_dir: Path,
    store_path: StoreLocation,
    data_dir: Path,
    project_config: Path | None,
    as_json: bool,
) -> None:
    """Move ATTEMPT_ID aside: an attempt whose journal holds no event.

    Such an attempt's process stopped (SIGKILL) after creating the attempt directory
    and before its first event: it sent nothing and created no table, since every
    mutation follows its durable intent. Refused, changing nothing, when the journal
    has events (``journal_not_empty``, naming the command that finishes it) or a
    process still has the directory open (``attempt_running``). The ingest lease the
    stage took before its journal existed is closed first, with a proof, on the
    managed server of --data-dir (its holder must be proven gone:
    ``lease_holder_live`` / ``lease_holder_unknown``; an unproven closure is
    ``closure_unproven``, and nothing is archived). Then the whole directory moves to
    --work-dir's ``.archived/`` (never deleted), with ``archived.json`` saying when,
    from where and which leases were closed.
    """
    with reported_errors(as_json):
        empty_attempt(work_dir, attempt_id)  # every refusal before the store or a server
        closed = close_abandoned_leases(
            store_path, attempt_id, work_dir, server_access(data_dir, project_config)
        )
        target = archive_attempt(
            work_dir, attempt_id, {"leases_closed": closed, "store": str(store_path)}
        )
        if as_json:
            emit_json(
                {
                    "ok": True,
                    "attempt_id": attempt_id,
                    "state": "archived",
                    "archived_to": str(target),
                    "leases_closed": closed,
                    "store": str(store_path),
                }
            )
        else:
            # Named either way: a lease in another store than the stage's stays held.
            leases = (
                f"ingest lease {', '.join(closed)} closed in {store_path}"
                if closed
                else f"no lease of it in {store_path}"
            )
            click.echo(f"{attempt_id}: no journal event, archived to {target}; {leases}")
