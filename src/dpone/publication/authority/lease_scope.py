"""What belongs to one lease of a pool user: the scope of its closure.

A pool user is leased again and again, one active lease at a time, so closure acts on a
lease, never on a bare user name (:class:`LeaseScope`): its window from the lease's issue
time, its query-id marks (``dpone-s00-<intent[:32]>-`` for the publisher,
``dpone-b02-<attempt>-`` for the ingest lease), its drain-gate sessions, and whether the
user was leased again since (``relet``), after which only the lease's marked queries and
what started in its window are its own. See docs/publication-principals.md ("What the
closure rests on").
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from dpone.contracts.composition_snapshot import (
    QUERY_ID_PREFIX,
    exchange_session_id,
)
from dpone.errors import StateError
from dpone.localserver.principal_pool import ROLE_INGEST
from dpone.ports.composition_snapshot import PrincipalRef
from dpone.publication.dispatch.dispatch_notes import (
    SessionUse,
    dispatch_step_key,
    session_ids,
    session_use,
)
from dpone.publication.store import SnapshotStore, lease_step_key
from dpone.publication.store.parsed_intents import parsed_intents
from dpone.staging.ingest_session import ingest_session_id

STAGING_QUERY_ID_PREFIX = "dpone-b02"


@dataclass(frozen=True)
class LeaseScope:
    """One lease's window, query-id marks and drain-gate sessions (see the module doc)."""

    lease_id: str
    issued_at_us: int
    ended_at_us: int | None
    marks: tuple[str, ...]
    sessions: tuple[SessionUse, ...]
    relet: bool
    role: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "lease_id": self.lease_id,
            "role": self.role,
            "issued_at_us": self.issued_at_us,
            "ended_at_us": self.ended_at_us,
            "marks": list(self.marks),
            "sessions": [s.to_dict() for s in self.sessions],
            "relet": self.relet,
        }


def micros(at: str) -> int:
    """A store ``at`` (UTC ISO 8601 with microseconds, ``Z``) as Unix microseconds."""
    parsed = datetime.strptime(at, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)
    return int(parsed.timestamp()) * 1_000_000 + parsed.microsecond


def lease_scope(store: SnapshotStore, principal: PrincipalRef) -> LeaseScope:
    """The scope of ``principal``'s lease as the store holds it now."""
    found = store.lease_record(principal.lease_id)
    if found is None:
        raise StateError(
            f"lease {principal.lease_id} is not in the store",
            code="lease_not_found",
            lease_id=principal.lease_id,
        )
    record, relet = found
    marks: list[str] = []
    sessions: list[SessionUse] = []
    if record.lease.role == ROLE_INGEST:
        marks.append(f"{STAGING_QUERY_ID_PREFIX}-{record.lease.attempt_id}-")
        # Staging's drain gate notes its session under the lease's own key.
        key = lease_step_key(principal.lease_id)
        notes = store.step_notes(key)
        sessions.extend(session_use(sid, notes, key) for sid in session_ids(notes))
        if not sessions:
            # Staged without notes (over HTTP without session notes, or the client
            # transport, which has no sessions): the session its gated writes would use
            # is closed and probed all the same; a 372 costs no wait.
            derived = ingest_session_id(record.lease.attempt_id)
            sessions.append(SessionUse(derived, False, None, key, derived=True))
    else:
        # Only its attempt's intents can name it: the authority dispatches an intent
        # only through a publisher leased to the intent's own attempt.
        for intent in parsed_intents(store, attempt_id=record.lease.attempt_id):
            if intent.publisher.lease_id == principal.lease_id:
                marks.append(f"{QUERY_ID_PREFIX}-{intent.sha256[:32]}-")
                key = dispatch_step_key(intent.sha256)
                notes = store.step_notes(key)
                sessions.append(session_use(exchange_session_id(intent.sha256), notes, key))
    return LeaseScope(
        lease_id=principal.lease_id,
        issued_at_us=micros(record.issued_at),
        ended_at_us=None if record.ended_at is None else micros(record.ended_at),
        marks=tuple(marks),
        sessions=tuple(sessions),
        relet=relet,
        role=record.lease.role,
    )
