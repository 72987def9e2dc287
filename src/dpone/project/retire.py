"""Retiring a slot: its target and rollback copies removed through recorded, proven drops.

:func:`retire` refuses while a publication of the slot may still move, plans read-only
which tables are dpone's (a UUID the store recorded as created for this slot, carrying
that creation's mark; any other table is ``kept``), then fences the slot and notes
``retire_begun`` (:mod:`dpone.publication.store.retirement`), finishes the drops an
earlier retire left under ``<work_dir>/retire``, drops each planned table as its own
journaled attempt (:func:`dpone.project.retention.drop_recorded`), discards the slot's
generations no publication will use, and notes ``retired``. Without ``confirmed`` the
plan is all that happens; run again after any interruption, it continues. See
docs/operations.md ("Retiring a table").
"""

from __future__ import annotations

import shlex
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dpone.connectors.clickhouse_http import HttpTransport
from dpone.connectors.clickhouse_tables import Ownership, observe_ownership
from dpone.contracts.composition_snapshot import SnapshotState
from dpone.errors import ConfigurationError, DponeError, StateError
from dpone.ports.clickhouse import QueryPort
from dpone.ports.clickhouse_request import read_query_id
from dpone.ports.composition_snapshot import TargetSlot
from dpone.project.config import Project
from dpone.project.refresh_checks import table_lock
from dpone.project.retention import (
    REQUEST_SECONDS,
    discard_superseded,
    drop_recorded,
    recorded_owners,
    rollback_copies,
    unfinished_publication,
)
from dpone.publication.ceilings.retained import stored_intents
from dpone.publication.composition import check_ownership
from dpone.publication.store import SnapshotStore, open_store
from dpone.staging.journal import read_events
from dpone.staging.recovery import discard_attempt, survey_attempts
from dpone.staging.sink import new_attempt_id
from dpone.staging.states import StageState

TARGET, COPY = "target", "rollback_copy"


class RetireError(StateError):
    """A retire refused or could not finish (see ``code``)."""

    code = "retire_refused"


@dataclass(frozen=True)
class SlotName:
    """The slot a retire names, and the project table that declares it (if any)."""

    slot: TargetSlot
    table: str | None  # the [tables.NAME] that declares it now

    @property
    def target(self) -> str:
        return f"{self.slot.database}.{self.slot.table}"


@dataclass(frozen=True)
class PlannedTable:
    """One table of the slot as observed now, and whether it is proven dpone's."""

    role: str  # TARGET or COPY
    table: str
    uuid: str
    comment: str | None
    expected_comment: str | None  # None: the store records no table of this UUID
    intent_sha256: str | None  # the publication that left a copy there

    @property
    def owned(self) -> bool:
        return self.expected_comment is not None and (self.comment or "") == self.expected_comment

    def to_dict(self, database: str) -> dict[str, Any]:
        document: dict[str, Any] = {
            "table": f"{database}.{self.table}",
            "role": self.role,
            "uuid": self.uuid,
        }
        if not self.owned:
            document["reason"] = (
                "not_recorded" if self.expected_comment is None else "mark_mismatch"
            )
        return document


@dataclass
class RetireReport:
    """What a retire found and did, for people (text) and programs (``to_dict``)."""

    target: str
    table: str | None
    retired: bool = False
    retired_at: str | None = None
    dropped: list[dict[str, Any]] = field(default_factory=list)
    finished: list[dict[str, Any]] = field(default_factory=list)
    discarded_generations: list[str] = field(default_factory=list)
    kept: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.retired,
            "target": self.target,
            "table": self.table,
            "retired": self.retired,
            "retired_at": self.retired_at,
            "dropped": list(self.dropped),
            "finished_journals": list(self.finished),
            "discarded_generations": list(self.discarded_generations),
            "kept": list(self.kept),
            "warnings": list(self.warnings),
        }


def retire_command(project: Project, name: str) -> str:
    """The exact ``dpone retire`` command that (re)runs the retire of ``name``."""
    return shlex.join(["dpone", "retire", name, "--config", str(project.path), "--yes"])


def known_slots(store: SnapshotStore) -> list[TargetSlot]:
    """Every slot the store holds an intent of, in the order first published into."""
    seen = dict.fromkeys(TargetSlot(s.database, s.target_table) for s in store.list_snapshots())
    return list(seen)


def resolve_slot(project: Project, store: SnapshotStore, name: str) -> SlotName:
    """``name``: a table of the project file, or a target ``DATABASE.TABLE`` the store knows."""
    declared = project.tables.get(name)
    if declared is not None:
        slot = TargetSlot(declared.database, declared.target)
    else:
        database, _, table = name.partition(".")
        slot = TargetSlot(database, table)
    known = known_slots(store)
    if slot not in known:
        listed = [f"{s.database}.{s.table}" for s in known]
        raise ConfigurationError(
            f"{name!r} is neither a table of {project.path} with a publication nor a target the "
            f"store {project.store} recorded (it knows: {', '.join(listed) or 'none'}); "
            "nothing to retire",
            code="slot_unknown",
            name=name,
            known_targets=listed,
        )
    owner = next(
        (
            t.name
            for t in project.tables.values()
            if (t.database, t.target) == (slot.database, slot.table)
        ),
        None,
    )
    return SlotName(slot, owner)


def refuse_unfinished(project: Project, store: SnapshotStore, slot: TargetSlot) -> None:
    """``publication_unfinished`` naming the command that resolves it, or nothing."""
    summary = unfinished_publication(store, slot.database, slot.table)
    if summary is None:
        return
    verb = "cancel" if summary.state == SnapshotState.PREPARED.value else "reconcile"
    command = shlex.join(
        [
            "dpone",
            "snapshot",
            verb,
            summary.intent_sha256,
            "--store",
            str(project.store),
            *project.server_arguments(),
        ]
    )
    raise RetireError(
        f"{slot.database}.{slot.table} has an unfinished publication ({summary.state} "
        f"{summary.intent_sha256}); nothing was retired. Resolve it first: `{command}` "
        "(`dpone status` lists it), then run the retire again",
        code="publication_unfinished",
        intent_sha256=summary.intent_sha256,
        state=summary.state,
        next_command=command,
    )


def plan(store: SnapshotStore, transport: QueryPort, slot: TargetSlot) -> list[PlannedTable]:
    """The slot's tables that exist now (target first, then copies newest first)."""
    owners = recorded_owners(store, stored_intents(store, slot.database, slot.table))
    names: dict[str, tuple[str, str | None]] = {slot.table: (TARGET, None)}
    for copy in rollback_copies(store, slot.database, slot.table):
        names.setdefault(copy.table, (COPY, copy.intent.sha256))
    reads = iter(range(1, 10_000))
    attempt = new_attempt_id()
    found = []
    for name, (role, sha) in names.items():
        seen = observe_ownership(
            transport,
            slot.database,
            name,
            lambda: read_query_id(attempt, "retire_plan", next(reads)),
            time.monotonic() + REQUEST_SECONDS,
        )
        if seen is not None:
            found.append(
                PlannedTable(role, name, seen.uuid, seen.comment, owners.get(seen.uuid), sha)
            )
    return found


def retire(project: Project, name: str, *, confirmed: bool) -> RetireReport:
    """Retire the slot ``name`` names (see the module doc); raises what refuses it.

    Without ``confirmed`` nothing is written: ``confirmation_required`` carries the plan.
    A table still declared is retired under its refresh lock (``refresh_busy`` while a
    refresh of it runs), so no refresh exports and stages for a slot being retired.
    """
    store = open_store(project.store, create=False)
    named = resolve_slot(project, store, name)
    # Another store's target is not this project's to retire (ownership.py).
    check_ownership(project.clickhouse.access, project.store, [named.slot], project=project.path)
    with ExitStack() as held:
        if named.table is not None:
            held.enter_context(table_lock(project.work_dir, named.table, project.store))
        return _retire(project, store, named, name, confirmed=confirmed)


def _retire(
    project: Project, store: SnapshotStore, named: SlotName, name: str, *, confirmed: bool
) -> RetireReport:
    slot = named.slot
    report = RetireReport(named.target, named.table)
    if named.table is not None:
        report.warnings.append(
            f"{named.table} is still declared in {project.path}: the next `dpone refresh "
            f"{named.table}` publishes {named.target} again; remove it from the file to stop that"
        )
    refuse_unfinished(project, store, slot)
    endpoint = project.clickhouse.access.endpoint(slot.database)
    login = project.clickhouse.access.operator()
    admin = HttpTransport(endpoint, login)
    found = plan(store, admin, slot)
    report.kept = [t.to_dict(slot.database) for t in found if not t.owned]
    drops = [t for t in found if t.owned]
    if not confirmed:
        listed = (
            ", ".join(f"{slot.database}.{t.table} ({t.role.replace('_', ' ')})" for t in drops)
            or "nothing"
        )
        raise ConfigurationError(
            f"retiring {named.target} drops {listed}; nothing was done: run "
            f"`{retire_command(project, name)}` to drop them",
            code="confirmation_required",
            planned=[t.to_dict(slot.database) for t in drops],
            kept=report.kept,
            next_command=retire_command(project, name),
        )
    retire_dir = project.work_dir / "retire"
    store.begin_retirement(
        slot, {"planned": [t.to_dict(slot.database) for t in drops], "name": name}
    )
    try:
        report.finished = _finish_earlier(admin, retire_dir, slot)
        if report.finished:
            found = plan(store, admin, slot)  # the finished drops changed what is there
            drops = [t for t in found if t.owned]
        for table in drops:
            journal = drop_recorded(
                admin,
                retire_dir,
                "retire-",
                database=slot.database,
                table=table.table,
                owned=Ownership(table.uuid, table.comment),
                expected_comment=table.expected_comment,
                facts={"role": table.role, "intent_sha256": table.intent_sha256},
                user=login.user,
                planned={"retire": {"database": slot.database, "table": slot.table}},
            )
            report.dropped.append({**table.to_dict(slot.database), "journal": str(journal)})
        report.discarded_generations = discard_superseded(
            store, admin, project.work_dir / "attempts", slot.database, slot.table
        )
        note = store.end_retirement(
            slot,
            {
                "dropped": [{k: v for k, v in d.items() if k != "journal"} for d in report.dropped],
                "kept": report.kept,
            },
        )
    except DponeError as exc:
        exc.add_details(
            dropped=[d["table"] for d in report.dropped],
            next_command=retire_command(project, name),
        )
        raise
    report.retired, report.retired_at = True, note.at
    return report


def _finish_earlier(
    transport: QueryPort, retire_dir: Path, slot: TargetSlot
) -> list[dict[str, Any]]:
    """Finish the slot's drops an earlier retire left unfinished (as ``attempts discard``)."""
    found, unreadable = survey_attempts(retire_dir)
    if unreadable:
        raise unreadable[0].error
    finished = []
    for summary in found:
        if summary.state == StageState.DISCARDED.value or retired_slot(summary.path) != slot:
            continue
        done = discard_attempt(transport, retire_dir, summary.attempt_id, database=slot.database)
        finished.append(
            {
                "journal": str(summary.path),
                "table": f"{slot.database}.{(summary.planned_table or {}).get('table')}",
                "state": done.state,
            }
        )
    return finished


def retired_slot(journal: Path) -> TargetSlot | None:
    """The slot a retire journal's drop belongs to (None: not a retire's journal)."""
    try:
        events = read_events(journal)
    except DponeError:
        return None
    named = events[0].document.get("retire") if events else None
    if not isinstance(named, dict):
        return None
    return TargetSlot(str(named.get("database")), str(named.get("table")))
