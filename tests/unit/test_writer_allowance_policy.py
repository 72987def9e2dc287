"""The pool users allowed to hold write grants, decided by each user's last lease."""

from __future__ import annotations

from dpone.connectors.clickhouse_tables import staging_table_name
from dpone.ports.composition_snapshot import (
    Admission,
    AttemptEpochs,
    Lease,
    OwnershipState,
    TargetSlot,
)
from dpone.publication.catalog.allowance import Idle, accounted_pool_users, allowed_pool_users
from dpone.publication.catalog.pool_queries import LOGGED, RUNNING, PoolQuery, pool_query_blockers
from dpone.publication.composition import is_slot_peer_publisher, is_slots_own_lease

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


def test_every_pool_user_without_an_active_lease_is_idle_since_its_lease_ended() -> None:
    last = [
        (lease("a", "ingest_1", False), 100),
        (lease("b", "ingest_1", True), None),  # leased again: in custody
        (lease("c", "ingest_2", False), 200),
    ]
    # Never leased: from when the store was made (what ran before is another store's).
    # ingest_1's active lease is the observed publication's own: not accounted.
    assert accounted_pool_users(
        last, POOL, store_made_us=50, own=lambda _: True, ended_us={"ingest_1": 100}
    ) == {
        "ingest_2": Idle(200, leased=True),
        "ingest_3": Idle(50, leased=False),
        "publisher_1": Idle(50, leased=False),
    }


def test_a_pool_user_another_run_holds_is_accounted_from_its_previous_lease_end() -> None:
    last = [
        (lease("a", "ingest_1", False), 100),
        (lease("b", "ingest_1", True), None),  # another run's (attempt-b)
        (lease("c", "ingest_2", True), None),  # another run's, never leased before
        (lease("d", "publisher_1", True), None),  # the observed publication's own
    ]
    accounted = accounted_pool_users(
        last,
        POOL,
        store_made_us=50,
        own=lambda x: x.attempt_id == "attempt-d",
        ended_us={"ingest_1": 100},
    )
    assert accounted == {
        # From where an idle user's window would start: its idle time before the
        # current lease still counts, and what the other run's lease runs counts.
        "ingest_1": Idle(100, leased=True, held_by="attempt-b"),
        "ingest_2": Idle(50, leased=True, held_by="attempt-c"),
        "ingest_3": Idle(50, leased=False),
    }
    found = [
        PoolQuery(LOGGED, "ingest_1", "inside-old-lease", "Insert", 90, ("b",)),
        PoolQuery(LOGGED, "ingest_1", "by-the-other-run", "Insert", 150, ("b",)),
        PoolQuery(RUNNING, "publisher_1", "own-exchange", "", 0, ("b", "t")),
    ]
    writers = {"b": {"ingest_1", "publisher_1"}, "t": {"publisher_1"}}
    blockers = pool_query_blockers(found, accounted, writers.__getitem__, "db", "b")
    assert [b.detail for b in blockers] == [
        "pool user ingest_1 (leased to another run, attempt attempt-b) ran Insert "
        "by-the-other-run on db.b"
    ]


def test_an_idle_pool_users_query_blocks_from_its_lease_end_on() -> None:
    found = [
        PoolQuery(LOGGED, "ingest_2", "inside-lease", "Insert", 150, ("b",)),
        PoolQuery(LOGGED, "ingest_2", "after-lease", "Insert", 250, ("b",)),
        PoolQuery(RUNNING, "ingest_3", "now", "", 0, ("b", "t")),
        PoolQuery(LOGGED, "ingest_1", "leased", "Insert", 300, ("b",)),  # active: custody
        PoolQuery(LOGGED, "publisher_1", "no-grant", "Insert", 300, ("b",)),
        PoolQuery(LOGGED, "ingest_3", "before-the-store", "Insert", 40, ("b",)),
    ]
    idle = {
        "ingest_2": Idle(200, leased=True),
        "ingest_3": Idle(50, leased=False),
        "publisher_1": Idle(50, leased=False),
    }
    writers = {"b": {"ingest_1", "ingest_2", "ingest_3"}, "t": {"publisher_1"}}
    blockers = pool_query_blockers(found, idle, writers.__getitem__, "db", "b")
    assert [(b.reason, b.detail) for b in blockers] == [
        (
            "pool_writer_query",
            "pool user ingest_2 (its lease ended) ran Insert after-lease on db.b",
        ),
        (
            "pool_writer_query",
            "pool user ingest_3 (never leased by this store) is running now on db.b",
        ),
    ]
    # ingest_3's running query names t too, but it cannot write t.
    assert pool_query_blockers(found, idle, writers.__getitem__, "db", "t") == []


def test_the_slots_own_leases_are_its_generations_attempt_and_peers_its_publishers() -> None:
    slot, elsewhere = TargetSlot("db", "t"), TargetSlot("db", "u")
    admitted = {
        "a-1": Admission("r1", slot, "a-1", AttemptEpochs(1, 1), OwnershipState.ACTIVE),
        "a-2": Admission("r2", slot, "a-2", AttemptEpochs(2, 2), OwnershipState.ACTIVE),
        "a-3": Admission("r3", elsewhere, "a-3", AttemptEpochs(1, 3), OwnershipState.ACTIVE),
    }

    def own(attempt: str, role: str) -> bool:
        return is_slots_own_lease(Lease("l", "u", role, attempt, True), staging_table_name("a-1"))

    def peer(attempt: str, role: str) -> bool:
        return is_slot_peer_publisher(Lease("l", "u", role, attempt, True), slot, admitted.get)

    # The generation's own attempt, either role (its ingest is leased before admission).
    assert own("a-1", "ingest") and own("a-1", "publisher")
    # Another attempt of the same slot is not the publication's own; its publisher is
    # the slot's peer (only its CREATE and EXCHANGE are left to the slot's protocol).
    assert not own("a-2", "publisher") and not own("a-2", "ingest")
    assert peer("a-2", "publisher") and not peer("a-2", "ingest")
    # Another slot's run, an attempt never admitted, an attempt id that names no table.
    assert not peer("a-3", "publisher") and not peer("a-9", "publisher")
    assert not own("a-3", "publisher") and not own("a b", "publisher")


def test_a_slot_peers_insert_blocks_its_create_and_exchange_do_not() -> None:
    idle = {"publisher_2": Idle(0, leased=True, held_by="a-2", slot_peer=True)}
    found = [
        PoolQuery(LOGGED, "publisher_2", f"q-{kind}", kind, 10, ("t",))
        for kind in ("Create", "Rename", "Insert", "Drop", "Alter")
    ]
    blockers = pool_query_blockers(found, idle, lambda name: {"publisher_2"}, "db", "t")
    assert [b.detail.split(" ran ")[1] for b in blockers] == [
        "Insert q-Insert on db.t",
        "Drop q-Drop on db.t",
        "Alter q-Alter on db.t",
    ]
    assert "publisher of another attempt of this slot, a-2" in blockers[0].detail
