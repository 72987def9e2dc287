"""Several leases closed at once, on the real server: each proven as it is alone, stored
under its own lease, with the closer's reads (the KILL, each sample, the account and
the sign-in count, the window) shared by all of them (issue 33)."""

from __future__ import annotations

import contextlib
import itertools
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from dpone.connectors.clickhouse_http import HttpTransport
from dpone.connectors.http_connections import POOL
from dpone.contracts.composition_snapshot import QUERY_ID_PREFIX
from dpone.errors import StateError
from dpone.localserver import ServerInfo
from dpone.localserver.principal_pool import CLOSER_USER, ROLE_INGEST, ROLE_PUBLISHER
from dpone.ports.clickhouse import QueryPort
from dpone.ports.clickhouse_request import ClickHouseRequest, Credentials
from dpone.ports.clickhouse_result import QueryResult
from dpone.ports.composition_snapshot import ClosureProof, PrincipalRef
from dpone.publication.authority.closure import ClosureUsersNotDistinct
from dpone.publication.authority.lease_scope import lease_scope
from dpone.publication.authority.snapshot_authority import ClosurePolicy, SnapshotAuthority
from dpone.publication.dispatch.dispatch_gate import DispatchGate, DispatchGateBusy
from dpone.publication.principals.principal_issuers import LocalPoolIssuer
from dpone.publication.store import SqliteSnapshotStore, lease_step_key
from tests.plugins.publication_pool import (
    Pool,
    RunningQuery,
    make_authority,
    make_pool,
    new_gate,
)

POLICY = ClosurePolicy(samples=3, sample_spacing_seconds=0.1)
# What a closure of one lease asks as the closer, and no more for several.
ONE_CLOSURE = ["now", "kill", "sample", "sample", "sample", "sample", "flush", "uptime"]


class CountingCloser:
    """The closer's transport, keeping the purpose of each request it sends."""

    name = "counting"

    def __init__(self, inner: QueryPort) -> None:
        self.inner = inner
        self.purposes: list[str] = []

    def execute(self, request: ClickHouseRequest, *, deadline: float) -> QueryResult:
        # A closer's query id is <prefix>-close-<purpose>-<ns>-<n>.
        purpose = request.query_id.removeprefix(f"{QUERY_ID_PREFIX}-close-").split("-")[0]
        self.purposes.append(purpose)
        return self.inner.execute(request, deadline=deadline)


@pytest.fixture(name="pool")
def fresh_pool(clickhouse: ServerInfo, pool_credentials: dict[str, Credentials]) -> Pool:
    return make_pool(clickhouse, pool_credentials)


def stored(
    pool: Pool,
    tmp_path: Path,
    *,
    sleep: Callable[[float], None] = time.sleep,
    note_step: Callable[[str, Mapping[str, Any]], object] | None = None,
) -> tuple[SqliteSnapshotStore, LocalPoolIssuer, SnapshotAuthority]:
    """A store, its pool issuer and the authority as build_publication wires them: the
    real lease scope, the store's notes, the closer counted."""
    store = SqliteSnapshotStore(tmp_path / "snapshots.sqlite")
    issuer = LocalPoolIssuer(store, pool.credentials, pool.user_ids)
    authority = SnapshotAuthority(
        registry=store,
        issuer=issuer,
        closer=CountingCloser(HttpTransport(pool.endpoint(), pool.credentials[CLOSER_USER])),
        endpoint=pool.endpoint(),
        probe_credentials=issuer.role_credentials,
        scope_of=lambda ref: lease_scope(store, ref),
        dispatch_gate=DispatchGate(tmp_path / "gate"),
        policy=POLICY,
        sleep=sleep,
        note_step=note_step or store.note_step,
    )
    return store, issuer, authority


def three(issuer: LocalPoolIssuer, token: str) -> list[PrincipalRef]:
    """Two ingest leases and a publisher's, of three users."""
    refs = [
        issuer.issue(ROLE_INGEST, f"{token}a").ref,
        issuer.issue(ROLE_INGEST, f"{token}b").ref,
        issuer.issue(ROLE_PUBLISHER, f"{token}c").ref,
    ]
    assert len({r.user for r in refs}) == 3
    return refs


def findings(proof: ClosureProof) -> dict[str, Any]:
    """What a proof found, without its times and ids."""
    facts = proof.facts
    account = facts["query_log"]
    return {
        "proven": proof.proven,
        "strength": proof.strength,
        "keys": sorted(facts),
        "unproven": facts["unproven"],
        "killed": [k["kill_status"] for k in facts["killed"]],
        "listed": [bool(s["queries"]) for s in facts["samples"]][:3],
        "closes": [(c["answer"], c["ended"]) for c in facts["closes"]],
        "sessions": [g["answer"] for g in facts["sessions"]],
        "query_log": {k: bool(account[k]) for k in account if isinstance(account[k], list)},
        "logins_open": facts["logins"]["open"],
        "scope": {k: facts["scope"][k] for k in ("role", "relet")},
        "gate_wait_ms": facts["gate_wait_ms"],
        "ingest_gate": facts.get("ingest_gate"),
    }


class LateQuery:
    """A sleep that, the first time the closure waits between its samples, starts a
    query as ``user`` (no KILL of the closure can have stopped it)."""

    def __init__(self, pool: Pool, user: str) -> None:
        self.pool, self.user = pool, user
        self.query_id = f"late-{uuid.uuid4().hex}"
        self.stack = contextlib.ExitStack()
        self.started = False

    def __call__(self, seconds: float) -> None:
        if not self.started:
            self.started = True
            password = self.pool.credentials[self.user].password
            self.stack.enter_context(
                RunningQuery(self.pool.port, self.user, password, self.query_id)
            )
        time.sleep(seconds)


@contextlib.contextmanager
def late_query(pool: Pool, user: str) -> Iterator[LateQuery]:
    late = LateQuery(pool, user)
    with late.stack:
        yield late


def test_three_leases_closed_at_once_are_each_proven_as_alone(pool: Pool, tmp_path: Path) -> None:
    _, issuer, authority = stored(pool, tmp_path)
    token = uuid.uuid4().hex[:8]
    together = authority.close_principals(three(issuer, f"t{token}"))
    alone = [authority.close_principal(ref) for ref in three(issuer, f"s{token}")]
    assert [findings(p) for p in together] == [findings(p) for p in alone]
    assert all(p.proven for p in together), [p.facts["unproven"] for p in together]
    # One window for the set: as many samples each, at the same server times.
    times = [[s["at_us"] for s in p.facts["samples"]] for p in together]
    assert len(times[0]) >= 4 and times == [times[0]] * 3
    # Each lease's sessions were closed and probed as its own user.
    ingest = together[0].facts
    assert [c["answer"] for c in ingest["closes"]] == [372]
    assert ingest["sessions"][0]["session_id"] == ingest["scope"]["sessions"][0]["session_id"]


def test_a_query_of_one_user_leaves_only_that_lease_unproven(pool: Pool) -> None:
    refs = [pool.issuer.issue(ROLE_INGEST, f"late{i}-{uuid.uuid4().hex[:6]}").ref for i in range(3)]
    with late_query(pool, refs[1].user) as late:
        proofs = make_authority(pool, new_gate(), {}, sleep=late).close_principals(refs)
    assert [p.proven for p in proofs] == [True, False, True], [p.facts["unproven"] for p in proofs]
    assert [p.principal for p in proofs] == refs
    unproven = proofs[1].facts["unproven"]
    assert {"processes_running", "query_log_late_start"} <= set(unproven)
    assert any(late.query_id in s["queries"] for s in proofs[1].facts["samples"])
    for other in (proofs[0], proofs[2]):
        assert all(s["queries"] == [] for s in other.facts["samples"])
        assert other.facts["query_log"]["started_after_closure"] == []
    # Alone, the same lease's closure finds the same.
    again = pool.issuer.issue(ROLE_INGEST, f"late-alone-{uuid.uuid4().hex[:6]}").ref
    with late_query(pool, again.user) as late:
        alone = make_authority(pool, new_gate(), {}, sleep=late).close_principal(again)
    assert findings(alone) == findings(proofs[1])


def test_a_query_running_before_the_closure_is_killed_for_its_own_lease_only(
    pool: Pool,
) -> None:
    refs = [pool.issuer.issue(ROLE_INGEST, f"kill{i}-{uuid.uuid4().hex[:6]}").ref for i in range(3)]
    query_id = f"shared-kill-{uuid.uuid4().hex}"
    password = pool.credentials[refs[2].user].password
    with RunningQuery(pool.port, refs[2].user, password, query_id) as running:
        proofs = make_authority(pool, new_gate(), {}).close_principals(refs)
        running.thread.join(timeout=60)
    assert all(p.proven for p in proofs), [p.facts["unproven"] for p in proofs]
    assert [p.facts["killed"] for p in proofs] == [
        [],
        [],
        [{"query_id": query_id, "kill_status": "finished"}],
    ]


def test_three_leases_cost_the_closer_as_many_requests_as_one(pool: Pool) -> None:
    closer = CountingCloser(HttpTransport(pool.endpoint(), pool.credentials[CLOSER_USER]))
    authority = make_authority(pool, new_gate(), {})
    authority.closer = closer
    one = authority.close_principal(pool.issuer.issue(ROLE_INGEST, "count-one").ref)
    asked_for_one, closer.purposes = closer.purposes, []
    refs = [pool.issuer.issue(ROLE_INGEST, f"count-{i}").ref for i in range(3)]
    proofs = authority.close_principals(refs)
    # No sign-in was open (no read again), so each closure asked exactly this.
    assert [p.facts["logins"]["reads"] for p in [one, *proofs]] == [1, 1, 1, 1]
    assert asked_for_one == ONE_CLOSURE
    assert closer.purposes == ONE_CLOSURE
    assert all(p.proven for p in [one, *proofs])


def test_each_proof_is_stored_under_its_own_lease(pool: Pool, tmp_path: Path) -> None:
    sleep: list[Callable[[float], None]] = [time.sleep]
    store, issuer, authority = stored(pool, tmp_path, sleep=lambda s: sleep[0](s))
    refs = three(issuer, uuid.uuid4().hex[:8])
    with late_query(pool, refs[1].user) as late:
        sleep[0] = late
        proofs = authority.close_principals(refs)
    assert [p.proven for p in proofs] == [True, False, True]
    leases = [store.get_lease(r.lease_id) for r in refs]
    assert [store.closure_proven(lease) for lease in leases] == [True, False, True]
    for ref in refs:
        notes = store.step_notes(lease_step_key(ref.lease_id))
        closures = [n.facts["facts"] for n in notes if n.facts.get("step") == "closure"]
        assert [(c["lease_id"], c["user"]) for c in closures] == [(ref.lease_id, ref.user)]


def test_a_proof_the_store_refuses_keeps_the_others(pool: Pool, tmp_path: Path) -> None:
    """Decided: every proof is offered to the store; the first refusal is raised after,
    naming the leases whose proof was not stored."""
    refused: set[str] = set()
    holder: list[SqliteSnapshotStore] = []

    def note(key: str, facts: Mapping[str, Any]) -> object:
        if key in refused:
            raise StateError("the store is read-only", code="store_unavailable")
        return holder[0].note_step(key, facts)

    store, issuer, authority = stored(pool, tmp_path, note_step=note)
    holder.append(store)
    refs = three(issuer, uuid.uuid4().hex[:8])
    refused.add(lease_step_key(refs[0].lease_id))
    with pytest.raises(StateError) as caught:
        authority.close_principals(refs)
    assert caught.value.code == "store_unavailable"
    assert caught.value.details["unnoted_leases"] == [refs[0].lease_id]
    leases = [store.get_lease(r.lease_id) for r in refs]
    assert [store.closure_proven(lease) for lease in leases] == [False, True, True]


def test_a_relet_users_scope_is_kept_per_user(pool: Pool, tmp_path: Path) -> None:
    """The old lease of a user leased again, closed with another user's lease: the new
    lease's query runs on; the other user's query is killed as its own."""
    store, issuer, authority = stored(pool, tmp_path)
    token = uuid.uuid4().hex[:10]
    old = issuer.issue(ROLE_INGEST, f"old{token}").ref
    issuer.revoke(old)
    store.note_step(lease_step_key(old.lease_id), {"step": "closure", "proven": True})
    new = issuer.issue(ROLE_INGEST, f"new{token}").ref
    other = issuer.issue(ROLE_INGEST, f"other{token}").ref
    assert new.user == old.user != other.user
    marked = f"dpone-b02-new{token}-insert"
    unmarked = f"other-{token}"
    passwords = {r.user: pool.credentials[r.user].password for r in (new, other)}
    with (
        RunningQuery(pool.port, new.user, passwords[new.user], marked) as kept,
        RunningQuery(pool.port, other.user, passwords[other.user], unmarked) as stopped,
    ):
        proofs = authority.close_principals([old, other])
        stopped.thread.join(timeout=60)
        assert kept.thread.is_alive()
    assert [p.proven for p in proofs] == [True, True], [p.facts["unproven"] for p in proofs]
    assert [p.facts["scope"]["relet"] for p in proofs] == [True, False]
    assert proofs[0].facts["killed"] == []
    assert proofs[1].facts["killed"] == [{"query_id": unmarked, "kill_status": "finished"}]
    assert marked not in proofs[0].facts["query_log"]["unfinished"]
    assert proofs[0].facts["logins"]["skipped"] == "relet"


def test_two_leases_of_one_user_are_refused_before_anything(pool: Pool, tmp_path: Path) -> None:
    store, issuer, authority = stored(pool, tmp_path)
    old = issuer.issue(ROLE_INGEST, "twice-old").ref
    issuer.revoke(old)
    store.note_step(lease_step_key(old.lease_id), {"step": "closure", "proven": True})
    new = issuer.issue(ROLE_INGEST, "twice-new").ref
    assert new.user == old.user
    with pytest.raises(ClosureUsersNotDistinct) as caught:
        authority.close_principals([new, old])
    assert caught.value.code == "principals_not_distinct"
    assert store.get_lease(new.lease_id).active
    assert isinstance(authority.closer, CountingCloser) and authority.closer.purposes == []


class RecordingGate(DispatchGate):
    """A dispatch gate that records the order its gates are taken in."""

    def __init__(self, path: Path, **kwargs: Any) -> None:
        super().__init__(path, **kwargs)
        self.taken: list[str] = []

    @contextlib.contextmanager
    def held(self, user: str) -> Iterator[None]:
        with super().held(user):
            self.taken.append(user)
            yield


def test_every_users_gate_is_held_in_sorted_order_before_any_lease_ends(
    pool: Pool, tmp_path: Path
) -> None:
    gate = RecordingGate(tmp_path / "gate.lock", wait_seconds=0.3)
    authority = make_authority(pool, gate, {})
    refs = [pool.issuer.issue(ROLE_INGEST, f"gate{i}").ref for i in range(3)]
    given = [refs[2], refs[0], refs[1]]
    busy = sorted(r.user for r in refs)[1]
    with gate.held(busy), pytest.raises(DispatchGateBusy):
        authority.close_principals(given)
    assert all(pool.registry.get_lease(r.lease_id).active for r in refs)
    gate.taken.clear()
    authority.close_principals(given)
    assert gate.taken == sorted(r.user for r in refs)


class SlowSamples(CountingCloser):
    """The closer's transport over a slow link: each sample takes ``delay`` seconds more
    before it reaches the server."""

    def __init__(self, inner: QueryPort, delay: float) -> None:
        super().__init__(inner)
        self.delay = delay

    def execute(self, request: ClickHouseRequest, *, deadline: float) -> QueryResult:
        if f"{QUERY_ID_PREFIX}-close-sample-" in request.query_id:
            time.sleep(self.delay)
        return super().execute(request, deadline=deadline)


def test_samples_are_paced_by_the_clock_not_lengthened_by_their_round_trips(
    pool: Pool,
) -> None:
    delay, spacing = 0.06, POLICY.sample_spacing_seconds
    authority = make_authority(pool, new_gate(), {}, policy=POLICY)
    authority.closer = SlowSamples(
        HttpTransport(pool.endpoint(), pool.credentials[CLOSER_USER]), delay
    )
    proof = authority.close_principal(pool.issuer.issue(ROLE_INGEST, "paced").ref)
    assert proof.proven, proof.facts["unproven"]
    # The window's samples (the last one follows the gate's probe): each began the
    # spacing after the one before it began, however long its trip took; a sleep of
    # the spacing after each answer would put them spacing + delay apart.
    times = [s["at_us"] for s in proof.facts["samples"][: POLICY.samples]]
    gaps = [(b - a) / 1_000_000 for a, b in itertools.pairwise(times)]
    assert len(gaps) == POLICY.samples - 1
    assert all(spacing - 0.005 <= gap < spacing + delay / 2 for gap in gaps), gaps


def test_the_sessions_closes_and_probes_are_counted_as_the_closing_threads(pool: Pool) -> None:
    refs = [
        pool.issuer.issue(ROLE_INGEST, f"drain{i}-{uuid.uuid4().hex[:6]}").ref for i in range(3)
    ]
    sessions = {ref.lease_id: [f"never-opened-{uuid.uuid4().hex}"] for ref in refs}
    authority = make_authority(pool, new_gate(), sessions, policy=POLICY)
    before = POOL.thread_traffic()
    proofs = authority.close_principals(refs)
    sent = POOL.thread_traffic().since(before)
    assert all(p.proven for p in proofs), [p.facts["unproven"] for p in proofs]
    # Each session (never opened) answers its close and the check after it with 372,
    # and its probe too: three requests a session, sent side by side in threads that
    # work for this one, on top of the closer's eight.
    assert [[c["answer"] for c in p.facts["closes"]] for p in proofs] == [[372]] * 3
    assert [[g["answer"] for g in p.facts["sessions"]] for p in proofs] == [[372]] * 3
    assert sent.requests == len(ONE_CLOSURE) + 3 * 3
