"""Slot retirement: the store's record that a slot's tables were removed on purpose.

``dpone retire`` removes a slot's target and rollback copies, and
:class:`SlotRetirement` records it in two notes under the slot's key
(:func:`retirement_key`): ``retire_begun`` (:meth:`SlotRetirement.begin_retirement`),
which fences every run admitted so far by moving the slot's epoch on, and ``retired``
(:meth:`SlotRetirement.end_retirement`) once the drops are done. Both are idempotent.
What each refuses and when a slot counts as retired are in docs/publication.md ("The
snapshot store") and docs/operations.md ("Retiring a table").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dpone.contracts import canonical_json
from dpone.contracts.composition_snapshot import SnapshotState
from dpone.ports.composition_snapshot import OwnershipState, StepNote, TargetSlot
from dpone.publication.store.admission import NOT_ABANDONED, UNRESOLVED_STATES, slot_epoch
from dpone.publication.store.connections import StoreConnection, StoreConnections
from dpone.publication.store.errors import SnapshotStoreError
from dpone.publication.store.schema import decode_facts, now
from dpone.publication.store.steps import append_step

RETIREMENT_PREFIX = "retire/"
BEGUN, RETIRED = "retire_begun", "retired"


def retirement_key(slot: TargetSlot) -> str:
    """The ``steps`` key of ``slot``'s retirement notes."""
    return f"{RETIREMENT_PREFIX}{slot.database}/{slot.table}"


class SlotRetirement:
    """The retirement notes of slots, with the fence that makes a retirement safe."""

    def __init__(self, connections: StoreConnections) -> None:
        self.connections = connections

    def begin_retirement(self, slot: TargetSlot, facts: Mapping[str, Any]) -> StepNote:
        """Fence the slot and note ``retire_begun`` (or return the begun note it has).

        A retirement already begun, or ended, with no run activated since, is returned
        as it is (nothing written). ``facts`` (what is planned) go into a new note.
        """
        with self.connections.write("begin_retirement", "store_commit_unknown") as conn:
            _refuse_unfinished(conn, slot)
            epoch = slot_epoch(conn, slot)
            last = _last_note(conn, slot)
            if last is not None and last.facts.get("epoch") == epoch:
                return last  # begun (or ended) and nothing activated since
            epoch += 1
            conn.execute(
                "INSERT INTO slots VALUES (?, ?, ?) ON CONFLICT (database, target_table)"
                " DO UPDATE SET epoch = excluded.epoch",
                (slot.database, slot.table, epoch),
            )
            conn.execute(
                "UPDATE runs SET ownership = ? WHERE database = ? AND target_table = ?"
                " AND ownership = ?",
                (
                    OwnershipState.RETIRING.value,
                    slot.database,
                    slot.table,
                    OwnershipState.ACTIVE.value,
                ),
            )
            return _note(conn, slot, {**facts, "step": BEGUN, "epoch": epoch})

    def end_retirement(self, slot: TargetSlot, facts: Mapping[str, Any]) -> StepNote:
        """Note ``retired`` and retire the fenced runs (an ended retirement is returned)."""
        with self.connections.write("end_retirement", "store_commit_unknown") as conn:
            last = _last_note(conn, slot)
            epoch = slot_epoch(conn, slot)
            if last is None or last.facts.get("epoch") != epoch:
                raise SnapshotStoreError(
                    f"{slot.database}.{slot.table} was published into after its retirement "
                    "began (a run holds a newer epoch); it is not noted as retired",
                    code="retirement_superseded",
                    database=slot.database,
                    table=slot.table,
                )
            if last.facts.get("step") == RETIRED:
                return last
            conn.execute(
                "UPDATE runs SET ownership = ? WHERE database = ? AND target_table = ?"
                " AND ownership = ? AND slot_epoch <= ?",
                (
                    OwnershipState.RETIRED.value,
                    slot.database,
                    slot.table,
                    OwnershipState.RETIRING.value,
                    epoch,
                ),
            )
            return _note(conn, slot, {**facts, "step": RETIRED, "epoch": epoch})

    def retirement_notes(self) -> dict[TargetSlot, list[StepNote]]:
        """Every slot's retirement notes, oldest first."""
        with self.connections.reading("retirement_notes") as conn:
            rows = conn.execute(
                "SELECT id, key, at, facts FROM steps WHERE substr(key, 1, ?) = ? ORDER BY id",
                (len(RETIREMENT_PREFIX), RETIREMENT_PREFIX),
            ).fetchall()
        found: dict[TargetSlot, list[StepNote]] = {}
        for row in rows:
            note = StepNote(row[0], row[1], row[2], decode_facts(row[3]))
            slot = TargetSlot(str(note.facts.get("database")), str(note.facts.get("table")))
            if retirement_key(slot) == note.key:  # the facts name the key's own slot
                found.setdefault(slot, []).append(note)
        return found


def _refuse_unfinished(conn: StoreConnection, slot: TargetSlot) -> None:
    """``slot_blocked`` / ``publication_unfinished``: a publication of the slot may move."""
    rows = conn.execute(
        "SELECT r.intent_sha256, r.state, u.slot_epoch FROM records r"
        " JOIN intents i USING (intent_sha256) JOIN runs u USING (parent_request)"
        " WHERE i.database = ? AND i.target_table = ? AND r.state IN (?, ?, ?)"
        f" AND {NOT_ABANDONED} ORDER BY i.created_at",
        (slot.database, slot.table, *UNRESOLVED_STATES, SnapshotState.PREPARED.value),
    ).fetchall()
    current = slot_epoch(conn, slot)
    for sha, state, epoch in rows:
        # A PREPARED intent of an older epoch can never be claimed: it is superseded.
        if state != SnapshotState.PREPARED.value or epoch == current:
            raise SnapshotStoreError(
                f"{slot.database}.{slot.table} has an unfinished publication ({state} {sha}); "
                "nothing is retired until it is resolved",
                code="slot_blocked" if state in UNRESOLVED_STATES else "publication_unfinished",
                intent_sha256=sha,
                state=state,
            )


def _last_note(conn: StoreConnection, slot: TargetSlot) -> StepNote | None:
    row = conn.execute(
        "SELECT id, key, at, facts FROM steps WHERE key = ? ORDER BY id DESC LIMIT 1",
        (retirement_key(slot),),
    ).fetchone()
    return None if row is None else StepNote(row[0], row[1], row[2], decode_facts(row[3]))


def _note(conn: StoreConnection, slot: TargetSlot, facts: Mapping[str, Any]) -> StepNote:
    document = {**facts, "database": slot.database, "table": slot.table}
    data = canonical_json.dumps(document)
    at = now()
    sequence = append_step(conn, retirement_key(slot), data, at)
    assert sequence is not None
    return StepNote(sequence, retirement_key(slot), at, decode_facts(data))
