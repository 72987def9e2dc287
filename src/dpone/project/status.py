"""What a project's targets look like now, and everything that needs a person.

Read only: the store (publications, oldest first, and the pool's leases), the
attempt and retention journals under the work dir, and, when the managed server runs,
which rollback copies still exist. Each item that needs a person carries the exact
command to run (docs/operations.md explains each). A lease whose holder is proven
gone (:mod:`dpone.project.leases`) is one of them: it would otherwise keep its
pool principal forever.
"""

from __future__ import annotations

import shlex
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dpone.connectors.clickhouse_http import HttpTransport
from dpone.connectors.clickhouse_tables import observe_ownership
from dpone.contracts.composition_snapshot import SnapshotIntent, SnapshotRecord, SnapshotState
from dpone.errors import DponeError
from dpone.localserver import find_running
from dpone.localserver.credentials import admin_credentials
from dpone.ports.clickhouse_request import Endpoint
from dpone.project.config import Project
from dpone.project.leases import (
    GONE,
    close_lease_command,
    end_lease_command,
    judge_leases,
    project_journal_dirs,
    unproven_closures,
)
from dpone.project.retention import observe_copy, rollback_copies
from dpone.publication.store import SqliteSnapshotStore
from dpone.staging.recovery import finishing_command, list_attempts


@dataclass
class ProjectStatus:
    """Targets with their last publication, copies kept, and what needs a person."""

    targets: list[dict[str, Any]] = field(default_factory=list)
    needs_person: list[dict[str, Any]] = field(default_factory=list)
    server_running: bool = False
    active_leases: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "targets": self.targets,
            "needs_person": self.needs_person,
            "server_running": self.server_running,
            "active_leases": self.active_leases,
        }


def project_status(project: Project) -> ProjectStatus:
    """Read the store, the journals and (if it runs) the server."""
    status = ProjectStatus()
    # Status never creates a store: a project that never ran has none yet.
    store = SqliteSnapshotStore(project.store, create=False) if project.store.exists() else None
    summaries = store.list_snapshots() if store is not None else []
    info = find_running(project.clickhouse.data_dir)
    status.server_running = info is not None
    data_dir = str(project.clickhouse.data_dir)
    tail = ["--store", str(project.store), "--data-dir", data_dir]
    for table in project.tables.values():
        mine = [
            s for s in summaries if (s.database, s.target_table) == (table.database, table.target)
        ]
        published = [s for s in mine if s.state == SnapshotState.PUBLISHED.value]
        entry: dict[str, Any] = {
            "table": table.name,
            "target": table.qualified_target,
            "last_publication": None,
            "rollback_copies": None,
        }
        if published:
            last = published[-1]
            intent = SnapshotIntent.from_bytes(last.intent_bytes)
            record = (
                SnapshotRecord.from_bytes(store.load(last.intent_sha256).record_bytes)
                if store
                else None
            )
            entry["last_publication"] = {
                "intent_sha256": last.intent_sha256,
                "prepared_at": intent.prepared_at,
                "published_at": record.at if record is not None else None,
                "rows": intent.source_rows,
                "uuid": intent.generation_uuid,
                "attempt_id": intent.attempt_id,
                # A rollback's evidence is its journal under work_dir/rollbacks.
                "rollback": (project.work_dir / "rollbacks" / intent.attempt_id).is_dir(),
            }
        if info is not None and store is not None:
            entry["rollback_copies"] = _copies(
                store, info.http_port, project, table.database, table.target
            )
        status.targets.append(entry)
        for summary in mine:
            state = SnapshotState(summary.state)
            if state in (SnapshotState.EXCHANGE_INTENT, SnapshotState.COMMIT_UNKNOWN):
                status.needs_person.append(
                    {
                        "kind": state.value,
                        "target": table.qualified_target,
                        "intent_sha256": summary.intent_sha256,
                        "command": shlex.join(
                            ["dpone", "snapshot", "reconcile", summary.intent_sha256, *tail]
                        ),
                    }
                )
            elif state is SnapshotState.PREPARED:
                status.needs_person.append(
                    {
                        "kind": "prepared",
                        "target": table.qualified_target,
                        "intent_sha256": summary.intent_sha256,
                        "command": shlex.join(
                            ["dpone", "snapshot", "cancel", summary.intent_sha256, *tail]
                        ),
                    }
                )
    finishing = _attempts(project, status, data_dir, store)
    if store is not None:
        _leases(project, status, store, finishing)
    elif info is not None:
        _targets_without_store(project, status, info.http_port)
    return status


def _targets_without_store(project: Project, status: ProjectStatus, port: int) -> None:
    """No store, yet a target exists: ``store`` is not the one the refreshes used.

    Without the store nothing about the target's publications is known, so this is
    said rather than reported as "never published" (which a nightly check would pass).
    """
    reads = iter(range(1, 10_000))
    for table in project.tables.values():
        admin = HttpTransport(
            Endpoint("127.0.0.1", port, 0, table.database),
            admin_credentials(project.clickhouse.data_dir),
        )
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
    project: Project, status: ProjectStatus, store: SqliteSnapshotStore, finishing: set[str]
) -> None:
    """``finishing``: attempts listed with their cleanup or discard, which ends the
    attempt's ingest lease in this store once its journal is terminal (no second item)."""
    dirs = project_journal_dirs(project.work_dir)
    for verdict in judge_leases(store, dirs):
        status.active_leases.append(verdict.to_dict())
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
                "command": close_lease_command(
                    lease.lease_id, project.store, project.clickhouse.data_dir
                ),
            }
        )


def _copies(
    store: SqliteSnapshotStore, port: int, project: Project, database: str, target: str
) -> list[dict[str, Any]] | None:
    admin = HttpTransport(
        Endpoint("127.0.0.1", port, 0, database), admin_credentials(project.clickhouse.data_dir)
    )
    kept = []
    try:
        for copy in rollback_copies(store, database, target):
            if observe_copy(admin, copy, "status_copy") is not None:
                kept.append(copy.to_dict())
    except DponeError:
        return None  # unobservable now: status says so rather than guess
    return kept


def _attempts(
    project: Project, status: ProjectStatus, data_dir: str, store: SqliteSnapshotStore | None
) -> set[str]:
    """List the attempts that need a person; the ids listed with a finishing command."""
    finishing: set[str] = set()
    attempts_dir = project.work_dir / "attempts"
    # A staged generation is done with once an intent that may still publish it (or did)
    # names its attempt; otherwise it waits for a discard.
    named = {
        SnapshotIntent.from_bytes(s.intent_bytes).attempt_id
        for s in (store.list_snapshots() if store is not None else [])
        if s.state != SnapshotState.NOT_PUBLISHED.value
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
        tail = ["--data-dir", data_dir, "--store", str(project.store)]
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
                "command": f"{command} {shlex.join(['--data-dir', data_dir])}"
                if command
                else shlex.join(["dpone", "journal", "show", str(summary.path)]),
            }
        )
    return finishing
