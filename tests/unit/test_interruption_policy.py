"""Which interrupted runs may let their generation go (a pure policy)."""

from __future__ import annotations

import pytest

from dpone.contracts.composition_snapshot import SnapshotState
from dpone.project.interruption import nothing_will_publish


@pytest.mark.parametrize(
    ("state", "let_go"),
    [
        (None, True),  # no intent: nothing can publish the generation
        (SnapshotState.NOT_PUBLISHED, True),  # nothing sent, or proven not run
        (SnapshotState.PUBLISHED, False),  # it is the target now
        (SnapshotState.PREPARED, False),  # a settle that could not cancel: still claimable
        (SnapshotState.EXCHANGE_INTENT, False),  # claimed: an EXCHANGE may be in flight
        (SnapshotState.COMMIT_UNKNOWN, False),  # an unproven closure: it may still land
    ],
)
def test_only_an_intent_that_cannot_publish_lets_its_generation_go(
    state: SnapshotState | None, let_go: bool
) -> None:
    assert nothing_will_publish(state) is let_go
