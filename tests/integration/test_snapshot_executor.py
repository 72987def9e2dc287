"""The snapshot executor on the managed server: EXCHANGE as the publisher in its drain-gate
session, outcomes, the first publication's CREATE, and the gate against a delayed request."""

from __future__ import annotations

import contextlib
import hashlib
import socket
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from dpone.contracts.composition_snapshot import (
    SnapshotIntent,
    create_target_query_id,
    exchange_query_id,
    exchange_session_id,
)
from dpone.localserver import ServerInfo
from dpone.localserver.principal_pool import ROLE_INGEST, ROLE_PUBLISHER
from dpone.ports.clickhouse_request import Credentials, Endpoint
from dpone.ports.composition_snapshot import (
    DispatchOutcome,
    IssuedPrincipal,
    TargetSlot,
)
from dpone.publication.authority.snapshot_authority import ClosurePolicy
from dpone.publication.dispatch.dispatch_gate import DispatchGate
from dpone.publication.dispatch.dispatch_notes import DispatchGuard
from dpone.publication.dispatch.executor import ClickHouseSnapshotExecutor, ExecutorError
from tests import chhttp
from tests.plugins.publication_pool import (
    DB,
    Pool,
    make_authority,
    make_intent,
    make_pool,
    new_gate,
)
from tests.plugins.raw_http import read_all, read_request


def uuid_of(port: int, table: str) -> str | None:
    rows = chhttp.rows(
        port,
        f"SELECT toString(uuid) AS uuid FROM system.tables WHERE database = '{DB}' AND name = '{table}'",
    )
    return rows[0]["uuid"] if rows else None


def log_types(port: int, query_id: str) -> list[str]:
    chhttp.query(port, "SYSTEM FLUSH LOGS")
    rows = chhttp.rows(
        port,
        "SELECT toString(type) AS type FROM system.query_log "
        f"WHERE query_id = '{query_id}' ORDER BY event_time_microseconds, type",
    )
    return [r["type"] for r in rows]


@pytest.fixture
def pool(clickhouse: ServerInfo, pool_credentials: dict[str, Credentials]) -> Pool:
    return make_pool(clickhouse, pool_credentials)


@pytest.fixture
def tables(pool: Pool) -> tuple[str, str]:
    """A fresh generation (2 rows, with the ownership comment) and target (1 row)."""
    token = uuid.uuid4().hex[:12]
    generation, target = f"dpone_stage_g{token}", f"target_{token}"
    chhttp.query(
        pool.port,
        f"CREATE TABLE {DB}.{generation} (id Int64 COMMENT 'dpone-owned attempt=a semantic=s', "
        "s String CODEC(ZSTD(3)), d Int32 DEFAULT 7) ENGINE = MergeTree ORDER BY id "
        "SETTINGS index_granularity = 4096",
    )
    chhttp.query(pool.port, f"INSERT INTO {DB}.{generation} (id, s) VALUES (1, 'a'), (2, 'b')")
    chhttp.query(
        pool.port,
        f"CREATE TABLE {DB}.{target} (id Int64, s String, d Int32) ENGINE = MergeTree ORDER BY id",
    )
    chhttp.query(pool.port, f"INSERT INTO {DB}.{target} VALUES (9, 'old', 0)")
    return generation, target


def issue_pair(pool: Pool, attempt_id: str) -> tuple[IssuedPrincipal, IssuedPrincipal]:
    ingest = pool.issuer.issue(ROLE_INGEST, attempt_id)
    publisher = pool.issuer.issue(ROLE_PUBLISHER, attempt_id)
    return ingest, publisher


class UnstoredGuard(DispatchGuard):
    """The executor's wire behaviour on intents no store holds (they are built here, not
    prepared): the re-check passes and the notes are kept in memory. The re-check itself
    is held through ``build_publication`` in test_dispatch_gate.py."""

    def __init__(self) -> None:
        self.notes: list[dict[str, Any]] = []

    def check(self, intent: SnapshotIntent, principal: IssuedPrincipal, step: str) -> None:
        return None

    def check_lease(self, principal: IssuedPrincipal, step: str) -> None:
        return None

    def note(self, intent_sha256: str, facts: Mapping[str, Any]) -> None:
        self.notes.append(dict(facts))


def executor_on(
    endpoint: Endpoint, gate: DispatchGate | None = None, **options: Any
) -> ClickHouseSnapshotExecutor:
    """An executor with its own gate (or ``gate``) and an :class:`UnstoredGuard`."""
    return ClickHouseSnapshotExecutor(
        endpoint, dispatch_gate=gate or new_gate(), guard=UnstoredGuard(), **options
    )


# ---------------------------------------------------------------------- EXCHANGE


def test_exchange_swaps_as_the_publisher_and_a_reused_id_swaps_back(
    pool: Pool, tables: tuple[str, str]
) -> None:
    generation, target = tables
    ingest, publisher = issue_pair(pool, "a1")
    intent = make_intent(publisher.ref, ingest.ref, generation, target)
    executor = executor_on(pool.endpoint())
    a, b = uuid_of(pool.port, target), uuid_of(pool.port, generation)
    result = executor.exchange(intent, publisher)
    assert result.outcome is DispatchOutcome.ACKNOWLEDGED
    assert (result.query_id, result.session_id) == (
        exchange_query_id(intent.sha256),
        exchange_session_id(intent.sha256),
    )
    assert (uuid_of(pool.port, target), uuid_of(pool.port, generation)) == (b, a)
    assert chhttp.query(pool.port, f"SELECT count() FROM {DB}.{target}") == "2\n"
    assert log_types(pool.port, result.query_id) == ["QueryStart", "QueryFinish"]
    users = chhttp.rows(
        pool.port,
        f"SELECT DISTINCT user FROM system.query_log WHERE query_id = '{result.query_id}'",
    )
    assert users == [{"user": publisher.ref.user}]
    # The server does not refuse a reused query id: the same EXCHANGE runs again and
    # swaps the tables back. Only the store's single claim prevents a second dispatch.
    again = executor.exchange(intent, publisher)
    assert again.outcome is DispatchOutcome.ACKNOWLEDGED
    assert (uuid_of(pool.port, target), uuid_of(pool.port, generation)) == (a, b)
    assert log_types(pool.port, result.query_id).count("QueryFinish") == 2


def test_exchange_with_a_missing_table_is_refused_with_its_code(
    pool: Pool, tables: tuple[str, str]
) -> None:
    generation, target = tables
    ingest, publisher = issue_pair(pool, "a2")
    intent = make_intent(publisher.ref, ingest.ref, generation + "_missing", target)
    a = uuid_of(pool.port, target)
    result = executor_on(pool.endpoint()).exchange(intent, publisher)
    assert (result.outcome, result.clickhouse_code) == (DispatchOutcome.REFUSED, 60)
    assert uuid_of(pool.port, target) == a
    assert log_types(pool.port, result.query_id) == ["ExceptionBeforeStart"]


def test_exchange_refuses_another_principal_before_sending(
    pool: Pool, tables: tuple[str, str]
) -> None:
    generation, target = tables
    ingest, publisher = issue_pair(pool, "a3")
    intent = make_intent(publisher.ref, ingest.ref, generation, target)
    executor = executor_on(pool.endpoint())
    with pytest.raises(ExecutorError) as refused:
        executor.exchange(intent, ingest)
    assert refused.value.code == "principal_mismatch"
    assert log_types(pool.port, exchange_query_id(intent.sha256)) == []


def test_exchange_that_cannot_connect_is_not_sent(pool: Pool, tables: tuple[str, str]) -> None:
    generation, target = tables
    ingest, publisher = issue_pair(pool, "a4")
    intent = make_intent(publisher.ref, ingest.ref, generation, target)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed_port = probe.getsockname()[1]
    executor = executor_on(pool.endpoint(closed_port))
    result = executor.exchange(intent, publisher)
    assert (result.outcome, result.error_code) == (
        DispatchOutcome.NOT_SENT,
        "session_open_not_sent",
    )


def test_an_http_error_without_a_clickhouse_code_is_unknown(
    pool: Pool, tables: tuple[str, str]
) -> None:
    generation, target = tables
    ingest, publisher = issue_pair(pool, "a5")
    intent = make_intent(publisher.ref, ingest.ref, generation, target)
    with HoldingProxy(
        pool.port, answer_marked=b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n"
    ) as proxy:
        executor = executor_on(pool.endpoint(proxy.port))
        result = executor.exchange(intent, publisher)
    assert (result.outcome, result.clickhouse_code) == (DispatchOutcome.UNKNOWN, None)


# ---------------------------------------------------------------------- first publication


def test_create_target_copies_the_design_without_comments(
    pool: Pool, tables: tuple[str, str]
) -> None:
    generation, _ = tables
    target = f"first_{uuid.uuid4().hex[:12]}"
    _, publisher = issue_pair(pool, "a6")
    query_id = create_target_query_id(hashlib.sha256(target.encode()).hexdigest())
    executor = executor_on(pool.endpoint())
    result = executor.create_target(TargetSlot(DB, target), generation, query_id, publisher)
    assert result.outcome is DispatchOutcome.ACKNOWLEDGED

    def design(table: str) -> tuple[list[dict[str, str]], str]:
        columns = chhttp.rows(
            pool.port,
            "SELECT name, type, default_kind, default_expression, compression_codec, comment "
            f"FROM system.columns WHERE database = '{DB}' AND table = '{table}' ORDER BY position",
        )
        engine = chhttp.rows(
            pool.port,
            f"SELECT engine_full FROM system.tables WHERE database = '{DB}' AND name = '{table}'",
        )[0]["engine_full"]
        return columns, engine

    created, engine = design(target)
    original, original_engine = design(generation)
    assert engine == original_engine == "MergeTree ORDER BY id SETTINGS index_granularity = 4096"
    assert [{**c, "comment": ""} for c in original] == created
    assert original[0]["comment"].startswith("dpone-owned") and all(
        c["comment"] == "" for c in created
    )
    assert chhttp.query(pool.port, f"SELECT count() FROM {DB}.{target}") == "0\n"
    assert log_types(pool.port, query_id) == ["QueryStart", "QueryFinish"]
    # A second CREATE is the server's refusal (the name exists), never a replacement.
    again = executor.create_target(TargetSlot(DB, target), generation, query_id + "-2", publisher)
    assert (again.outcome, again.clickhouse_code) == (DispatchOutcome.REFUSED, 57)


def test_create_target_refuses_a_design_it_cannot_render(pool: Pool) -> None:
    token = uuid.uuid4().hex[:12]
    generation, target = f"dpone_stage_p{token}", f"first_{token}"
    chhttp.query(
        pool.port,
        f"CREATE TABLE {DB}.{generation} (id Int64, INDEX i id TYPE minmax GRANULARITY 1) "
        "ENGINE = MergeTree ORDER BY id",
    )
    _, publisher = issue_pair(pool, "a7")
    executor = executor_on(pool.endpoint())
    result = executor.create_target(TargetSlot(DB, target), generation, f"q-{token}", publisher)
    assert (result.outcome, result.error_code) == (DispatchOutcome.NOT_SENT, "design_unrenderable")
    assert uuid_of(pool.port, target) is None
    missing = executor.create_target(
        TargetSlot(DB, target), generation + "x", f"q2-{token}", publisher
    )
    assert (missing.outcome, missing.error_code) == (
        DispatchOutcome.NOT_SENT,
        "generation_unobservable",
    )


# ---------------------------------------------------------------------- the drain gate


class HoldingProxy:
    """A TCP proxy to the server that holds every request containing ``marker``.

    A held request's bytes are forwarded only when ``release`` is set (the client may
    have given up by then); the server's answer is kept in ``late_answers``. With
    ``answer_marked`` the proxy answers a marked request itself and forwards nothing.
    """

    def __init__(
        self, upstream: int, marker: bytes = b"EXCHANGE", answer_marked: bytes | None = None
    ) -> None:
        self.upstream, self.marker, self.answer_marked = upstream, marker, answer_marked
        self.release = threading.Event()
        self.held = threading.Event()
        self.answered = threading.Event()
        self.late_answers: list[bytes] = []
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port = self._server.getsockname()[1]
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def __enter__(self) -> HoldingProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self._closed = True
        self.release.set()
        self._server.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        with client:
            request = read_request(client)
            marked = self.marker in request
            if marked and self.answer_marked is not None:
                client.sendall(self.answer_marked)
                return
            if marked:
                self.held.set()
                self.release.wait()
            with socket.create_connection(("127.0.0.1", self.upstream)) as upstream:
                upstream.sendall(request)
                answer = read_all(upstream)
            if marked:
                self.late_answers.append(answer)
                self.answered.set()
            with contextlib.suppress(OSError):  # the client may have given up long ago
                client.sendall(answer)


@pytest.fixture
def held(
    pool: Pool, tables: tuple[str, str]
) -> Iterator[tuple[HoldingProxy, SnapshotIntent, IssuedPrincipal]]:
    """An EXCHANGE dispatched through the proxy and held there: the executor gave up."""
    generation, target = tables
    ingest, publisher = issue_pair(pool, "gate")
    intent = make_intent(publisher.ref, ingest.ref, generation, target, attempt_id="gate")
    with HoldingProxy(pool.port) as proxy:
        executor = executor_on(
            pool.endpoint(proxy.port),
            session_timeout=GATE_T,
            request_seconds=1.0,
        )
        result = executor.exchange(intent, publisher)
        assert result.outcome is DispatchOutcome.UNKNOWN and proxy.held.is_set()
        yield proxy, intent, publisher


GATE_T = 4
GATE_POLICY = ClosurePolicy(samples=3, sample_spacing_seconds=0.5, session_timeout=GATE_T)


def test_gate_proves_a_request_held_past_the_session_timeout_dead(
    pool: Pool, tables: tuple[str, str], held: tuple[HoldingProxy, SnapshotIntent, IssuedPrincipal]
) -> None:
    proxy, intent, publisher = held
    generation, target = tables
    before = (uuid_of(pool.port, target), uuid_of(pool.port, generation))
    session = exchange_session_id(intent.sha256)
    authority = make_authority(
        pool, new_gate(), {publisher.ref.lease_id: [session]}, policy=GATE_POLICY
    )
    proof = authority.close_principal(publisher.ref)
    assert proof.proven, proof.facts["unproven"]
    assert [g["answer"] for g in proof.facts["sessions"]] == [372]
    proxy.release.set()
    assert proxy.answered.wait(60)
    assert b"Code: 372" in proxy.late_answers[0] and b"SESSION_NOT_FOUND" in proxy.late_answers[0]
    assert (uuid_of(pool.port, target), uuid_of(pool.port, generation)) == before
    assert "QueryStart" not in log_types(pool.port, exchange_query_id(intent.sha256))


def test_a_request_held_less_than_t_and_released_after_the_close_fails(
    pool: Pool, tables: tuple[str, str], held: tuple[HoldingProxy, SnapshotIntent, IssuedPrincipal]
) -> None:
    """The closure closes the session before it waits: a held EXCHANGE let through at the
    closure's first pause, well within T of its session's last request, finds no session
    (a closure that only waited let it run: 200, the tables swapped after closure began)."""
    proxy, intent, publisher = held
    generation, target = tables
    before = (uuid_of(pool.port, target), uuid_of(pool.port, generation))

    def sleep_releasing(seconds: float) -> None:
        if not proxy.release.is_set():
            proxy.release.set()
            assert proxy.answered.wait(60)
        time.sleep(seconds)

    session = exchange_session_id(intent.sha256)
    authority = make_authority(
        pool,
        new_gate(),
        {publisher.ref.lease_id: [session]},
        policy=GATE_POLICY,
        sleep=sleep_releasing,
    )
    proof = authority.close_principal(publisher.ref)
    assert proxy.release.is_set(), "the closure never paused"
    assert b"Code: 372" in proxy.late_answers[0] and b"SESSION_NOT_FOUND" in proxy.late_answers[0]
    assert (uuid_of(pool.port, target), uuid_of(pool.port, generation)) == before
    assert proof.proven, proof.facts["unproven"]
    assert [(c["session_id"], c["answer"]) for c in proof.facts["closes"]] == [(session, "closed")]
    assert [g["answer"] for g in proof.facts["sessions"]] == [372]
    assert proof.facts["gate_wait_ms"] == 0  # nothing left to wait out
    assert "QueryStart" not in log_types(pool.port, exchange_query_id(intent.sha256))


# What a gateway answers for the server, which never sees the close: no answer a
# closure can trust (502, no ClickHouse code), or a 200 that closed nothing (as a
# server answers that does not honour close_session).
UNSEEN_CLOSES = {
    "bad_gateway": b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n",
    "ignored": b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n1\n",
}


@pytest.mark.parametrize("unseen", sorted(UNSEEN_CLOSES))
def test_a_close_that_ends_nothing_waits_the_session_out(
    pool: Pool,
    tables: tuple[str, str],
    held: tuple[HoldingProxy, SnapshotIntent, IssuedPrincipal],
    unseen: str,
) -> None:
    """A close that ends nothing (no answer, or a 200 after which the session still
    answers) makes the closure fall back to T plus the margin, from now (the held
    EXCHANGE may still run), and then prove the session gone."""
    proxy, intent, publisher = held
    generation, target = tables
    before = (uuid_of(pool.port, target), uuid_of(pool.port, generation))
    session = exchange_session_id(intent.sha256)
    answer = UNSEEN_CLOSES[unseen]
    with HoldingProxy(pool.port, marker=b"close_session=1", answer_marked=answer) as gateway:
        authority = make_authority(
            pool,
            new_gate(),
            {publisher.ref.lease_id: [session]},
            policy=GATE_POLICY,
            endpoint=pool.endpoint(gateway.port),
        )
        proof = authority.close_principal(publisher.ref)
    assert proof.proven, proof.facts["unproven"]
    [close] = proof.facts["closes"]
    assert close["session_id"] == session and close["ended"] is False
    if unseen == "ignored":
        # The 200 is not believed: the probe right after it found the session open.
        assert (close["answer"], close["checked"]) == ("closed", "open")
    else:
        assert close["answer"] not in ("closed", 372) and "checked" not in close
    window = GATE_POLICY.session_timeout + GATE_POLICY.session_margin_seconds
    assert proof.facts["gate_wait_ms"] >= (window - 0.5) * 1000
    assert [g["answer"] for g in proof.facts["sessions"]] == [372]
    proxy.release.set()
    assert proxy.answered.wait(60)
    assert b"Code: 372" in proxy.late_answers[0]
    assert (uuid_of(pool.port, target), uuid_of(pool.port, generation)) == before


def test_closure_waits_for_a_dispatch_in_flight(pool: Pool, tables: tuple[str, str]) -> None:
    generation, target = tables
    ingest, publisher = issue_pair(pool, "lock")
    intent = make_intent(publisher.ref, ingest.ref, generation, target, attempt_id="lock")
    gate = new_gate()
    authority = make_authority(
        pool, gate, {}, policy=ClosurePolicy(samples=3, sample_spacing_seconds=0.1)
    )
    with HoldingProxy(pool.port) as proxy:
        executor = executor_on(pool.endpoint(proxy.port), gate, request_seconds=60)
        results: list[object] = []
        dispatch = threading.Thread(
            target=lambda: results.append(executor.exchange(intent, publisher))
        )
        dispatch.start()
        assert proxy.held.wait(30)
        closing = threading.Thread(
            target=lambda: results.append(authority.close_principal(publisher.ref))
        )
        closing.start()
        closing.join(timeout=1.0)
        # The closure is blocked behind the dispatch: the lease has not been ended yet.
        assert closing.is_alive() and pool.registry.get_lease(publisher.ref.lease_id).active
        proxy.release.set()
        dispatch.join(timeout=60)
        closing.join(timeout=60)
    assert getattr(results[0], "outcome", None) is DispatchOutcome.ACKNOWLEDGED
    assert not pool.registry.get_lease(publisher.ref.lease_id).active
