"""The run registry: admissions to a slot, slot epochs, ownership, and the authority recheck.

Admission only reserves a run's slot epoch (the slot's next); the run takes it, fencing
every older run of the slot, in the transaction that stores its PREPARED intent
(:func:`activate`), so a prepare refused by any check fences nothing. See
docs/publication.md ("One attempt, one publication", "The snapshot store").
"""

from __future__ import annotations

import uuid

from dpone.contracts.composition_snapshot import SnapshotState
from dpone.ports.composition_snapshot import (
    Admission,
    AttemptEpochs,
    OwnershipState,
    ParentAuthority,
    TargetSlot,
)
from dpone.publication.store.connections import StoreConnection, StoreConnections
from dpone.publication.store.errors import SnapshotStoreError
from dpone.publication.store.schema import now

# A durable claim not yet resolved: it blocks new admissions to its slot, and RETIRING
# ownership (still retained) may resolve it.
UNRESOLVED_STATES = (SnapshotState.EXCHANGE_INTENT.value, SnapshotState.COMMIT_UNKNOWN.value)

# The ``steps`` key under which an operator's abandonment of an intent is noted: a
# COMMIT_UNKNOWN record whose database was dropped, its publisher closed (``dpone
# snapshot abandon``). The record keeps its state (no edge leaves COMMIT_UNKNOWN but to
# a proven outcome); the note only stops it from holding its slot.
ABANDONED_PREFIX = "abandoned/"
# SQL: the record ``r`` has no abandonment note (SQLite and PostgreSQL alike).
NOT_ABANDONED = (
    f"NOT EXISTS (SELECT 1 FROM steps s WHERE s.key = '{ABANDONED_PREFIX}' || r.intent_sha256)"
)


def abandoned_key(intent_sha256: str) -> str:
    """The ``steps`` key of the abandonment of ``intent_sha256``."""
    return f"{ABANDONED_PREFIX}{intent_sha256}"


_OWNERSHIP_NEXT = {
    OwnershipState.ACTIVE: OwnershipState.RETIRING,
    OwnershipState.RETIRING: OwnershipState.RETIRED,
}
_RUN_COLUMNS = (
    "parent_request, database, target_table, attempt_id, slot_epoch, attempt_epoch, ownership,"
    " activated"
)


class RunAdmission:
    """The :class:`~dpone.ports.composition_snapshot.SnapshotRunRegistry` half of the store."""

    def __init__(self, connections: StoreConnections) -> None:
        self.connections = connections

    def admit(self, slot: TargetSlot, attempt_id: str) -> Admission:
        """Admit ``attempt_id`` for ``slot`` or return its existing admission.

        A new admission reserves the slot's next epoch (the run is not yet activated:
        nothing older is fenced); ``slot_blocked`` while a record of the slot is
        EXCHANGE_INTENT or COMMIT_UNKNOWN; ``admission_conflict`` if the attempt holds
        another slot.
        """
        with self.connections.write("admit", "store_commit_unknown") as conn:
            existing = admission_row(conn, "attempt_id", attempt_id)
            if existing is not None:
                if existing.slot != slot:
                    raise SnapshotStoreError(
                        f"attempt {attempt_id} is admitted for"
                        f" {existing.slot.database}.{existing.slot.table}",
                        code="admission_conflict",
                        attempt_id=attempt_id,
                    )
                return existing
            _refuse_a_blocked_slot(conn, slot, attempt_id)
            return _admit_new_run(conn, slot, attempt_id)

    def admission(self, attempt_id: str) -> Admission | None:
        """The admission of ``attempt_id``, if any."""
        with self.connections.reading("admission") as conn:
            return admission_row(conn, "attempt_id", attempt_id)

    def current_epoch(self, slot: TargetSlot) -> int:
        """The slot's current epoch (0 before any admission)."""
        with self.connections.reading("current_epoch") as conn:
            return slot_epoch(conn, slot)

    def set_ownership(self, parent_request: str, state: OwnershipState) -> None:
        """Move a run's ownership one step forward (setting the current one is a no-op)."""
        with self.connections.write("set_ownership", "store_commit_unknown") as conn:
            run = admission_row(conn, "parent_request", parent_request)
            if run is None:
                raise SnapshotStoreError(
                    f"no run {parent_request} is admitted",
                    code="admission_not_found",
                    parent_request=parent_request,
                )
            if run.ownership is state:
                return
            if _OWNERSHIP_NEXT.get(run.ownership) is not state:
                raise SnapshotStoreError(
                    f"ownership of {parent_request} cannot move from"
                    f" {run.ownership.value} to {state.value}",
                    code="invalid_ownership_transition",
                    parent_request=parent_request,
                )
            conn.execute(
                "UPDATE runs SET ownership = ? WHERE parent_request = ?",
                (state.value, parent_request),
            )


def _refuse_a_blocked_slot(conn: StoreConnection, slot: TargetSlot, attempt_id: str) -> None:
    """``slot_blocked`` while a record of ``slot`` holds an unresolved durable claim
    (one abandoned, :data:`ABANDONED_PREFIX`, holds nothing)."""
    blocking = conn.execute(
        "SELECT r.intent_sha256, r.state FROM records r JOIN intents i"
        " USING (intent_sha256) WHERE i.database = ? AND i.target_table = ?"
        f" AND r.state IN ({', '.join('?' for _ in UNRESOLVED_STATES)})"
        f" AND {NOT_ABANDONED} ORDER BY r.intent_sha256",
        (slot.database, slot.table, *UNRESOLVED_STATES),
    ).fetchall()
    if blocking:
        raise SnapshotStoreError(
            f"{slot.database}.{slot.table} is held by an unresolved publication"
            f" ({blocking[0][1]} {blocking[0][0]})",
            code="slot_blocked",
            attempt_id=attempt_id,
            intents=[row[0] for row in blocking],
        )


def _admit_new_run(conn: StoreConnection, slot: TargetSlot, attempt_id: str) -> Admission:
    """Insert the run with the slot's next epoch reserved (taken later by :func:`activate`)."""
    epoch = slot_epoch(conn, slot) + 1
    number = conn.execute("SELECT coalesce(max(attempt_epoch), 0) + 1 FROM runs")
    admission = Admission(
        uuid.uuid4().hex,
        slot,
        attempt_id,
        AttemptEpochs(epoch, number.fetchone()[0]),
        OwnershipState.ACTIVE,
        activated=False,
    )
    conn.execute(
        "INSERT INTO runs VALUES (?, ?, ?, ?, ?, ?, ?, ?, 0)",
        (
            admission.parent_request,
            slot.database,
            slot.table,
            attempt_id,
            epoch,
            admission.epochs.attempt_epoch,
            admission.ownership.value,
            now(),
        ),
    )
    return admission


def activate(conn: StoreConnection, run: Admission) -> None:
    """The run takes its reserved slot epoch; every other ACTIVE run of the slot retires.

    Called in the transaction that stores the run's PREPARED intent, after the authority
    check found the slot still one epoch before the reserved one.
    """
    if run.activated:
        return
    _refuse_a_blocked_slot(conn, run.slot, run.attempt_id)
    conn.execute(
        "INSERT INTO slots VALUES (?, ?, ?) ON CONFLICT (database, target_table)"
        " DO UPDATE SET epoch = excluded.epoch",
        (run.slot.database, run.slot.table, run.epochs.slot_epoch),
    )
    conn.execute(
        "UPDATE runs SET ownership = ? WHERE database = ? AND target_table = ? AND ownership = ?"
        " AND parent_request != ?",
        (
            OwnershipState.RETIRING.value,
            run.slot.database,
            run.slot.table,
            OwnershipState.ACTIVE.value,
            run.parent_request,
        ),
    )
    conn.execute("UPDATE runs SET activated = 1 WHERE parent_request = ?", (run.parent_request,))


def slot_epoch(conn: StoreConnection, slot: TargetSlot) -> int:
    """The slot's epoch as stored in ``conn``'s transaction (0 before any admission)."""
    row = conn.execute(
        "SELECT epoch FROM slots WHERE database = ? AND target_table = ?",
        (slot.database, slot.table),
    ).fetchone()
    return 0 if row is None else int(row[0])


def admission_row(conn: StoreConnection, column: str, value: str) -> Admission | None:
    """The run whose ``column`` (``attempt_id`` or ``parent_request``) is ``value``, if any."""
    assert column in ("attempt_id", "parent_request")
    row = conn.execute(f"SELECT {_RUN_COLUMNS} FROM runs WHERE {column} = ?", (value,)).fetchone()
    if row is None:
        return None
    return Admission(
        row[0],
        TargetSlot(row[1], row[2]),
        row[3],
        AttemptEpochs(row[4], row[5]),
        OwnershipState(row[6]),
        activated=bool(row[7]),
    )


def authority_problem(
    conn: StoreConnection,
    authority: ParentAuthority,
    *,
    allow_retiring: bool,
    intent_sha256: str | None = None,
    activating: bool = False,
) -> tuple[str, str] | None:
    """Why ``authority`` may not write now (code, sentence), or None when it may.

    ``activating``: the write stores the run's PREPARED intent, which activates it.
    """
    run = admission_row(conn, "parent_request", authority.parent_request)
    if run is None:
        return "attempt_fenced", f"run {authority.parent_request} is not admitted"
    if intent_sha256 is not None:
        bound = conn.execute(
            "SELECT parent_request, database, target_table FROM intents WHERE intent_sha256 = ?",
            (intent_sha256,),
        ).fetchone()
        if bound is None or (bound[0], TargetSlot(bound[1], bound[2])) != (
            authority.parent_request,
            authority.slot,
        ):
            return "attempt_fenced", "the intent belongs to another run or slot"
    current = slot_epoch(conn, authority.slot)
    if run.slot != authority.slot or run.epochs.slot_epoch != authority.slot_epoch:
        return "attempt_fenced", f"run {authority.parent_request} holds another slot epoch"
    # A run not yet activated may only take its reserved epoch, the one after the slot's.
    expected = authority.slot_epoch - (0 if run.activated else 1)
    if current != expected or (not run.activated and not activating):
        return "attempt_fenced", (
            f"the slot is at epoch {current}, the run was admitted for {authority.slot_epoch}"
        )
    allowed = {OwnershipState.ACTIVE} | ({OwnershipState.RETIRING} if allow_retiring else set())
    if run.ownership not in allowed:
        return "ownership_not_active", f"run {authority.parent_request} is {run.ownership.value}"
    return None
