"""Publication faults on a real managed server with the real adapters (build_publication).

Each fault ends in the state the seed prescribes, with the target holding exactly A or
exactly B: PUBLISHED when the EXCHANGE ran, NOT_PUBLISHED when it provably did not,
COMMIT_UNKNOWN otherwise. Crashes are real SIGKILLs of a child process at one exact
boundary (tests/publication_harness.py); other faults come from test-side subclasses
of the real adapters or from the server itself.
"""

from __future__ import annotations

import contextlib
import signal
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from dpone.connectors.clickhouse_http import HttpTransport
from dpone.contracts.composition_snapshot import (
    SnapshotIntent,
    exchange_session_id,
)
from dpone.errors import DponeError
from dpone.localserver.principal_pool import CATALOG_USER
from dpone.ports.clickhouse_request import Endpoint, RequestKind
from dpone.ports.composition_snapshot import DispatchResult, IssuedPrincipal
from dpone.publication.catalog import ClickHouseSnapshotCatalog
from dpone.publication.composition import (
    build_publication,
    pool_credentials,
)
from dpone.publication.dispatch.dispatch_notes import BEFORE_EXCHANGE
from dpone.publication.dispatch.executor import (
    ClickHouseSnapshotExecutor,
    session_request,
)
from dpone.publication.publisher import (
    ClickHouseAtomicSnapshotPublisher,
)
from dpone.publication.store import SqliteSnapshotStore
from tests.plugins.publication_rig import A_ROWS, DB, Case, P, make_case, state_of
from tests.publication_harness import Rig

# Test actions that run right after the EXCHANGE answered, before the publisher reconciles.
AfterExchange = Callable[["Case", DispatchResult, IssuedPrincipal], None]


def after_exchange(action: AfterExchange, case: Case) -> type[ClickHouseSnapshotExecutor]:
    """An executor that runs ``action`` right after its EXCHANGE answered."""

    class ActingExecutor(ClickHouseSnapshotExecutor):
        def exchange(self, intent: SnapshotIntent, principal: IssuedPrincipal) -> DispatchResult:
            result = super().exchange(intent, principal)
            action(case, result, principal)
            return result

    return ActingExecutor


# ---------------------------------------------------------------------- crashes


def test_crash_after_the_claim_commit_reconciles_to_not_published(case: Case) -> None:
    done = case.rig.crash("after-claim", case.intent)
    assert done.returncode == -signal.SIGKILL, done.stderr
    assert (case.record().state, case.record().revision) == (P.EXCHANGE_INTENT, 2)
    assert case.rig.exchange_events(case.intent) == []
    # Another publish never grants a second dispatch: it waits for the claim's holder,
    # then names the command that resolves it.
    impatient = case.rig.config(claim_wait_seconds=0.2)
    with pytest.raises(DponeError) as caught:
        build_publication(impatient, DB).publisher.publish(case.intent)
    assert caught.value.code == "claim_exists"
    assert case.rig.exchange_events(case.intent) == []

    reconciled = case.reconcile()
    assert state_of(reconciled) == (P.NOT_PUBLISHED, 3)
    assert case.record().reason == "exchange_not_run"
    facts = case.last_facts()
    assert (facts["decided"], facts["exchange_finishes"], facts["closure_proven"]) == (
        "not_published",
        0,
        True,
    )
    assert case.holds_a()
    assert case.rig.uuid_of(case.b.table) == case.b.uuid


@pytest.mark.parametrize("point", ["after-send", "after-answer"])
def test_crash_after_the_exchange_reconciles_to_published(
    rig: Rig, request: pytest.FixtureRequest, point: str
) -> None:
    case = make_case(rig, request)
    done = rig.crash(point, case.intent)
    assert done.returncode == -signal.SIGKILL, done.stderr
    # The claim is durable, the outcome was never recorded.
    record = case.record()
    assert (record.state, record.revision, record.dispatch) == (P.EXCHANGE_INTENT, 2, None)
    # Killed right after the request left, the server may start it a moment later: the
    # log is read until it shows the EXCHANGE (one run in seven read it too early).
    deadline = time.monotonic() + 30
    while len(rig.exchange_events(case.intent)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert rig.exchange_events(case.intent) == ["QueryStart", "QueryFinish"]

    reconciled = case.reconcile()
    assert state_of(reconciled) == (P.PUBLISHED, 3)
    assert (reconciled.target_uuid, reconciled.generation_uuid) == (case.b.uuid, case.a_uuid)
    assert case.holds_b()
    facts = case.last_facts()
    assert (facts["decided"], facts["exchange_finishes"], facts["dispatch_outcome"]) == (
        "published",
        1,
        None,
    )
    # Repeating publish replays the record; the EXCHANGE is never sent again.
    replay = rig.components().publisher.publish(case.intent)
    assert (replay.historical, replay.record_sha256) == (True, reconciled.record_sha256)
    assert rig.exchange_events(case.intent) == ["QueryStart", "QueryFinish"]


# ---------------------------------------------------------------------- the claim


class CommitThenRaise(SqliteSnapshotStore):
    """The claim's COMMIT succeeds, then its answer is lost."""

    def _after_commit(self, operation: str) -> None:
        if operation == "compare_and_set":
            raise ConnectionResetError("the commit's answer was lost")


def test_a_lost_claim_acknowledgment_dispatches_nothing(case: Case) -> None:
    publisher = case.rig.components(store=CommitThenRaise).publisher
    with pytest.raises(DponeError) as caught:
        publisher.publish(case.intent)
    assert caught.value.code == "claim_uncertain"
    assert case.rig.exchange_events(case.intent) == []
    assert (case.record().state, case.record().revision) == (P.EXCHANGE_INTENT, 2)
    assert case.holds_a()
    assert state_of(case.reconcile()) == (P.NOT_PUBLISHED, 3)
    assert case.holds_a()
    assert case.rig.exchange_events(case.intent) == []


# ---------------------------------------------------------------------- EXCHANGE errors


def test_a_refused_exchange_with_both_tables_back_is_not_published(case: Case) -> None:
    rig, db = case.rig, DB
    hidden = f"{case.b.table}_hidden"

    class HidingExecutor(ClickHouseSnapshotExecutor):
        """B is renamed away after the executor's last look under the gate (so that the
        server itself refuses the EXCHANGE) and back after the answer."""

        def _recheck(self, *args: Any) -> DispatchResult | None:
            refused = super()._recheck(*args)
            if refused is None and args[2] == BEFORE_EXCHANGE:
                rig.admin(f"RENAME TABLE {db}.{case.b.table} TO {db}.{hidden}")
            return refused

        def exchange(self, intent: SnapshotIntent, principal: IssuedPrincipal) -> DispatchResult:
            try:
                return super().exchange(intent, principal)
            finally:
                rig.admin(f"RENAME TABLE {db}.{hidden} TO {db}.{case.b.table}")

    published = case.publisher_with(HidingExecutor).publish(case.intent)
    assert state_of(published) == (P.NOT_PUBLISHED, 3)
    record = case.record()
    assert record.dispatch is not None
    assert (record.dispatch.outcome, record.dispatch.clickhouse_code) == ("refused", 60)
    assert rig.exchange_events(case.intent) == ["ExceptionBeforeStart"]
    assert case.holds_a() and rig.uuid_of(case.b.table) == case.b.uuid
    # A terminal record is replayed, never dispatched again.
    again = rig.components().publisher.publish(case.intent)
    assert (again.state, again.historical) == (P.NOT_PUBLISHED, True)
    assert rig.exchange_events(case.intent) == ["ExceptionBeforeStart"]


def test_an_exchange_error_for_a_dropped_generation_stays_unknown(case: Case) -> None:
    rig, db = case.rig, DB

    class DroppingExecutor(ClickHouseSnapshotExecutor):
        """The generation is dropped after the executor's last look, before the EXCHANGE."""

        def _recheck(self, *args: Any) -> DispatchResult | None:
            refused = super()._recheck(*args)
            if refused is None and args[2] == BEFORE_EXCHANGE:
                rig.admin(f"DROP TABLE {db}.{case.b.table} SYNC")
            return refused

    published = case.publisher_with(DroppingExecutor).publish(case.intent)
    # B is gone: NOT_PUBLISHED needs both names observed, so the outcome stays unknown.
    assert state_of(published) == (P.COMMIT_UNKNOWN, 3)
    assert case.record().reason == "tables_unobserved"
    assert rig.exchange_events(case.intent) == ["ExceptionBeforeStart"]
    assert case.holds_a()
    # Publishing again resolves instead of dispatching: still one refused attempt.
    again = rig.components().publisher.publish(case.intent)
    assert state_of(again) == (P.COMMIT_UNKNOWN, 3)
    assert rig.exchange_events(case.intent) == ["ExceptionBeforeStart"]
    history = case.store().history(case.intent)
    assert [(h.state, h.revision) for h in history][-2:] == [
        ("commit_unknown", 3),
        ("commit_unknown", 3),
    ]
    assert dict(history[-1].facts)["step"] == "reconcile"


# ---------------------------------------------------------------------- catalog


def dead_port() -> int:
    """A local port nobody listens on (bound, then closed)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


def test_an_unavailable_catalog_stays_unknown_until_observed(case: Case) -> None:
    parts = case.rig.components()
    endpoint = parts.endpoint
    unreachable = Endpoint(endpoint.host, dead_port(), endpoint.tcp_port, endpoint.database)
    blind = ClickHouseSnapshotCatalog(
        HttpTransport(unreachable, pool_credentials(case.rig.data_dir)[CATALOG_USER]),
        trusted_users=frozenset(),
    )
    publisher = ClickHouseAtomicSnapshotPublisher(
        authority=parts.publisher.authority,
        store=parts.store,
        catalog=blind,
        executor=parts.publisher.executor,
    )
    published = publisher.publish(case.intent)
    assert state_of(published) == (P.COMMIT_UNKNOWN, 3)
    record = case.record()
    assert record.reason == "tables_unobserved"
    assert record.dispatch is not None and record.dispatch.outcome == "not_sent"
    facts = case.last_facts()
    assert (facts["target_uuid"], facts["exchange_finishes"]) == (None, None)
    assert case.rig.exchange_events(case.intent) == []
    assert case.holds_a()
    # With the catalog back, a reconcile proves the EXCHANGE never ran.
    assert state_of(case.reconcile()) == (P.NOT_PUBLISHED, 4)
    assert case.holds_a()


# ---------------------------------------------------------------------- after the EXCHANGE


def _drop_target(case: Case, result: DispatchResult, principal: IssuedPrincipal) -> None:
    case.rig.admin(f"DROP TABLE {DB}.{case.target} SYNC")


def _rename_generation(case: Case, result: DispatchResult, principal: IssuedPrincipal) -> None:
    case.rig.admin(f"RENAME TABLE {DB}.{case.b.table} TO {DB}.{case.b.table}_moved")


def _insert_into_target(case: Case, result: DispatchResult, principal: IssuedPrincipal) -> None:
    case.rig.admin(f"INSERT INTO {DB}.{case.target} VALUES (99, 'intruder', 99)")


def _alter_target(case: Case, result: DispatchResult, principal: IssuedPrincipal) -> None:
    case.rig.admin(f"ALTER TABLE {DB}.{case.target} ADD COLUMN extra UInt8 DEFAULT 1")


def _design_change(sql: str) -> AfterExchange:
    """An alteration of the target's design only: its rows, content and UUID stay B's."""

    def act(case: Case, result: DispatchResult, principal: IssuedPrincipal) -> None:
        case.rig.admin(f"ALTER TABLE {DB}.{case.target} {sql}")

    return act


DESIGN_CHANGES = {
    "skipping-index": "ADD INDEX dpone_idx id TYPE minmax GRANULARITY 1",
    "column-codec": "MODIFY COLUMN name Nullable(String) CODEC(ZSTD(3))",
    "table-setting": "MODIFY SETTING max_parts_in_total = 12345",
}


@pytest.mark.parametrize(
    "action",
    [
        _drop_target,
        _rename_generation,
        _insert_into_target,
        _alter_target,
        *(_design_change(sql) for sql in DESIGN_CHANGES.values()),
    ],
    ids=[
        "target-dropped",
        "generation-renamed",
        "target-written",
        "target-altered",
        *DESIGN_CHANGES,
    ],
)
def test_tables_changed_after_the_exchange_stay_unknown(
    rig: Rig, request: pytest.FixtureRequest, action: AfterExchange
) -> None:
    case = make_case(rig, request)
    published = case.publisher_with(after_exchange(action, case)).publish(case.intent)
    assert state_of(published) == (P.COMMIT_UNKNOWN, 3)
    facts = case.last_facts()
    assert (facts["decided"], facts["exchange_finishes"], facts["closure_proven"]) == (
        "commit_unknown",
        1,
        True,
    )
    assert rig.exchange_events(case.intent) == ["QueryStart", "QueryFinish"]
    # A later reconcile observes again and stays unknown at the same revision.
    assert state_of(case.reconcile()) == (P.COMMIT_UNKNOWN, 3)
    assert rig.exchange_events(case.intent) == ["QueryStart", "QueryFinish"]
    history = case.store().history(case.intent)
    assert [h.revision for h in history] == [1, 1, 2, 3, 3]  # prepared, its limits_checked
    if action.__name__ == "act":  # a design change alone: the tables hold B and A, rows intact
        assert case.holds_b()
        assert case.record().reason == "design_changed"


def test_a_renamed_generation_put_back_is_then_published(case: Case) -> None:
    published = case.publisher_with(after_exchange(_rename_generation, case)).publish(case.intent)
    assert state_of(published) == (P.COMMIT_UNKNOWN, 3)
    assert case.record().reason == "tables_unobserved"
    assert case.holds_b()
    case.rig.admin(f"RENAME TABLE {DB}.{case.b.table}_moved TO {DB}.{case.b.table}")
    assert state_of(case.reconcile()) == (P.PUBLISHED, 4)
    assert case.holds_b() and case.rig.uuid_of(case.b.table) == case.a_uuid


def _refreshing_view(case: Case, result: DispatchResult, principal: IssuedPrincipal) -> None:
    """A refreshable view replaces the target's table (a new UUID, no Rename logged)."""
    rig = case.rig
    rig.admin(
        f"CREATE MATERIALIZED VIEW {DB}.{case.target}_refresh REFRESH EVERY 1 HOUR "
        f"TO {DB}.{case.target} AS SELECT * FROM {DB}.{case.b.table}"
    )
    deadline = time.monotonic() + 60
    while rig.uuid_of(case.target) == case.b.uuid and time.monotonic() < deadline:
        time.sleep(0.2)
    rig.admin(f"DROP VIEW {DB}.{case.target}_refresh SYNC")


def test_a_refreshable_view_replacing_the_target_stays_unknown(case: Case) -> None:
    published = case.publisher_with(after_exchange(_refreshing_view, case)).publish(case.intent)
    assert state_of(published) == (P.COMMIT_UNKNOWN, 3)
    replaced = case.rig.uuid_of(case.target)
    assert replaced not in (None, case.a_uuid, case.b.uuid)
    assert case.record().reason == "uuid_pair_unexpected"
    assert published.target_uuid == replaced
    # The refresh copied A (now under the generation's name) into a new table.
    assert case.rig.rows_of(case.target) == sorted(A_ROWS)
    assert state_of(case.reconcile()) == (P.COMMIT_UNKNOWN, 3)


# ---------------------------------------------------------------------- closure


def test_an_unproven_closure_stays_unknown_until_the_publisher_is_quiet(case: Case) -> None:
    stop = threading.Event()
    workers: list[threading.Thread] = []
    session = exchange_session_id(case.intent)

    def keep_busy(principal: IssuedPrincipal, endpoint: Endpoint) -> None:
        # The publisher's password still works (custodial closure on this server):
        # queries in its drain-gate session keep both the processes and the session busy.
        transport = HttpTransport(endpoint, principal.credentials)
        number = 0
        while not stop.is_set():
            number += 1
            request = session_request(
                "SELECT sleep(1)",
                f"dpone-test-busy-{case.intent[:16]}-{number}",
                RequestKind.READ,
                session_id=session,
                # T as the executor's: a longer one keeps the session open longer,
                # which only keeps the closure unproven longer.
                session_timeout=1,
                check=False,
            )
            # Killed by the closure, or the session is locked: go again.
            with contextlib.suppress(DponeError):
                transport.execute(request, deadline=time.monotonic() + 30)

    def start_busy(case: Case, result: DispatchResult, principal: IssuedPrincipal) -> None:
        endpoint = case.rig.components().endpoint
        worker = threading.Thread(target=keep_busy, args=(principal, endpoint), daemon=True)
        workers.append(worker)
        worker.start()

    try:
        published = case.publisher_with(after_exchange(start_busy, case)).publish(case.intent)
    finally:
        stop.set()
        for worker in workers:
            worker.join(timeout=60)
    assert state_of(published) == (P.COMMIT_UNKNOWN, 3)
    assert case.record().reason == "closure_unproven"
    closure = case.last_facts()["closure"]
    assert isinstance(closure, dict) and closure["proven"] is False
    assert "query_log_late_start" in closure["facts"]["unproven"]
    assert case.holds_b()  # the EXCHANGE ran; only the proof was missing
    # Once nothing runs as the publisher any more, a reconcile proves it.
    assert not any(worker.is_alive() for worker in workers)
    reconciled = case.reconcile()
    assert state_of(reconciled) == (P.PUBLISHED, 4)
    assert case.holds_b()
    assert case.rig.exchange_events(case.intent) == ["QueryStart", "QueryFinish"]


def test_a_buffer_made_after_the_precheck_is_seen_under_the_gate_and_nothing_sent(
    case: Case,
) -> None:
    """Before: the catalog was read only before the gate; a Buffer over the target made
    after it (one row held in it) let the EXCHANGE run (published@3) and the row landed
    in the new target later (issue 37, item 1)."""
    rig, db, buffer = case.rig, DB, f"{case.target}_buf"

    class BufferingExecutor(ClickHouseSnapshotExecutor):
        """After the publisher's observation and precheck, before the dispatch gate."""

        def exchange(self, intent: SnapshotIntent, principal: IssuedPrincipal) -> DispatchResult:
            rig.admin(
                f"CREATE TABLE {db}.{buffer} AS {db}.{case.target} ENGINE = Buffer("
                f"{db}, {case.target}, 1, 3600, 3600, 1000000, 1000000, 1000000000, 1000000000)"
            )
            rig.admin(f"INSERT INTO {db}.{buffer} SELECT * FROM {db}.{case.target} LIMIT 1")
            return super().exchange(intent, principal)

    try:
        published = case.publisher_with(BufferingExecutor).publish(case.intent)
        assert state_of(published) == (P.NOT_PUBLISHED, 3)
        record = case.record()
        assert record.dispatch is not None
        assert record.dispatch.outcome == "not_sent", record
        assert rig.exchange_events(case.intent) == []  # no EXCHANGE ever reached the server
        assert case.holds_a()
        notes = [n.facts for n in case.store().step_notes(f"dispatch/{case.intent}")]
        refused = [n for n in notes if n.get("step") == "dispatch_refused"]
        assert [(n["at"], n["reason"]) for n in refused] == [
            ("before_session", "side_effect_present")
        ]
    finally:
        rig.admin(f"DROP TABLE IF EXISTS {db}.{buffer} SYNC")
