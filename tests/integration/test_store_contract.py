"""One contract, two stores: the SQLite file and the PostgreSQL database workers share.

Every test here runs against both backends, on a real SQLite file and on a real
throwaway PostgreSQL cluster (tests/postgres_cluster.py), with real separate processes
for the races. What only a file has (its mode, WAL, a foreign file) is tested in
test_sqlite_snapshot_store.py.
"""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest

from dpone.contracts import canonical_json
from dpone.errors import ConfigurationError
from dpone.ports.composition_snapshot import OwnershipState, ParentAuthority, TargetSlot
from dpone.publication.store import (
    APPLICATION_ID,
    PostgresSnapshotStore,
    SnapshotStore,
    SnapshotStoreError,
    SqliteSnapshotStore,
    StoreLocation,
    abandoned_key,
    open_store,
    store_exists,
)
from dpone.publication.store.leases import CLOSURE_STEP, lease_step_key
from dpone.publication.store.parsed_intents import parsed_intents
from dpone.publication.store.postgres import check_store_url, is_store_url

SLOT = TargetSlot("sales", "orders")
RACERS = 4


def record(state: str, revision: int, **extra: Any) -> bytes:
    return canonical_json.dumps({"state": state, "revision": revision, **extra})


PREPARED = record("prepared", 1, note="é ∑ 😀")
CLAIMED = record("exchange_intent", 2)


@pytest.fixture(params=["sqlite", "postgres"])
def location(request: pytest.FixtureRequest, tmp_path: Path) -> StoreLocation:
    """Where a new, empty store of each backend is."""
    if request.param == "sqlite":
        return tmp_path / "store.sqlite"
    return str(request.getfixturevalue("postgres_store"))


def store_class(location: StoreLocation) -> type[SnapshotStore]:
    return PostgresSnapshotStore if isinstance(location, str) else SqliteSnapshotStore


def with_fault(location: StoreLocation, fault: type, **kwargs: Any) -> SnapshotStore:
    """The store at ``location`` with ``fault``'s seams over its backend's class."""
    cls = type(fault.__name__, (fault, store_class(location)), {})
    store: SnapshotStore = cls(location, **kwargs)
    return store


def prepare(store: SnapshotStore, attempt_id: str = "attempt-1") -> tuple[ParentAuthority, str]:
    admission = store.admit(SLOT, attempt_id)
    authority = ParentAuthority(admission.parent_request, SLOT, admission.epochs.slot_epoch)
    intent = canonical_json.dumps({"attempt": attempt_id, "bytes": "ü\u0001"})
    store.create(intent, PREPARED, authority)
    return authority, hashlib.sha256(intent).hexdigest()


@contextmanager
def raw(location: StoreLocation) -> Iterator[Any]:
    """Another program's connection to the store, outside dpone."""
    if isinstance(location, str):
        with psycopg.connect(location, autocommit=True, options="-c search_path=dpone") as conn:
            yield conn
        return
    lite = sqlite3.connect(location, isolation_level=None)
    try:
        yield lite
    finally:
        lite.close()


def refused_by_sql(location: StoreLocation) -> type[Exception]:
    return psycopg.Error if isinstance(location, str) else sqlite3.IntegrityError


def test_create_load_and_read_back_return_the_exact_bytes(location: StoreLocation) -> None:
    store = open_store(location)
    authority, sha = prepare(store)
    stored = open_store(location, create=False).load(sha)
    assert stored.record_bytes == PREPARED and stored.revision == 1
    assert store.read_back(sha) == PREPARED
    with pytest.raises(SnapshotStoreError) as again:
        store.create(stored.intent_bytes, PREPARED, authority)
    assert again.value.code == "intent_exists"


def test_compare_and_set_moves_one_revision_and_stale_bytes_lose(location: StoreLocation) -> None:
    store = open_store(location)
    authority, sha = prepare(store)
    store.compare_and_set(
        sha, expected=PREPARED, replacement=CLAIMED, authority=authority, facts={}
    )
    with pytest.raises(SnapshotStoreError) as lost:
        store.compare_and_set(
            sha, expected=PREPARED, replacement=CLAIMED, authority=authority, facts={}
        )
    assert lost.value.code == "claim_lost"
    assert store.read_back(sha) == CLAIMED
    assert [e.revision for e in store.history(sha)] == [1, 2]


def test_history_records_and_steps_cannot_be_rewritten_in_sql(location: StoreLocation) -> None:
    store = open_store(location)
    _, sha = prepare(store)
    store.note_step("k", {"n": 1})
    statements = [
        "UPDATE history SET revision = 7",
        "DELETE FROM history",
        "UPDATE records SET revision = 3",
        "DELETE FROM records",
        "UPDATE intents SET created_at = 'x'",
        "DELETE FROM steps",
    ]
    with raw(location) as conn:
        for statement in statements:
            with pytest.raises(refused_by_sql(location)):
                conn.execute(statement)
    assert store.read_back(sha) == PREPARED and len(store.step_notes("k")) == 1


def _race_claim(
    location: StoreLocation, sha: str, authority: ParentAuthority, me: int, go: Any, out: Any
) -> None:
    store = open_store(location, create=False)
    go.wait(timeout=120)
    try:
        store.compare_and_set(
            sha,
            expected=PREPARED,
            replacement=record("exchange_intent", 2, claimant=me),
            authority=authority,
            facts={"claimant": me},
        )
    except SnapshotStoreError as exc:
        out.put((me, exc.code))
    else:
        out.put((me, "won"))


def _race_lease(location: StoreLocation, me: int, go: Any, out: Any) -> None:
    store = open_store(location, create=False)
    go.wait(timeout=120)
    try:
        out.put((me, store.lease("publisher", ("p1", "p2", "p3"), f"attempt-{me}").user))
    except SnapshotStoreError as exc:
        out.put((me, exc.code))


def race(target: Any, args: tuple[Any, ...], count: int) -> list[str]:
    """``count`` real processes released together; each one's answer."""
    context = multiprocessing.get_context("spawn")
    go, out = context.Barrier(count + 1), context.Queue()
    processes = [context.Process(target=target, args=(*args, me, go, out)) for me in range(count)]
    for process in processes:
        process.start()
    go.wait(timeout=120)
    answers = sorted(out.get(timeout=120) for _ in processes)
    for process in processes:
        process.join(timeout=120)
        assert process.exitcode == 0
    return [answer for _, answer in answers]


def test_racing_processes_claim_once_and_lease_distinct_users(location: StoreLocation) -> None:
    store = open_store(location)
    authority, sha = prepare(store)
    outcomes = race(_race_claim, (location, sha, authority), RACERS)
    assert outcomes.count("won") == 1 and set(outcomes) <= {"won", "claim_lost"}
    winner = outcomes.index("won")
    assert store.read_back(sha) == record("exchange_intent", 2, claimant=winner)
    users = race(_race_lease, (location,), RACERS)
    assert sorted(u for u in users if u in ("p1", "p2", "p3")) == ["p1", "p2", "p3"]
    assert users.count("pool_exhausted") == RACERS - 3


def test_admission_fences_older_runs_and_ownership_only_moves_forward(
    location: StoreLocation,
) -> None:
    store = open_store(location)
    first, old = prepare(store, "attempt-1")
    second, sha = prepare(store, "attempt-2")
    assert store.current_epoch(SLOT) == 2
    with pytest.raises(SnapshotStoreError) as fenced:
        store.compare_and_set(
            old, expected=PREPARED, replacement=CLAIMED, authority=first, facts={}
        )
    assert (fenced.value.code, fenced.value.details["reason"]) == ("claim_lost", "attempt_fenced")
    admitted = store.admission("attempt-2")
    assert admitted is not None and admitted.ownership is OwnershipState.ACTIVE
    store.set_ownership(second.parent_request, OwnershipState.RETIRING)
    with pytest.raises(SnapshotStoreError):
        store.set_ownership(second.parent_request, OwnershipState.ACTIVE)
    assert store.load(sha).revision == 1


def test_an_abandoned_claim_holds_its_slot_no_more(location: StoreLocation) -> None:
    """An unresolved claim blocks new attempts (``slot_blocked``) until its abandonment
    is noted (``dpone snapshot abandon``, issue 37 item 6); its record stays as it was."""
    store = open_store(location)
    authority, sha = prepare(store)
    store.compare_and_set(
        sha, expected=PREPARED, replacement=CLAIMED, authority=authority, facts={}
    )
    with pytest.raises(SnapshotStoreError) as blocked:
        store.admit(SLOT, "attempt-2")
    assert blocked.value.code == "slot_blocked"
    [listed] = store.list_snapshots()
    assert (listed.abandoned, listed.blocking) == (False, True)
    store.note_step(abandoned_key(sha), {"step": "abandon"})
    [listed] = store.list_snapshots()
    assert (listed.state, listed.abandoned, listed.blocking) == ("exchange_intent", True, False)
    assert store.admit(SLOT, "attempt-2").attempt_id == "attempt-2"
    assert store.load(sha).record_bytes == CLAIMED


def test_leases_take_the_first_free_user_and_end_once(location: StoreLocation) -> None:
    store = open_store(location)
    one = store.lease("ingest", ("u1", "u2"), "a1")
    two = store.lease("ingest", ("u1", "u2"), "a2")
    assert (one.user, two.user) == ("u1", "u2")
    with pytest.raises(SnapshotStoreError) as exhausted:
        store.lease("ingest", ("u1", "u2"), "a3")
    assert exhausted.value.code == "pool_exhausted"
    store.end_lease(one.lease_id)
    store.end_lease(one.lease_id)  # idempotent
    assert [r.lease.lease_id for r in store.lease_records()] == [two.lease_id]
    last = {r.lease.user: r.lease.active for r in store.last_lease_records()}
    assert last == {"u1": False, "u2": True}


def test_only_a_leases_last_closure_says_whether_it_was_proven(location: StoreLocation) -> None:
    store = open_store(location)
    lease = store.lease("ingest", ("u1",), "a1")
    key = lease_step_key(lease.lease_id)
    assert not store.closure_proven(lease)  # none noted
    store.note_step(key, {"step": CLOSURE_STEP, "proven": True})
    store.note_step(key, {"step": "session_opened", "session_id": "s1"})  # not a closure
    assert store.closure_proven(lease)
    store.note_step(key, {"step": CLOSURE_STEP, "proven": False})  # withdraws the proof
    store.note_step(key, {"step": "session_opened", "session_id": "s2"})
    assert not store.closure_proven(lease)
    store.note_step(key, {"step": CLOSURE_STEP, "proven": True})
    assert store.closure_proven(lease)


def test_intents_are_listed_by_digest_or_slot_and_read_by_digest(location: StoreLocation) -> None:
    store = open_store(location)
    _, first = prepare(store, "attempt-1")
    other = TargetSlot("other", "orders")
    admission = store.admit(other, "attempt-2")
    intent = canonical_json.dumps({"attempt": "attempt-2"})
    authority = ParentAuthority(admission.parent_request, other, admission.epochs.slot_epoch)
    store.create(intent, PREPARED, authority)
    second = hashlib.sha256(intent).hexdigest()
    assert store.intent_keys() == [first, second]
    assert (store.intent_keys("sales"), store.intent_keys("other")) == ([first], [second])
    assert store.intent_keys("nowhere") == []
    assert store.intent_keys(attempt_id="attempt-2") == [second]
    assert store.intent_keys("sales", attempt_id="attempt-1") == [first]
    assert store.intent_keys("sales", attempt_id="attempt-2") == []
    listed = {slot: [x.intent_sha256 for x in store.list_snapshots(slot)] for slot in (SLOT, other)}
    assert listed == {SLOT: [first], other: [second]}
    assert [x.intent_sha256 for x in store.list_snapshots()] == [first, second]
    assert store.list_snapshots(TargetSlot("sales", "nothing")) == []
    many = [first, *(f"{n:064x}" for n in range(1_200)), second]  # past one query's keys
    found = store.intent_bytes(many)
    assert found == {first: store.load(first).intent_bytes, second: intent}


class _LosesIntentBytes:
    def intent_bytes(self, keys: Sequence[str]) -> dict[str, bytes]:
        return {}


def test_an_intent_listed_without_its_bytes_is_unavailable_never_left_out(
    location: StoreLocation,
) -> None:
    _, sha = prepare(open_store(location))
    with pytest.raises(SnapshotStoreError) as caught:
        parsed_intents(with_fault(location, _LosesIntentBytes), "sales")
    assert caught.value.code == "store_unavailable"
    assert caught.value.details["intent_sha256"] == sha


class _CommitThenRaise:
    """The commit of a compare-and-set reaches the store, then its answer is lost."""

    def _after_commit(self, operation: str) -> None:
        if operation == "compare_and_set":
            raise OSError("the answer was lost")


class _RaiseBeforeCommit:
    def _before_commit(self, operation: str) -> None:
        if operation == "compare_and_set":
            raise OSError("the disk went away")


def test_a_lost_commit_answer_is_uncertain_and_a_failure_before_it_rolls_back(
    location: StoreLocation,
) -> None:
    store = open_store(location)
    authority, sha = prepare(store)
    with pytest.raises(SnapshotStoreError) as before:
        with_fault(location, _RaiseBeforeCommit).compare_and_set(
            sha, expected=PREPARED, replacement=CLAIMED, authority=authority, facts={}
        )
    assert before.value.code == "claim_uncertain"
    assert store.read_back(sha) == PREPARED and len(store.history(sha)) == 1
    with pytest.raises(SnapshotStoreError) as after:
        with_fault(location, _CommitThenRaise).compare_and_set(
            sha, expected=PREPARED, replacement=CLAIMED, authority=authority, facts={}
        )
    assert after.value.code == "claim_uncertain"
    # Only the read-back tells: the record was written, with its history row.
    assert store.read_back(sha) == CLAIMED and len(store.history(sha)) == 2


def _held_write_lock(location: StoreLocation) -> AbstractContextManager[Any]:
    """Another writer holds the store's write lock (SQLite's, or the advisory one)."""

    @contextmanager
    def held() -> Iterator[Any]:
        with raw(location) as conn:
            if isinstance(location, str):
                conn.execute("BEGIN")
                conn.execute(f"SELECT pg_advisory_xact_lock({APPLICATION_ID})")
            else:
                conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
            finally:
                conn.execute("ROLLBACK")

    return held()


def test_a_busy_store_makes_a_write_uncertain_and_lets_reads_through(
    location: StoreLocation,
) -> None:
    store = open_store(location)
    authority, sha = prepare(store)
    impatient = open_store(location, busy_timeout=0.05)
    with _held_write_lock(location):
        with pytest.raises(SnapshotStoreError) as caught:
            impatient.compare_and_set(
                sha, expected=PREPARED, replacement=CLAIMED, authority=authority, facts={}
            )
        # SQLite cannot say whether its busy write began; PostgreSQL's wait for the
        # store's lock runs out before anything is written: definite.
        expected = "store_busy" if isinstance(location, str) else "claim_uncertain"
        assert caught.value.code == expected
        assert impatient.read_back(sha) == PREPARED
    assert store.read_back(sha) == PREPARED


def test_a_store_has_one_identity_and_an_empty_location_is_missing(
    location: StoreLocation,
) -> None:
    assert not store_exists(location)
    with pytest.raises(SnapshotStoreError) as missing:
        open_store(location, create=False)
    assert missing.value.code == "store_missing"
    assert not store_exists(location)  # asking created nothing
    first = open_store(location).store_identity()
    assert store_exists(location)
    assert open_store(location, create=False).store_identity() == first


@pytest.mark.parametrize(
    "form",
    [
        "{userinfo}",
        "{url}?password=hunter2-secret",
        "{url}?sslmode=prefer&PassWord=hunter2-secret",
        "{url}?sslpassword=hunter2-secret",
        "POSTGRESQL://dpone:hunter2-secret@127.0.0.1:1/db",
    ],
)
def test_a_postgres_url_with_a_password_is_refused_without_echoing_it(
    postgres_store: str, form: str
) -> None:
    with_password = postgres_store.replace("dpone@", "dpone:hunter2-secret@")
    secret = form.replace("{userinfo}", with_password).replace("{url}", postgres_store)
    assert is_store_url(secret)
    with pytest.raises(ConfigurationError) as caught:
        check_store_url(secret)
    assert caught.value.code == "store_url_invalid"
    assert "hunter2" not in str(caught.value) and "hunter2" not in repr(caught.value.details)


def test_a_foreign_dpone_schema_is_refused_untouched(postgres_store: str) -> None:
    with raw(postgres_store) as conn:
        conn.execute("CREATE SCHEMA dpone")
        conn.execute(
            "CREATE TABLE dpone.store_identity (application_id BIGINT, schema_version INT)"
        )
        conn.execute("INSERT INTO dpone.store_identity VALUES (1, 1)")
    with pytest.raises(SnapshotStoreError) as caught:
        open_store(postgres_store)
    assert caught.value.code == "store_schema_mismatch"
    with raw(postgres_store) as conn:
        tables = conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'dpone'"
        ).fetchall()
    assert tables == [("store_identity",)]


def _race_open(location: StoreLocation, me: int, go: Any, out: Any) -> None:
    go.wait(timeout=120)
    try:
        out.put((me, open_store(location).store_identity()))
    except SnapshotStoreError as exc:
        out.put((me, exc.code))


def test_racing_processes_create_one_store(location: StoreLocation) -> None:
    """Workers of a new project start at once: one creates the store, all use it."""
    identities = race(_race_open, (location,), RACERS)
    assert len(set(identities)) == 1 and len(identities[0]) == 36, identities


def _terminate_other_sessions(url: str) -> int:
    """As another program would: end every other session of the store's database."""
    with psycopg.connect(url, autocommit=True) as conn:
        found = conn.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        ).fetchone()
    return int(found[0]) if found else 0


def test_kept_sessions_the_server_ended_are_replaced_not_failed(postgres_store: str) -> None:
    store = open_store(postgres_store)
    store.note_step("k", {"n": 0})  # leaves kept sessions behind
    assert _terminate_other_sessions(postgres_store) >= 1
    assert [dict(n.facts) for n in store.step_notes("k")] == [{"n": 0}]
    store.note_step("k", {"n": 1})
    assert len(open_store(postgres_store).step_notes("k")) == 2


def test_a_forked_child_never_uses_the_parents_kept_sessions(postgres_store: str) -> None:
    store = open_store(postgres_store)
    store.note_step("fork", {"who": "parent"})  # a kept session in the parent
    pid = os.fork()
    if pid == 0:  # the child writes through sessions of its own
        code = 0
        try:
            for n in range(20):
                open_store(postgres_store).note_step("fork", {"who": "child", "n": n})
        except BaseException:
            code = 1
        os._exit(code)
    for n in range(20):
        store.note_step("fork", {"who": "parent", "n": n})
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    notes = [dict(n.facts) for n in store.step_notes("fork")]
    assert len(notes) == 41 and sum(1 for n in notes if n["who"] == "child") == 20
