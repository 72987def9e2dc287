"""What a dispatch durably notes about its drain-gate session, and the guard it runs under.

The executor, holding the dispatch gate (:mod:`dpone.publication.dispatch_gate`), notes
in the store's ``steps`` under ``dispatch/<intent_sha256>``:

- ``session_opening`` before the request that opens the session leaves;
- ``session_open_answered`` / ``exchange_answered`` after each request answered:
  the wall-clock time of the answer (``answered_at``, Unix seconds), the outcome and
  its reason;
- ``dispatch_refused`` when a re-check under the gate refused (nothing was sent), with
  the reason.

Closure reads these notes under the same gate (:func:`session_use`): no
``session_opening`` note means the session was provably never opened (the executor
writes the note before opening, under the gate, after re-checking the lease that
closure has already ended), so there is nothing to wait for; otherwise the session
outlives its last request by T, counted from the last recorded answer, or from now
when the last request has no settled answer.

:class:`DispatchGuard` is the executor's re-check: the lease is still active and is the
intent's exact publisher lease, and the record is the intent's EXCHANGE_INTENT@2.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from dpone.contracts.composition_snapshot import (
    SnapshotIntent,
    SnapshotRecord,
    SnapshotState,
)
from dpone.errors import DponeError, StateError
from dpone.ports.composition_snapshot import (
    DispatchOutcome,
    IssuedPrincipal,
    Lease,
    StepNote,
    StoredSnapshot,
)

OPENING = "session_opening"
# Closure's probe found the session open: whoever used it, it may live T (or longer)
# from now, so the next closure counts its full wait from its own start.
PROBE_OPEN = "probe_found_open"
ANSWER_STEPS = ("session_open_answered", "exchange_answered")
REFUSED = "dispatch_refused"
# Answers after which the request provably no longer runs on the server: the session's
# T counts from then. Anything else (unknown) may still be running.
_SETTLED = frozenset(
    {
        DispatchOutcome.ACKNOWLEDGED.value,
        DispatchOutcome.REFUSED.value,
        DispatchOutcome.NOT_SENT.value,
    }
)


def dispatch_step_key(intent_sha256: str) -> str:
    """The ``steps`` key of an intent's dispatch notes."""
    return f"dispatch/{intent_sha256}"


class DispatchRefused(StateError):
    """A re-check under the dispatch gate refused; nothing was sent (see ``code``)."""

    code = "dispatch_refused"


class GuardStore(Protocol):
    """The parts of the snapshot store the guard reads and writes."""

    def get_lease(self, lease_id: str) -> Lease: ...

    def load(self, intent_sha256: str) -> StoredSnapshot: ...

    def note_step(self, key: str, facts: Mapping[str, Any]) -> StepNote: ...

    def step_notes(self, key: str) -> list[StepNote]: ...


class DispatchGuard:
    """The executor's re-check and notes, over the snapshot store (see the module doc)."""

    def __init__(self, store: GuardStore) -> None:
        self.store = store

    def check(self, intent: SnapshotIntent, principal: IssuedPrincipal, step: str) -> None:
        """Raise :class:`DispatchRefused` unless the lease and the claim still hold."""
        bound, ref = intent.publisher, principal.ref
        try:
            lease = self.store.get_lease(bound.lease_id)
            stored = self.store.load(intent.sha256)
            record = SnapshotRecord.from_bytes(stored.record_bytes)
        except DponeError as exc:
            raise DispatchRefused(
                f"the lease or the claim of {intent.sha256} cannot be read before {step}",
                code="dispatch_unverified",
                step=step,
            ) from exc
        if not lease.active or (lease.lease_id, lease.user, lease.attempt_id) != (
            ref.lease_id,
            bound.user,
            intent.attempt_id,
        ):
            raise DispatchRefused(
                f"lease {bound.lease_id} is no longer this intent's active publisher ({step})",
                code="lease_ended",
                step=step,
                active=lease.active,
            )
        if (record.intent_sha256, record.state, record.revision) != (
            intent.sha256,
            SnapshotState.EXCHANGE_INTENT,
            2,
        ):
            raise DispatchRefused(
                f"{intent.sha256} is {record.state.value}@{record.revision}, not the claim "
                f"EXCHANGE_INTENT@2 ({step})",
                code="claim_moved",
                step=step,
            )

    def note(self, intent_sha256: str, facts: Mapping[str, Any]) -> None:
        """Note one dispatch step durably (raises if the store cannot)."""
        self.store.note_step(dispatch_step_key(intent_sha256), facts)


@dataclass(frozen=True)
class SessionUse:
    """What the notes say about one drain-gate session.

    ``opened``: a ``session_opening`` note exists. ``settled_at_us``: the wall-clock
    answer time (Unix microseconds) of the last request, when every request noted after the last opening has a
    settled answer; None when one may still be running (count T from now).
    """

    session_id: str
    opened: bool
    settled_at_us: int | None
    note_key: str | None = None  # where closure notes what its probe found

    def to_dict(self) -> dict[str, Any]:
        return {
            "session_id": self.session_id,
            "opened": self.opened,
            "settled_at_us": self.settled_at_us,
        }


def session_use(session_id: str, notes: Sequence[StepNote], key: str | None = None) -> SessionUse:
    """Read one session's use from its intent's dispatch notes (see the module doc)."""
    mine = [n.facts for n in notes if n.facts.get("session_id") == session_id]
    openings = [i for i, facts in enumerate(mine) if facts.get("step") in (OPENING, PROBE_OPEN)]
    if not openings:
        return SessionUse(session_id, False, None, key)
    after = mine[openings[-1] + 1 :]
    answers = [f for f in after if f.get("step") in ANSWER_STEPS]
    if not answers:
        return SessionUse(session_id, True, None, key)
    last = answers[-1]
    answered = last.get("answered_at_us")
    if last.get("outcome") in _SETTLED and isinstance(answered, int):
        return SessionUse(session_id, True, answered, key)
    return SessionUse(session_id, True, None, key)
