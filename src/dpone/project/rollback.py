"""Rollback: put the previous content of a target back through a new publication.

After a PUBLISHED EXCHANGE the previous target sits under the generation's name: the
rollback copy (:mod:`dpone.project.retention`). A rollback never sends a blind second
EXCHANGE: it locates the copy from the store, verifies it against the evidence of the
staging that proved its content, writes a rollback journal under
``<work_dir>/rollbacks/<attempt>`` that repeats that evidence, and has the publisher
prepare and publish it exactly as a refresh's, so the store records it and ``dpone
snapshot reconcile`` finishes it if it is cut short. See docs/operations.md
("Rollback").
"""

from __future__ import annotations

import shlex
import time
from contextlib import ExitStack
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from dpone.connectors.clickhouse_http import HttpTransport
from dpone.connectors.endpoint_identity import observe_identity
from dpone.contracts.composition_snapshot import TERMINAL, SnapshotIntent, SnapshotState
from dpone.errors import ConfigurationError, DponeError, StateError
from dpone.localserver.principal_pool import ROLE_INGEST
from dpone.ports.composition_snapshot import (
    AttemptRef,
    CatalogObservation,
    IssuedPrincipal,
    TargetSlot,
)
from dpone.project.config import Project, TableConfig
from dpone.project.interruption import (
    account_for_interruption,
    nothing_will_publish,
    settle_intent,
)
from dpone.project.leases import close_attempt_leases
from dpone.project.refresh_checks import table_lock
from dpone.project.retention import unfinished_publication
from dpone.project.table_run import (
    REQUEST_SECONDS,
    Phases,
    PublishStep,
    RunReport,
    publication_for,
    run_phases,
)
from dpone.publication.composition import PublicationComponents, check_ownership
from dpone.publication.principals.pool_databases import require_database
from dpone.publication.store import SnapshotStore
from dpone.staging.journal import (
    ClickHouseFileAttemptJournal,
    JournalEvent,
    read_events,
)
from dpone.staging.sink import new_attempt_id

# The staging events whose documents the rollback journal repeats, by outcome.
_ORIGIN_MEMBERS = {"admitted": "source_identity", "prepared": "derived_identity"}


class RollbackError(StateError):
    """A rollback refused (see ``code``: no_rollback_copy, content_mismatch, ...)."""

    code = "rollback_refused"


# Short of a terminal state, a rollback publication is finished by `dpone snapshot reconcile`.
_PUBLISH = PublishStep(
    "rollback publication", RollbackError, reconcile_in=frozenset(SnapshotState) - TERMINAL
)


@dataclass(frozen=True)
class RollbackSource:
    """The publication undone, the copy it left, and the evidence that staged the copy."""

    undone: SnapshotIntent
    origin: SnapshotIntent
    journal: Path
    events: list[JournalEvent]

    @property
    def copy_table(self) -> str:
        return self.undone.generation_table

    @property
    def copy_uuid(self) -> str:
        return self.undone.target_uuid


@dataclass
class RollbackReport(RunReport):
    """What one rollback did, for people (text) and programs (``to_dict``)."""

    copy_table: str | None = None
    undone_intent: str | None = None
    restored_intent: str | None = None
    origin_journal: str | None = None


def find_rollback_source(
    store: SnapshotStore, attempts_dir: Path, database: str, target: str
) -> RollbackSource:
    """The copy the slot's last publication left and the journal that staged its content."""
    mine = store.list_snapshots(TargetSlot(database, target))
    # A PREPARED intent a newer epoch superseded can never move: it is not unfinished.
    pending = unfinished_publication(store, database, target)
    if pending is not None:
        raise RollbackError(
            f"{database}.{target} has an unfinished publication ({pending.intent_sha256}); "
            "reconcile or cancel it first (`dpone status` names the command)",
            code="publication_unfinished",
            intent_sha256=pending.intent_sha256,
        )
    published = [s for s in mine if s.state == SnapshotState.PUBLISHED.value]
    if not published:
        raise RollbackError(
            f"{database}.{target} was never published: there is no rollback copy",
            code="no_rollback_copy",
            reason="never_published",
        )
    undone = SnapshotIntent.from_bytes(published[-1].intent_bytes)
    # Oldest first: the first intent that named this UUID as its generation staged it.
    origin = next(
        (
            i
            for i in (SnapshotIntent.from_bytes(s.intent_bytes) for s in mine)
            if i.generation_uuid == undone.target_uuid
        ),
        None,
    )
    if origin is None:
        raise RollbackError(
            f"the copy {database}.{undone.generation_table} is the empty target the first "
            "publication created: there is no earlier content to roll back to",
            code="no_rollback_copy",
            reason="first_publication",
            undone_intent=undone.sha256,
        )
    journal = attempts_dir / origin.attempt_id
    try:
        events = read_events(journal)
    except DponeError as exc:
        raise RollbackError(
            f"the staging journal of the copy ({journal}) does not verify: {exc.message}",
            code="staging_evidence_missing",
            journal=str(journal),
            cause=exc.code,
        ) from exc
    if not events or events[-1].sha256 != origin.staged_event_sha256:
        raise RollbackError(
            f"the staging journal {journal} does not end with the staged event the publication "
            f"{origin.sha256} names",
            code="staging_evidence_missing",
            journal=str(journal),
            intent_sha256=origin.sha256,
        )
    return RollbackSource(undone, origin, journal, events)


def check_copy(observation: CatalogObservation, source: RollbackSource) -> None:
    """The target is the undone generation; the copy is the staged content, unchanged."""
    undone, origin = source.undone, source.origin
    target, copy = observation.target, observation.generation
    name = f"{undone.database}.{source.copy_table}"
    if target is None or target.uuid != undone.generation_uuid:
        raise RollbackError(
            f"the target {undone.database}.{undone.target_table} is not the last publication's "
            f"generation {undone.generation_uuid} (observed {target.uuid if target else None})",
            code="target_changed",
            intent_sha256=undone.sha256,
        )
    if copy is None or copy.uuid != source.copy_uuid:
        raise RollbackError(
            f"{name} no longer holds the rollback copy {source.copy_uuid} (dropped by retention "
            "or replaced)",
            code="no_rollback_copy",
            reason="copy_gone",
            table=name,
            observed_uuid=copy.uuid if copy else None,
        )
    if copy.design_sha256 != origin.design_sha256:
        # Published as it is (a rollback may cross a design change), so its design must
        # be the one it was staged and published with: an index, codec, TTL or setting
        # added to the copy since is refused like altered content.
        raise RollbackError(
            f"{name}'s physical design {copy.design_sha256} is not the one it was published "
            f"with ({origin.design_sha256}): the copy was altered, nothing is published",
            code="design_mismatch",
            table=name,
        )
    if (copy.rows, copy.content_digest) != (origin.source_rows, origin.content_digest):
        raise RollbackError(
            f"{name} holds {copy.rows} rows with content digest {copy.content_digest}; it was "
            f"staged with {origin.source_rows} rows and digest {origin.content_digest}: the "
            "copy was altered, nothing is published",
            code="content_mismatch",
            table=name,
            rows=copy.rows,
            expected_rows=origin.source_rows,
            content_digest=copy.content_digest,
            expected_digest=origin.content_digest,
        )


class RollbackService:
    """Rolls one table of a project back to its rollback copy (see the module doc)."""

    def __init__(self, project: Project) -> None:
        self.project = project

    @property
    def rollbacks_dir(self) -> Path:
        return self.project.work_dir / "rollbacks"

    def rollback(self, table: TableConfig) -> RollbackReport:
        """One rollback attempt; never raises a :class:`DponeError` (the report has it)."""
        report = RollbackReport(table.name, table.qualified_target, new_attempt_id())
        return run_phases(
            report,
            partial(self._run, table),
            interrupted=lambda done: account_for_interruption(
                self.project, table, done, "rollback", partial(self._settle, table)
            ),
        )

    def _settle(self, table: TableConfig, report: RunReport) -> None:
        """End what an interrupted rollback holds: its intent decided, then, unless it may
        still publish, its ingest lease closed (the copy itself stays, it is the target's
        rollback copy)."""
        parts = publication_for(self.project, table)
        if nothing_will_publish(settle_intent(parts, report)):
            close_attempt_leases(parts, report.attempt_id)

    def _run(self, table: TableConfig, report: RollbackReport, phase: Phases) -> None:
        with ExitStack() as held:
            with phase("check"):
                # One refresh or rollback of a table at a time (``refresh_busy``).
                held.enter_context(
                    table_lock(self.project.work_dir, table.name, self.project.store)
                )
                # A rollback publishes: the slot must be this store's (ownership.py).
                check_ownership(
                    self.project.clickhouse.access,
                    self.project.store,
                    [TargetSlot(table.database, table.target)],
                    project=self.project.path,
                )
                try:
                    require_rollback_database(self.project, table)
                except RollbackError as exc:
                    report.next_commands = [str(exc.details["next_command"])]
                    raise
            self._run_locked(table, report, phase)

    def _run_locked(self, table: TableConfig, report: RollbackReport, phase: Phases) -> None:
        project = self.project
        slot = TargetSlot(table.database, table.target)
        with phase("locate"):
            parts = publication_for(project, table)
            source = find_rollback_source(
                parts.store, project.work_dir / "attempts", table.database, table.target
            )
        report.copy_table = f"{table.database}.{source.copy_table}"
        report.undone_intent, report.restored_intent = source.undone.sha256, source.origin.sha256
        report.origin_journal, report.rows = str(source.journal), source.origin.source_rows
        report.target_uuid_before = source.undone.generation_uuid
        with phase("verify_copy"):
            check_copy(parts.publisher.catalog.observe(slot, source.copy_table), source)
        with phase("evidence"):
            ingest = parts.issuer.issue(ROLE_INGEST, report.attempt_id)
            try:
                staged = self._journal(parts, source, ingest, report.attempt_id)
            except DponeError as exc:
                _release(parts, ingest, exc)
                raise
        report.journal = str(self.rollbacks_dir / report.attempt_id)
        with phase("prepare"):
            try:
                # The copy's design is published as it is: the content it held before
                # a design change goes back with the design it had (its digest and rows
                # were verified against the evidence that staged it).
                prepared = parts.publisher.prepare(
                    AttemptRef(Path(report.journal), slot), staged.sha256, design_change=True
                )
            except DponeError as exc:
                _release(parts, ingest, exc)  # a refused reopen leaves the lease active
                raise
        report.intent_sha256 = prepared.intent_sha256
        with phase("publish"):
            _PUBLISH.run(project, parts, report)

    def _journal(
        self,
        parts: PublicationComponents,
        source: RollbackSource,
        ingest: IssuedPrincipal,
        attempt_id: str,
    ) -> JournalEvent:
        """Write the rollback attempt's journal; returns its final ``staged`` event."""
        undone = source.undone
        original = {e.document.get("outcome"): e.document for e in source.events}
        staged_doc = source.events[-1].document
        admin = HttpTransport(parts.endpoint, self.project.clickhouse.access.operator())
        identity = observe_identity(
            admin,
            undone.database,
            probe_prefix=f"dpone-b02-{attempt_id}-rollback-identity",
            deadline=time.monotonic() + REQUEST_SECONDS,
        ).to_document()
        if identity != staged_doc.get("endpoint_identity"):
            raise RollbackError(
                "the server or database is not the one that staged the copy: "
                f"{identity} != {staged_doc.get('endpoint_identity')}",
                code="endpoint_changed",
            )
        common = {
            "principal": {"user": ingest.ref.user, "user_uuid": ingest.ref.user_uuid},
            "planned_ownership": {"database": undone.database, "table": source.copy_table},
            "endpoint": f"{parts.endpoint.host}:{parts.endpoint.http_port}/{undone.database}",
            "endpoint_identity": identity,
            "kind": "rollback",
        }
        rollback = {
            "undone_intent": undone.sha256,
            "origin_intent": source.origin.sha256,
            "origin_journal": str(source.journal),
            "origin_staged_event_sha256": source.origin.staged_event_sha256,
            "copy_uuid": source.copy_uuid,
        }
        journal = ClickHouseFileAttemptJournal(self.rollbacks_dir, attempt_id)
        journal.open()
        journal.record(
            {
                **common,
                "state": "checking",
                "outcome": "admitted",
                "rollback": rollback,
                "source_identity": original["admitted"][_ORIGIN_MEMBERS["admitted"]],
            }
        )
        journal.record(
            {
                **common,
                "state": "prepared",
                "outcome": "prepared",
                "semantic_id": source.origin.semantic_id,
                "derived_identity": original["prepared"][_ORIGIN_MEMBERS["prepared"]],
                "counts": {"prepared_rows": source.origin.source_rows, "observed_count": None},
            }
        )
        # The copy was checked just before (verify_copy); prepare checks it again.
        return journal.record(
            {
                **common,
                "state": "staged",
                "outcome": "staged",
                "rollback": rollback,
                "semantic_id": source.origin.semantic_id,
                "counts": {
                    "prepared_rows": source.origin.source_rows,
                    "observed_count": source.origin.source_rows,
                },
                "observed_ownership": {"table_uuid": source.copy_uuid},
            }
        )


def require_rollback_database(project: Project, table: TableConfig) -> None:
    """Refuse (``database_missing``) a rollback into a database the server does not have.

    Asked before the store or the pool: the first pool request names the database and
    would fail with the server's raw ``UNKNOWN_DATABASE``. Without the database there is
    no rollback copy on this server either (it lived there), so the error names the
    database, the config key that names it and the check that says what the server lacks.
    """
    try:
        require_database(project.clickhouse.access, table.database)
    except ConfigurationError as exc:
        if exc.code != "database_missing":
            raise
        key = f"tables.{table.name}.target"
        command = shlex.join(["dpone", "check", "--config", str(project.path)])
        raise RollbackError(
            f"database {table.database!r}, which {key} ({table.qualified_target!r}) names, "
            f"does not exist on {project.clickhouse.access.describe()}: there is no rollback "
            f"copy to restore there. If {key} or [clickhouse] names the wrong database or "
            f"server, correct the project file; otherwise the database was dropped with its "
            f"copies, and `{command}` names what the server lacks",
            code="database_missing",
            database=table.database,
            key=key,
            statement=exc.details.get("statement"),
            next_command=command,
        ) from exc


def _release(parts: PublicationComponents, ingest: IssuedPrincipal, exc: DponeError) -> None:
    """Close the rollback's ingest principal if its lease is still active (nothing ran as it)."""
    try:
        if parts.store.get_lease(ingest.ref.lease_id).active:
            parts.publisher.authority.close_principal(ingest.ref)
    except DponeError as close_exc:
        exc.add_details(ingest_release_failed=close_exc.code)
