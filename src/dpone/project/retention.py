"""Rollback copies of a target: which are kept, and the verified drop of the others.

The copies of a slot are derived from its PUBLISHED records (:func:`rollback_copies`),
each dropped only when its name, UUID and ownership mark (:func:`recorded_owners`) are
as expected and no publication of the slot is unfinished
(:func:`unfinished_publication`); generations no publication can use are discarded
through their staging journals (:func:`discard_superseded`). Each drop is an attempt of
its own under ``<work_dir>/retention/<id>`` with a journal, a durable intent and its own
query id (``dpone-b02-<id>-discard``); :func:`drop_recorded` is that drop for any table
dpone recorded (``dpone retire`` uses it for a target too). See docs/configuration.md
("Rollback copies and retention") and docs/operations.md.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dpone.connectors.clickhouse_tables import (
    Ownership,
    observe_ownerships,
    ownership_comment,
)
from dpone.contracts.composition_snapshot import (
    TERMINAL,
    SnapshotIntent,
    SnapshotState,
    create_target_query_id,
)
from dpone.errors import DponeError, StateError
from dpone.ports.clickhouse import QueryPort
from dpone.ports.clickhouse_request import read_query_id
from dpone.ports.composition_snapshot import DispatchOutcome, TargetSlot
from dpone.publication.ceilings.retained import StoredIntent, stored_intents
from dpone.publication.publisher.created_target import DROP_STEP, OBSERVED_STEP
from dpone.publication.store import SnapshotStore, SnapshotSummary
from dpone.staging.cleanup import drop_owned_table
from dpone.staging.journal import ClickHouseFileAttemptJournal, read_events
from dpone.staging.recovery import discard_attempt, summarize
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


def created_target(store: SnapshotStore, intent: SnapshotIntent) -> bool:
    """Whether ``intent``'s target is the empty table its own ``prepare`` created.

    ``prepare`` notes the CREATE (and its acknowledged answer) under the CREATE's query
    id before the intent exists, seals the intent over the table it then observes, and
    links the note into the intent's history last: a prepare killed in between leaves
    the notes without the link, and they still say so.
    """
    if any(h.facts.get("step") == "create_target" for h in store.history(intent.sha256)):
        return True
    notes = [n.facts for n in store.step_notes(create_target_query_id(intent.staged_event_sha256))]
    planned = any(
        f.get("step") == "create_target"
        and (f.get("database"), f.get("target_table")) == (intent.database, intent.target_table)
        and f.get("generation_uuid") == intent.generation_uuid
        for f in notes
    )
    answered = any(
        f.get("step") == "create_target_answer"
        and f.get("outcome") == DispatchOutcome.ACKNOWLEDGED.value
        for f in notes
    )
    # The tables it made, by UUID (stores before that note have none): a table the name
    # holds now that is not one of them (one made after a refused prepare dropped its
    # own) was not created by dpone.
    observed = {f.get("table_uuid") for f in notes if f.get("step") in (OBSERVED_STEP, DROP_STEP)}
    return planned and answered and (not observed or intent.target_uuid in observed)


def recorded_owners(store: SnapshotStore, stored: list[StoredIntent]) -> dict[str, str]:
    """UUID -> the mark of every table the slot's intents record dpone as creating.

    A generation carries the mark of the oldest intent that staged it (later ones are
    rollbacks of the same content); the empty target a first publication created
    carries none (``""``), whether that publication was then published or not. A UUID
    missing here (the user's own table a first publication replaced) is not dpone's.
    """
    owners: dict[str, str] = {}
    for _, intent in stored:  # oldest first: the first generation with a UUID created it
        owners.setdefault(
            intent.generation_uuid, ownership_comment(intent.attempt_id, intent.semantic_id)
        )
        if created_target(store, intent):
            owners.setdefault(intent.target_uuid, "")
    return owners


def superseded_prepared(store: SnapshotStore, stored: list[StoredIntent]) -> set[str]:
    """The PREPARED intents of one slot that can never be claimed: a newer epoch holds it."""
    prepared = [i for s, i in stored if s.state == SnapshotState.PREPARED.value]
    if not prepared:
        return set()
    current = store.current_epoch(TargetSlot(prepared[0].database, prepared[0].target_table))
    return {i.sha256 for i in prepared if i.slot_epoch < current}


def unfinished_publication(
    store: SnapshotStore, database: str, target: str
) -> SnapshotSummary | None:
    """The slot's oldest publication that may still move (None when every one is settled).

    EXCHANGE_INTENT and COMMIT_UNKNOWN need ``dpone snapshot reconcile``; a PREPARED
    intent of the slot's current epoch may still be claimed (``dpone snapshot
    cancel``). A PREPARED intent that a newer epoch superseded is settled for good.
    """
    stored = stored_intents(store, database, target)
    superseded = superseded_prepared(store, stored)
    for summary, intent in stored:
        if summary.abandoned:
            continue  # its database was dropped: nothing of it can move any more
        if SnapshotState(summary.state) not in TERMINAL and intent.sha256 not in superseded:
            return summary
    return None


def rollback_copies(store: SnapshotStore, database: str, target: str) -> list[RollbackCopy]:
    """The slot's possible rollback copies, newest publication first (existence unchecked)."""
    stored = stored_intents(store, database, target)
    owners = recorded_owners(store, stored)
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
        expected = owners.get(intent.target_uuid)
        copies.append(RollbackCopy(intent, summary.created_at, expected, expected == ""))
    return copies


def existing_copies(
    store: SnapshotStore,
    transport: QueryPort,
    database: str,
    target: str,
    purpose: str = "retention_copies",
) -> list[tuple[RollbackCopy, Ownership]]:
    """The copies that exist now (name and UUID as the store says), newest first."""
    return copies_in_database(store, transport, database, [target], purpose)[target]


def copies_in_database(
    store: SnapshotStore,
    transport: QueryPort,
    database: str,
    targets: Sequence[str],
    purpose: str,
) -> dict[str, list[tuple[RollbackCopy, Ownership]]]:
    """:func:`existing_copies` of several targets of one database, in one read at most."""
    copies = {target: rollback_copies(store, database, target) for target in targets}
    newest = next((c[0].intent.attempt_id for c in copies.values() if c), None)
    if newest is None:
        return {target: [] for target in targets}
    reads = iter(range(1, 100))
    tables = observe_ownerships(
        transport,
        database,
        [copy.table for found in copies.values() for copy in found],
        lambda: read_query_id(newest, purpose, next(reads)),
        time.monotonic() + REQUEST_SECONDS,
    )
    return {
        target: [
            (copy, owned)
            for copy in found
            if (owned := tables.get(copy.table)) is not None and owned.uuid == copy.uuid
        ]
        for target, found in copies.items()
    }


def enforce_retention(
    store: SnapshotStore,
    transport: QueryPort,
    retention_dir: Path,
    database: str,
    target: str,
    *,
    keep: int,
    user: str,
    attempts_dir: Path | None = None,
) -> list[str]:
    """Drop the copies beyond the ``keep`` newest, then discard the generations no
    publication can use (:func:`discard_superseded`); returns the dropped tables' names.

    ``user`` is the server user ``transport`` authenticates as: each drop's journal
    names it, so a later proof of the DROP's fate finds it in the query log.
    ``attempts_dir`` holds the staging journals (default: ``attempts`` beside
    ``retention_dir``, the project's work dir layout).
    """
    unfinished = unfinished_publication(store, database, target)
    if unfinished is not None:
        raise RetentionError(
            f"{database}.{target} has an unfinished publication ({unfinished.intent_sha256});"
            " no rollback copy is dropped until it is reconciled",
            code="publication_unfinished",
            intent_sha256=unfinished.intent_sha256,
        )
    dropped = []
    for copy, owned in existing_copies(store, transport, database, target)[keep:]:
        drop_copy(transport, retention_dir, copy, owned, user=user)
        dropped.append(f"{database}.{copy.table}")
    staged = attempts_dir if attempts_dir is not None else retention_dir.parent / "attempts"
    dropped += discard_superseded(store, transport, staged, database, target)
    return dropped


def discard_superseded(
    store: SnapshotStore, transport: QueryPort, attempts_dir: Path, database: str, target: str
) -> list[str]:
    """Discard the staged generations of the slot's intents that will never be published.

    Those of ``not_published`` intents and of superseded PREPARED ones, each through its
    own staging journal under ``attempts_dir`` (``dpone attempts discard``: the UUID the
    intent recorded and the journal's mark are proven first, the DROP is journaled).
    A generation that is a table some publication placed (a rollback's generation is
    a rollback copy, and its journal is not a staging one) is never touched. Returns
    the discarded tables' names (already gone ones are only recorded).
    """
    stored = stored_intents(store, database, target)
    superseded = superseded_prepared(store, stored)
    placed = {i.target_uuid for _, i in stored} | {
        i.generation_uuid for s, i in stored if s.state == SnapshotState.PUBLISHED.value
    }
    discarded = []
    for summary, intent in stored:
        never = summary.state == SnapshotState.NOT_PUBLISHED.value or intent.sha256 in superseded
        journal = attempts_dir / intent.attempt_id
        if not never or intent.generation_uuid in placed or not (journal / "events").is_dir():
            continue
        try:
            staged = summarize(journal, read_events(journal))
        except DponeError:
            continue  # a journal that does not verify proves nothing: status lists it
        if (
            staged.state not in (StageState.STAGED.value, StageState.DISCARDING.value)
            or (staged.planned_table or {}).get("table") != intent.generation_table
        ):
            continue  # discarded already, or not this generation's journal
        discard_attempt(
            transport,
            attempts_dir,
            intent.attempt_id,
            database=database,
            expected_uuid=intent.generation_uuid,
        )
        discarded.append(f"{database}.{intent.generation_table}")
    return discarded


def drop_copy(
    transport: QueryPort, retention_dir: Path, copy: RollbackCopy, owned: Ownership, *, user: str
) -> None:
    """Drop one copy after its ownership is proven, as its own journaled attempt."""
    drop_recorded(
        transport,
        retention_dir,
        "retain-",
        database=copy.intent.database,
        table=copy.table,
        owned=owned,
        expected_comment=copy.expected_comment,
        facts={"intent_sha256": copy.intent.sha256, "published_at": copy.published_at},
        user=user,
    )


def drop_recorded(
    transport: QueryPort,
    journal_dir: Path,
    prefix: str,
    *,
    database: str,
    table: str,
    owned: Ownership,
    expected_comment: str | None,
    facts: dict[str, Any],
    user: str,
    planned: dict[str, Any] | None = None,
) -> Path:
    """Drop ``database.table`` (observed as ``owned``) as its own journaled attempt.

    Refused (``ownership_unverified``, nothing written) unless its mark is
    ``expected_comment`` (None: the mark cannot be derived, never dropped). The journal
    ``<journal_dir>/<prefix><id>`` first records the table's UUID and mark (the
    ``rollback_copy`` member, with ``facts``, and ``planned``'s members), then the
    DROP's intent, its settled answer and the verified removal. Returns the journal.
    """
    if expected_comment is None or (owned.comment or "") != expected_comment:
        raise RetentionError(
            f"{database}.{table} carries the mark {owned.comment!r}, not "
            f"{expected_comment!r}; it is not proven to be the table dpone recorded, not dropped",
            code="ownership_unverified",
            table=table,
            table_uuid=owned.uuid,
        )
    journal = ClickHouseFileAttemptJournal(journal_dir, prefix + new_attempt_id())
    journal.open()
    run = AttemptRun(
        journal,
        {"planned_ownership": {"database": database, "table": table}, "principal": {"user": user}},
        state=StageState.DISCARDING,
    )
    run.table_uuid = owned.uuid
    # ``rollback_copy``: the member a later `attempts discard` proves ownership from.
    run.event(
        StageState.DISCARDING,
        "retention_planned",
        observed_ownership={"table_uuid": owned.uuid},
        rollback_copy={**facts, "uuid": owned.uuid, "comment": owned.comment},
        **(planned or {}),
    )
    reads = iter(range(1, 100))
    try:
        gone = drop_owned_table(
            transport,
            run,
            StageState.DISCARDING,
            kind="discard",
            database=database,
            table=table,
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
            f"the DROP of {database}.{table} has an unknown outcome; its journal "
            f"{journal.attempt_dir} stays at discarding",
            code="retention_unknown",
            journal=str(journal.attempt_dir),
        )
    run.event(StageState.DISCARDED, "discarded")
    return journal.attempt_dir
