"""Closure acts on one lease, on the real server: an old lease's closure never touches
the pool user's new lease, and what the user ran before the lease is not the lease's."""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path

import pytest

from dpone.connectors.clickhouse_http import HttpTransport
from dpone.localserver import ServerInfo
from dpone.localserver.principal_pool import (
    CLOSER_USER,
    ROLE_INGEST,
    pool_names,
)
from dpone.ports.clickhouse_request import Credentials, Endpoint
from dpone.publication.authority.lease_scope import lease_scope
from dpone.publication.authority.snapshot_authority import ClosurePolicy, SnapshotAuthority
from dpone.publication.dispatch.dispatch_gate import DispatchGate, DispatchGateBusy
from dpone.publication.principals.principal_issuers import LocalPoolIssuer
from dpone.publication.store import SqliteSnapshotStore, lease_step_key
from tests import chhttp
from tests.plugins.managed_server import POOL_DATABASE
from tests.plugins.publication_pool import RunningQuery

POLICY = ClosurePolicy(samples=3, sample_spacing_seconds=0.1)


def user_ids(port: int) -> dict[str, str]:
    rows = chhttp.rows(port, "SELECT name, toString(id) AS id FROM system.users")
    return {r["name"]: r["id"] for r in rows if r["name"] in pool_names()}


def authority_on(
    store: SqliteSnapshotStore,
    issuer: LocalPoolIssuer,
    endpoint: Endpoint,
    closer: Credentials,
    gate: Path,
) -> SnapshotAuthority:
    """The authority as build_publication wires it: real store, scope and gate."""
    return SnapshotAuthority(
        registry=store,
        issuer=issuer,
        closer=HttpTransport(endpoint, closer),
        endpoint=endpoint,
        probe_credentials=issuer.role_credentials,
        scope_of=lambda ref: lease_scope(store, ref),
        dispatch_gate=DispatchGate(gate),
        policy=POLICY,
    )


def test_closing_an_old_lease_never_touches_the_new_leases_query(
    clickhouse: ServerInfo, pool_credentials: dict[str, Credentials], tmp_path: Path
) -> None:
    port = clickhouse.http_port
    chhttp.query(port, f"CREATE DATABASE IF NOT EXISTS {POOL_DATABASE} ENGINE = Atomic")
    store = SqliteSnapshotStore(tmp_path / "snapshots.sqlite")
    issuer = LocalPoolIssuer(store, pool_credentials, user_ids(port))
    endpoint = Endpoint("127.0.0.1", port, clickhouse.tcp_port, POOL_DATABASE)
    authority = authority_on(
        store, issuer, endpoint, pool_credentials[CLOSER_USER], tmp_path / "gate"
    )
    token = uuid.uuid4().hex[:10]
    old = issuer.issue(ROLE_INGEST, f"old{token}").ref
    issuer.revoke(old)
    # Its closure proven (as close_principal stores it): only then does the pool lease
    # the user to the next attempt. Closing the old lease again must still touch only
    # what is its own.
    store.note_step(lease_step_key(old.lease_id), {"step": "closure", "proven": True})
    new = issuer.issue(ROLE_INGEST, f"new{token}").ref
    assert new.user == old.user and new.lease_id != old.lease_id
    # The new attempt's INSERT-like long query, carrying the new lease's mark.
    query_id = f"dpone-b02-new{token}-insert"
    with RunningQuery(port, new.user, pool_credentials[new.user].password, query_id) as running:
        proof = authority.close_principal(old)
        still = chhttp.rows(
            port, f"SELECT 1 AS n FROM system.processes WHERE query_id = '{query_id}'"
        )
        assert still == [{"n": 1}] and running.thread.is_alive()
        assert proof.proven, proof.facts["unproven"]
        assert proof.facts["killed"] == []
        assert proof.facts["scope"]["relet"] is True
        assert query_id not in proof.facts["query_log"]["unfinished"]
        assert all(s["queries"] == [] for s in proof.facts["samples"])
        # The new lease's own closure does stop it.
        own = authority.close_principal(new)
        running.thread.join(timeout=60)
    assert {"query_id": query_id, "kill_status": "finished"} in own.facts["killed"]
    assert own.facts["scope"]["relet"] is False


def test_the_gate_serializes_threads_of_one_process(tmp_path: Path) -> None:
    gate = DispatchGate(tmp_path / "gate.lock")
    inside: list[int] = []
    overlap: list[bool] = []

    def hold() -> None:
        with gate.held("dpone_publisher_1"):
            inside.append(1)
            overlap.append(len(inside) > 1)
            time.sleep(0.05)
            inside.pop()

    workers = [threading.Thread(target=hold) for _ in range(8)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=30)
    assert overlap == [False] * 8


def test_principals_never_wait_for_each_others_gate(tmp_path: Path) -> None:
    """One table's closure (seconds of samples) or a stopped holder holds only its own
    principal's gate: another principal's dispatch or closure goes on at once, the same
    principal's waits (and gives up, coded), and a pool verification waits for all."""
    gate = DispatchGate(tmp_path / "store.sqlite.dispatch.lock", wait_seconds=0.3)
    with gate.held("dpone_ingest_1"):
        started = time.monotonic()
        with gate.held("dpone_publisher_1"), gate.held("dpone_ingest_2"):
            assert time.monotonic() - started < 0.2
        with pytest.raises(DispatchGateBusy) as same, gate.held("dpone_ingest_1"):
            pass
        assert same.value.details["user"] == "dpone_ingest_1"
        with (
            pytest.raises(DispatchGateBusy),
            gate.held_for_all(["dpone_publisher_1", "dpone_ingest_1"]),
        ):
            pass
        # The verification that gave up holds nothing: the other gates are free again.
        with gate.held("dpone_publisher_1"):
            pass
    with gate.held_for_all(["dpone_publisher_1", "dpone_ingest_1", "dpone_ingest_1"]):
        assert gate.path_for("dpone_ingest_1").name == "store.sqlite.dispatch.lock.dpone_ingest_1"
    odd = gate.path_for("we/ird name")
    assert odd.parent == tmp_path and "/" not in odd.name[len("store.sqlite.dispatch.lock.") :]


def test_two_attempts_of_one_slot_never_dispatch_at_once(tmp_path: Path) -> None:
    """Their publishers differ, their target is the same: the slot's gate orders them (a
    check-then-DROP of a created target never meets the other's EXCHANGE), while
    another slot's dispatch and the same principals' closures go on."""
    gate = DispatchGate(tmp_path / "store.sqlite.dispatch.lock", wait_seconds=0.3)
    with gate.held_for_slot("db", "items", "dpone_publisher_1"):
        with (
            pytest.raises(DispatchGateBusy),
            gate.held_for_slot("db", "items", "dpone_publisher_2"),
        ):
            pass
        started = time.monotonic()
        with gate.held_for_slot("db", "other", "dpone_publisher_2"), gate.held("dpone_ingest_1"):
            assert time.monotonic() - started < 0.2
    with gate.held_for_slot("db", "items", "dpone_publisher_2"):
        pass
