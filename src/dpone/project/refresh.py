"""The full refresh of one table: export, stage, prepare, guard, publish, report.

:class:`RefreshService` runs one attempt per table and call, in phases: ``check``,
``export``, ``stage``, ``prepare``, ``shrink_guard``, ``publish`` and ``retention``.
Whatever fails, the target is left as it was, and the report names the phase, the error
and the command that finishes or undoes what remains. See docs/architecture.md ("The
journey of one refresh") and docs/cli.md (``dpone refresh``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple

from dpone.connectors.clickhouse_http import HttpTransport
from dpone.connectors.clickhouse_tables import (
    TableObservationError,
    staging_table_name,
    table_rows,
)
from dpone.contracts.composition_snapshot import SnapshotIntent, SnapshotState
from dpone.contracts.receipt import FileReceipt
from dpone.durable_files import private_directories, temporary_siblings
from dpone.errors import DponeError
from dpone.exporters.export import export_table, receipt_path_for
from dpone.exporters.sources import open_source
from dpone.localserver.principal_pool import ROLE_INGEST
from dpone.ports.clickhouse import QueryPort
from dpone.ports.clickhouse_request import read_query_id
from dpone.ports.composition_snapshot import AttemptRef, IssuedPrincipal, TargetSlot
from dpone.preparation.artifact import HeldArtifact
from dpone.project.config import Project, TableConfig
from dpone.project.interruption import (
    account_for_interruption,
    nothing_will_publish,
    settle_intent,
)
from dpone.project.leases import close_attempt_leases
from dpone.project.refresh_checks import (
    RefreshChecks,
    RefreshError,
    literal,
    select_rows,
    table_lock,
)
from dpone.project.retention import enforce_retention
from dpone.project.table_run import (
    REQUEST_SECONDS,
    Phases,
    PublishStep,
    RunReport,
    publication_for,
    run_phases,
    snapshot_command,
)
from dpone.project.workers import register_attempt
from dpone.publication.catalog import ClickHouseSnapshotCatalog
from dpone.publication.ceilings.retained import headroom_policy, headroom_refusal
from dpone.publication.ceilings.stream_ceilings import stream_refusal
from dpone.publication.composition import (
    PublicationComponents,
    ingest_session_notes,
    staging_policy,
)
from dpone.publication.sharing.run_sharing import RunSharing
from dpone.staging.composition import StagingConfig
from dpone.staging.contract import PhysicalDesign, StagingPolicy
from dpone.staging.journal import read_events
from dpone.staging.leftovers import archive_attempt
from dpone.staging.recovery import discard_attempt, finishing_command
from dpone.staging.sink import ClickHouseSink, new_attempt_id

PHASES = ("check", "export", "stage", "prepare", "shrink_guard", "publish", "retention")
# progress(phase, rows, bytes): a terminal display only, never part of any evidence.
Progress = Callable[[str, int, int], None]


class Headroom(NamedTuple):
    """What the slot's database retained before staging, and the policy it leaves."""

    retained_bytes: int
    policy: StagingPolicy


_PUBLISH = PublishStep(
    "publication",
    RefreshError,
    reconcile_in=frozenset({SnapshotState.EXCHANGE_INTENT, SnapshotState.COMMIT_UNKNOWN}),
)


@dataclass
class TableReport(RunReport):
    """What one table's refresh did, for people (text) and programs (``to_dict``)."""

    previous_rows: int | None = None
    file_bytes: int | None = None
    generation_table: str | None = None
    created_target: bool = False
    dropped_rollback_copies: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    # The columns the published design changed (on_design_change = "replace").
    design_change: list[dict[str, Any]] = field(default_factory=list)


class RefreshService:
    """Refreshes the tables of one project on the managed local server."""

    def __init__(
        self,
        project: Project,
        *,
        allow_shrink: bool = False,
        progress: Progress | None = None,
        done: Callable[[], None] | None = None,
        design_change: str | None = None,
        cleared: frozenset[str] = frozenset(),
        sharing: RunSharing | None = None,
    ) -> None:
        self.project = project
        # The run's shared reads, when its tables go in threads (project/jobs.py).
        self.sharing = sharing
        self.allow_shrink = allow_shrink
        # Tables whose targets the run found clear at its start, for all of them at once
        # (refresh_checks.catalog_cleared): their check does not observe them again.
        self.cleared = cleared
        self.design_change = design_change  # this run's choice over each table's own
        self.progress = progress
        self.done = done or (lambda: None)

    @property
    def attempts_dir(self) -> Path:
        return self.project.work_dir / "attempts"

    def refresh(self, table: TableConfig) -> TableReport:
        """One attempt for ``table``; never raises a :class:`DponeError` (the report has it)."""
        report = TableReport(table.name, table.qualified_target, new_attempt_id())
        return run_phases(
            report,
            partial(self._run, table),
            partial(self._failed, table),
            partial(self._interrupted, table),
        )

    def _failed(self, table: TableConfig, report: TableReport, exc: DponeError) -> None:
        self.done()
        if not report.next_commands:
            report.next_commands = self._after_failure(table, report, exc)

    def _interrupted(self, table: TableConfig, report: TableReport) -> None:
        self.done()
        account_for_interruption(
            self.project, table, report, "refresh", partial(self._settle, table)
        )

    def _settle(self, table: TableConfig, report: RunReport) -> None:
        """End what an interrupted refresh holds: its intent decided, then, unless it
        was published, its staged generation discarded and its ingest lease closed."""
        parts = publication_for(self.project, table)
        if not nothing_will_publish(settle_intent(parts, report)):
            return  # published, or for the reconcile that status names to decide
        events = _events(self.attempts_dir / report.attempt_id)
        if events and events[-1].document.get("state") == "staged":
            intent = None
            if report.intent_sha256 is not None:
                stored = parts.store.load(report.intent_sha256)
                intent = SnapshotIntent.from_bytes(stored.intent_bytes)
            discard_attempt(
                HttpTransport(parts.endpoint, self.project.clickhouse.access.operator()),
                self.attempts_dir,
                report.attempt_id,
                database=table.database,
                expected_uuid=intent.generation_uuid if intent is not None else None,
            )
        closed = close_attempt_leases(parts, report.attempt_id)
        journal = self.attempts_dir / report.attempt_id
        if not events and (journal / "events").is_dir():
            # Cut between the journal's creation and its first event: nothing was sent
            # (every mutation follows its durable intent). Moved aside as `dpone attempts
            # archive` would, so that nothing is left for a person.
            archive_attempt(
                self.attempts_dir,
                report.attempt_id,
                {"leases_closed": closed, "store": str(self.project.store), "by": "refresh"},
            )

    # ------------------------------------------------------------------ the phases

    def _run(self, table: TableConfig, report: TableReport, phase: Phases) -> None:
        with ExitStack() as held:
            with phase("check"):
                held.enter_context(
                    table_lock(self.project.work_dir, table.name, self.project.store)
                )
                checks = RefreshChecks(self.project, self.design_change, self.cleared, self.sharing)
                report.design_change = checks.check(table, report.attempt_id)
                replace = checks.replaces(table)
                # The check built the publication's parts (its claims and the pool's
                # ids read): the run goes on with them rather than read them again.
                parts = checks.parts or publication_for(self.project, table, sharing=self.sharing)
            self._run_locked(table, report, phase, replace, parts)

    def _run_locked(
        self,
        table: TableConfig,
        report: TableReport,
        phase: Phases,
        replace: bool,
        parts: PublicationComponents,
    ) -> None:
        project = self.project
        with phase("export"):
            exported = self._export(table, report.warnings.append)
        report.file_bytes = exported.receipt.artifact_size
        report.rows = exported.receipt.rows_validated
        with phase("stage"):
            admin_login = project.clickhouse.access.operator()
            admin = HttpTransport(parts.endpoint, admin_login)
            design = self._design(admin, table, report.attempt_id)
            headroom = self._headroom(table, parts, report.attempt_id)  # before any lease
            # Whose files the attempt needs, for status on any worker sharing the store.
            register_attempt(parts.store, report.attempt_id, project.work_dir / "attempts")
            ingest = parts.issuer.issue(ROLE_INGEST, report.attempt_id)
            staged = self._stage(table, ingest, design, exported, report, parts, headroom)
        report.journal = str(staged.journal_path)
        report.generation_table = staged.table
        with phase("prepare"):
            self._show("prepare")
            prepared = parts.publisher.prepare(
                AttemptRef(staged.journal_path, TargetSlot(table.database, table.target)),
                staged.journal_head,
                # "replace" publishes the generation's design whatever differs: its
                # columns (listed in the report) or what was added to the target since
                # (an index, a codec, a TTL, a setting), which prepare alone can see.
                design_change=replace,
            )
        report.intent_sha256 = prepared.intent_sha256
        intent = SnapshotIntent.from_bytes(parts.store.load(prepared.intent_sha256).intent_bytes)
        report.target_uuid_before = intent.target_uuid
        report.created_target = any(
            h.facts.get("step") == "create_target" for h in parts.store.history(intent.sha256)
        )
        with phase("shrink_guard"):
            report.previous_rows = self._targetselect_rows(admin, intent, report.attempt_id)
            refused = self._shrinks(table, report.previous_rows, intent.source_rows)
            if refused is not None:
                self._refuse_shrink(parts, admin, intent, report, refused)
                return
        with phase("publish"):
            self._show("publish")
            _PUBLISH.run(project, parts, report)
            self.done()
        if not project.keep_exports:
            _remove_export(exported.path, exported.receipt_path, report.warnings.append)
        with phase("retention"):
            report.dropped_rollback_copies = enforce_retention(
                parts.store,
                admin,
                project.work_dir / "retention",
                table.database,
                table.target,
                keep=project.keep_rollback,
                user=admin_login.user,
            )

    def _show(self, phase: str) -> None:
        """A phase without counts (it waits on the server) is shown as running."""
        if self.progress is not None:
            self.progress(phase, 0, 0)

    def _export(self, table: TableConfig, warn: Callable[[str], None]) -> Any:
        source = open_source(self.project.sources[table.source])
        exports = self.project.work_dir / "exports"
        private_directories(exports)
        progress = None
        if self.progress is not None:
            show = self.progress
            progress = lambda rows, size: show("export", rows, size)  # noqa: E731
        out = exports / f"{table.name}.tsv"
        # A refresh killed while exporting (SIGKILL runs no cleanup) left its temporary
        # siblings; under the table's lock no live export of this table owns one.
        for stale in _partial_exports(out):
            stale.unlink(missing_ok=True)
        result = export_table(
            source,
            table.source_table,
            out,
            force=_replaces_own_export(out),
            progress=progress,
            warn=warn,
        )
        self.done()
        return result

    def _headroom(
        self, table: TableConfig, parts: PublicationComponents, attempt_id: str
    ) -> Headroom:
        """The staging bound under what the slot's database retains now.

        Wire bytes are what the producer can bound while it streams: the staging
        policy's ``max_spool_bytes`` (the spool as written, the INSERT body as sent)
        becomes min(wire_bytes, total_transient_storage_bytes - retained now), and a
        database already at a storage ceiling is refused here, before anything is
        staged (``limit_exceeded``). What the server stores for those bytes is known
        only once they are in: the final storage values are checked again at
        ``prepare`` and at ``publish``.
        """
        catalog = parts.publisher.catalog
        if not isinstance(catalog, ClickHouseSnapshotCatalog):
            raise RefreshError(
                "the publication's catalog cannot observe retained storage",
                code="catalog_unobservable",
            )
        slot = TargetSlot(table.database, table.target)
        retained = catalog.retained_bytes(slot, staging_table_name(attempt_id))
        base = staging_policy(
            table.limits,
            session_timeout_seconds=self.project.publication.session_timeout_seconds,
        )
        return Headroom(retained, headroom_policy(table.limits, retained, base))

    def _stage(
        self,
        table: TableConfig,
        ingest: IssuedPrincipal,
        design: PhysicalDesign,
        exported: Any,
        report: TableReport,
        parts: PublicationComponents,
        headroom: Headroom,
    ) -> Any:
        clickhouse = self.project.clickhouse
        config = StagingConfig(
            parts.endpoint,
            ingest.credentials,
            self.attempts_dir,
            transport=clickhouse.transport,
            client_path=clickhouse.client_path,
            preparation_mode=clickhouse.preparation,
            principal_uuid=ingest.ref.user_uuid,
            design=design,
            policy=headroom.policy,
            # The ingest drain gate notes its session under the lease, for its closure.
            session_notes=ingest_session_notes(self.project.store, ingest.ref.lease_id),
        )
        try:
            staged = ClickHouseSink(config, progress=self.progress).stage_validated_file(
                exported.path,
                exported.receipt_path,
                attempt_id=report.attempt_id,
                overrides=dict(table.types) or None,
            )
        except DponeError as exc:
            # Nothing will be published from this attempt: its ingest principal is
            # closed (proven quiescent) so the pool gets the user back.
            try:
                parts.publisher.authority.close_principal(ingest.ref)
            except DponeError as close_exc:
                exc.add_details(ingest_release_failed=close_exc.code)
            if "journal" in exc.details:
                report.journal = str(exc.details["journal"])
            refusal = headroom_refusal(
                table.limits, headroom.retained_bytes, headroom.policy, exc, table.limit_key
            ) or stream_refusal(table.limits, headroom.policy, exc, table.limit_key)
            if refusal is not None:
                kept = ("journal", "ingest_release_failed")  # what the staging error told
                refusal.add_details(**{k: exc.details[k] for k in kept if k in exc.details})
                raise refusal from exc
            raise
        except BaseException as exc:
            # Interrupted (Ctrl-C, SIGTERM, a bug): the lease must not outlive the run.
            # Closing proves it quiescent in a few seconds; when even that is cut, the
            # lease is at least ended (its closure is then unproven, and `dpone status`
            # names the command that proves it).
            _release_ingest(parts, ingest, exc)
            raise
        finally:
            self.done()
        return staged

    def _design(self, admin: QueryPort, table: TableConfig, attempt_id: str) -> PhysicalDesign:
        """The target's ORDER BY / PARTITION BY when it exists, else the declared design."""
        rows = select_rows(
            admin,
            "SELECT engine, sorting_key, partition_key FROM system.tables WHERE "
            f"database = {literal(table.database)} AND name = {literal(table.target)}",
            read_query_id(attempt_id, "refresh_design", 1),
        )
        if not rows:
            return table.design
        row = rows[0]
        if row.get("engine") != "MergeTree":
            raise RefreshError(
                f"the target {table.qualified_target} is a {row.get('engine')} table; a refresh "
                "publishes MergeTree generations only",
                code="design_unsupported",
                engine=row.get("engine"),
            )
        try:
            return PhysicalDesign(
                order_by=str(row.get("sorting_key") or "") or "tuple()",
                partition_by=str(row.get("partition_key") or "") or None,
            )
        except DponeError as exc:
            raise RefreshError(
                f"the target's keys cannot be reproduced by a generation: {exc.message}",
                code="design_unsupported",
            ) from exc

    def _targetselect_rows(self, admin: QueryPort, intent: SnapshotIntent, attempt_id: str) -> int:
        """The target's exact row count now, on the intent's own target UUID."""
        try:
            count = table_rows(
                admin,
                intent.database,
                intent.target_table,
                intent.target_uuid,
                read_query_id(attempt_id, "refresh_target_rows", 1),
                time.monotonic() + REQUEST_SECONDS,
            )
        except TableObservationError as exc:
            raise RefreshError(
                "the target's row count is unobservable", code="target_changed"
            ) from exc
        if count is None:
            raise RefreshError(
                f"the target {intent.database}.{intent.target_table} is not the prepared one "
                f"({intent.target_uuid})",
                code="target_changed",
                intent_sha256=intent.sha256,
            )
        return count

    def _shrinks(self, table: TableConfig, before: int, after: int) -> str | None:
        if self.allow_shrink or before == 0 or after >= before:
            return None
        lost = (before - after) / before
        if lost <= table.shrink_guard:
            return None
        return (
            f"the new generation has {after} rows, the target {before}: {lost:.0%} fewer, more "
            f"than the guard's {table.shrink_guard:.0%}; nothing was published (run again with "
            "--allow-shrink if the source really shrank)"
        )

    def _refuse_shrink(
        self,
        parts: PublicationComponents,
        admin: QueryPort,
        intent: SnapshotIntent,
        report: TableReport,
        message: str,
    ) -> None:
        cancelled = parts.publisher.cancel(intent.sha256)
        report.state, report.revision = cancelled.state.value, cancelled.revision
        report.outcome = "not_published"
        report.target_uuid_after = intent.target_uuid
        try:
            discard_attempt(
                admin,
                self.attempts_dir,
                report.attempt_id,
                database=intent.database,
                expected_uuid=intent.generation_uuid,
            )
        except DponeError as exc:
            report.next_commands = [
                self._attempt_command("staged", report.attempt_id, intent.database)
            ]
            message += f"; the generation was not discarded: [{exc.code}] {exc.message}"
        raise RefreshError(
            message,
            code="shrink_refused",
            previous_rows=report.previous_rows,
            rows=intent.source_rows,
        )

    # ------------------------------------------------------------------ what remains

    def _after_failure(self, table: TableConfig, report: TableReport, exc: DponeError) -> list[str]:
        """The command that finishes or undoes what the failed phase left."""
        if report.phase == "retention":
            return []  # published; the copies left are listed by `dpone status`
        if report.intent_sha256 is not None and report.phase == "publish":
            return [snapshot_command(self.project, "reconcile", report.intent_sha256)]
        if report.intent_sha256 is not None and report.phase == "shrink_guard":
            if report.state is None:
                return [snapshot_command(self.project, "cancel", report.intent_sha256)]
            return []
        if report.journal is not None:
            events = _events(Path(report.journal))
            state = str(events[-1].document.get("state")) if events else "no_events"
            command = self._attempt_command(state, report.attempt_id, table.database)
            return [command] if command else []
        return []

    def _attempt_command(self, state: str, attempt_id: str, database: str) -> str:
        # The project's server and store: cleanup, discard and archive close the
        # attempt's ingest lease there.
        server: dict[str, object] = {"data_dir": str(self.project.clickhouse.data_dir)}
        if self.project.clickhouse.remote is not None:
            server = {"project_config": str(self.project.path)}
        command = finishing_command(
            state, attempt_id, self.attempts_dir, database, server, store=self.project.store
        )
        return command or ""


def _replaces_own_export(out: Path) -> bool:
    """Whether ``out`` (and its receipt) may be replaced: only an export dpone wrote there.

    dpone's own is a file whose receipt beside it describes it exactly (size and
    SHA-256), or a receipt left alone by a removal cut short. Anything else there is
    someone's file: ``export_exists``, and nothing is written. Neither existing is
    False: the export then refuses a file that appears meanwhile.
    """
    receipt_path = receipt_path_for(out)
    if not os.path.lexists(out) and not os.path.lexists(receipt_path):
        return False
    try:
        receipt = FileReceipt.from_bytes(receipt_path.read_bytes())
        if os.path.lexists(out):
            with HeldArtifact(out, receipt) as held:
                held.verify()
        return True
    except (OSError, DponeError) as exc:
        raise RefreshError(
            f"{out if os.path.lexists(out) else receipt_path} exists and is not an export "
            "this refresh wrote (no receipt beside it that matches it); dpone does not "
            "replace a file it did not write: move it away or delete it",
            code="export_exists",
            path=str(out),
        ) from exc


def _remove_export(path: Path, receipt_path: Path, warn: Callable[[str], None]) -> None:
    """Remove a published table's export: the data first, so a cut leaves the receipt alone."""
    for done in (path, receipt_path):
        try:
            done.unlink(missing_ok=True)
        except OSError as exc:
            warn(f"the published export {done} was not removed: {exc.strerror}")


def _partial_exports(out: Path) -> list[Path]:
    """The temporary siblings an export of ``out`` (data and receipt) writes before its rename."""
    return [*temporary_siblings(out), *temporary_siblings(receipt_path_for(out))]


def _events(journal: Path) -> list[Any]:
    try:
        return read_events(journal)
    except DponeError:
        return []


def _release_ingest(
    parts: PublicationComponents, ingest: IssuedPrincipal, cause: BaseException
) -> None:
    """Close the ingest lease of an interrupted stage, or at least end it."""
    try:
        parts.publisher.authority.close_principal(ingest.ref)
    except BaseException as exc:  # a second Ctrl-C too: the lease is ended below
        cause.add_note(f"closing the ingest lease {ingest.ref.lease_id} failed: {exc!r}")
        try:
            parts.store.end_lease(ingest.ref.lease_id)
        except DponeError as end_exc:
            cause.add_note(f"ending it failed too: {end_exc.code}")
