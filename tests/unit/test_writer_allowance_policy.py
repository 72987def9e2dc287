"""The pool users allowed to hold write grants, decided by each user's last lease."""

from __future__ import annotations

from dpone.ports.composition_snapshot import Lease
from dpone.publication.catalog.allowance import allowed_pool_users

POOL = ("ingest_1", "ingest_2", "ingest_3", "publisher_1")


def lease(lease_id: str, user: str, active: bool) -> Lease:
    return Lease(lease_id, user, "ingest", f"attempt-{lease_id}", active)


def test_the_last_lease_of_each_user_decides() -> None:
    leases = [
        lease("a", "ingest_1", False),  # ended, then leased again: the new one decides
        lease("b", "ingest_1", True),
        lease("c", "ingest_2", False),  # ended, closure proven
        lease("d", "ingest_3", True),
        lease("e", "publisher_1", False),
    ]
    proven = {"c"}
    allowed = allowed_pool_users(leases, lambda x: x.lease_id in proven, POOL)
    # publisher_1's last lease ended without a proven closure: a writer outside the leases.
    assert allowed == frozenset({"ingest_1", "ingest_2", "ingest_3"})


def test_an_ended_unproven_lease_blocks_even_after_an_older_proof() -> None:
    leases = [lease("a", "ingest_1", False), lease("b", "ingest_1", False)]
    assert allowed_pool_users(leases, lambda x: x.lease_id == "a", POOL) == frozenset(
        {"ingest_2", "ingest_3", "publisher_1"}
    )
    assert "ingest_1" in allowed_pool_users(leases, lambda x: x.lease_id == "b", POOL)


def test_never_leased_users_are_allowed() -> None:
    assert allowed_pool_users([], lambda _: False, POOL) == frozenset(POOL)
