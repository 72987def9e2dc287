"""The staging state machine: states, allowed transitions, terminal states. Pure.

``ALLOWED`` is the attempt's own sequence. Two later actors enter it again, each
through one edge of ``REENTRY``: an operator's verified cleanup of an attempt that
needs one (``-> cleanup``), and the discard of a staged table that will never be
published (``staged -> discarding``).
"""

from __future__ import annotations

import enum

from dpone.errors import StateError


class StageState(enum.Enum):
    """Where one staging attempt is."""

    CHECKING = "checking"
    PREPARING = "preparing"
    PREPARED = "prepared"
    CREATING_STAGING = "creating_staging"
    LOADING = "loading"
    VERIFYING = "verifying"
    STAGED = "staged"
    CLEANUP = "cleanup"
    FAILED_CLEANED = "failed_cleaned"
    RETAINED_UNKNOWN = "retained_unknown"
    CLEANUP_FAILED = "cleanup_failed"
    DISCARDING = "discarding"
    DISCARDED = "discarded"


S = StageState
ALLOWED: dict[StageState, frozenset[StageState]] = {
    S.CHECKING: frozenset({S.PREPARING, S.FAILED_CLEANED}),
    S.PREPARING: frozenset({S.PREPARED, S.FAILED_CLEANED}),
    # Nothing exists remotely before the CREATE intent: a pre-CREATE failure is clean.
    S.PREPARED: frozenset({S.CREATING_STAGING, S.FAILED_CLEANED}),
    S.CREATING_STAGING: frozenset({S.LOADING, S.CLEANUP}),
    S.LOADING: frozenset({S.VERIFYING, S.CLEANUP}),
    S.VERIFYING: frozenset({S.STAGED, S.CLEANUP}),
    S.CLEANUP: frozenset({S.FAILED_CLEANED, S.RETAINED_UNKNOWN, S.CLEANUP_FAILED}),
    S.DISCARDING: frozenset({S.DISCARDED}),
}
TERMINAL = frozenset(
    {S.STAGED, S.FAILED_CLEANED, S.RETAINED_UNKNOWN, S.CLEANUP_FAILED, S.DISCARDED}
)
# Terminal states that leave something for an operator.
NEEDS_OPERATOR = frozenset({S.RETAINED_UNKNOWN, S.CLEANUP_FAILED})
# Where a later actor may enter: an operator's cleanup from any state that needs one
# (a journal without a terminal state belongs to a process that died), the discard
# of a staged table from ``staged`` (and again from ``discarding`` if it was cut short).
REENTRY: dict[StageState, frozenset[StageState]] = {
    **{s: frozenset({S.CLEANUP}) for s in S if s not in TERMINAL or s in NEEDS_OPERATOR},
    S.STAGED: frozenset({S.DISCARDING}),
    S.DISCARDING: frozenset({S.DISCARDING, S.DISCARDED}),
}


def check_transition(current: StageState, target: StageState) -> StageState:
    """Return ``target`` if the attempt may move there from ``current``."""
    return _check(ALLOWED, current, target)


def check_reentry(current: StageState, target: StageState) -> StageState:
    """Return ``target`` if a later actor (operator cleanup, discard) may enter it."""
    return _check(REENTRY, current, target)


def _check(
    table: dict[StageState, frozenset[StageState]], current: StageState, target: StageState
) -> StageState:
    if target not in table.get(current, frozenset()):
        raise StateError(
            f"staging cannot move from {current.value} to {target.value}",
            code="invalid_transition",
            current=current.value,
            target=target.value,
        )
    return target
