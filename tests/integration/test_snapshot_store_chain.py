"""The store keeps every revision's exact bytes and re-verifies the chain from them (issue 22, 10)."""

from __future__ import annotations

import dataclasses
import hashlib
import sqlite3
from pathlib import Path

import pytest

from dpone.contracts.composition_snapshot import RecordClaim, SnapshotRecord, SnapshotState
from dpone.ports.composition_snapshot import ParentAuthority, TargetSlot
from dpone.publication.store import SCHEMA_VERSION, SnapshotStoreError, SqliteSnapshotStore
from dpone.publication.store.chain import verify_chain

SLOT = TargetSlot("sales", "orders")
INTENT = b'{"attempt":"a1"}'
SHA = hashlib.sha256(INTENT).hexdigest()
AT = "2026-12-01T00:00:00.000000Z"


def _prepared_and_claimed(store: SqliteSnapshotStore) -> tuple[SnapshotRecord, SnapshotRecord]:
    admission = store.admit(SLOT, "a1")
    authority = ParentAuthority(admission.parent_request, SLOT, admission.epochs.slot_epoch)
    prepared = SnapshotRecord.prepared(SHA, at=AT)
    store.create(INTENT, prepared.raw, authority)
    claimed = prepared.successor(
        SnapshotState.EXCHANGE_INTENT, at=AT, claim=RecordClaim(claim_id="c1", claimed_at=AT)
    )
    store.compare_and_set(
        SHA, expected=prepared.raw, replacement=claimed.raw, authority=authority, facts={}
    )
    store.observe(SHA, {"step": "look"})
    return prepared, claimed


def test_every_revision_keeps_its_exact_bytes(tmp_path: Path) -> None:
    store = SqliteSnapshotStore(tmp_path / "s.sqlite")
    prepared, claimed = _prepared_and_claimed(store)
    history = store.history(SHA)
    assert [h.record_bytes for h in history] == [prepared.raw, claimed.raw, None]
    assert [h.record_sha256 for h in history[:2]] == [
        hashlib.sha256(prepared.raw).hexdigest(),
        hashlib.sha256(claimed.raw).hexdigest(),
    ]
    check = store.verify_chain(SHA)
    assert check.verified, check.to_dict()
    assert check.revisions == 2


def test_a_tampered_or_reordered_chain_does_not_verify(tmp_path: Path) -> None:
    store = SqliteSnapshotStore(tmp_path / "s.sqlite")
    prepared, claimed = _prepared_and_claimed(store)
    history = store.history(SHA)
    current = claimed.raw
    # Bytes that do not hash to their row's digest.
    forged = [history[0], dataclasses.replace(history[1], record_bytes=b"{}")]
    found = verify_chain(SHA, forged, current)
    assert not found.verified
    assert any("do not hash" in p for p in found.problems)
    # A second revision that does not name the first one's bytes.
    other = SnapshotRecord.prepared(SHA, at="2026-12-02T00:00:00.000000Z").successor(
        SnapshotState.EXCHANGE_INTENT, at=AT, claim=RecordClaim(claim_id="c2", claimed_at=AT)
    )
    swapped = dataclasses.replace(
        history[1], record_bytes=other.raw, record_sha256=hashlib.sha256(other.raw).hexdigest()
    )
    found = verify_chain(SHA, [history[0], swapped], other.raw)
    assert any("does not name the bytes" in p for p in found.problems)
    # The current record must be the last revision's bytes.
    found = verify_chain(SHA, history, prepared.raw)
    assert any("not the current record" in p for p in found.problems)


def _downgrade_to_version_1(path: Path) -> None:
    """Make a store file exactly as schema version 1 laid it out."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("DROP TRIGGER activation_forward")
        conn.execute("ALTER TABLE runs DROP COLUMN activated")
        conn.execute("ALTER TABLE history DROP COLUMN record_bytes")
        conn.execute("PRAGMA user_version = 1")
    finally:
        conn.close()


def test_a_version_1_store_is_upgraded_in_place(tmp_path: Path) -> None:
    path = tmp_path / "s.sqlite"
    store = SqliteSnapshotStore(path)
    admission = store.admit(SLOT, "a1")
    authority = ParentAuthority(admission.parent_request, SLOT, 1)
    prepared = SnapshotRecord.prepared(SHA, at=AT)
    store.create(INTENT, prepared.raw, authority)
    ended = store.lease("ingest", ("u1",), "a1")
    store.end_lease(ended.lease_id)
    # Version 1 kept no closure proofs: make the file exactly as it was then.
    with sqlite3.connect(path) as conn:
        conn.execute("DROP TRIGGER steps_no_delete")
        conn.execute("DELETE FROM steps")
    _downgrade_to_version_1(path)
    reopened = SqliteSnapshotStore(path, create=False)
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 2
    history = reopened.history(SHA)
    assert history[0].record_bytes is None  # version 1 kept only the digest
    check = reopened.verify_chain(SHA)
    assert not check.verified and check.unverifiable == (1,)
    run = reopened.admission("a1")
    assert run is not None and run.activated  # version 1 runs were activated at admission
    assert reopened.load(SHA).record_bytes == prepared.raw
    # Its ended leases are marked legacy and trusted as the pool was then: the upgraded
    # store keeps its pool.
    assert reopened.closure_proven(reopened.get_lease(ended.lease_id))
    assert reopened.lease("ingest", ("u1",), "a2").user == "u1"


def test_a_newer_store_is_still_refused(tmp_path: Path) -> None:
    path = tmp_path / "s.sqlite"
    SqliteSnapshotStore(path)
    with sqlite3.connect(path) as conn:
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    with pytest.raises(SnapshotStoreError) as caught:
        SqliteSnapshotStore(path)
    assert caught.value.code == "store_schema_mismatch"
