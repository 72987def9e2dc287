"""Policy tests of ClickHouseAtomicSnapshotPublisher over the fakes of its four ports.

The adapters are proven against the real server elsewhere; these tests drive the
sequencing: which port is called, in which order, and what the record becomes.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from dpone.contracts.composition_snapshot import (
    RecordClaim,
    SnapshotIntent,
    SnapshotLimits,
    SnapshotRecord,
    SnapshotState,
    create_target_query_id,
    exchange_query_id,
)
from dpone.errors import DponeError
from dpone.ports.composition_snapshot import Blocker, OwnershipState
from dpone.publication.publisher import (
    ClickHouseAtomicSnapshotPublisher,
    PublicationReceipt,
)
from tests.fakes.snapshot_ports import GENERATION, TARGET, Crash, FakeTable, World, new_uuid

P = SnapshotState
CLOCK = "2024-05-01T12:00:00.000000Z"


def publisher(world: World, **options: Any) -> ClickHouseAtomicSnapshotPublisher:
    return ClickHouseAtomicSnapshotPublisher(
        authority=world.authority,
        store=world.store,
        catalog=world.catalog,
        executor=world.executor,
        clock=lambda: CLOCK,
        **options,
    )


@pytest.fixture
def world() -> World:
    return World.build()


def prepared(world: World) -> str:
    return publisher(world).prepare(world.attempt, world.generation_ref).intent_sha256


def record_of(world: World, intent_sha256: str) -> SnapshotRecord:
    return SnapshotRecord.from_bytes(world.store.load(intent_sha256).record_bytes)


def intent_of(world: World, intent_sha256: str) -> SnapshotIntent:
    return SnapshotIntent.from_bytes(world.store.load(intent_sha256).intent_bytes)


def claim_directly(world: World, intent_sha256: str) -> SnapshotRecord:
    """Put the record at EXCHANGE_INTENT@2 as a claimant that then vanished would."""
    record = record_of(world, intent_sha256)
    claimed = record.successor(
        P.EXCHANGE_INTENT, at=CLOCK, claim=RecordClaim(claim_id="c-1", claimed_at=CLOCK)
    )
    world.store.compare_and_set(
        intent_sha256,
        expected=record.raw,
        replacement=claimed.raw,
        authority=world.authority.recheck(intent_of(world, intent_sha256)),
        facts={},
    )
    return claimed


def swap(world: World) -> None:
    tables = world.catalog.tables
    tables[TARGET], tables[GENERATION] = tables[GENERATION], tables[TARGET]


def error_code(exc: pytest.ExceptionInfo[DponeError]) -> str:
    return exc.value.code


# ---------------------------------------------------------------------- prepare


def test_prepare_binds_a_and_b_and_stores_prepared(world: World) -> None:
    receipt = publisher(world).prepare(world.attempt, world.generation_ref)
    intent = intent_of(world, receipt.intent_sha256)
    assert (receipt.state, receipt.revision) == (P.PREPARED, 1)
    assert (intent.target_uuid, intent.generation_uuid) == (world.a_uuid, world.b_uuid)
    assert (receipt.target_uuid, receipt.generation_uuid) == (world.a_uuid, world.b_uuid)
    assert intent.content_digest == world.authority.generation.rows_digest
    assert intent.ingest.user == "dpone_ingest_1"
    assert intent.publisher.user == "dpone_publisher_1"
    # The ingest principal is closed before anything is stored, the publisher is not.
    events = world.events
    assert events.index("authority.close_principal") < events.index("store.create")
    assert world.authority.closed == ["lease-ingest"]
    assert world.executor.exchanges == []


def test_prepare_refuses_an_unproven_ingest_closure(world: World) -> None:
    world.authority.closure_proven = False
    with pytest.raises(DponeError) as exc:
        publisher(world).prepare(world.attempt, world.generation_ref)
    assert error_code(exc) == "ingest_not_quiescent"
    assert world.store.entries == {}


def test_prepare_refuses_an_ingest_closure_that_could_not_count_sign_ins(world: World) -> None:
    """A server without a session log: a held request outside the session is unseen, so
    prepare refuses unless the caller accepts the closure on samples and the log alone."""
    world.authority.closure_facts = {"logins": {"observed": False, "open": None, "reads": 1}}
    with pytest.raises(DponeError) as exc:
        publisher(world).prepare(world.attempt, world.generation_ref)
    assert error_code(exc) == "ingest_logins_unobservable"
    assert "<session_log>" in exc.value.message and "accept_ungated_ingest" in exc.value.message
    assert world.store.entries == {}
    accepted = publisher(world, accept_ungated_ingest=True)
    assert accepted.prepare(world.attempt, world.generation_ref).state.value == "prepared"


def test_prepare_accepts_only_the_original_generation_record(world: World) -> None:
    with pytest.raises(DponeError) as exc:
        publisher(world).prepare(world.attempt, "f" * 64)
    assert error_code(exc) == "evidence_unverified"
    assert world.store.entries == {}


@pytest.mark.parametrize("where", [TARGET, GENERATION])
def test_prepare_names_a_side_effect(world: World, where: str) -> None:
    world.catalog.tables[where].blockers = (Blocker("incoming_mv", "mv_orders writes here"),)
    with pytest.raises(DponeError) as exc:
        publisher(world).prepare(world.attempt, world.generation_ref)
    assert error_code(exc) == "side_effect_present"
    assert exc.value.details["reason"] == "incoming_mv"
    assert world.store.entries == {}


def test_prepare_refuses_a_design_difference(world: World) -> None:
    world.catalog.tables[TARGET].design_sha256 = "0" * 64
    with pytest.raises(DponeError) as exc:
        publisher(world).prepare(world.attempt, world.generation_ref)
    assert error_code(exc) == "design_mismatch"


@pytest.mark.parametrize(("rows", "digest"), [(4, None), (None, "9" * 32)], ids=["rows", "digest"])
def test_prepare_refuses_content_that_differs_from_staging(
    world: World, rows: int | None, digest: str | None
) -> None:
    table = world.catalog.tables[GENERATION]
    table.rows = table.rows if rows is None else rows
    table.content_digest = table.content_digest if digest is None else digest
    with pytest.raises(DponeError) as exc:
        publisher(world).prepare(world.attempt, world.generation_ref)
    assert error_code(exc) == "content_mismatch"
    assert world.store.entries == {}


def test_prepare_refuses_a_generation_that_is_not_the_staged_table(world: World) -> None:
    world.catalog.tables[GENERATION] = FakeTable(
        new_uuid(), 3, world.catalog.tables[GENERATION].content_digest
    )
    with pytest.raises(DponeError) as exc:
        publisher(world).prepare(world.attempt, world.generation_ref)
    assert error_code(exc) == "evidence_unverified"


@pytest.mark.parametrize(
    ("ceiling", "value"),
    [
        ("source_rows", 2),
        ("source_bytes", 4095),
        ("wire_bytes", 2047),
        ("generation_storage_bytes", 999),
        ("retained_storage_bytes", 999),
        ("total_transient_storage_bytes", 1999),
    ],
)
def test_prepare_names_the_exceeded_ceiling(world: World, ceiling: str, value: int) -> None:
    # Observed: 3 rows, 4096 source bytes, 2048 wire bytes, B 1000 bytes, retained 1000.
    generous = dict.fromkeys(SnapshotLimits.__dataclass_fields__, 10**9)
    limits = SnapshotLimits(**{**generous, ceiling: value})
    with pytest.raises(DponeError) as exc:
        publisher(world, limits=limits).prepare(world.attempt, world.generation_ref)
    assert error_code(exc) == "limit_exceeded"
    assert exc.value.details["ceiling"] == ceiling
    # The limits at their observed values pass: the comparison is "exceeds", not "reaches".
    exact = SnapshotLimits(**{**generous, ceiling: value + 1})
    assert publisher(world, limits=exact).prepare(world.attempt, world.generation_ref).revision == 1


def test_first_publication_creates_the_target_as_a_noted_step() -> None:
    world = World.build(target_exists=False)
    receipt = publisher(world).prepare(world.attempt, world.generation_ref)
    intent = intent_of(world, receipt.intent_sha256)
    created = world.catalog.tables[TARGET]
    assert intent.target_uuid == created.uuid
    assert (created.rows, created.design_sha256) == (
        0,
        world.catalog.tables[GENERATION].design_sha256,
    )
    key = create_target_query_id(world.generation_ref)
    assert world.executor.creates == [key]
    # One publisher, issued before the CREATE, is the one the intent binds.
    assert world.authority.calls.count("issue_publisher") == 1
    assert world.authority.leases[intent.publisher.lease_id].active
    notes = world.store.step_notes(key)
    assert [n.facts["step"] for n in notes] == [
        "create_target",
        "create_target_answer",
        "create_target_observed",
    ]
    assert notes[1].facts["outcome"] == "acknowledged"
    assert notes[2].facts["table_uuid"] == created.uuid  # the table it made, by UUID
    # The durable note precedes the CREATE; the intent's history links to it.
    events = world.events
    assert events.index("store.note_step") < events.index("executor.create_target")
    steps = [h.facts.get("step") for h in world.store.history(receipt.intent_sha256)]
    assert "create_target" in steps
    # Then the one ordinary path: one EXCHANGE, and B is the target.
    published = publisher(world).publish(receipt.intent_sha256)
    assert (published.state, published.revision) == (P.PUBLISHED, 3)
    assert world.catalog.tables[TARGET].uuid == world.b_uuid
    assert len(world.executor.exchanges) == 1


def test_a_refused_first_create_stores_nothing_and_releases_the_publisher() -> None:
    world = World.build(target_exists=False)
    world.executor.create_mode = "refused"
    with pytest.raises(DponeError) as exc:
        publisher(world).prepare(world.attempt, world.generation_ref)
    assert error_code(exc) == "create_target_failed"
    assert world.store.entries == {}
    publisher_lease = next(k for k, v in world.authority.leases.items() if "publisher" in v.user)
    assert world.authority.closed == ["lease-ingest", publisher_lease]
    assert not world.authority.leases[publisher_lease].active


# ---------------------------------------------------------------------- publish


def test_publish_exchanges_once_and_proves_b(world: World) -> None:
    sha = prepared(world)
    receipt = publisher(world).publish(sha)
    assert (receipt.state, receipt.revision, receipt.historical) == (P.PUBLISHED, 3, False)
    assert (receipt.target_uuid, receipt.generation_uuid) == (world.b_uuid, world.a_uuid)
    record = record_of(world, sha)
    assert record.closure is not None and record.closure.proven
    assert record.dispatch is not None and record.dispatch.outcome == "acknowledged"
    assert world.executor.exchanges == [(exchange_query_id(sha), "dpone_publisher_1")]
    states = [(h.state, h.revision) for h in world.store.history(sha) if h.record_sha256]
    assert states == [("prepared", 1), ("exchange_intent", 2), ("published", 3)]
    # The claim is durable and read back before the EXCHANGE; the publisher closed after.
    events = world.events
    claim = events.index("store.cas:exchange_intent")
    assert claim < events.index("store.read_back") < events.index("executor.exchange")
    assert world.authority.closed[-1] == intent_of(world, sha).publisher.lease_id


def test_terminal_replay_uses_no_authority_at_all(world: World) -> None:
    sha = prepared(world)
    first = publisher(world).publish(sha)
    world.authority.calls.clear()
    observations = world.catalog.observations
    again = publisher(world).publish(sha)
    assert world.authority.calls == []
    assert world.catalog.observations == observations
    assert again.historical is True
    assert (again.state, again.revision, again.record_sha256) == (
        first.state,
        first.revision,
        first.record_sha256,
    )
    assert len(world.executor.exchanges) == 1


def test_a_lost_commit_acknowledgment_raises_and_never_dispatches(world: World) -> None:
    sha = prepared(world)
    world.store.faults.commit_then_raise = True
    with pytest.raises(DponeError) as exc:
        publisher(world).publish(sha)
    assert error_code(exc) == "claim_uncertain"
    assert world.executor.exchanges == []
    assert record_of(world, sha).state is P.EXCHANGE_INTENT  # it did commit
    # Repeating publish finds the old claim: it never grants another EXCHANGE.
    with pytest.raises(DponeError) as exc:
        publisher(world, claim_wait_seconds=0).publish(sha)
    assert error_code(exc) == "claim_exists"
    assert world.executor.exchanges == []
    # Reconcile proves nothing ran: NOT_PUBLISHED@3 with A still in place.
    receipt = publisher(world).reconcile(sha)
    assert (receipt.state, receipt.revision) == (P.NOT_PUBLISHED, 3)
    assert world.catalog.tables[TARGET].uuid == world.a_uuid
    assert world.executor.exchanges == []


def test_a_busy_store_raises_without_a_claim_or_dispatch(world: World) -> None:
    sha = prepared(world)
    world.store.faults.busy = True
    with pytest.raises(DponeError) as exc:
        publisher(world).publish(sha)
    assert error_code(exc) == "claim_uncertain"
    assert record_of(world, sha).state is P.PREPARED
    assert world.executor.exchanges == []


def test_claim_commit_then_crash_reconciles_to_not_published(world: World) -> None:
    sha = prepared(world)
    world.store.faults.crash_after_commit = True
    with pytest.raises(Crash):
        publisher(world).publish(sha)
    assert world.executor.exchanges == []
    receipt = publisher(world).reconcile(sha)
    assert (receipt.state, receipt.revision) == (P.NOT_PUBLISHED, 3)
    assert record_of(world, sha).reason == "exchange_not_run"


def test_crash_after_sending_reconciles_to_published(world: World) -> None:
    sha = prepared(world)
    world.executor.mode = "crash_after_send"
    with pytest.raises(Crash):
        publisher(world).publish(sha)
    assert record_of(world, sha).state is P.EXCHANGE_INTENT
    receipt = publisher(world).reconcile(sha)
    assert (receipt.state, receipt.revision) == (P.PUBLISHED, 3)
    assert len(world.executor.exchanges) == 1


@pytest.mark.parametrize(
    ("hook", "code"),
    [(lambda data: None, "claim_uncertain"), (lambda data: data + b" ", "readback_mismatch")],
    ids=["missing", "different"],
)
def test_an_uncertain_readback_raises_without_dispatch(world: World, hook: Any, code: str) -> None:
    sha = prepared(world)
    world.store.faults.readback = hook
    with pytest.raises(DponeError) as exc:
        publisher(world).publish(sha)
    assert error_code(exc) == code
    assert world.executor.exchanges == []
    assert "executor.exchange" not in world.events


def test_concurrent_callers_exchange_once_and_report_one_record(world: World) -> None:
    sha = prepared(world)
    callers = 8
    barrier = threading.Barrier(callers)
    receipts: list[PublicationReceipt] = []
    errors: list[BaseException] = []

    def call() -> None:
        barrier.wait()
        try:
            receipts.append(publisher(world).publish(sha))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=call) for _ in range(callers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert len(world.executor.exchanges) == 1
    final = record_of(world, sha)
    assert {(r.state, r.revision, r.record_sha256) for r in receipts} == {
        (P.PUBLISHED, 3, final.sha256)
    }
    # Only the winner closed the publisher: once, after its EXCHANGE.
    publisher_lease = intent_of(world, sha).publisher.lease_id
    assert world.authority.closed.count(publisher_lease) == 1
    assert world.events.index("executor.exchange") < world.events.index(
        "authority.close_principal", world.events.index("store.cas:exchange_intent")
    )


def test_a_loser_waiting_for_a_live_claim_never_closes_its_publisher(world: World) -> None:
    sha = prepared(world)
    loser_saw: list[str] = []

    def loser_arrives() -> None:
        # The winner holds the claim and is about to send: a second caller arrives.
        loser = publisher(world, claim_wait_seconds=0)
        with pytest.raises(DponeError) as exc:
            loser.publish(sha)
        loser_saw.append(error_code(exc))

    world.executor.before_exchange = loser_arrives
    receipt = publisher(world).publish(sha)
    assert loser_saw == ["claim_exists"]
    # The loser closed nothing: the publisher was closed once, by the winner, after it sent.
    publisher_lease = intent_of(world, sha).publisher.lease_id
    assert world.authority.closed.count(publisher_lease) == 1
    assert (receipt.state, receipt.revision) == (P.PUBLISHED, 3)
    assert len(world.executor.exchanges) == 1


def test_an_older_attempt_is_fenced_out(world: World) -> None:
    sha = prepared(world)
    world.authority.admit_newer()
    with pytest.raises(DponeError) as exc:
        publisher(world).publish(sha)
    assert error_code(exc) == "attempt_fenced"
    assert record_of(world, sha).state is P.PREPARED
    assert world.executor.exchanges == []


@pytest.mark.parametrize(
    ("change", "state"),
    [
        ("b_rows_changed", P.NOT_PUBLISHED),
        ("b_blocker", P.NOT_PUBLISHED),
        ("a_replaced", P.COMMIT_UNKNOWN),
        ("publisher_lease_ended", P.NOT_PUBLISHED),
    ],
)
def test_a_failed_recheck_after_the_claim_sends_nothing(
    world: World, change: str, state: SnapshotState
) -> None:
    sha = prepared(world)
    if change == "b_rows_changed":
        world.catalog.tables[GENERATION].rows += 1
    elif change == "b_blocker":
        world.catalog.tables[GENERATION].blockers = (Blocker("mutation", "ALTER in flight"),)
    elif change == "a_replaced":  # e.g. a refreshable MV replaced the target
        world.catalog.tables[TARGET] = FakeTable(new_uuid(), 7, "a" * 32)
    else:
        world.authority.leases[intent_of(world, sha).publisher.lease_id].active = False
    receipt = publisher(world).publish(sha)
    assert world.executor.exchanges == []
    assert (receipt.state, receipt.revision) == (state, 3)
    record = record_of(world, sha)
    assert record.dispatch is not None and record.dispatch.outcome == "not_sent"
    # A dispatch not sent keeps why in the record itself, not only in the history.
    kept = {
        "b_rows_changed": "not_sent_content_mismatch",
        "b_blocker": "not_sent_side_effect_present",
        "publisher_lease_ended": "not_sent_lease_not_active",
    }
    if change in kept:
        assert record.reason == kept[change]


def test_a_refused_exchange_is_not_published(world: World) -> None:
    sha = prepared(world)
    world.executor.mode = "refused"
    receipt = publisher(world).publish(sha)
    assert (receipt.state, receipt.revision) == (P.NOT_PUBLISHED, 3)
    record = record_of(world, sha)
    assert record.dispatch is not None
    assert (record.dispatch.outcome, record.dispatch.clickhouse_code) == ("refused", 60)


def test_an_executor_that_raises_is_an_unknown_answer(world: World) -> None:
    sha = prepared(world)
    world.executor.mode = "raise"
    receipt = publisher(world).publish(sha)  # it did run: the catalog proves B
    assert (receipt.state, receipt.revision) == (P.PUBLISHED, 3)
    record = record_of(world, sha)
    assert record.dispatch is not None and record.dispatch.outcome == "unknown"


# ---------------------------------------------------------------------- reconcile


@pytest.mark.parametrize(
    ("pair", "parity", "closure", "log", "expected"),
    [
        ("B/A", True, True, 1, P.PUBLISHED),
        ("B/A", True, True, None, P.PUBLISHED),
        ("B/A", False, True, 1, P.COMMIT_UNKNOWN),
        ("B/A", True, False, 1, P.COMMIT_UNKNOWN),
        ("A/B", True, True, 0, P.NOT_PUBLISHED),
        ("A/B", True, True, None, P.COMMIT_UNKNOWN),
        ("A/B", True, True, 2, P.COMMIT_UNKNOWN),  # a double exchange swapped back
        ("A/B", True, False, 0, P.COMMIT_UNKNOWN),
        ("A/?", True, True, 0, P.COMMIT_UNKNOWN),  # the target was replaced
        ("A/-", True, True, 0, P.COMMIT_UNKNOWN),  # the generation name vanished
        ("-/-", True, True, 0, P.COMMIT_UNKNOWN),  # the catalog is unavailable
    ],
)
def test_reconcile_truth_table(
    world: World, pair: str, parity: bool, closure: bool, log: int | None, expected: SnapshotState
) -> None:
    sha = prepared(world)
    claim_directly(world, sha)
    qid = exchange_query_id(sha)
    if pair == "B/A":
        swap(world)
        if not parity:
            world.catalog.tables[TARGET].content_digest = "0" * 32
    elif pair == "A/?":
        world.catalog.tables[TARGET] = FakeTable(new_uuid(), 7, "a" * 32)
    elif pair == "A/-":
        del world.catalog.tables[GENERATION]
    elif pair == "-/-":
        world.catalog.observe_fails = True
    if log is None:
        world.catalog.log_fails = True
    for _ in range(log or 0):
        world.catalog.log_event(qid, "QueryStart")
        world.catalog.log_event(qid, "QueryFinish")
    world.authority.closure_proven = closure
    receipt = publisher(world).reconcile(sha)
    assert (receipt.state, receipt.revision) == (expected, 3)
    assert world.executor.exchanges == []
    assert (
        "authority.issue_publisher"
        not in world.events[world.events.index("store.cas:exchange_intent") :]
    )


def test_commit_unknown_that_stays_unknown_keeps_its_revision(world: World) -> None:
    sha = prepared(world)
    claim_directly(world, sha)
    world.catalog.log_fails = True
    first = publisher(world).reconcile(sha)
    assert (first.state, first.revision) == (P.COMMIT_UNKNOWN, 3)
    assert record_of(world, sha).reason == "query_log_unobservable"
    before = world.store.history(sha)
    again = publisher(world).reconcile(sha)
    after = world.store.history(sha)
    assert (again.state, again.revision, again.record_sha256) == (
        P.COMMIT_UNKNOWN,
        3,
        first.record_sha256,
    )
    assert len(after) == len(before) + 1
    assert (after[-1].record_sha256, after[-1].revision, after[-1].facts["step"]) == (
        None,
        3,
        "reconcile",
    )
    # publish on a COMMIT_UNKNOWN record reconciles; it never dispatches.
    world.catalog.log_fails = False
    settled = publisher(world).publish(sha)
    assert (settled.state, settled.revision) == (P.NOT_PUBLISHED, 4)
    assert world.executor.exchanges == []


def test_commit_unknown_moves_to_published_when_b_is_proven(world: World) -> None:
    sha = prepared(world)
    claim_directly(world, sha)
    world.authority.closure_raises = True
    assert publisher(world).reconcile(sha).state is P.COMMIT_UNKNOWN
    assert record_of(world, sha).reason == "closure_unproven"
    world.authority.closure_raises = False
    swap(world)
    receipt = publisher(world).reconcile(sha)
    assert (receipt.state, receipt.revision) == (P.PUBLISHED, 4)


def test_reconcile_needs_retained_ownership(world: World) -> None:
    sha = prepared(world)
    claim_directly(world, sha)
    run = world.authority.runs["req-1"]
    run.ownership = OwnershipState.RETIRING
    assert publisher(world).reconcile(sha).state is P.NOT_PUBLISHED
    run.ownership = OwnershipState.RETIRED
    with pytest.raises(DponeError) as exc:
        publisher(world).reconcile(sha)
    assert error_code(exc) == "ownership_not_retained"


def test_reconcile_never_rewrites_a_terminal_record(world: World) -> None:
    sha = prepared(world)
    published = publisher(world).publish(sha)
    swap(world)  # someone swapped the tables back since
    receipt = publisher(world).reconcile(sha)
    assert (receipt.state, receipt.revision, receipt.record_sha256) == (
        P.PUBLISHED,
        3,
        published.record_sha256,
    )
    assert receipt.target_uuid == world.a_uuid  # today's observation, reported as such
    assert receipt.historical is False
    assert world.store.history(sha)[-1].facts["step"] == "observe"


# ---------------------------------------------------------------------- cancel


def test_cancel_before_a_claim(world: World) -> None:
    sha = prepared(world)
    receipt = publisher(world).cancel(sha)
    assert (receipt.state, receipt.revision) == (P.NOT_PUBLISHED, 2)
    record = record_of(world, sha)
    assert (record.reason, record.claim) == ("cancelled", None)
    # The unused publisher is released only after the record is terminal.
    events = world.events
    assert events.index("store.cas:not_published") < len(events) - events[::-1].index(
        "authority.close_principal"
    )
    assert not world.authority.leases[intent_of(world, sha).publisher.lease_id].active
    assert publisher(world).cancel(sha).historical is True
    replay = publisher(world).publish(sha)
    assert (replay.state, replay.revision, replay.historical) == (P.NOT_PUBLISHED, 2, True)
    assert world.executor.exchanges == []


def test_cancel_after_a_claim_is_refused(world: World) -> None:
    sha = prepared(world)
    claim_directly(world, sha)
    with pytest.raises(DponeError) as exc:
        publisher(world).cancel(sha)
    assert error_code(exc) == "claim_exists"
    assert record_of(world, sha).state is P.EXCHANGE_INTENT


def test_a_publisher_closure_blind_to_sign_ins_keeps_the_record_unknown(world: World) -> None:
    """The publisher's closure could not read the session log (issue 37): reconcile
    leaves COMMIT_UNKNOWN and says why, with its own reason, until it can."""
    sha = prepared(world)
    swap(world)  # the EXCHANGE ran
    claim_directly(world, sha)
    world.authority.closure_proven = False
    world.authority.closure_facts = {
        "logins": {"observed": False, "open": None, "reads": 1},
        "unproven": ["logins_unobservable"],
    }
    assert publisher(world).reconcile(sha).state is P.COMMIT_UNKNOWN
    assert record_of(world, sha).reason == "publisher_logins_unobservable"
    world.authority.closure_proven = True
    world.authority.closure_facts = {"unproven": []}
    receipt = publisher(world).reconcile(sha)
    assert (receipt.state, receipt.revision) == (P.PUBLISHED, 4)
