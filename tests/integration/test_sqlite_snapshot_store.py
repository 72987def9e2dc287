"""The SQLite snapshot store on real SQLite files, with real separate processes."""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import sqlite3
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from dpone.contracts import canonical_json
from dpone.errors import DponeError
from dpone.ports.composition_snapshot import (
    OwnershipState,
    ParentAuthority,
    SnapshotPublicationStore,
    SnapshotRunRegistry,
    TargetSlot,
)
from dpone.publication.store import (
    SCHEMA_VERSION,
    SnapshotStoreError,
    SqliteSnapshotStore,
    lease_step_key,
)

SLOT = TargetSlot("sales", "orders")
PROCESSES = 4


def record(state: str, revision: int, **extra: Any) -> bytes:
    return canonical_json.dumps({"state": state, "revision": revision, **extra})


PREPARED = record("prepared", 1, note="é ∑ 😀")
CLAIMED = record("exchange_intent", 2)


@dataclass(frozen=True)
class Prepared:
    store: SqliteSnapshotStore
    authority: ParentAuthority
    intent_bytes: bytes
    intent_sha256: str


def prepare(store: SqliteSnapshotStore, attempt_id: str = "attempt-1") -> Prepared:
    admission = store.admit(SLOT, attempt_id)
    authority = ParentAuthority(admission.parent_request, SLOT, admission.epochs.slot_epoch)
    intent = canonical_json.dumps({"attempt": attempt_id, "bytes": "ü\u0001"})
    store.create(intent, PREPARED, authority)
    return Prepared(store, authority, intent, hashlib.sha256(intent).hexdigest())


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "state" / "snapshots.sqlite"


@pytest.fixture
def store(path: Path) -> SqliteSnapshotStore:
    return SqliteSnapshotStore(path)


@pytest.fixture
def prepared(store: SqliteSnapshotStore) -> Prepared:
    return prepare(store)


def code_of(exc_info: pytest.ExceptionInfo[DponeError]) -> str:
    return exc_info.value.code


def raw(path: Path) -> sqlite3.Connection:
    """An independent connection, as another program would open the file."""
    return sqlite3.connect(path, isolation_level=None)


# ---------------------------------------------------------------------- records


def test_the_store_satisfies_both_ports(store: SqliteSnapshotStore) -> None:
    publication: SnapshotPublicationStore = store
    registry: SnapshotRunRegistry = store
    assert publication is store
    assert registry is store


def test_create_load_and_read_back_return_the_exact_bytes(prepared: Prepared) -> None:
    stored = prepared.store.load(prepared.intent_sha256)
    assert stored.intent_sha256 == hashlib.sha256(prepared.intent_bytes).hexdigest()
    assert stored.intent_bytes == prepared.intent_bytes
    assert stored.record_bytes == PREPARED
    assert stored.revision == 1
    assert prepared.store.read_back(prepared.intent_sha256) == PREPARED
    # Another store object on the same file (a later process) sees the same bytes.
    again = SqliteSnapshotStore(prepared.store.path)
    assert again.load(prepared.intent_sha256) == stored


def test_create_refuses_an_existing_intent(prepared: Prepared) -> None:
    with pytest.raises(SnapshotStoreError) as caught:
        prepared.store.create(prepared.intent_bytes, PREPARED, prepared.authority)
    assert code_of(caught) == "intent_exists"
    assert len(prepared.store.history(prepared.intent_sha256)) == 1


def test_create_refuses_a_second_intent_of_the_same_attempt(prepared: Prepared) -> None:
    # Cancelled or not, an admitted attempt gets one intent: a new publication needs a
    # new attempt (seed O8).
    other = canonical_json.dumps({"attempt": "attempt-1", "again": True})
    with pytest.raises(SnapshotStoreError) as caught:
        prepared.store.create(other, PREPARED, prepared.authority)
    assert code_of(caught) == "attempt_used"
    assert caught.value.details["existing_intent"] == prepared.intent_sha256
    with pytest.raises(SnapshotStoreError) as missing:
        prepared.store.load(hashlib.sha256(other).hexdigest())
    assert code_of(missing) == "snapshot_not_found"


def test_create_refuses_a_record_that_is_not_prepared_at_one(store: SqliteSnapshotStore) -> None:
    admission = store.admit(SLOT, "a")
    authority = ParentAuthority(admission.parent_request, SLOT, 1)
    with pytest.raises(DponeError) as caught:
        store.create(b'{"i":1}', CLAIMED, authority)
    assert code_of(caught) == "invalid_transition"
    with pytest.raises(SnapshotStoreError) as missing:
        store.load(hashlib.sha256(b'{"i":1}').hexdigest())
    assert code_of(missing) == "snapshot_not_found"


def test_create_needs_an_admitted_current_active_run(store: SqliteSnapshotStore) -> None:
    stale = store.admit(SLOT, "stale")  # reserves epoch 1...
    prepare(store, "old")  # ...which this run takes: the slot is at epoch 1
    new = store.admit(SLOT, "new")  # reserves epoch 2
    store.set_ownership(new.parent_request, OwnershipState.RETIRING)
    cases = [
        ("attempt_fenced", ParentAuthority(stale.parent_request, SLOT, 1)),  # taken by another
        ("attempt_fenced", ParentAuthority("no-such-run", SLOT, 2)),
        ("attempt_fenced", ParentAuthority(new.parent_request, TargetSlot("x", "y"), 2)),
        ("attempt_fenced", ParentAuthority(new.parent_request, SLOT, 1)),  # not its epoch
        ("ownership_not_active", ParentAuthority(new.parent_request, SLOT, 2)),
    ]
    for number, (expected, authority) in enumerate(cases):
        intent = canonical_json.dumps({"case": number})
        with pytest.raises(SnapshotStoreError) as caught:
            store.create(intent, PREPARED, authority)
        assert (number, code_of(caught)) == (number, expected)
        with pytest.raises(SnapshotStoreError) as missing:
            store.load(hashlib.sha256(intent).hexdigest())
        assert code_of(missing) == "snapshot_not_found"
    assert store.current_epoch(SLOT) == 1  # nothing refused took the slot


def test_a_reserved_epoch_is_taken_only_by_the_first_prepared_run(
    store: SqliteSnapshotStore,
) -> None:
    one = store.admit(SLOT, "one")
    two = store.admit(SLOT, "two")
    assert one.epochs.slot_epoch == two.epochs.slot_epoch == 1
    assert not one.activated and not two.activated
    assert store.current_epoch(SLOT) == 0  # reserving fences nobody
    first = prepare(store, "two")
    assert store.current_epoch(SLOT) == 1
    taken = store.admission("two")
    assert taken is not None and taken.activated
    with pytest.raises(SnapshotStoreError) as caught:  # its reserved epoch is gone
        store.create(
            canonical_json.dumps({"late": 1}),
            PREPARED,
            ParentAuthority(one.parent_request, SLOT, 1),
        )
    assert code_of(caught) == "attempt_fenced"
    late = store.admission("one")
    assert late is not None and late.ownership is OwnershipState.RETIRING
    assert store.history(first.intent_sha256)[0].record_bytes == PREPARED


def test_create_refuses_noncanonical_intent_bytes(store: SqliteSnapshotStore) -> None:
    admission = store.admit(SLOT, "a")
    authority = ParentAuthority(admission.parent_request, SLOT, 1)
    with pytest.raises(DponeError) as caught:
        store.create(b'{"b":1, "a":2}', PREPARED, authority)
    assert code_of(caught) == "noncanonical_json"


def test_compare_and_set_moves_to_the_next_revision(prepared: Prepared) -> None:
    prepared.store.compare_and_set(
        prepared.intent_sha256,
        expected=PREPARED,
        replacement=CLAIMED,
        authority=prepared.authority,
        facts={"claimant": "me"},
    )
    assert prepared.store.read_back(prepared.intent_sha256) == CLAIMED
    assert prepared.store.load(prepared.intent_sha256).revision == 2


def test_stale_bytes_lose_the_claim_and_write_nothing(prepared: Prepared) -> None:
    store, sha = prepared.store, prepared.intent_sha256
    same_revision_other_bytes = record("prepared", 1, note="another")
    with pytest.raises(SnapshotStoreError) as same_revision:
        store.compare_and_set(
            sha,
            expected=same_revision_other_bytes,
            replacement=CLAIMED,
            authority=prepared.authority,
            facts={},
        )
    assert code_of(same_revision) == "claim_lost"
    assert store.read_back(sha) == PREPARED
    store.compare_and_set(
        sha, expected=PREPARED, replacement=CLAIMED, authority=prepared.authority, facts={}
    )
    for expected in (PREPARED, same_revision_other_bytes):
        with pytest.raises(SnapshotStoreError) as caught:
            store.compare_and_set(
                sha,
                expected=expected,
                replacement=record("not_published", 2),
                authority=prepared.authority,
                facts={},
            )
        assert code_of(caught) == "claim_lost"
        assert caught.value.details["reason"] == "stale_record"
        assert caught.value.details["stored_revision"] == 2
    assert store.read_back(sha) == CLAIMED
    assert [entry.revision for entry in store.history(sha)] == [1, 2]


def test_a_fenced_authority_loses_the_claim(prepared: Prepared) -> None:
    store, sha = prepared.store, prepared.intent_sha256
    # A newer attempt admitted fences nothing until its own intent is stored...
    store.admit(SLOT, "attempt-2")
    assert store.current_epoch(SLOT) == 1
    newer = prepare(store, "attempt-2")  # ...and then fences attempt-1 out
    assert newer.authority.slot_epoch == 2
    with pytest.raises(SnapshotStoreError) as caught:
        store.compare_and_set(
            sha, expected=PREPARED, replacement=CLAIMED, authority=prepared.authority, facts={}
        )
    assert code_of(caught) == "claim_lost"
    assert caught.value.details["reason"] == "attempt_fenced"
    # Claiming the new epoch with the old run does not help either.
    borrowed = ParentAuthority(prepared.authority.parent_request, SLOT, 2)
    with pytest.raises(SnapshotStoreError) as again:
        store.compare_and_set(
            sha, expected=PREPARED, replacement=CLAIMED, authority=borrowed, facts={}
        )
    assert code_of(again) == "claim_lost"
    assert store.read_back(sha) == PREPARED
    assert len(store.history(sha)) == 1


def test_an_admitted_run_that_never_prepares_fences_nothing(prepared: Prepared) -> None:
    store, sha = prepared.store, prepared.intent_sha256
    store.admit(SLOT, "attempt-2")  # its prepare then fails a check: no intent stored
    store.compare_and_set(
        sha, expected=PREPARED, replacement=CLAIMED, authority=prepared.authority, facts={}
    )
    assert store.read_back(sha) == CLAIMED
    older = store.admission("attempt-1")
    assert older is not None and older.ownership is OwnershipState.ACTIVE


def test_an_intent_is_claimed_only_by_its_own_run(store: SqliteSnapshotStore) -> None:
    first = prepare(store, "attempt-1")
    other_slot = TargetSlot("sales", "customers")
    other = store.admit(other_slot, "attempt-x")
    stranger = ParentAuthority(other.parent_request, other_slot, 1)
    with pytest.raises(SnapshotStoreError) as caught:
        store.compare_and_set(
            first.intent_sha256,
            expected=PREPARED,
            replacement=CLAIMED,
            authority=stranger,
            facts={},
        )
    assert code_of(caught) == "claim_lost"
    assert store.read_back(first.intent_sha256) == PREPARED


def test_retiring_ownership_resolves_a_claim_but_cannot_claim(prepared: Prepared) -> None:
    store, sha, authority = prepared.store, prepared.intent_sha256, prepared.authority
    store.set_ownership(authority.parent_request, OwnershipState.RETIRING)
    with pytest.raises(SnapshotStoreError) as caught:
        store.compare_and_set(
            sha, expected=PREPARED, replacement=CLAIMED, authority=authority, facts={}
        )
    assert code_of(caught) == "claim_lost"
    assert caught.value.details["reason"] == "ownership_not_active"

    # Back in a world where the claim was made while ACTIVE, RETIRING may reconcile it.
    second = prepare(store, "attempt-2")
    second.store.compare_and_set(
        second.intent_sha256,
        expected=PREPARED,
        replacement=CLAIMED,
        authority=second.authority,
        facts={},
    )
    store.set_ownership(second.authority.parent_request, OwnershipState.RETIRING)
    unknown = record("commit_unknown", 3)
    store.compare_and_set(
        second.intent_sha256,
        expected=CLAIMED,
        replacement=unknown,
        authority=second.authority,
        facts={},
    )
    assert store.read_back(second.intent_sha256) == unknown
    store.set_ownership(second.authority.parent_request, OwnershipState.RETIRED)
    with pytest.raises(SnapshotStoreError) as retired:
        store.compare_and_set(
            second.intent_sha256,
            expected=unknown,
            replacement=record("published", 4),
            authority=second.authority,
            facts={},
        )
    assert retired.value.details["reason"] == "ownership_not_active"


def test_an_unreachable_transition_is_refused_before_writing(prepared: Prepared) -> None:
    with pytest.raises(DponeError) as caught:
        prepared.store.compare_and_set(
            prepared.intent_sha256,
            expected=PREPARED,
            replacement=record("commit_unknown", 3),
            authority=prepared.authority,
            facts={},
        )
    assert code_of(caught) == "invalid_transition"
    with pytest.raises(DponeError) as bad_pair:
        prepared.store.compare_and_set(
            prepared.intent_sha256,
            expected=PREPARED,
            replacement=record("published", 2),
            authority=prepared.authority,
            facts={},
        )
    assert code_of(bad_pair) == "unreachable_state"
    assert prepared.store.read_back(prepared.intent_sha256) == PREPARED


def test_history_keeps_every_transition_and_observation_in_order(prepared: Prepared) -> None:
    store, sha, authority = prepared.store, prepared.intent_sha256, prepared.authority
    store.observe(sha, {"catalog": {"target_uuid": "a"}})
    store.compare_and_set(
        sha, expected=PREPARED, replacement=CLAIMED, authority=authority, facts={"claim": 1}
    )
    store.observe(sha, {"dispatch": "acknowledged"})
    published = record("published", 3, target="b")
    store.compare_and_set(
        sha,
        expected=CLAIMED,
        replacement=published,
        authority=authority,
        facts={"uuids": ["b", "a"]},
    )
    entries = store.history(sha)
    assert [(e.revision, e.state, dict(e.facts)) for e in entries] == [
        (1, "prepared", {}),
        (1, "prepared", {"catalog": {"target_uuid": "a"}}),
        (2, "exchange_intent", {"claim": 1}),
        (2, "exchange_intent", {"dispatch": "acknowledged"}),
        (3, "published", {"uuids": ["b", "a"]}),
    ]
    digests = [e.record_sha256 for e in entries]
    assert digests == [
        hashlib.sha256(PREPARED).hexdigest(),
        None,
        hashlib.sha256(CLAIMED).hexdigest(),
        None,
        hashlib.sha256(published).hexdigest(),
    ]
    sequences = [e.sequence for e in entries]
    assert sequences == sorted(sequences) and len(set(sequences)) == 5
    assert all(e.at.endswith("Z") for e in entries)
    assert [e.at for e in entries] == sorted(e.at for e in entries)


def test_observe_refuses_unknown_intents_and_noncanonical_facts(prepared: Prepared) -> None:
    with pytest.raises(SnapshotStoreError) as caught:
        prepared.store.observe("0" * 64, {"a": 1})
    assert code_of(caught) == "snapshot_not_found"
    with pytest.raises(DponeError) as floats:
        prepared.store.observe(prepared.intent_sha256, {"ratio": 0.5})
    assert code_of(floats) == "float_not_allowed"
    assert len(prepared.store.history(prepared.intent_sha256)) == 1


def test_history_and_records_cannot_be_rewritten_in_sql(prepared: Prepared) -> None:
    prepared.store.note_step("k", {})
    conn = raw(prepared.store.path)
    try:
        statements = [
            "UPDATE history SET facts = X'7B7D'",
            "DELETE FROM history",
            "UPDATE records SET record_bytes = X'00'",  # same revision
            "UPDATE records SET revision = 3",  # skips a revision
            "DELETE FROM records",
            "UPDATE intents SET intent_bytes = X'00'",
            "DELETE FROM steps",
        ]
        for statement in statements:
            with pytest.raises(sqlite3.IntegrityError):
                conn.execute(statement)
    finally:
        conn.close()
    assert prepared.store.read_back(prepared.intent_sha256) == PREPARED
    assert len(prepared.store.history(prepared.intent_sha256)) == 1


def test_step_notes_are_durable_and_ordered(store: SqliteSnapshotStore) -> None:
    first = store.note_step("create-target:g1", {"query_id": "q1"})
    store.note_step("other", {"x": 1})
    second = store.note_step("create-target:g1", {"observed_uuid": "u"})
    notes = SqliteSnapshotStore(store.path).step_notes("create-target:g1")
    assert notes == [first, second]
    assert [dict(n.facts) for n in notes] == [{"query_id": "q1"}, {"observed_uuid": "u"}]


# ---------------------------------------------------------------------- concurrency


def _race_claim(
    path: str, sha: str, authority: ParentAuthority, me: int, go: Any, out: Any
) -> None:
    store = SqliteSnapshotStore(path)
    expected = store.read_back(sha)
    go.wait()
    try:
        store.compare_and_set(
            sha,
            expected=expected,
            replacement=record("exchange_intent", 2, claimant=me),
            authority=authority,
            facts={"claimant": me},
        )
    except SnapshotStoreError as exc:
        out.put((me, exc.code, store.read_back(sha)))
    else:
        out.put((me, "won", store.read_back(sha)))


def _race_lease(path: str, candidates: tuple[str, ...], me: int, go: Any, out: Any) -> None:
    store = SqliteSnapshotStore(path)
    go.wait(timeout=120)
    try:
        lease = store.lease("publisher", candidates, f"attempt-{me}")
    except SnapshotStoreError as exc:
        out.put((me, exc.code, None))
    else:
        out.put((me, "leased", lease.user))


def run_racers(target: Any, args: tuple[Any, ...], count: int) -> list[tuple[int, str, Any]]:
    """Start ``count`` real processes, release them together, collect one answer each."""
    context = multiprocessing.get_context("spawn")
    go = context.Barrier(count + 1)  # every racer has opened its store before any starts
    out = context.Queue()
    processes = [context.Process(target=target, args=(*args, me, go, out)) for me in range(count)]
    for process in processes:
        process.start()
    go.wait(timeout=120)
    results = [out.get(timeout=120) for _ in processes]
    for process in processes:
        process.join(timeout=120)
        assert process.exitcode == 0
    return sorted(results)


def test_racing_processes_claim_exactly_once(prepared: Prepared) -> None:
    results = run_racers(
        _race_claim,
        (str(prepared.store.path), prepared.intent_sha256, prepared.authority),
        PROCESSES,
    )
    winners = [me for me, outcome, _ in results if outcome == "won"]
    assert len(winners) == 1
    assert {outcome for _, outcome, _ in results} <= {"won", "claim_lost", "claim_uncertain"}
    final = record("exchange_intent", 2, claimant=winners[0])
    # Every caller, winner or loser, reads the winner's record back.
    assert [seen for _, _, seen in results] == [final] * PROCESSES
    assert prepared.store.read_back(prepared.intent_sha256) == final
    history = prepared.store.history(prepared.intent_sha256)
    assert [(e.revision, dict(e.facts)) for e in history] == [
        (1, {}),
        (2, {"claimant": winners[0]}),
    ]


def test_racing_processes_lease_distinct_users(store: SqliteSnapshotStore) -> None:
    pool = ("dpone_publisher_1", "dpone_publisher_2", "dpone_publisher_3", "dpone_publisher_4")
    results = run_racers(_race_lease, (str(store.path), pool), PROCESSES + 2)
    users = [user for _, outcome, user in results if outcome == "leased"]
    assert sorted(users) == sorted(pool)
    assert [outcome for _, outcome, _ in results].count("pool_exhausted") == 2


# ---------------------------------------------------------------------- registry


def test_admission_reserves_and_the_prepared_intent_fences_older_runs(
    store: SqliteSnapshotStore,
) -> None:
    assert store.current_epoch(SLOT) == 0
    first = prepare(store, "attempt-1").authority
    admitted = store.admission("attempt-1")
    assert admitted is not None
    assert (admitted.epochs.slot_epoch, admitted.epochs.attempt_epoch) == (1, 1)
    assert admitted.ownership is OwnershipState.ACTIVE and admitted.activated
    elsewhere = store.admit(TargetSlot("sales", "other"), "attempt-x")
    assert (elsewhere.epochs.slot_epoch, elsewhere.epochs.attempt_epoch) == (1, 2)
    second = store.admit(SLOT, "attempt-2")
    assert (second.epochs.slot_epoch, second.epochs.attempt_epoch) == (2, 3)
    assert store.current_epoch(SLOT) == 1  # reserved, not taken
    assert second.parent_request != first.parent_request
    authority = ParentAuthority(second.parent_request, SLOT, 2)
    store.create(canonical_json.dumps({"second": 1}), PREPARED, authority)
    assert store.current_epoch(SLOT) == 2
    older = store.admission("attempt-1")
    assert older is not None and older.ownership is OwnershipState.RETIRING
    assert older.epochs == admitted.epochs
    other = store.admission("attempt-x")
    assert other is not None and other.ownership is OwnershipState.ACTIVE
    # Admitting again returns the existing admission and fences nobody.
    again = store.admit(SLOT, "attempt-2")
    assert (again.parent_request, again.epochs, again.activated) == (
        second.parent_request,
        second.epochs,
        True,
    )
    assert store.current_epoch(SLOT) == 2
    assert store.admission("unknown") is None
    with pytest.raises(SnapshotStoreError) as caught:
        store.admit(TargetSlot("sales", "other"), "attempt-2")
    assert code_of(caught) == "admission_conflict"


@pytest.mark.parametrize("state", ["exchange_intent", "commit_unknown"])
def test_an_unresolved_record_blocks_the_slot(prepared: Prepared, state: str) -> None:
    store, sha, authority = prepared.store, prepared.intent_sha256, prepared.authority
    store.compare_and_set(
        sha, expected=PREPARED, replacement=CLAIMED, authority=authority, facts={}
    )
    current = CLAIMED
    if state == "commit_unknown":
        current = record("commit_unknown", 3)
        store.compare_and_set(
            sha, expected=CLAIMED, replacement=current, authority=authority, facts={}
        )
    with pytest.raises(SnapshotStoreError) as caught:
        store.admit(SLOT, "attempt-2")
    assert code_of(caught) == "slot_blocked"
    assert caught.value.details["intents"] == [sha]
    assert store.current_epoch(SLOT) == 1
    assert store.admission("attempt-2") is None
    # Another slot is not blocked; the resolved record frees this one.
    assert store.admit(TargetSlot("sales", "other"), "attempt-3").epochs.slot_epoch == 1
    final = record("published", 4 if state == "commit_unknown" else 3)
    store.compare_and_set(sha, expected=current, replacement=final, authority=authority, facts={})
    assert store.admit(SLOT, "attempt-2").epochs.slot_epoch == 2


def test_ownership_only_moves_forward(store: SqliteSnapshotStore) -> None:
    run = store.admit(SLOT, "attempt-1").parent_request
    with pytest.raises(SnapshotStoreError) as skip:
        store.set_ownership(run, OwnershipState.RETIRED)
    assert code_of(skip) == "invalid_ownership_transition"
    store.set_ownership(run, OwnershipState.ACTIVE)  # the current state: no change
    store.set_ownership(run, OwnershipState.RETIRING)
    with pytest.raises(SnapshotStoreError) as back:
        store.set_ownership(run, OwnershipState.ACTIVE)
    assert code_of(back) == "invalid_ownership_transition"
    store.set_ownership(run, OwnershipState.RETIRED)
    for state in (OwnershipState.ACTIVE, OwnershipState.RETIRING):
        with pytest.raises(SnapshotStoreError):
            store.set_ownership(run, state)
    admission = store.admission("attempt-1")
    assert admission is not None and admission.ownership is OwnershipState.RETIRED
    with pytest.raises(SnapshotStoreError) as unknown:
        store.set_ownership("nobody", OwnershipState.RETIRING)
    assert code_of(unknown) == "admission_not_found"
    conn = raw(store.path)
    try:
        with pytest.raises(sqlite3.IntegrityError):
            conn.execute("UPDATE runs SET ownership = 'active'")
    finally:
        conn.close()


def test_leases_take_the_first_free_candidate_and_end_idempotently(
    store: SqliteSnapshotStore,
) -> None:
    pool = ("u1", "u2")
    first = store.lease("ingest", pool, "a1")
    second = store.lease("publisher", pool, "a1")
    assert (first.user, second.user) == ("u1", "u2")
    assert first.lease_id != second.lease_id and len(first.lease_id) == 32
    with pytest.raises(SnapshotStoreError) as caught:
        store.lease("publisher", pool, "a2")
    assert code_of(caught) == "pool_exhausted"
    ended = store.end_lease(first.lease_id)
    assert (ended.active, ended.user) == (False, "u1")
    assert store.end_lease(first.lease_id) == ended
    # Ended, but its closure is not proven: u1 is not leased again until it is.
    with pytest.raises(SnapshotStoreError) as held:
        store.lease("publisher", pool, "a2")
    assert code_of(held) == "pool_exhausted"
    assert held.value.details["unproven_leases"] == [first.lease_id]
    assert "close-lease" in held.value.message
    store.note_step(lease_step_key(first.lease_id), {"step": "closure", "proven": False})
    with pytest.raises(SnapshotStoreError):
        store.lease("publisher", pool, "a2")  # an unproven closure does not release it
    store.note_step(lease_step_key(first.lease_id), {"step": "closure", "proven": True})
    third = store.lease("publisher", pool, "a2")
    assert third.user == "u1" and third.active
    assert store.leases_of("a1") == [ended, second]
    assert store.get_lease(third.lease_id) == third
    with pytest.raises(SnapshotStoreError) as missing:
        store.get_lease("nope")
    assert code_of(missing) == "lease_not_found"
    with pytest.raises(SnapshotStoreError) as missing_end:
        store.end_lease("nope")
    assert code_of(missing_end) == "lease_not_found"


# ---------------------------------------------------------------------- the file


def test_the_file_is_private_and_in_wal_mode(tmp_path: Path) -> None:
    directory = tmp_path / "shared"
    directory.mkdir(mode=0o755)
    os.chmod(directory, 0o755)  # noqa: S103 - a shared directory the store must not narrow
    path = directory / "snapshots.sqlite"
    store = SqliteSnapshotStore(path)
    prepare(store)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(directory.stat().st_mode) == 0o755
    conn = raw(path)
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        conn.execute("SELECT count(*) FROM records").fetchone()
        # SQLite gives the WAL file the database file's permissions.
        wal = Path(f"{path}-wal")
        assert wal.exists() and stat.S_IMODE(wal.stat().st_mode) == 0o600
    finally:
        conn.close()
    created = tmp_path / "new" / "deeper" / "s.sqlite"
    SqliteSnapshotStore(created)
    assert stat.S_IMODE(created.parent.stat().st_mode) & 0o077 == 0


def test_a_file_that_is_not_sqlite_is_refused_untouched(tmp_path: Path) -> None:
    path = tmp_path / "snapshots.sqlite"
    content = b"these are somebody's notes, not a database\n" * 100
    path.write_bytes(content)
    with pytest.raises(SnapshotStoreError) as caught:
        SqliteSnapshotStore(path)
    assert code_of(caught) == "store_not_sqlite"
    assert path.read_bytes() == content


def test_another_applications_database_is_refused_untouched(tmp_path: Path) -> None:
    path = tmp_path / "other.sqlite"
    conn = raw(path)
    conn.execute("CREATE TABLE notes (x)")
    conn.close()
    before = path.read_bytes()
    with pytest.raises(SnapshotStoreError) as caught:
        SqliteSnapshotStore(path)
    assert code_of(caught) == "store_schema_mismatch"
    assert path.read_bytes() == before
    assert not Path(f"{path}-wal").exists()


def test_a_store_of_another_schema_version_is_refused(store: SqliteSnapshotStore) -> None:
    conn = raw(store.path)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.close()
    with pytest.raises(SnapshotStoreError) as caught:
        SqliteSnapshotStore(store.path)
    assert code_of(caught) == "store_schema_mismatch"
    assert caught.value.details["user_version"] == SCHEMA_VERSION + 1


# ---------------------------------------------------------------------- faults


class CommitThenRaise(SqliteSnapshotStore):
    """The commit of ``operation`` reaches the file, then the caller's answer is lost."""

    def __init__(self, path: Path, operation: str) -> None:
        super().__init__(path)
        self.operation = operation

    def _after_commit(self, operation: str) -> None:
        if operation == self.operation:
            raise sqlite3.OperationalError("disk I/O error")


class RaiseBeforeCommit(SqliteSnapshotStore):
    def _before_commit(self, operation: str) -> None:
        if operation == "compare_and_set":
            raise sqlite3.OperationalError("disk I/O error")


class ReadBackMissing(SqliteSnapshotStore):
    def _after_read_back(self, intent_sha256: str, data: bytes | None) -> bytes | None:
        return None


def test_commit_then_raise_is_uncertain_but_written(prepared: Prepared) -> None:
    faulty = CommitThenRaise(prepared.store.path, "compare_and_set")
    with pytest.raises(SnapshotStoreError) as caught:
        faulty.compare_and_set(
            prepared.intent_sha256,
            expected=PREPARED,
            replacement=CLAIMED,
            authority=prepared.authority,
            facts={"n": 1},
        )
    assert code_of(caught) == "claim_uncertain"
    assert isinstance(caught.value.__cause__, sqlite3.OperationalError)
    # Only the read-back tells: here the record was written, with its history row.
    assert prepared.store.read_back(prepared.intent_sha256) == CLAIMED
    assert [e.revision for e in prepared.store.history(prepared.intent_sha256)] == [1, 2]


def test_a_prepared_record_whose_commit_answer_is_lost_is_uncertain(
    store: SqliteSnapshotStore,
) -> None:
    admission = store.admit(SLOT, "a")
    authority = ParentAuthority(admission.parent_request, SLOT, 1)
    with pytest.raises(SnapshotStoreError) as caught:
        CommitThenRaise(store.path, "create").create(b'{"i":2}', PREPARED, authority)
    assert code_of(caught) == "prepare_uncertain"
    assert store.read_back(hashlib.sha256(b'{"i":2}').hexdigest()) == PREPARED


def test_a_failure_before_commit_is_uncertain_and_rolled_back(prepared: Prepared) -> None:
    faulty = RaiseBeforeCommit(prepared.store.path)
    with pytest.raises(SnapshotStoreError) as caught:
        faulty.compare_and_set(
            prepared.intent_sha256,
            expected=PREPARED,
            replacement=CLAIMED,
            authority=prepared.authority,
            facts={},
        )
    assert code_of(caught) == "claim_uncertain"
    assert prepared.store.read_back(prepared.intent_sha256) == PREPARED
    assert len(prepared.store.history(prepared.intent_sha256)) == 1


@pytest.fixture
def locked(prepared: Prepared) -> Iterator[sqlite3.Connection]:
    """Another writer holds the database's write lock."""
    conn = raw(prepared.store.path)
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield conn
    finally:
        conn.execute("ROLLBACK")
        conn.close()


def test_a_busy_database_makes_the_claim_uncertain(
    prepared: Prepared, locked: sqlite3.Connection
) -> None:
    impatient = SqliteSnapshotStore(prepared.store.path, busy_timeout=0.05)
    with pytest.raises(SnapshotStoreError) as caught:
        impatient.compare_and_set(
            prepared.intent_sha256,
            expected=PREPARED,
            replacement=CLAIMED,
            authority=prepared.authority,
            facts={},
        )
    assert code_of(caught) == "claim_uncertain"
    assert "locked" in str(caught.value.__cause__)
    # WAL lets the independent read-back through while the writer holds its lock.
    assert impatient.read_back(prepared.intent_sha256) == PREPARED
    with pytest.raises(SnapshotStoreError) as lease:
        impatient.lease("publisher", ("u1",), "a")
    assert code_of(lease) == "store_commit_unknown"


def test_read_back_sees_another_writers_commit(prepared: Prepared) -> None:
    store, sha = prepared.store, prepared.intent_sha256
    store.compare_and_set(
        sha, expected=PREPARED, replacement=CLAIMED, authority=prepared.authority, facts={}
    )
    intruder = record("commit_unknown", 3, by="someone else")
    conn = raw(store.path)
    conn.execute(
        "UPDATE records SET record_bytes = ?, revision = 3 WHERE intent_sha256 = ?", (intruder, sha)
    )
    conn.close()
    assert store.read_back(sha) == intruder
    assert store.read_back(sha) != CLAIMED


def test_read_back_missing_is_snapshot_not_found(prepared: Prepared) -> None:
    with pytest.raises(SnapshotStoreError) as caught:
        ReadBackMissing(prepared.store.path).read_back(prepared.intent_sha256)
    assert code_of(caught) == "snapshot_not_found"


def test_a_vanished_store_is_unavailable_and_not_recreated(prepared: Prepared) -> None:
    path = prepared.store.path
    path.unlink()
    with pytest.raises(SnapshotStoreError) as caught:
        prepared.store.read_back(prepared.intent_sha256)
    assert code_of(caught) == "store_unavailable"
    assert not path.exists()
