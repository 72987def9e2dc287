"""The five states of a publication, the revisions each can hold, the edges between
them, and the members a record in each state must hold (the module doc of
:mod:`dpone.contracts.composition_snapshot` has the table)."""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING

from dpone.contracts.fields import DocumentError
from dpone.errors import StateError

if TYPE_CHECKING:
    from dpone.contracts.composition_snapshot.record import SnapshotRecord


class SnapshotState(enum.Enum):
    """Where one publication is."""

    PREPARED = "prepared"
    EXCHANGE_INTENT = "exchange_intent"
    PUBLISHED = "published"
    NOT_PUBLISHED = "not_published"
    COMMIT_UNKNOWN = "commit_unknown"


P = SnapshotState
TERMINAL = frozenset({P.PUBLISHED, P.NOT_PUBLISHED})
CANCELLED = "cancelled"  # the reason of NOT_PUBLISHED@2, and of nothing else


def revision_ok(state: SnapshotState, revision: int) -> bool:
    """Whether ``state`` can be reached at ``revision`` at all."""
    if state is P.PREPARED:
        return revision == 1
    if state is P.EXCHANGE_INTENT:
        return revision == 2
    # COMMIT_UNKNOWN is entered only from EXCHANGE_INTENT@2 and keeps its revision while
    # it stays unknown, so it exists at 3 alone; the terminal states follow 2 or 3.
    if state is P.COMMIT_UNKNOWN:
        return revision == 3
    if state is P.NOT_PUBLISHED:
        return 2 <= revision <= 4
    return 3 <= revision <= 4  # PUBLISHED


def transition_ok(
    current: SnapshotState | None, revision: int | None, target: SnapshotState, new_revision: int
) -> bool:
    """Whether ``current@revision -> target@new_revision`` is an allowed edge."""
    if current is None:  # nothing stored yet: there is no revision either
        return revision is None and target is P.PREPARED and new_revision == 1
    if revision is None or new_revision != revision + 1 or not revision_ok(current, revision):
        return False
    if current is P.PREPARED:
        return target in (P.EXCHANGE_INTENT, P.NOT_PUBLISHED)
    if current is P.EXCHANGE_INTENT:
        return target in (P.PUBLISHED, P.NOT_PUBLISHED, P.COMMIT_UNKNOWN)
    if current is P.COMMIT_UNKNOWN:
        return target in (P.PUBLISHED, P.NOT_PUBLISHED)
    return False  # PUBLISHED and NOT_PUBLISHED are terminal


def check_transition(
    current: SnapshotState | None, revision: int | None, target: SnapshotState, new_revision: int
) -> None:
    """Raise ``invalid_transition`` unless the edge is allowed."""
    if not transition_ok(current, revision, target, new_revision):
        was = "nothing" if current is None else f"{current.value}@{revision}"
        raise StateError(
            f"a snapshot record cannot move from {was} to {target.value}@{new_revision}",
            code="invalid_transition",
        )


def check_record_shape(record: SnapshotRecord) -> None:
    """Refuse (``unreachable_state``) a record whose revision or members do not fit its state.

    PREPARED@1: nothing but the intent. EXCHANGE_INTENT@2: a claim, nothing observed yet.
    NOT_PUBLISHED@2: the cancellation (no claim, reason ``cancelled``). PUBLISHED and
    NOT_PUBLISHED@3-4: a claim, a proven closure and the observed UUID pair (PUBLISHED
    also B's rows and digest). COMMIT_UNKNOWN@3: a claim. Every record after the first
    names its predecessor.
    """
    state, revision = record.state, record.revision
    problems: list[str] = []
    if not revision_ok(state, revision):
        problems.append(f"revision {revision} is not reachable in this state")
    first = state is P.PREPARED
    if first != (record.previous_record_sha256 is None):
        problems.append("only the first record has no previous_record_sha256")
    cancelled = state is P.NOT_PUBLISHED and revision == 2
    if (record.reason == CANCELLED) != cancelled:
        problems.append(f"reason {CANCELLED!r} belongs to NOT_PUBLISHED@2 exactly")
    if first or cancelled:
        present = [
            name
            for name in ("claim", "closure", "observation", "dispatch", "reason")
            if getattr(record, name) is not None and not (cancelled and name == "reason")
        ]
        if present:
            problems.append(f"holds {', '.join(present)} although no claim was ever made")
    else:
        problems.extend(_claimed_shape(record))
    if problems:
        raise DocumentError(
            f"record {state.value}@{revision} is unreachable: {'; '.join(problems)}",
            code="unreachable_state",
            where="record",
            state=state.value,
            revision=revision,
        )


def _claimed_shape(record: SnapshotRecord) -> list[str]:
    problems: list[str] = []
    state = record.state
    if record.claim is None:
        problems.append("a claimed state needs its claim")
    if state is P.EXCHANGE_INTENT:
        present = [n for n in ("closure", "observation", "dispatch") if getattr(record, n)]
        if present:
            problems.append(f"holds {', '.join(present)} before any dispatch")
        return problems
    if state is P.COMMIT_UNKNOWN:
        return problems
    closure, seen = record.closure, record.observation
    if closure is None or not closure.proven:
        problems.append("a terminal state needs a proven publisher closure")
    if seen is None or seen.target_uuid is None or seen.generation_uuid is None:
        problems.append("a terminal state needs both observed UUIDs")
    elif state is P.PUBLISHED and (seen.target_rows is None or seen.target_content_digest is None):
        problems.append("PUBLISHED needs B's observed rows and content digest")
    return problems
