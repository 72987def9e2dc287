"""What a dispatch durably notes about its drain-gate session, and the guard it runs under.

Holding the dispatch gate, the executor notes in the store's ``steps`` under
``dispatch/<intent_sha256>`` ``session_opening`` before the opening leaves,
``session_open_answered`` and ``exchange_answered`` after each answer (``answered_at``,
Unix seconds, the outcome and its reason), and ``dispatch_refused`` when a re-check
refused; staging's drain gate notes its session the same way under its lease's key.
Closure reads them under the same gate (:func:`session_use`): no ``session_opening``
means no session to close. :class:`DispatchGuard` is the executor's re-check: the lease
is still the intent's active publisher lease and the record is the intent's
EXCHANGE_INTENT@2. See docs/publication-principals.md ("The executor", "The ingest drain
gate").
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from dpone.contracts.composition_snapshot import (
    SnapshotIntent,
    SnapshotRecord,
    SnapshotState,
)
from dpone.errors import DponeError, StateError
from dpone.ports.composition_snapshot import (
    Blocker,
    DispatchOutcome,
    IssuedPrincipal,
    Lease,
    StepNote,
    StoredSnapshot,
)
from dpone.staging.ingest_session import (
    SESSION_OPEN_ANSWERED,
    SESSION_OPENING,
    SETTLED_OUTCOMES,
    WRITE_ANSWERED,
    WRITE_SENDING,
)

# The step names are shared with the ingest drain gate, which notes its session the
# same way under its lease's key (:mod:`dpone.staging.ingest_session`).
OPENING = SESSION_OPENING
# Closure's probe found the session open: whoever used it, it may live T (or longer)
# from now, so the next closure counts its full wait from its own start.
PROBE_OPEN = "probe_found_open"
ANSWER_STEPS = (SESSION_OPEN_ANSWERED, "exchange_answered", WRITE_ANSWERED)
# Noted before a request leaves: until its answer is noted it may still be running.
SENDING_STEPS = (WRITE_SENDING,)
REFUSED = "dispatch_refused"
# The executor's re-check steps: before it opens the session, before it sends the EXCHANGE.
BEFORE_SESSION, BEFORE_EXCHANGE = "before_session", "before_exchange"
# What blocks an intent's EXCHANGE on its two names now (the catalog's last look).
SideEffectsNow = Callable[[SnapshotIntent], Sequence[Blocker]]
# Answers after which the request provably no longer runs on the server: the session's
# T counts from then. Anything else (unknown) may still be running.
_SETTLED = frozenset(
    {
        DispatchOutcome.ACKNOWLEDGED.value,
        DispatchOutcome.REFUSED.value,
        DispatchOutcome.NOT_SENT.value,
        *SETTLED_OUTCOMES,
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

    def __init__(self, store: GuardStore, side_effects: SideEffectsNow | None = None) -> None:
        """``side_effects``: the catalog's last look at both names of an intent (what
        blocks its EXCHANGE now), asked under the gate before the session opens."""
        self.store = store
        self.side_effects = side_effects

    def check_lease(self, principal: IssuedPrincipal, step: str) -> None:
        """Raise :class:`DispatchRefused` unless ``principal``'s lease is still active:
        a first publication's CREATE (or the DROP of what it created) is sent only as a
        lease nobody ended or closed meanwhile."""
        ref = principal.ref
        try:
            lease = self.store.get_lease(ref.lease_id)
        except DponeError as exc:
            raise DispatchRefused(
                f"lease {ref.lease_id} cannot be read before {step}",
                code="dispatch_unverified",
                step=step,
            ) from exc
        if not lease.active or lease.user != ref.user:
            raise DispatchRefused(
                f"lease {ref.lease_id} of {ref.user} is no longer active ({step})",
                code="lease_ended",
                step=step,
                active=lease.active,
            )

    def check(self, intent: SnapshotIntent, principal: IssuedPrincipal, step: str) -> None:
        """Raise :class:`DispatchRefused` unless the lease and the claim still hold and,
        before the session that carries the EXCHANGE opens, nothing blocks it on either
        name (before, not inside it: the look may take longer than the session lives)."""
        self._check_claim(intent, principal, step)
        if step == BEFORE_SESSION and self.side_effects is not None:
            try:
                blockers = self.side_effects(intent)
            except DponeError as exc:
                raise DispatchRefused(
                    f"the side effects on {intent.database}.{intent.target_table} could not "
                    f"be observed before the EXCHANGE's session: {exc.message}",
                    code="dispatch_unverified",
                    step=step,
                ) from exc
            if blockers:
                raise DispatchRefused(
                    f"{intent.database}.{intent.target_table} has a side effect the publisher "
                    "does not handle, seen under the gate before the EXCHANGE: "
                    f"{blockers[0].reason} ({blockers[0].detail})",
                    code="side_effect_present",
                    step=step,
                    blockers=[b.reason for b in blockers],
                )

    def _check_claim(self, intent: SnapshotIntent, principal: IssuedPrincipal, step: str) -> None:
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
    answer time (Unix microseconds) of the last request, when every request noted
    after the last opening has a settled answer; None when one may still be running
    (count T from now). ``session_timeout``: the T the last opening noted, if any.
    """

    session_id: str
    opened: bool
    settled_at_us: int | None
    note_key: str | None = None  # where closure notes what its probe found
    session_timeout: int | None = None
    # Not noted, but the one its writes would have used (an ingest lease staged without
    # notes): closure closes and probes it anyway, and waits for it as if opened when
    # the close does not end it.
    derived: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "session_id": self.session_id,
            "opened": self.opened,
            "settled_at_us": self.settled_at_us,
            "session_timeout": self.session_timeout,
            "derived": self.derived,
        }

    @property
    def may_exist(self) -> bool:
        """Whether closure must end this session (noted as opened, or derived)."""
        return self.opened or self.derived


def session_use(session_id: str, notes: Sequence[StepNote], key: str | None = None) -> SessionUse:
    """Read one session's use from its notes (an intent's dispatch, or an ingest lease's)."""
    mine = [n.facts for n in notes if n.facts.get("session_id") == session_id]
    openings = [i for i, facts in enumerate(mine) if facts.get("step") in (OPENING, PROBE_OPEN)]
    if not openings:
        return SessionUse(session_id, False, None, key)
    timeouts = [f.get("session_timeout") for f in mine if f.get("step") == OPENING]
    timeout = timeouts[-1] if timeouts and type(timeouts[-1]) is int else None
    settled: int | None = None
    for facts in mine[openings[-1] + 1 :]:
        step = facts.get("step")
        if step in SENDING_STEPS:
            settled = None  # sent, not yet answered: it may still run
        elif step in ANSWER_STEPS:
            answered = facts.get("answered_at_us")
            ok = facts.get("outcome") in _SETTLED and type(answered) is int
            settled = answered if ok and isinstance(answered, int) else None
    return SessionUse(session_id, True, settled, key, timeout)


def session_ids(notes: Sequence[StepNote]) -> list[str]:
    """The sessions whose opening ``notes`` record, in order of first opening."""
    found: list[str] = []
    for note in notes:
        session_id = note.facts.get("session_id")
        opening = note.facts.get("step") == OPENING and isinstance(session_id, str)
        if opening and session_id not in found:
            found.append(str(session_id))
    return found
