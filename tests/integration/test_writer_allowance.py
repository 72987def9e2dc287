"""Writers outside the leases block prepare, on the real managed server (issue 22, 8).

The catalog no longer trusts the whole pool: a pool user that can write B (every
ingest user can write ``db.dpone_stage_*``) is allowed while it holds a lease, once its
last lease's closure is proven and stored, or when it was never leased. A lease that
ended without a proven closure blocks ``prepare`` with a ``writer_grant`` naming its
user until its closure is proven.
"""

from __future__ import annotations

import pytest

from dpone.localserver.principal_pool import ROLE_INGEST
from dpone.project.leases import close_lease, unproven_closures
from dpone.publication.publisher import SnapshotPublicationError
from dpone.publication.store import SqliteSnapshotStore
from tests.publication_harness import Rig, Row

ROWS: list[Row] = [(1, "one", 1), (2, "two", 2)]


def test_an_unproven_ended_lease_blocks_prepare_until_its_closure_is_proven(
    rig: Rig,
) -> None:
    staged = rig.stage(ROWS, "allow-main")
    rig.existing_target(staged, "t_allow", [(9, "a", 9)])
    parts = rig.components()
    # Another attempt's ingest lease, ended without a closure (as an operator's
    # end-lease does): a request of it may still arrive, and its user can write B.
    stale = parts.issuer.issue(ROLE_INGEST, "allow-stale").ref
    parts.store.end_lease(stale.lease_id)
    store = SqliteSnapshotStore(rig.store_path, create=False)
    assert [r.lease.lease_id for r in unproven_closures(store)] == [stale.lease_id]

    with pytest.raises(SnapshotPublicationError) as caught:
        rig.prepare(staged, "t_allow")
    error = caught.value
    assert error.code == "side_effect_present"
    assert error.details["reason"] == "writer_grant"
    assert stale.user in error.message
    assert rig.uuid_of(staged.table) == staged.uuid  # nothing moved

    proof = close_lease(parts, stale.lease_id)
    assert proof.proven, proof.facts["unproven"]
    assert store.closure_proven(store.get_lease(stale.lease_id))
    assert unproven_closures(store) == []

    prepared = rig.prepare(staged, "t_allow")
    assert prepared.state.value == "prepared"
    # The attempt's own publisher holds its lease during publish: it is allowed.
    published = rig.components().publisher.publish(prepared.intent_sha256)
    assert published.state.value == "published"
    assert rig.uuid_of("t_allow") == staged.uuid
