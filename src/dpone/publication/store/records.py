"""Publication records: intents, their current record, its compare-and-set and history.

An intent is immutable; its record changes only to the next revision, by a
compare-and-set that rechecks the parent authority in the same transaction; every
change and every observation is appended to ``history``. ``read_back`` always opens
a fresh connection.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dpone.contracts import canonical_json
from dpone.contracts.composition_snapshot import SnapshotState, check_transition, revision_ok
from dpone.contracts.fields import DocumentError, check_type
from dpone.ports.composition_snapshot import (
    HistoryEntry,
    ParentAuthority,
    StoredSnapshot,
    TargetSlot,
)
from dpone.publication.store.admission import (
    NOT_ABANDONED,
    UNRESOLVED_STATES,
    activate,
    admission_row,
    authority_problem,
)
from dpone.publication.store.chain import ChainCheck, verify_chain
from dpone.publication.store.connections import StoreConnection, StoreConnections, StoreHooks
from dpone.publication.store.errors import SnapshotStoreError
from dpone.publication.store.schema import decode_facts, now

# Digests asked in one query (SQLite binds at most 32766 parameters).
_KEYS_A_QUERY = 500


@dataclass(frozen=True)
class SnapshotSummary:
    """One stored intent as listed: its slot, creation time and current state."""

    intent_sha256: str
    database: str
    target_table: str
    created_at: str
    state: str
    revision: int
    intent_bytes: bytes
    # An operator abandoned it (``dpone snapshot abandon``): its database was dropped, its
    # publisher closed; it keeps its state but holds its slot no more.
    abandoned: bool = False

    @property
    def blocking(self) -> bool:
        """Whether it holds its slot unresolved (EXCHANGE_INTENT or COMMIT_UNKNOWN)."""
        return self.state in UNRESOLVED_STATES and not self.abandoned


class SnapshotRecords:
    """The :class:`~dpone.ports.composition_snapshot.SnapshotPublicationStore` half, on
    the store's connections; ``hooks`` (the store's seams) sees every read-back."""

    def __init__(self, connections: StoreConnections, hooks: StoreHooks) -> None:
        self.connections = connections
        self.hooks = hooks

    def create(self, intent_bytes: bytes, record_bytes: bytes, authority: ParentAuthority) -> None:
        """Persist a new intent with its PREPARED record (``intent_exists`` if present).

        ``attempt_used`` when the run (one admitted attempt) already has an intent.

        The authority must be admitted, unfenced and ACTIVE in the same transaction, which
        also activates the run: it takes its reserved slot epoch and every other ACTIVE
        run of the slot retires (``slot_blocked`` if a record of the slot is unresolved).
        """
        canonical_json.loads(intent_bytes, what="snapshot intent")
        state, revision = _record_position(record_bytes)
        check_transition(None, None, state, revision)
        intent_sha256 = hashlib.sha256(intent_bytes).hexdigest()
        slot = authority.slot
        with self.connections.write("create", "prepare_uncertain") as conn:
            _refuse_a_second_intent(conn, intent_sha256, authority)
            problem = authority_problem(conn, authority, allow_retiring=False, activating=True)
            if problem is not None:
                raise SnapshotStoreError(
                    f"intent {intent_sha256} was not stored: {problem[1]}",
                    code=problem[0],
                    intent_sha256=intent_sha256,
                    parent_request=authority.parent_request,
                )
            run = admission_row(conn, "parent_request", authority.parent_request)
            assert run is not None  # authority_problem found it in this transaction
            activate(conn, run)
            at = now()
            conn.execute(
                "INSERT INTO intents VALUES (?, ?, ?, ?, ?, ?)",
                (
                    intent_sha256,
                    intent_bytes,
                    at,
                    authority.parent_request,
                    slot.database,
                    slot.table,
                ),
            )
            conn.execute(
                "INSERT INTO records VALUES (?, ?, ?, ?)",
                (intent_sha256, record_bytes, revision, state.value),
            )
            _append_history(conn, intent_sha256, revision, state.value, record_bytes, at, b"{}")

    def load(self, intent_sha256: str) -> StoredSnapshot:
        """The stored intent and current record (``snapshot_not_found`` when absent)."""
        with self.connections.reading("load") as conn:
            row = conn.execute(
                "SELECT i.intent_bytes, r.record_bytes, r.revision FROM intents i"
                " JOIN records r USING (intent_sha256) WHERE intent_sha256 = ?",
                (intent_sha256,),
            ).fetchone()
        if row is None:
            raise _not_found(intent_sha256)
        return StoredSnapshot(intent_sha256, bytes(row[0]), bytes(row[1]), row[2])

    def intent_keys(
        self, database: str | None = None, *, attempt_id: str | None = None
    ) -> list[str]:
        """The digest of every intent (of ``database``; of the run of ``attempt_id``),
        oldest first, without its bytes."""
        where, parameters = [], []
        if database is not None:
            where.append("i.database = ?")
            parameters.append(database)
        if attempt_id is not None:
            where.append(
                "i.parent_request IN (SELECT parent_request FROM runs WHERE attempt_id = ?)"
            )
            parameters.append(attempt_id)
        condition = f" WHERE {' AND '.join(where)}" if where else ""
        with self.connections.reading("intent_keys") as conn:
            rows = conn.execute(
                f"SELECT i.intent_sha256 FROM intents i{condition}"
                " ORDER BY i.created_at, i.intent_sha256",
                tuple(parameters),
            ).fetchall()
        return [str(row[0]) for row in rows]

    def intent_bytes(self, keys: Sequence[str]) -> dict[str, bytes]:
        """The stored bytes of the intents of these digests (those stored)."""
        found: dict[str, bytes] = {}
        with self.connections.reading("intent_bytes") as conn:
            for start in range(0, len(keys), _KEYS_A_QUERY):
                chunk = keys[start : start + _KEYS_A_QUERY]
                rows = conn.execute(
                    "SELECT intent_sha256, intent_bytes FROM intents WHERE intent_sha256 IN "
                    f"({', '.join('?' for _ in chunk)})",
                    tuple(chunk),
                ).fetchall()
                found.update((str(row[0]), bytes(row[1])) for row in rows)
        return found

    def list_snapshots(self, slot: TargetSlot | None = None) -> list[SnapshotSummary]:
        """Every intent (of ``slot``) with its current state, oldest first (for status and
        lookups; a slot's alone is what a refresh's check reads, not the whole history)."""
        where, parameters = (
            (" WHERE i.database = ? AND i.target_table = ?", (slot.database, slot.table))
            if slot is not None
            else ("", ())
        )
        with self.connections.reading("list") as conn:
            rows = conn.execute(
                "SELECT i.intent_sha256, i.database, i.target_table, i.created_at, r.state,"
                f" r.revision, i.intent_bytes, CASE WHEN {NOT_ABANDONED} THEN 0 ELSE 1 END"
                f" FROM intents i JOIN records r USING (intent_sha256){where}"
                " ORDER BY i.created_at, i.intent_sha256",
                parameters,
            ).fetchall()
        return [
            SnapshotSummary(
                row[0], row[1], row[2], row[3], row[4], row[5], bytes(row[6]), row[7] == 1
            )
            for row in rows
        ]

    def compare_and_set(
        self,
        intent_sha256: str,
        *,
        expected: bytes,
        replacement: bytes,
        authority: ParentAuthority,
        facts: Mapping[str, Any],
    ) -> None:
        """Replace ``expected`` (exact bytes and revision) by ``replacement`` atomically.

        ``claim_lost``: the stored bytes, the revision or the authority differ; nothing
        was written. ``claim_uncertain``: the commit's outcome is not known.
        RETIRING ownership may still resolve a durable claim (EXCHANGE_INTENT or
        COMMIT_UNKNOWN); every other move needs ACTIVE.
        """
        current, revision = _record_position(expected)
        target, new_revision = _record_position(replacement)
        check_transition(current, revision, target, new_revision)
        facts_bytes = canonical_json.dumps(dict(facts))
        where = {"intent_sha256": intent_sha256, "revision": revision}
        with self.connections.write("compare_and_set", "claim_uncertain") as conn:
            row = conn.execute(
                "SELECT record_bytes, revision FROM records WHERE intent_sha256 = ?",
                (intent_sha256,),
            ).fetchone()
            if row is None:
                raise _not_found(intent_sha256)
            if bytes(row[0]) != expected or row[1] != revision:
                raise SnapshotStoreError(
                    f"claim on {intent_sha256} lost: the stored record is at revision"
                    f" {row[1]} and differs from the expected revision {revision}",
                    code="claim_lost",
                    reason="stale_record",
                    stored_revision=row[1],
                    **where,
                )
            problem = authority_problem(
                conn,
                authority,
                intent_sha256=intent_sha256,
                allow_retiring=current.value in UNRESOLVED_STATES,
            )
            if problem is not None:
                raise SnapshotStoreError(
                    f"claim on {intent_sha256} lost: {problem[1]}",
                    code="claim_lost",
                    reason=problem[0],
                    **where,
                )
            updated = conn.execute(
                "UPDATE records SET record_bytes = ?, revision = ?, state = ?"
                " WHERE intent_sha256 = ? AND revision = ? AND record_bytes = ?",
                (replacement, new_revision, target.value, intent_sha256, revision, expected),
            ).rowcount
            if updated != 1:  # the checks above ran in this transaction: a broken store
                raise SnapshotStoreError(
                    f"record {intent_sha256} changed inside its own transaction",
                    code="store_unavailable",
                    **where,
                )
            _append_history(
                conn, intent_sha256, new_revision, target.value, replacement, now(), facts_bytes
            )

    def read_back(self, intent_sha256: str) -> bytes:
        """The current record bytes through a fresh, independent connection."""
        with self.connections.fresh("read_back") as conn:
            row = conn.execute(
                "SELECT record_bytes FROM records WHERE intent_sha256 = ?", (intent_sha256,)
            ).fetchone()
        data = self.hooks._after_read_back(intent_sha256, None if row is None else bytes(row[0]))
        if data is None:
            raise _not_found(intent_sha256)
        return data

    def observe(self, intent_sha256: str, facts: Mapping[str, Any]) -> None:
        """Append an observation (no record change) at the record's current revision."""
        facts_bytes = canonical_json.dumps(dict(facts))
        with self.connections.write("observe", "store_commit_unknown") as conn:
            row = conn.execute(
                "SELECT revision, state FROM records WHERE intent_sha256 = ?", (intent_sha256,)
            ).fetchone()
            if row is None:
                raise _not_found(intent_sha256)
            _append_history(conn, intent_sha256, row[0], row[1], None, now(), facts_bytes)

    def verify_chain(self, intent_sha256: str) -> ChainCheck:
        """Re-verify the intent's chain from the bytes its history keeps (see ``chain``).

        The current record and the history are read in one snapshot.
        """
        with self.connections.reading("verify_chain") as conn:
            entries = _history_of(conn, intent_sha256)
            current = conn.execute(
                "SELECT record_bytes FROM records WHERE intent_sha256 = ?", (intent_sha256,)
            ).fetchone()
        return verify_chain(intent_sha256, entries, b"" if current is None else bytes(current[0]))

    def history(self, intent_sha256: str) -> list[HistoryEntry]:
        """The full history of one intent, oldest first (``snapshot_not_found``)."""
        with self.connections.reading("history") as conn:
            return _history_of(conn, intent_sha256)


def _history_of(conn: StoreConnection, intent_sha256: str) -> list[HistoryEntry]:
    if not conn.execute(
        "SELECT 1 FROM intents WHERE intent_sha256 = ?", (intent_sha256,)
    ).fetchone():
        raise _not_found(intent_sha256)
    rows = conn.execute(
        "SELECT id, revision, state, record_sha256, at, facts, record_bytes FROM history"
        " WHERE intent_sha256 = ? ORDER BY id",
        (intent_sha256,),
    ).fetchall()
    return [
        HistoryEntry(
            row[0],
            row[1],
            row[2],
            row[3],
            row[4],
            decode_facts(row[5]),
            None if row[6] is None else bytes(row[6]),
        )
        for row in rows
    ]


def _refuse_a_second_intent(
    conn: StoreConnection, intent_sha256: str, authority: ParentAuthority
) -> None:
    """``intent_exists`` for a stored intent, ``attempt_used`` for a run that has one."""
    if conn.execute("SELECT 1 FROM intents WHERE intent_sha256 = ?", (intent_sha256,)).fetchone():
        raise SnapshotStoreError(
            f"intent {intent_sha256} is already stored",
            code="intent_exists",
            intent_sha256=intent_sha256,
        )
    # One admitted attempt, one publication (seed O8): preparing the same attempt
    # again, even after a cancellation, would bind the same generation to a
    # second intent and a second publisher.
    used = conn.execute(
        "SELECT intent_sha256 FROM intents WHERE parent_request = ?",
        (authority.parent_request,),
    ).fetchone()
    if used is not None:
        raise SnapshotStoreError(
            f"the attempt of run {authority.parent_request} already has the publication"
            f" intent {used[0]}; a new publication needs a new attempt",
            code="attempt_used",
            intent_sha256=intent_sha256,
            existing_intent=used[0],
            parent_request=authority.parent_request,
        )


def _record_position(record_bytes: bytes) -> tuple[SnapshotState, int]:
    """A record's ``state`` and ``revision`` members, read from its canonical bytes."""
    document = canonical_json.loads(record_bytes, what="snapshot record")
    if not isinstance(document, dict):
        raise DocumentError("a snapshot record must be an object", where="record")
    for name, kind in (("state", str), ("revision", int)):
        if name not in document:
            raise DocumentError(f"record has no {name}", code="missing_member", where=name)
        check_type(document[name], kind, where=f"record.{name}")
    try:
        state = SnapshotState(document["state"])
    except ValueError as exc:
        raise DocumentError(
            f"unknown record state {document['state']!r}", code="unreachable_state"
        ) from exc
    revision = document["revision"]
    if not revision_ok(state, revision):
        raise DocumentError(
            f"{state.value} cannot be at revision {revision}", code="unreachable_state"
        )
    return state, revision


def _not_found(intent_sha256: str) -> SnapshotStoreError:
    return SnapshotStoreError(
        f"no snapshot intent {intent_sha256} is stored",
        code="snapshot_not_found",
        intent_sha256=intent_sha256,
    )


def _append_history(
    conn: StoreConnection,
    intent_sha256: str,
    revision: int,
    state: str,
    record_bytes: bytes | None,
    at: str,
    facts: bytes,
) -> None:
    digest = None if record_bytes is None else hashlib.sha256(record_bytes).hexdigest()
    conn.execute(
        "INSERT INTO history (intent_sha256, revision, state, record_sha256, at, facts,"
        " record_bytes) VALUES (?, ?, ?, ?, ?, ?, ?)",
        (intent_sha256, revision, state, digest, at, facts, record_bytes),
    )
