"""``dpone stage``, ``dpone journal`` and ``dpone attempts``."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

import click

from dpone.cli.connection import managed_credentials
from dpone.cli.output import emit_json, json_option, reported_errors
from dpone.cli.server import data_dir_option
from dpone.errors import ConfigurationError, DponeError, StateError
from dpone.localserver import find_running
from dpone.localserver.principal_pool import ROLE_INGEST
from dpone.localserver.protected import start_command
from dpone.ports.clickhouse_request import Endpoint, check_attempt_id
from dpone.preparation.modes import DEFAULT_MODE, MODES, refuse_removed_mode
from dpone.project.leases import close_lease
from dpone.publication.composition import (
    DEFAULT_STORE,
    PublicationConfig,
    build_publication,
    ingest_session_notes,
    issue_ingest,
    pool_protects,
)
from dpone.publication.store import SqliteSnapshotStore
from dpone.staging.composition import StagingConfig, build_transport
from dpone.staging.journal import read_events, verify_journal
from dpone.staging.recovery import (
    RECOVERY_STEPS,
    attempt_directory,
    cleanup_attempt,
    discard_attempt,
    finishing_command,
    left_behind,
    survey_attempts,
)
from dpone.staging.sink import ClickHouseSink, new_attempt_id

existing_file = click.Path(exists=True, dir_okay=False, path_type=Path)
work_dir_option = click.option(
    "--work-dir",
    type=click.Path(file_okay=False, path_type=Path),
    required=True,
    help="Directory holding attempt journals and spools.",
)


F = TypeVar("F", bound=Callable[..., Any])


class PreparationChoice(click.Choice[str]):
    """The preparation modes. A removed one (``engine-chdb``) is refused with its typed
    error, ``preparation_mode_removed``, which names the replacement, not as an
    unknown choice."""

    def __init__(self) -> None:
        super().__init__(MODES)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        if isinstance(value, str):
            refuse_removed_mode(value)
        return super().convert(value, param, ctx)


def server_options(func: F) -> F:
    """Where the ClickHouse server is: the managed local one by default."""
    for option in reversed(
        [
            data_dir_option,
            click.option("--host", help="A ClickHouse host instead of the managed local server."),
            click.option("--http-port", type=int, help="HTTP port (with --host)."),
            click.option("--tcp-port", type=int, help="Native port (with --host)."),
            click.option("--database", required=True, help="The Atomic database to stage into."),
            click.option(
                "--transport",
                type=click.Choice(["http", "client"]),
                default="http",
                show_default=True,
                help="Controlled transport; chosen explicitly, never auto.",
            ),
            click.option(
                "--client-path",
                default="clickhouse-client",
                show_default=True,
                help="clickhouse-client binary for --transport client.",
            ),
            click.option(
                "--preparation",
                "preparation_mode",
                type=PreparationChoice(),
                default=DEFAULT_MODE,
                show_default=True,
                help="RowBinary converter: compiled (a file it declines goes to the Python "
                "reference), or the Python reference alone; both give the same bytes.",
            ),
        ]
    ):
        func = option(func)
    return func


def staging_config(
    data_dir: Path,
    host: str | None,
    http_port: int | None,
    tcp_port: int | None,
    database: str,
    transport: str,
    client_path: str,
    work_dir: Path,
    preparation_mode: str = DEFAULT_MODE,
) -> StagingConfig:
    """Endpoint from options; credentials from the environment or the managed server's file."""
    if host is None:
        info = find_running(data_dir)
        if info is None:
            command = start_command(data_dir, also=(database,))
            raise ConfigurationError(
                f"no managed server runs on {data_dir}; start it with `{command}` or pass --host",
                code="no_server",
                next_command=command,
            )
        endpoint = Endpoint("127.0.0.1", info.http_port, info.tcp_port, database)
    else:
        if http_port is None or tcp_port is None:
            raise ConfigurationError(
                "--host needs --http-port and --tcp-port", code="incomplete_endpoint"
            )
        endpoint = Endpoint(host, http_port, tcp_port, database)
    credentials = managed_credentials(data_dir, managed=host is None)
    return StagingConfig(
        endpoint,
        credentials,
        work_dir,
        transport=transport,
        client_path=client_path,
        preparation_mode=preparation_mode,
    )


def _with_principal(
    config: StagingConfig,
    principal: str,
    server: dict[str, object],
    store_path: Path,
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
    data_dir = Path(str(server["data_dir"]))
    if principal == "auto" and not pool_protects(data_dir, config.endpoint.database):
        return config, None  # no pool over this database: stage as the administrator
    issued = issue_ingest(data_dir, store_path, config.endpoint.database, attempt_id)
    leased = replace(
        config,
        credentials=issued.credentials,
        principal_uuid=issued.ref.user_uuid,
        # The drain gate notes its session under the lease: prepare's closure waits
        # from the last write's answer and proves the session gone.
        session_notes=ingest_session_notes(store_path, issued.ref.lease_id),
    )
    return leased, issued.ref.lease_id


def release_ingest_leases(
    store_path: Path,
    attempt_id: str,
    server: Mapping[str, object],
    database: str,
    only: str | None = None,
) -> list[str]:
    """Close the active ingest leases of ``attempt_id`` (or just ``only``); their ids.

    On the managed server each is closed as ``prepare`` closes it, and the proof is
    stored: a pool user whose last lease ended without a proven closure may not hold a
    write grant on a publication's tables (``writer_grant``). Where no closure can run
    (another server, no pool), the lease is only ended (:func:`end_ingest_leases`).
    """
    if not store_path.is_file():
        return []
    store = SqliteSnapshotStore(store_path, create=False)
    mine = [lease for lease in store.leases_of(attempt_id) if only in (None, lease.lease_id)]
    # An ended lease whose closure was never proven (an interrupted stage, an operator's
    # end-lease) is closed too: until then its user blocks prepare as a writer.
    active = [
        lease.lease_id
        for lease in mine
        if lease.active or (lease.role == ROLE_INGEST and not store.closure_proven(lease))
    ]
    if not active or server.get("host") is not None:
        return end_ingest_leases(store_path, attempt_id, only)
    config = PublicationConfig(Path(str(server["data_dir"])), store_path, create_store=False)
    parts = build_publication(config, database)
    for lease_id in active:
        close_lease(parts, lease_id)
    return active


def end_ingest_leases(store_path: Path, attempt_id: str, only: str | None = None) -> list[str]:
    """End the active ingest leases of ``attempt_id`` (or just ``only``); their ids.

    A staged table that will never be published needs no principal: without this its
    lease stays active and the pool runs out (``pool_exhausted``). A store that does
    not exist holds no lease (and is not created).
    """
    if not store_path.is_file():
        return []
    store = SqliteSnapshotStore(store_path, create=False)
    ended = []
    for lease in store.leases_of(attempt_id):
        if lease.active and only in (None, lease.lease_id):
            store.end_lease(lease.lease_id)
            ended.append(lease.lease_id)
    return ended


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
@click.option(
    "--store",
    "store_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=DEFAULT_STORE,
    show_default=True,
    help="The publication store holding the lease.",
)
@server_options
@json_option
def stage(
    file: Path,
    receipt_path: Path,
    work_dir: Path,
    attempt_id: str | None,
    principal: str,
    store_path: Path,
    as_json: bool,
    **server: object,
) -> None:
    """Stage FILE into a private, verified ClickHouse table."""
    with reported_errors(as_json):
        config = staging_config(work_dir=work_dir, **server)  # type: ignore[arg-type]
        progress = None if as_json or not sys.stderr.isatty() else TerminalProgress()
        # An empty --attempt-id is refused like any other invalid one, never replaced.
        attempt_id = new_attempt_id() if attempt_id is None else check_attempt_id(attempt_id)
        config, lease_id = _with_principal(config, principal, server, store_path, attempt_id)
        journal_dir = work_dir / attempt_id
        existed = journal_dir.exists()  # then it is not this run's journal to describe
        try:
            staged = ClickHouseSink(config, progress=progress).stage_validated_file(
                file, receipt_path, attempt_id=attempt_id
            )
        except BaseException as exc:  # SIGTERM and Ctrl-C too: say what remains
            if progress is not None:
                progress.finish()
            if lease_id is not None:
                _end_lease_after_failure(
                    exc, store_path, attempt_id, lease_id, server, config.endpoint.database
                )
            if not existed:
                _tell_what_remains(
                    exc, journal_dir, work_dir, config.endpoint.database, server, as_json
                )
            raise
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
        }
        if as_json:
            emit_json(payload)
        else:
            click.echo(
                f"staged {staged.rows} rows into {staged.database}.{staged.table} (uuid {staged.uuid})"
            )
            click.echo(f"semantic id {staged.semantic_id}")
            click.echo(f"journal {staged.journal_path}")
            click.echo(
                f"journal head {staged.journal_head} (dpone journal verify --head checks it)"
            )


def _end_lease_after_failure(
    exc: BaseException,
    store_path: Path,
    attempt_id: str,
    lease_id: str,
    server: Mapping[str, object],
    database: str,
) -> None:
    """A failed stage publishes nothing: its lease is closed, or at least ended.

    Interrupted (Ctrl-C, SIGTERM), or when a closure cannot run or fails, the lease is
    only ended; each failure is a note on the primary error, which the user sees.
    """
    if isinstance(exc, Exception):  # not on Ctrl-C or SIGTERM: a closure waits seconds
        try:
            release_ingest_leases(store_path, attempt_id, server, database, only=lease_id)
            return
        except (DponeError, OSError) as close_exc:
            exc.add_note(f"the ingest lease {lease_id} could not be closed: {close_exc}")
    try:
        end_ingest_leases(store_path, attempt_id, only=lease_id)
    except (DponeError, OSError) as store_exc:
        exc.add_note(f"the ingest lease {lease_id} could not be ended: {store_exc}")


def _tell_what_remains(
    exc: BaseException,
    journal_dir: Path,
    work_dir: Path,
    database: str,
    server: Mapping[str, object],
    as_json: bool,
) -> None:
    """Say what a failed or stopped stage left behind and the command that finishes it.

    Read from the attempt's own journal (its last event), so it holds for any way
    the stage ended: a coded error, SIGTERM, Ctrl-C. Never raises: the primary
    failure is what the user must see.
    """
    try:
        events = read_events(journal_dir) if (journal_dir / "events").is_dir() else []
    except DponeError as unreadable:
        exc.add_note(f"the journal {journal_dir} could not be read: {unreadable}")
        return
    if not events:
        return  # nothing was journaled (the attempt never started)
    last = events[-1].document
    state = str(last.get("state"))
    remains = left_behind(last, journal_dir)
    finish = finishing_command(state, journal_dir.name, work_dir, database, server)
    if isinstance(exc, DponeError):
        exc.add_details(left_behind=remains, next_command=finish)
    if as_json:
        return
    lines = [f"the attempt {journal_dir.name} ended {state}; it left behind:"]
    lines += [f"  {what}: {where}" for what, where in remains.items()]
    if finish:
        lines.append(f"to finish: {finish}")
    click.echo("\n".join(lines), err=True)


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


@click.group()
def attempts() -> None:
    """Attempts that need an operator, and their verified cleanup."""


@attempts.command("list")
@work_dir_option
@click.option("--all", "show_all", is_flag=True, help="Also list attempts that need nothing.")
@json_option
def attempts_list(work_dir: Path, show_all: bool, as_json: bool) -> None:
    """List attempts that ended retained_unknown or cleanup_failed, or never ended."""
    with reported_errors(as_json):
        if not work_dir.is_dir():
            raise ConfigurationError(
                f"work directory {work_dir} does not exist",
                code="work_dir_missing",
                path=str(work_dir),
            )
        summaries, unreadable = survey_attempts(work_dir)
        found = [a for a in summaries if show_all or a.needs_operator]
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
                "attempts": [a.to_dict() for a in found],
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
            click.echo(f"{a.attempt_id}: {a.state} (event {a.last_sequence}, error {a.error_code})")
            table = a.planned_table or {}
            click.echo(
                f"  table {table.get('database')}.{table.get('table')} uuid {a.table_uuid}; "
                f"sent {', '.join(a.sent_mutations) or 'nothing'}"
            )
            if a.state == "staged":
                click.echo(
                    f"  staged, not published by dpone; drop it with: "
                    f"{finishing_command(a.state, a.attempt_id, work_dir, str(table.get('database')))}"
                )
            else:
                click.echo(f"  inventory {json.dumps(a.inventory, sort_keys=True)}")
        for u in unreadable:
            click.echo(f"{u.path.name}: journal unreadable: [{u.error.code}] {u.error.message}")
        if any(a.needs_operator for a in found):
            click.echo("recovery: " + "; then ".join(RECOVERY_STEPS))
        if unreadable:
            raise broken


@attempts.command("cleanup")
@click.argument("attempt_id")
@work_dir_option
@click.option(
    "--store",
    "store_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=DEFAULT_STORE,
    show_default=True,
    help="The publication store holding the attempt's ingest lease (ended).",
)
@server_options
@json_option
def attempts_cleanup(
    attempt_id: str, work_dir: Path, store_path: Path, as_json: bool, **server: object
) -> None:
    """Clean ATTEMPT_ID up when its queries' terminal state is proven; refuse otherwise.

    ATTEMPT_ID names a directory directly inside --work-dir, and the server must be
    the one the attempt's journal bound (endpoint_mismatch). Once cleaned up, the
    attempt's ingest lease in the publication store ends too.
    """
    with reported_errors(as_json):
        # Before the server is even looked for: a bad id is the user's first error.
        attempt_directory(work_dir, attempt_id)
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
@click.option(
    "--store",
    "store_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=DEFAULT_STORE,
    show_default=True,
    help="The publication store holding the attempt's ingest lease (ended).",
)
@server_options
@json_option
def attempts_discard(
    attempt_id: str, work_dir: Path, store_path: Path, as_json: bool, **server: object
) -> None:
    """Drop the staged table of ATTEMPT_ID (never published) after verifying it is its own.

    As for cleanup, ATTEMPT_ID names a directory directly inside --work-dir and the
    server must be the one the journal bound. The attempt's ingest lease in the
    publication store ends too.
    """
    with reported_errors(as_json):
        attempt_directory(work_dir, attempt_id)  # as for cleanup: before any server
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
