"""What a project's targets look like now, and everything that needs a person.

Read only: the store (publications, the pool's leases, the slots' retirements), the
attempt, retention and retire journals under the work dir, and, when the managed server
runs, which rollback copies still exist. Each item that needs a person carries the exact
command to run, among them a lease whose holder is proven gone
(:mod:`dpone.project.leases`); a slot whose table left the project file is listed under
``removed`` with the ``dpone retire`` that removes it; a PREPARED intent a newer one
superseded needs no cancel, and its generation is ``staged_unpublished``. See
docs/operations.md.
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dpone.connectors.clickhouse_http import HttpTransport
from dpone.connectors.clickhouse_tables import observe_ownership
from dpone.connectors.tls_probe import TLS_PORT_FIX, plain_http_to_tls
from dpone.contracts.composition_snapshot import SnapshotIntent, SnapshotRecord, SnapshotState
from dpone.errors import DeadlineError, DponeError
from dpone.ports.clickhouse_request import read
from dpone.ports.composition_snapshot import StepNote, TargetSlot
from dpone.project.config import Project
from dpone.project.leases import (
    GONE,
    close_lease_command,
    end_lease_command,
    judge_leases,
    project_journal_dirs,
    unproven_closures,
)
from dpone.project.retention import copies_in_database, superseded_prepared
from dpone.project.retire import known_slots, retire_command, retired_slot
from dpone.project.workers import attempt_worker
from dpone.publication.ceilings.retained import stored_intents
from dpone.publication.principals.server_access import REACH_SECONDS, reach_failure
from dpone.publication.store import SnapshotStore, SnapshotSummary, open_store, store_exists
from dpone.publication.store.retirement import RETIRED
from dpone.staging.recovery import finishing_command, list_attempts


@dataclass
class ProjectStatus:
    """Targets with their last publication, copies kept, and what needs a person."""

    targets: list[dict[str, Any]] = field(default_factory=list)
    needs_person: list[dict[str, Any]] = field(default_factory=list)
    server_running: bool = False
    active_leases: list[dict[str, Any]] = field(default_factory=list)
    # Slots the store knows whose table the project file no longer declares.
    removed: list[dict[str, Any]] = field(default_factory=list)
    # Why the server did not answer (code, reason, message, fix), None when it did.
    server_unreachable: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "targets": self.targets,
            "needs_person": self.needs_person,
            "server_running": self.server_running,
            "active_leases": self.active_leases,
            "removed": self.removed,
            "server_unreachable": self.server_unreachable,
        }


def project_status(project: Project) -> ProjectStatus:
    """Read the store, the journals and (if it runs) the server."""
    status = ProjectStatus()
    # Status never creates a store: a project that never ran has none yet.
    store = open_store(project.store, create=False) if store_exists(project.store) else None
    summaries = store.list_snapshots() if store is not None else []
    failure = reach_failure(project.clickhouse.access)
    running = failure is None
    status.server_running = running
    if failure is not None:
        status.server_unreachable = unreachable(project, failure)
    tail = ["--store", str(project.store), *project.server_arguments()]
    notes = store.retirement_notes() if store is not None else {}
    declared = {TargetSlot(t.database, t.target): t.name for t in project.tables.values()}
    removed = [s for s in (known_slots(store) if store is not None else []) if s not in declared]
    superseded: set[str] = set()
    databases: dict[str, str] | None = None  # read once, when a claim is unresolved
    copies = _copies(store, project, [*declared, *removed]) if running and store else {}
    for slot in [*declared, *removed]:
        mine = [s for s in summaries if (s.database, s.target_table) == (slot.database, slot.table)]
        if store is not None and mine:
            superseded |= superseded_prepared(
                store, stored_intents(store, slot.database, slot.table)
            )
        retirement = _retirement(notes.get(slot, []), mine)
        name = declared.get(slot)
        entry: dict[str, Any] = {
            "table": name,
            "target": f"{slot.database}.{slot.table}",
            "last_publication": None,
            "rollback_copies": None,
            "retired": retirement,
        }
        published = [s for s in mine if s.state == SnapshotState.PUBLISHED.value]
        if published and store is not None and retirement is None:
            entry["last_publication"] = _last_publication(project, store, published[-1])
        if running and store is not None:
            entry["rollback_copies"] = copies.get(slot)
        if name is not None:
            status.targets.append(entry)
        else:
            _removed(project, status, entry, running)
        if retirement is not None and retirement["state"] == "retiring":
            status.needs_person.append(
                {
                    "kind": "retire_unfinished",
                    "target": entry["target"],
                    "message": f"a `dpone retire` of {entry['target']} was cut short; running it "
                    "again finishes it from what the server shows",
                    "command": retire_command(project, name or entry["target"]),
                }
            )
        for summary in mine:
            if summary.blocking and running and databases is None:
                databases = _database_uuids(project)
            _publication_item(status, summary, entry["target"], superseded, tail, databases)
    finishing = _attempts(project, status, store, superseded)
    _retire_journals(project, status)
    if store is not None:
        _leases(project, status, store, finishing)
    elif running:
        _targets_without_store(project, status)
    return status


# What each way of not reaching the server is called, and what in the project fixes it.
_ENDPOINT_FIX = "check [clickhouse] host and http_port in {path} and that the server listens there"
_REASONS: dict[str, tuple[str, str]] = {
    "connect_failed": ("cannot connect", _ENDPOINT_FIX),
    "host_not_found": ("host not found", _ENDPOINT_FIX),
    "transport_deadline": (f"no answer within {REACH_SECONDS:g} s (timeout)", _ENDPOINT_FIX),
    "tls_certificate_refused": (
        "TLS certificate refused",
        "check [clickhouse] ca_file in {path} (the CA that signed the server's certificate) "
        "and that the certificate names host and has not expired",
    ),
    "tls_handshake_failed": (
        "TLS handshake failed",
        "check [clickhouse] secure and http_port in {path}: with secure = true the port "
        "must be the server's HTTPS one",
    ),
    "authentication_refused": (
        "authentication refused",
        "the server refused the password [clickhouse] credentials_file holds: install the "
        "users file of the same `dpone pool render`, or point credentials_file at the "
        "credentials file of the render installed; `dpone pool verify --config {path}` "
        "names each principal",
    ),
}


def unreachable(project: Project, failure: DponeError) -> dict[str, Any]:
    """Why ``project``'s server did not answer, from ``failure``'s code and message:
    ``code``, ``reason`` (in words), ``message`` and ``fix``, never a password."""
    access = project.clickhouse.access
    code = failure.code  # a refused sign-in is already authentication_refused
    if isinstance(failure, DeadlineError):
        code = "transport_deadline"
    if access.managed:
        command = failure.details.get("next_command")
        return {
            "code": code,
            "reason": "not running",
            "message": failure.message,
            "fix": f"start it with `{command}`" if command else None,
        }
    mismatch = plain_http_to_tls(access.endpoint("system"), failure)
    if mismatch is not None:
        return {**mismatch, "reason": "plain HTTP to a TLS port", "fix": TLS_PORT_FIX}
    message = failure.message
    # The server's own words are quoted; none has ever held a password, and none may.
    for login in access.known_credentials().values():
        if login.password:
            message = message.replace(login.password, "***")
    reason, fix = _REASONS.get(code, ("request failed", _ENDPOINT_FIX))
    if code == "connect_failed" and "refused" in message.lower():
        reason = "connection refused"
    return {
        "code": code,
        "reason": reason,
        "message": message,
        "fix": fix.format(path=project.path),
    }


def _publication_item(
    status: ProjectStatus,
    summary: SnapshotSummary,
    target: str,
    superseded: set[str],
    tail: list[str],
    databases: dict[str, str] | None,
) -> None:
    """The item of a publication that needs a person (reconcile, abandon or cancel).

    An unresolved claim whose database now has another UUID than the intent recorded,
    or none (``databases``: name -> UUID on the server now), was dropped with its
    tables: no reconcile can prove an outcome, ``abandon`` frees the target (it
    refuses unless the server is the same one and the tables are gone everywhere).
    """
    state = SnapshotState(summary.state)
    if summary.abandoned:
        return  # its database was dropped and an operator freed the target
    if summary.blocking:
        verb, kind = "reconcile", state.value
        recorded = SnapshotIntent.from_bytes(summary.intent_bytes).database_uuid
        if databases is not None and databases.get(summary.database) != recorded:
            verb, kind = "abandon", "database_replaced"
    elif state is SnapshotState.PREPARED and summary.intent_sha256 not in superseded:
        verb, kind = "cancel", "prepared"
    else:
        return
    status.needs_person.append(
        {
            "kind": kind,
            "target": target,
            "intent_sha256": summary.intent_sha256,
            "command": shlex.join(["dpone", "snapshot", verb, summary.intent_sha256, *tail]),
            **(
                {
                    "message": f"the database {summary.database} was dropped (its UUID is not "
                    "the one the publication recorded): its tables went with it, so no "
                    "outcome can be proven; abandon frees the target"
                }
                if kind == "database_replaced"
                else {}
            ),
        }
    )


def _database_uuids(project: Project) -> dict[str, str] | None:
    """name -> UUID of every database on the server now, read as its operator (None:
    unreadable; the unresolved claims are then named with reconcile, as always)."""
    try:
        rows = _operator(project, "system").execute(
            read(
                "SELECT name, toString(uuid) AS uuid FROM system.databases FORMAT JSONEachRow",
                f"dpone-status-{time.time_ns()}-databases",
            ),
            deadline=time.monotonic() + 30,
        )
        return {str(row["name"]): str(row["uuid"]) for row in rows.json_rows()}
    except (DponeError, KeyError):
        return None


def _last_publication(
    project: Project, store: SnapshotStore, last: SnapshotSummary
) -> dict[str, Any]:
    intent = SnapshotIntent.from_bytes(last.intent_bytes)
    record = SnapshotRecord.from_bytes(store.load(last.intent_sha256).record_bytes)
    return {
        "intent_sha256": last.intent_sha256,
        "prepared_at": intent.prepared_at,
        "published_at": record.at,
        "rows": intent.source_rows,
        "uuid": intent.generation_uuid,
        "attempt_id": intent.attempt_id,
        # A rollback's evidence is its journal under work_dir/rollbacks.
        "rollback": (project.work_dir / "rollbacks" / intent.attempt_id).is_dir(),
    }


def _retirement(notes: list[StepNote], mine: list[SnapshotSummary]) -> dict[str, Any] | None:
    """The slot's retirement, unless no retire began or the slot was published into since."""
    if not notes or any(s.created_at > notes[-1].at for s in mine):
        return None
    last = notes[-1]
    done = last.facts.get("step") == RETIRED
    return {
        "state": "retired" if done else "retiring",
        "at": last.at,
        "dropped": list(last.facts.get("dropped") or []) if done else [],
        "kept": list(last.facts.get("kept") or []) if done else [],
    }


def _removed(
    project: Project,
    status: ProjectStatus,
    entry: dict[str, Any],
    running: bool,
) -> None:
    """A slot no longer declared: what it still holds, and the retire that removes it."""
    database, _, table = str(entry["target"]).partition(".")
    entry.pop("table")
    entry["target_table"] = _observed(project, database, table) if running else None
    holds = entry["target_table"] is not None or bool(entry["rollback_copies"])
    unknown = not running or entry["target_table"] == {"unobservable": True}
    retired = entry["retired"] is not None and entry["retired"]["state"] == "retired"
    entry["command"] = (
        retire_command(project, str(entry["target"])) if holds or unknown or not retired else None
    )
    status.removed.append(entry)


def _observed(project: Project, database: str, table: str) -> dict[str, Any] | None:
    """The table under the name now (its UUID), None when there is none."""
    admin = _operator(project, database)
    reads = iter(range(1, 100))
    try:
        found = observe_ownership(
            admin,
            database,
            table,
            lambda: f"dpone-status-{time.time_ns()}-{next(reads)}",
            time.monotonic() + 30,
        )
    except DponeError:
        return {"unobservable": True}
    return None if found is None else {"table": f"{database}.{table}", "uuid": found.uuid}


def _retire_journals(project: Project, status: ProjectStatus) -> None:
    """Retire drops cut short whose slot is not retiring any more (it was published into
    since): each is finished on its own, never by a second retire of a live slot. A
    journal cut before its first event sent nothing and is not listed."""
    retire_dir = project.work_dir / "retire"
    retiring = {i.get("target") for i in status.needs_person if i["kind"] == "retire_unfinished"}
    for summary in list_attempts(retire_dir):
        slot = retired_slot(summary.path)
        if summary.state == "discarded" or slot is None:
            continue
        if f"{slot.database}.{slot.table}" in retiring:
            continue  # the slot's own item: its retire again finishes this drop
        command = finishing_command(summary.state, summary.attempt_id, retire_dir, slot.database)
        status.needs_person.append(
            {
                "kind": "retire_unfinished",
                "attempt_id": summary.attempt_id,
                "journal": str(summary.path),
                "table": summary.planned_table,
                "target": f"{slot.database}.{slot.table}",
                "unsettled_mutations": [m.query_id for m in summary.unsettled],
                "command": f"{command} {shlex.join(project.server_arguments())}"
                if command
                else None,
            }
        )


def _targets_without_store(project: Project, status: ProjectStatus) -> None:
    """No store, yet a target exists: ``store`` is not the one the refreshes used.

    Without the store nothing about the target's publications is known, so this is
    said rather than reported as "never published" (which a nightly check would pass).
    """
    reads = iter(range(1, 10_000))
    for table in project.tables.values():
        admin = _operator(project, table.database)
        try:
            found = observe_ownership(
                admin,
                table.database,
                table.target,
                lambda: f"dpone-status-{time.time_ns()}-{next(reads)}",
                time.monotonic() + 30,
            )
        except DponeError:
            continue  # unobservable now: nothing is claimed either way
        if found is not None:
            status.needs_person.append(
                {
                    "kind": "store_missing",
                    "target": table.qualified_target,
                    "store": str(project.store),
                    "uuid": found.uuid,
                    "message": f"{table.qualified_target} exists but the store {project.store} does "
                    "not: point `store` in the project file at the store its refreshes used",
                    "command": None,
                }
            )


def _leases(
    project: Project, status: ProjectStatus, store: SnapshotStore, finishing: set[str]
) -> None:
    """``finishing``: attempts listed with their cleanup or discard, which ends the
    attempt's ingest lease in this store once its journal is terminal (no second item)."""
    dirs = project_journal_dirs(project.work_dir)
    for verdict in judge_leases(store, dirs):
        # Which worker's files the attempt needs (workers sharing a PostgreSQL store).
        worker = attempt_worker(store, verdict.record.lease.attempt_id)
        status.active_leases.append({**verdict.to_dict(), "worker": worker})
        if verdict.holder != GONE or verdict.record.lease.attempt_id in finishing:
            continue
        lease = verdict.record.lease
        status.needs_person.append(
            {
                "kind": "lease_abandoned",
                "lease_id": lease.lease_id,
                "user": lease.user,
                "role": lease.role,
                "attempt_id": lease.attempt_id,
                "reason": verdict.reason,
                "worker": worker,
                "command": end_lease_command(lease.lease_id, project.store, dirs),
            }
        )
    for record in unproven_closures(store):
        # An ended lease whose closure is unproven: a request of it may still arrive, so
        # its user blocks prepare of every table it can write until the proof is stored.
        # The attempt's own cleanup or discard, when listed, proves it (no second item).
        lease = record.lease
        if lease.attempt_id in finishing:
            continue
        status.needs_person.append(
            {
                "kind": "closure_unproven",
                "lease_id": lease.lease_id,
                "user": lease.user,
                "role": lease.role,
                "attempt_id": lease.attempt_id,
                "reason": "lease_ended_unproven",
                "worker": attempt_worker(store, lease.attempt_id),
                "command": close_lease_command(
                    lease.lease_id, project.store, project.server_arguments()
                ),
            }
        )


def _operator(project: Project, database: str) -> HttpTransport:
    """A transport to the project's server in ``database``, as its operator."""
    access = project.clickhouse.access
    return HttpTransport(access.endpoint(database), access.operator())


def _copies(
    store: SnapshotStore, project: Project, slots: Sequence[TargetSlot]
) -> dict[TargetSlot, list[dict[str, Any]] | None]:
    """Each slot's rollback copies that exist now, one observation per database (None:
    unobservable now, which status says rather than guess)."""
    found: dict[TargetSlot, list[dict[str, Any]] | None] = {}
    for database in sorted({slot.database for slot in slots}):
        mine = [slot.table for slot in slots if slot.database == database]
        try:
            kept = copies_in_database(
                store, _operator(project, database), database, mine, "status_copies"
            )
        except DponeError:
            found.update({TargetSlot(database, table): None for table in mine})
            continue
        for table, copies in kept.items():
            found[TargetSlot(database, table)] = [copy.to_dict() for copy, _owned in copies]
    return found


def _attempts(
    project: Project,
    status: ProjectStatus,
    store: SnapshotStore | None,
    superseded: set[str],
) -> set[str]:
    """List the attempts that need a person; the ids listed with a finishing command.

    ``superseded``: the PREPARED intents that can never be claimed (their generation
    waits for a discard like a ``not_published`` one's)."""
    finishing: set[str] = set()
    attempts_dir = project.work_dir / "attempts"
    # A staged generation is done with once an intent that may still publish it (or did)
    # names its attempt; otherwise it waits for a discard.
    named = {
        SnapshotIntent.from_bytes(s.intent_bytes).attempt_id
        for s in (store.list_snapshots() if store is not None else [])
        if s.state != SnapshotState.NOT_PUBLISHED.value and s.intent_sha256 not in superseded
    }
    for summary in list_attempts(attempts_dir):
        # Without the store no intent can be seen: a staged attempt may well be published.
        lingering = (
            store is not None and summary.state == "staged" and summary.attempt_id not in named
        )
        if not summary.needs_operator and not lingering:
            continue
        database = str((summary.planned_table or {}).get("database"))
        command = finishing_command(summary.state, summary.attempt_id, attempts_dir, database)
        # The project's store, not the default one: cleanup and discard end the
        # attempt's ingest lease there.
        tail = [*project.server_arguments(), "--store", str(project.store)]
        if command:
            finishing.add(summary.attempt_id)
        status.needs_person.append(
            {
                "kind": "staged_unpublished" if lingering else summary.state,
                "attempt_id": summary.attempt_id,
                "journal": str(summary.path),
                "table": summary.planned_table,
                "unsettled_mutations": [m.query_id for m in summary.unsettled],
                "command": f"{command} {shlex.join(tail)}" if command else None,
            }
        )
    retention_dir: Path = project.work_dir / "retention"
    for summary in list_attempts(retention_dir):
        if summary.state == "discarded":
            continue
        database = str((summary.planned_table or {}).get("database"))
        # A drop of a rollback copy is finished by the discard that proves the copy's
        # ownership again (or, with nothing sent, says so).
        command = finishing_command(summary.state, summary.attempt_id, retention_dir, database)
        status.needs_person.append(
            {
                "kind": "retention_unfinished",
                "attempt_id": summary.attempt_id,
                "journal": str(summary.path),
                "table": summary.planned_table,
                "unsettled_mutations": [m.query_id for m in summary.unsettled],
                "command": f"{command} {shlex.join(project.server_arguments())}"
                if command
                else shlex.join(["dpone", "journal", "show", str(summary.path)]),
            }
        )
    return finishing
