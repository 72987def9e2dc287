"""Rollback copies of a target: which are kept, and the verified drop of the others.

After a PUBLISHED EXCHANGE the previous target sits under the generation's name: the
rollback copy of that publication, with the previous target's UUID
(``intent.target_uuid``). The store knows every publication, so the copies of a slot
are derived from its PUBLISHED records, newest first; a copy exists while the
generation's name still holds that UUID.

Each table carries the ownership mark of the staging attempt that created it (the
first column's comment), so the expected mark of a copy is the one of the oldest
publication whose generation had the copy's UUID; the empty target a first
publication created has no mark. A copy is dropped only when its name, UUID and mark
are all as expected, and never while a publication of the slot is unfinished (it may
be that publication's generation).

Each drop is an attempt of its own under ``<work_dir>/retention/<id>``: a journal
with the copy's facts, a durable intent, its own query id
(``dpone-b02-<id>-discard``), the settled answer and the verified removal. A drop cut
short leaves a journal ending ``discarding``: ``dpone status`` lists it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dpone.connectors.clickhouse_tables import Ownership, observe_ownership, ownership_comment
from dpone.contracts.composition_snapshot import TERMINAL, SnapshotIntent, SnapshotState
from dpone.errors import DponeError, StateError
from dpone.ports.clickhouse import QueryPort
from dpone.ports.clickhouse_request import read_query_id
from dpone.publication.retained import stored_intents
from dpone.publication.store import SqliteSnapshotStore
from dpone.staging.cleanup import drop_owned_table
from dpone.staging.journal import ClickHouseFileAttemptJournal
from dpone.staging.run import AttemptRun
from dpone.staging.sink import new_attempt_id
from dpone.staging.states import StageState

REQUEST_SECONDS = 60.0


class RetentionError(StateError):
    """A rollback copy could not be proven to be what the store says (see ``code``)."""

    code = "retention_refused"


@dataclass(frozen=True)
class RollbackCopy:
    """The previous target kept under a publication's generation name."""

    intent: SnapshotIntent
    published_at: str
    expected_comment: str | None  # None: the mark cannot be derived (not dropped)
    first_publication: bool

    @property
    def table(self) -> str:
        return self.intent.generation_table

    @property
    def uuid(self) -> str:
        return self.intent.target_uuid

    def to_dict(self) -> dict[str, Any]:
        return {
            "table": f"{self.intent.database}.{self.table}",
            "uuid": self.uuid,
            "rows": None,
            "published_at": self.published_at,
            "intent_sha256": self.intent.sha256,
        }


def rollback_copies(store: SqliteSnapshotStore, database: str, target: str) -> list[RollbackCopy]:
    """The slot's possible rollback copies, newest publication first (existence unchecked)."""
    stored = stored_intents(store, database, target)
    creators: dict[str, str] = {}
    for _, intent in stored:  # oldest first: the first generation with a UUID created it
        creators.setdefault(
            intent.generation_uuid, ownership_comment(intent.attempt_id, intent.semantic_id)
        )
    copies = []
    seen: set[tuple[str, str]] = set()
    for summary, intent in reversed(stored):
        if summary.state != SnapshotState.PUBLISHED.value:
            continue
        # A rollback publishes a copy under the name it already had, so two publications
        # can leave the same (name, UUID): it is one table, listed (and dropped) once.
        if (intent.generation_table, intent.target_uuid) in seen:
            continue
        seen.add((intent.generation_table, intent.target_uuid))
        first = any(h.facts.get("step") == "create_target" for h in store.history(intent.sha256))
        expected = "" if first else creators.get(intent.target_uuid)
        copies.append(RollbackCopy(intent, summary.created_at, expected, first))
    return copies


def observe_copy(transport: QueryPort, copy: RollbackCopy, purpose: str) -> Ownership | None:
    """The copy's table if its name still holds the copy's UUID, else None."""
    reads = iter(range(1, 100))
    found = observe_ownership(
        transport,
        copy.intent.database,
        copy.table,
        lambda: read_query_id(copy.intent.attempt_id, purpose, next(reads)),
        time.monotonic() + REQUEST_SECONDS,
    )
    return found if found is not None and found.uuid == copy.uuid else None


def existing_copies(
    store: SqliteSnapshotStore, transport: QueryPort, database: str, target: str
) -> list[tuple[RollbackCopy, Ownership]]:
    """The copies that exist now (name and UUID as the store says), newest first."""
    found = []
    for copy in rollback_copies(store, database, target):
        owned = observe_copy(transport, copy, "retention_copy")
        if owned is not None:
            found.append((copy, owned))
    return found


def enforce_retention(
    store: SqliteSnapshotStore,
    transport: QueryPort,
    retention_dir: Path,
    database: str,
    target: str,
    *,
    keep: int,
    user: str,
) -> list[str]:
    """Drop the copies beyond the ``keep`` newest; returns the dropped tables' names.

    ``user`` is the server user ``transport`` authenticates as: each drop's journal
    names it, so a later proof of the DROP's fate finds it in the query log.
    """
    unfinished = [
        s.intent_sha256
        for s in store.list_snapshots()
        if (s.database, s.target_table) == (database, target)
        and SnapshotState(s.state) not in TERMINAL
    ]
    if unfinished:
        raise RetentionError(
            f"{database}.{target} has an unfinished publication ({unfinished[0]}); no rollback "
            "copy is dropped until it is reconciled",
            code="publication_unfinished",
            intent_sha256=unfinished[0],
        )
    dropped = []
    for copy, owned in existing_copies(store, transport, database, target)[keep:]:
        drop_copy(transport, retention_dir, copy, owned, user=user)
        dropped.append(f"{database}.{copy.table}")
    return dropped


def drop_copy(
    transport: QueryPort, retention_dir: Path, copy: RollbackCopy, owned: Ownership, *, user: str
) -> None:
    """Drop one copy after its ownership is proven, as its own journaled attempt."""
    if copy.expected_comment is None or (owned.comment or "") != copy.expected_comment:
        raise RetentionError(
            f"{copy.intent.database}.{copy.table} carries the mark {owned.comment!r}, not "
            f"{copy.expected_comment!r}; it is not proven to be the rollback copy, not dropped",
            code="ownership_unverified",
            table=copy.table,
            table_uuid=owned.uuid,
        )
    journal = ClickHouseFileAttemptJournal(retention_dir, "retain-" + new_attempt_id())
    journal.open()
    planned = {"database": copy.intent.database, "table": copy.table}
    run = AttemptRun(
        journal,
        {"planned_ownership": planned, "principal": {"user": user}},
        state=StageState.DISCARDING,
    )
    run.table_uuid = owned.uuid
    run.event(
        StageState.DISCARDING,
        "retention_planned",
        observed_ownership={"table_uuid": owned.uuid},
        rollback_copy={
            "intent_sha256": copy.intent.sha256,
            "uuid": copy.uuid,
            "comment": owned.comment,
            "published_at": copy.published_at,
        },
    )
    reads = iter(range(1, 100))
    try:
        gone = drop_owned_table(
            transport,
            run,
            StageState.DISCARDING,
            kind="discard",
            database=copy.intent.database,
            table=copy.table,
            found=owned,
            request_seconds=REQUEST_SECONDS,
            clock=time.monotonic,
            read_id=lambda purpose: read_query_id(journal.attempt_id, purpose, next(reads)),
        )
    except DponeError as exc:
        exc.add_details(journal=str(journal.attempt_dir))
        raise
    if not gone:
        raise RetentionError(
            f"the DROP of {copy.intent.database}.{copy.table} has an unknown outcome; its journal "
            f"{journal.attempt_dir} stays at discarding",
            code="retention_unknown",
            journal=str(journal.attempt_dir),
        )
    run.event(StageState.DISCARDED, "discarded")
