"""The pool issuer's wait for a free principal: counted from the pool's last move."""

from __future__ import annotations

import pytest

from dpone.errors import StateError
from dpone.localserver.principal_pool import DEFAULT_POOL, ROLE_INGEST
from dpone.ports.clickhouse_request import Credentials
from dpone.ports.composition_snapshot import Lease
from dpone.publication.principals.principal_issuers import LocalPoolIssuer
from dpone.publication.store.holder_process import current_process
from dpone.publication.store.leases import LeaseRecord


class _Pool:
    """A registry whose every ingest principal is leased to a running holder (this
    process) until ``free_at``; ``moves`` says whether a lease ends and another begins
    at each try (the pool moving, as a run's other tables give principals back)."""

    def __init__(self, free_at: int, *, moves: bool) -> None:
        self.tries, self.free_at, self.moves = 0, free_at, moves

    def lease(self, role: str, candidates: tuple[str, ...], attempt_id: str) -> Lease:
        self.tries += 1
        if self.tries < self.free_at:
            raise StateError("every ingest principal is leased", code="pool_exhausted")
        return Lease("mine", candidates[0], role, attempt_id, True)

    def last_lease_records(self) -> list[LeaseRecord]:
        generation = self.tries if self.moves else 0
        return [
            LeaseRecord(
                Lease(f"{user}-{generation}", user, ROLE_INGEST, "another", True),
                "2026-12-07T00:00:00Z",
                None,
                current_process(),
            )
            for user in DEFAULT_POOL.ingest()
        ]


def _issuer(pool: _Pool, clock: list[float]) -> LocalPoolIssuer:
    users = DEFAULT_POOL.members()
    return LocalPoolIssuer(
        pool,  # type: ignore[arg-type]  # the registry's lease calls only
        {u: Credentials(u, "x") for u in users},
        {u: f"id-{u}" for u in users},
        lease_wait_seconds=10.0,
        clock=lambda: clock[0],
        sleep=lambda seconds: clock.__setitem__(0, clock[0] + seconds),
    )


def test_a_pool_that_moves_is_waited_for_past_the_wait_seconds() -> None:
    clock = [0.0]
    pool = _Pool(free_at=200, moves=True)
    issued = _issuer(pool, clock).issue(ROLE_INGEST, "mine")
    assert issued.ref.lease_id == "mine"
    assert clock[0] > 10.0  # longer than the wait: the pool kept moving


def test_a_pool_that_stands_still_is_exhausted_after_the_wait_seconds() -> None:
    clock = [0.0]
    pool = _Pool(free_at=10_000, moves=False)
    with pytest.raises(StateError) as exhausted:
        _issuer(pool, clock).issue(ROLE_INGEST, "mine")
    assert exhausted.value.code == "pool_exhausted"
    assert 10.0 <= clock[0] < 15.0
