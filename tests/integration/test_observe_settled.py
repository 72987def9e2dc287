"""An observation whose writer allowance went stale while it ran is taken again.

``observe_settled`` waits out a pool user another process is closing right now. A lease
that was still active when the wait's first check ran, then ended and had its closure
proven while the catalog observed, was seen by neither check: the observation read it
ended and unproven (``writer_grant``), the check after read it proven, and the stale
refusal was returned (``side_effect_present`` in 1 to 6 of 20 tables refreshed four
at a time). The store is real; the catalog is a stand-in that makes the lease end
inside its observation, a moment no real server can be asked to hit.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dpone.ports.composition_snapshot import (
    Blocker,
    CatalogObservation,
    ExchangeEvent,
    RecordedPresence,
    TableObservation,
    TargetSlot,
)
from dpone.publication.publisher.ports import PublisherPorts
from dpone.publication.store import SqliteSnapshotStore, lease_step_key

SLOT = TargetSlot("db", "target")


def _table(name: str, blockers: tuple[Blocker, ...]) -> TableObservation:
    return TableObservation(
        database="db",
        name=name,
        uuid="00000000-0000-4000-8000-000000000001",
        engine="MergeTree",
        design={"columns": []},
        design_sha256="0" * 64,
        rows=1,
        content_digest="0" * 32,
        total_bytes=1,
        parts=1,
        blockers=blockers,
    )


class LeaseEndsWhileObserving:
    """Each observation reports ``writer_grant`` while the lease is unproven in the
    store at that moment; the first one ends the lease and stores its proof inside."""

    def __init__(self, store: SqliteSnapshotStore, lease_id: str) -> None:
        self.store = store
        self.lease_id = lease_id
        self.calls = 0

    def observe(self, slot: TargetSlot, generation_table: str) -> CatalogObservation:
        self.calls += 1
        lease = self.store.get_lease(self.lease_id)
        stale = not lease.active and not self.store.closure_proven(lease)
        if self.calls == 1:
            # The allowance is read as ended and unproven, then the proof lands.
            self.store.end_lease(self.lease_id)
            stale = True
            self.store.note_step(lease_step_key(self.lease_id), {"step": "closure", "proven": True})
        blockers = (Blocker("writer_grant", "user u1 can write it"),) if stale else ()
        return CatalogObservation(_table(generation_table, blockers), None, 1, "now")

    def identities(self, slot: TargetSlot, generation_table: str) -> CatalogObservation:
        raise AssertionError("observe_settled observes everything, never identities alone")

    def exchange_events(self, query_id: str) -> list[ExchangeEvent]:
        raise AssertionError("observe_settled reads no query log")

    def database_uuid(self, database: str) -> str | None:
        raise AssertionError("observe_settled reads no database")

    def recorded_presence(
        self, database: str, database_uuid: str, table_uuids: tuple[str, ...]
    ) -> RecordedPresence:
        raise AssertionError("observe_settled looks for no recorded UUID")


def test_a_lease_that_ends_and_is_proven_during_the_observation_is_observed_again(
    tmp_path: Path,
) -> None:
    store = SqliteSnapshotStore(tmp_path / "store.sqlite")
    lease = store.lease("ingest", ("u1",), "attempt-1")
    catalog = LeaseEndsWhileObserving(store, lease.lease_id)
    unused: Any = None
    ports = PublisherPorts(
        authority=unused, store=store, catalog=catalog, executor=unused, sleep=lambda s: None
    )
    observation = ports.observe_settled(SLOT, "generation")
    assert catalog.calls == 2
    assert observation.target is not None and observation.target.blockers == ()


def test_a_writer_nobody_is_closing_is_returned_at_once(tmp_path: Path) -> None:
    store = SqliteSnapshotStore(tmp_path / "store.sqlite")
    lease = store.lease("ingest", ("u1",), "attempt-1")
    store.end_lease(lease.lease_id)  # ended by this process, never proven

    class Blocked(LeaseEndsWhileObserving):
        def observe(self, slot: TargetSlot, generation_table: str) -> CatalogObservation:
            self.calls += 1
            blockers = (Blocker("writer_grant", "user u1 can write it"),)
            return CatalogObservation(_table(generation_table, blockers), None, 1, "now")

    catalog = Blocked(store, lease.lease_id)
    unused: Any = None
    ports = PublisherPorts(
        authority=unused, store=store, catalog=catalog, executor=unused, sleep=lambda s: None
    )
    observation = ports.observe_settled(SLOT, "generation")
    assert catalog.calls == 1  # nothing changes and nobody closes it: no wait
    assert observation.target is not None
    assert [b.reason for b in observation.target.blockers] == ["writer_grant"]
