"""The staging state machine: states, allowed transitions, terminal states. Pure."""

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
}
TERMINAL = frozenset({S.STAGED, S.FAILED_CLEANED, S.RETAINED_UNKNOWN, S.CLEANUP_FAILED})
# Terminal states that leave something for an operator.
NEEDS_OPERATOR = frozenset({S.RETAINED_UNKNOWN, S.CLEANUP_FAILED})


def check_transition(current: StageState, target: StageState) -> StageState:
    """Return ``target`` if the machine may move there from ``current``."""
    if target not in ALLOWED.get(current, frozenset()):
        raise StateError(
            f"staging cannot move from {current.value} to {target.value}",
            code="invalid_transition", current=current.value, target=target.value,
        )  # fmt: skip
    return target
